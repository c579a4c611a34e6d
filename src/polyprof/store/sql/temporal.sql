-- Per rank and device, HTA's temporal breakdown: the span (first start to last end of device work),
-- idle (the span less the union of its work), compute (the union of computation) and the rest.
with spans as (
    select rank, device, min(device_name) as device_name, min(start_ns) as lo, max(end_ns) as hi
    from activities where work is not null group by rank, device
),
busy as (
    select rank, device, sum(case when work_set = 'ALL' then e - s else 0 end) as busy,
           sum(case when work_set = 'COMPUTATION' then e - s else 0 end) as compute
    from islands group by rank, device
)
select p.rank, p.device, p.device_name, p.hi - p.lo as span_ns,
       cast(p.hi - p.lo - b.busy as bigint) as idle_ns, cast(b.compute as bigint) as compute_ns,
       cast(b.busy - b.compute as bigint) as non_compute_ns,
       (p.hi - p.lo - b.busy) / greatest(p.hi - p.lo, 1) as idle_share,
       b.compute / greatest(p.hi - p.lo, 1) as compute_share
from spans p join busy b on b.rank = p.rank and b.device = p.device
order by p.rank, p.device
