-- Per step and rank, the rank view (polyprof.analysis.ranks): the step's duration, its busy time (the
-- duration less the time in collectives within it: the union of c10d::, record_param_comms, gloo:,
-- nccl: ops and NCCL kernels, nested ones once), whether the rank is the step's slowest (the most busy
-- time; ties: the lowest rank) and, for that rank, its busy time above the ranks' median (steps:
-- step_spans.sql; collectives: collective_ops.sql). (The blame analysis says who made the others wait from
-- collective entry times on one clock; this view is the busy-time heuristic, for a quick look.)
with clipped as (
    select s.rank, s.step, greatest(c.start_ns, s.lo) as s, least(c.end_ns, s.hi) as e
    from step_spans s join collective_ops c on c.rank = s.rank and c.start_ns < s.hi and c.end_ns > s.lo
),
marked as (
    select rank, step, s, e,
           case when s <= max(e) over (partition by rank, step order by s, e
                                       rows between unbounded preceding and 1 preceding)
                then 0 else 1 end as opens
    from clipped
),
numbered as (
    select rank, step, s, e,
           sum(opens) over (partition by rank, step order by s, e rows between unbounded preceding and current row) as island
    from marked
),
in_collectives as (
    select rank, step, sum(length) as collective_ns
    from (select rank, step, max(e) - min(s) as length from numbered group by rank, step, island) i
    group by rank, step
),
busy as (
    select s.rank, s.step, s.hi - s.lo as step_ns, s.hi - s.lo - coalesce(c.collective_ns, 0) as busy_ns
    from step_spans s left join in_collectives c on c.rank = s.rank and c.step = s.step
),
medians as (
    select step, quantile_cont(busy_ns, 0.5) as median_busy from busy group by step
),
ranked as (
    select b.*, m.median_busy, row_number() over (partition by b.step order by b.busy_ns desc, b.rank) as place
    from busy b join medians m on m.step = b.step
)
select step, rank, step_ns, cast(busy_ns as bigint) as busy_ns, place = 1 as slowest,
       case when place = 1 then cast(floor(busy_ns - median_busy) as bigint) end as behind_ns
from ranked
order by step, rank
