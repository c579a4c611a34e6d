-- Per rank and device, the time from the start of each launch call (the runtime or driver row with
-- the device row's correlation id) to the start of its device work: count, mean, median, p90, p99,
-- max, and the name of the row that waited longest (the earliest of those that waited as long).
with latencies as (
    select a.rank, a.device, a.device_name, a.name, a.start_ns - l.launched as latency,
           row_number() over (partition by a.rank, a.device order by a.start_ns - l.launched desc, a.start_ns) as place
    from activities a join launches l on l.rank = a.rank and l.correlation = a.correlation
    where a.work is not null and a.correlation <> 0
)
select rank, device, min(device_name) as device_name, count(*) as launches, cast(sum(latency) as double) / count(*) as mean_ns,
       quantile_cont(latency, 0.5) as p50_ns, quantile_cont(latency, 0.9) as p90_ns,
       quantile_cont(latency, 0.99) as p99_ns, max(latency) as max_ns,
       max(case when place = 1 then name end) as worst
from latencies
group by rank, device
order by rank, device
