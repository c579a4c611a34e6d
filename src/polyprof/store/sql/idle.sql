-- Per rank, device and stream, HTA's idle time by cause: each gap between consecutive rows on a stream
-- is "host wait" when the next row's launch call started after the previous row ended, "kernel wait"
-- when it is shorter than 30 us (launch overhead), "other" otherwise.
with ordered as (
    select a.rank, a.device, a.device_name, a.resource_name, a.start_ns, l.launched,
           lag(a.end_ns) over (partition by a.rank, a.device, a.resource order by a.start_ns, a.end_ns) as prev_end
    from activities a
    left join launches l on l.rank = a.rank and l.correlation = a.correlation and a.correlation <> 0
    where a.work is not null
),
gaps as (
    select rank, device, device_name, resource_name, start_ns - prev_end as gap,
           case when launched is not null and launched > prev_end then 'host wait'
                when start_ns - prev_end < 30000 then 'kernel wait' else 'other' end as cause
    from ordered where prev_end is not null
),
totals as (
    select rank, device, resource_name, sum(gap) as total from gaps group by rank, device, resource_name
)
select g.rank, g.device, min(g.device_name) as device_name, g.resource_name as stream, g.cause,
       count(*) as gaps, cast(sum(g.gap) as bigint) as idle_ns, sum(g.gap) / greatest(t.total, 1) as share
from gaps g join totals t on t.rank = g.rank and t.device = g.device and t.resource_name = g.resource_name
group by g.rank, g.device, g.resource_name, g.cause, t.total
order by g.rank, g.device, stream, g.cause
