-- Per rank, step and device, the step time breakdown (polyprof.analysis.steps): within the step's span,
-- computation counts first, then communication not hidden under it, memory work not hidden under
-- either, other device work, then host-side only time (the step's thread runs ops, annotations or
-- runtime calls and the device has nothing to do), and idle is the rest (steps: step_spans.sql); a
-- rank with no device work has one device row, "host".
-- Each part is the union of the intervals of its kind and the kinds before it, less the union of
-- those before it: one union per rank, step, device and layer, each interval in start order adding
-- what it reaches past the ones before it.
with devices as (
    select distinct rank, device, device_name from activities where work is not null
),
rank_devices as (  -- ranks with no device work: one row, the host
    select s.rank, coalesce(d.device, 'host') as device, coalesce(d.device_name, 'host') as device_name
    from (select distinct rank from step_spans) s left join devices d on d.rank = s.rank
),
-- A row meets the steps it overlaps through an equality join on time buckets (a range join on the rank
-- alone compares every row with every step): each rank's time from its first step to its last cut in
-- buckets of its median step (at most 4,096 buckets in all), each step and each row (clipped to that
-- time) listed in every bucket it touches, and a pair kept in the first bucket both touch.
widths as (
    select rank, min(lo) as first_lo, max(hi) as last_hi,
           greatest(cast(quantile_cont(hi - lo, 0.5) as bigint), (max(hi) - min(lo)) // 4096, 1) as width
    from step_spans group by rank
),
step_buckets as (
    select s.*, w.first_lo, w.width,
           unnest(range((s.lo - w.first_lo) // w.width, (s.hi - 1 - w.first_lo) // w.width + 1)) as bucket
    from step_spans s join widths w on w.rank = s.rank
),
counted as (  -- the rows a step's breakdown counts, with the layer of their kind (1 computation .. 5 host)
    select rank, device, resource, kind, name, start_ns, end_ns, 0 as on_thread,
           case work when 'COMPUTATION' then 1 when 'COMMUNICATION' then 2 when 'MEMORY' then 3 else 4 end as layer
    from activities where work is not null
    union all
    select rank, device, resource, kind, name, start_ns, end_ns, 1, 5
    from activities where kind in ('cpu_op', 'user_annotation', 'runtime', 'driver', 'sync', 'python_function')
),
row_buckets as (
    select c.*, (greatest(c.start_ns, w.first_lo) - w.first_lo) // w.width as first_bucket,
           unnest(range((greatest(c.start_ns, w.first_lo) - w.first_lo) // w.width,
                        (least(c.end_ns, w.last_hi) - 1 - w.first_lo) // w.width + 1)) as bucket
    from counted c join widths w on w.rank = c.rank and c.start_ns < w.last_hi and c.end_ns > w.first_lo
),
met as (
    select s.rank, s.step, s.lo, s.hi, s.host_device, s.thread, s.name as step_name, r.device, r.resource,
           r.name, r.start_ns, r.end_ns, r.on_thread, r.layer
    from step_buckets s join row_buckets r on r.rank = s.rank and r.bucket = s.bucket
    where r.start_ns < s.hi and r.end_ns > s.lo
      and s.bucket = greatest(r.first_bucket, (s.lo - s.first_lo) // s.width)
),
layered as (
    select rank, step, device, layer, greatest(start_ns, lo) as s, least(end_ns, hi) as e
    from met where on_thread = 0
    union all
    select m.rank, m.step, d.device, 5 as layer, greatest(m.start_ns, m.lo) as s, least(m.end_ns, m.hi) as e
    from met m join rank_devices d on d.rank = m.rank
    where m.on_thread = 1 and m.device = m.host_device and m.resource = m.thread
      and not (m.start_ns = m.lo and m.end_ns = m.hi and m.name = m.step_name)
),
upto as (  -- layer L's union takes the intervals of layers 1..L
    select l.rank, l.step, l.device, u.layer, l.s, l.e
    from layered l join (select 1 as layer union all select 2 union all select 3 union all select 4 union all select 5) u
         on l.layer <= u.layer
),
reach as (  -- how far the layer's earlier intervals (by start) reach: what this one adds to the union
    select rank, step, device, layer, s, e,
           max(e) over (partition by rank, step, device, layer order by s, e
                        rows between unbounded preceding and 1 preceding) as reach
    from upto
),
unions as (
    select rank, step, device, layer, sum(greatest(e - greatest(s, coalesce(reach, s)), 0)) as covered
    from reach group by rank, step, device, layer
),
covered as (
    select rank, step, device,
           coalesce(max(case when layer = 1 then covered end), 0) as u1,
           coalesce(max(case when layer = 2 then covered end), 0) as u2,
           coalesce(max(case when layer = 3 then covered end), 0) as u3,
           coalesce(max(case when layer = 4 then covered end), 0) as u4,
           coalesce(max(case when layer = 5 then covered end), 0) as u5
    from unions group by rank, step, device
)
select s.rank, s.step, d.device_name as device, s.hi - s.lo as step_ns,
       cast(coalesce(c.u1, 0) as bigint) as compute_ns,
       cast(coalesce(c.u2 - c.u1, 0) as bigint) as communication_ns,
       cast(coalesce(c.u3 - c.u2, 0) as bigint) as memory_ns,
       cast(coalesce(c.u4 - c.u3, 0) as bigint) as other_ns,
       cast(coalesce(c.u5 - c.u4, 0) as bigint) as host_only_ns,
       cast(s.hi - s.lo - coalesce(c.u5, 0) as bigint) as idle_ns
from step_spans s
join rank_devices d on d.rank = s.rank
left join covered c on c.rank = s.rank and c.step = s.step and c.device = d.device
order by s.rank, s.step, device
