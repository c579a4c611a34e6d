-- Per rank, the rank view's totals (polyprof.analysis.ranks): its steps and their mean duration, its
-- time in collectives over the whole trace (their union), and how much of that is above the least any
-- rank spent (waited_ns: the time it waited for the others, by the busy-time heuristic).
with steps_ as (
    select rank, count(*) as steps, cast(sum(hi - lo) as double) / count(*) as mean_step_ns from step_spans group by rank
),
marked as (
    select rank, start_ns as s, end_ns as e,
           case when start_ns <= max(end_ns) over (partition by rank order by start_ns, end_ns
                                                   rows between unbounded preceding and 1 preceding)
                then 0 else 1 end as opens
    from collective_ops
),
numbered as (
    select rank, s, e, sum(opens) over (partition by rank order by s, e rows between unbounded preceding and current row) as island
    from marked
),
collective as (
    select rank, sum(length) as collective_ns
    from (select rank, max(e) - min(s) as length from numbered group by rank, island) i group by rank
),
totals as (
    select r.rank, r.source, coalesce(s.steps, 0) as steps, coalesce(s.mean_step_ns, 0.0) as mean_step_ns,
           cast(coalesce(c.collective_ns, 0) as bigint) as collective_ns
    from ranks r left join steps_ s on s.rank = r.rank left join collective c on c.rank = r.rank
)
select rank, source, steps, mean_step_ns, collective_ns,
       collective_ns - min(collective_ns) over () as waited_ns
from totals
order by rank
