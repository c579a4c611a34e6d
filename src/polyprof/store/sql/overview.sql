-- Per rank, the job at a glance (one row a rank, for a thousand ranks as for two): its steps and mean
-- step (rank_totals), the shares of step time in computation, exposed communication, memory, other
-- device work, host-side only and idle (steps; a rank with several devices: the mean over them), the
-- kernel with the most device time, the op with the most self time, its time in collectives and
-- waiting (rank_totals), and the wait it made the other ranks pay in the steps (blame).
with parts as (
    select rank, sum(step_ns) as step_ns, sum(compute_ns) as compute_ns, sum(communication_ns) as communication_ns,
           sum(memory_ns) as memory_ns, sum(other_ns) as other_ns, sum(host_only_ns) as host_only_ns,
           sum(idle_ns) as idle_ns
    from steps group by rank
),
kernel_totals as (
    select rank, kernel, sum(total_ns) as ns,
           row_number() over (partition by rank order by sum(total_ns) desc, kernel) as place
    from kernels group by rank, kernel
),
op_totals as (
    select rank, op, self_ns, row_number() over (partition by rank order by self_ns desc, op) as place
    from operators
),
caused as (  -- the set-up before the first step apart
    select late_rank as rank, sum(cause_ns) as ns from blame where not setup group by late_rank
)
select t.rank, t.steps, t.mean_step_ns,
       p.compute_ns / p.step_ns as compute_share, p.communication_ns / p.step_ns as communication_share,
       p.memory_ns / p.step_ns as memory_share, p.other_ns / p.step_ns as other_share,
       p.host_only_ns / p.step_ns as host_only_share, p.idle_ns / p.step_ns as idle_share,
       k.kernel as top_kernel, cast(k.ns as bigint) as top_kernel_ns, o.op as top_op, o.self_ns as top_op_self_ns,
       t.collective_ns, t.waited_ns, cast(coalesce(c.ns, 0) as bigint) as made_others_wait_ns
from rank_totals t
left join parts p on p.rank = t.rank and p.step_ns > 0
left join kernel_totals k on k.rank = t.rank and k.place = 1
left join op_totals o on o.rank = t.rank and o.place = 1
left join caused c on c.rank = t.rank
order by t.rank
