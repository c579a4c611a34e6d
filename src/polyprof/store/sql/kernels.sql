-- Per rank and device, each kernel (copy, fill) by total time: calls, total, mean, min, max, its share
-- of the device's busy time (the sum of its rows' durations) and its kind of work.
with work_rows as (
    select rank, device, device_name, name, work, start_ns, dur_ns from activities where work is not null
),
totals as (
    select rank, device, sum(dur_ns) as total from work_rows group by rank, device
)
select w.rank, w.device, min(w.device_name) as device_name, w.name as kernel, min_by(w.work, w.start_ns) as kind,
       count(*) as calls, cast(sum(w.dur_ns) as bigint) as total_ns, cast(sum(w.dur_ns) as double) / count(*) as mean_ns,
       min(w.dur_ns) as min_ns, max(w.dur_ns) as max_ns, sum(w.dur_ns) / t.total as share
from work_rows w join totals t on t.rank = w.rank and t.device = w.device
group by w.rank, w.device, w.name, t.total
order by w.rank, w.device, total_ns desc
