-- The busy intervals of each device: its device rows (kernels, copies, fills) merged where they
-- overlap or touch, for all of them (work_set 'ALL') and for each kind of work. A row starts a new
-- interval when it starts after every earlier row of its set has ended.
with rows_ as (
    select rank, device, 'ALL' as work_set, start_ns as s, end_ns as e from activities where work is not null
    union all
    select rank, device, work as work_set, start_ns as s, end_ns as e from activities where work is not null
),
marked as (
    select rank, device, work_set, s, e,
           case when s <= max(e) over (partition by rank, device, work_set order by s, e
                                       rows between unbounded preceding and 1 preceding)
                then 0 else 1 end as opens
    from rows_
),
numbered as (
    select rank, device, work_set, s, e,
           sum(opens) over (partition by rank, device, work_set order by s, e
                            rows between unbounded preceding and current row) as interval_
    from marked
)
select rank, device, work_set, min(s) as s, max(e) as e
from numbered
group by rank, device, work_set, interval_
