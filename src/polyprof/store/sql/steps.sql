-- Per rank, step and device, the step time breakdown (polyprof.analysis.steps): within the step's span,
-- computation counts first, then communication not hidden under it, memory work not hidden under
-- either, other device work, then host-side only time (the step's thread runs ops, annotations or
-- runtime calls and the device has nothing to do), and idle is the rest (steps: step_spans.sql); a
-- rank with no device work has one device row, "host".
-- Each part is the union of the intervals of its kind and the kinds before it, less the union of
-- those before it: one union (islands, as in islands.sql) per rank, step, device and layer.
with devices as (
    select distinct rank, device, device_name from activities where work is not null
),
rank_devices as (  -- ranks with no device work: one row, the host
    select s.rank, coalesce(d.device, 'host') as device, coalesce(d.device_name, 'host') as device_name
    from (select distinct rank from step_spans) s left join devices d on d.rank = s.rank
),
layered as (  -- every interval of the step that counts, with the layer of its kind (1 computation .. 5 host)
    select s.rank, s.step, a.device,
           case a.work when 'COMPUTATION' then 1 when 'COMMUNICATION' then 2 when 'MEMORY' then 3 else 4 end as layer,
           greatest(a.start_ns, s.lo) as s, least(a.end_ns, s.hi) as e
    from step_spans s join activities a on a.rank = s.rank and a.work is not null
                                      and a.start_ns < s.hi and a.end_ns > s.lo
    union all
    select s.rank, s.step, d.device, 5 as layer, greatest(a.start_ns, s.lo) as s, least(a.end_ns, s.hi) as e
    from step_spans s
    join activities a on a.rank = s.rank and a.device = s.host_device and a.resource = s.thread
                     and a.kind in ('cpu_op', 'user_annotation', 'runtime', 'driver', 'sync', 'python_function')
                     and a.start_ns < s.hi and a.end_ns > s.lo
                     and not (a.start_ns = s.lo and a.end_ns = s.hi and a.name = s.name)
    join rank_devices d on d.rank = s.rank
),
upto as (  -- layer L's union takes the intervals of layers 1..L
    select l.rank, l.step, l.device, u.layer, l.s, l.e
    from layered l join (select 1 as layer union all select 2 union all select 3 union all select 4 union all select 5) u
         on l.layer <= u.layer
),
marked as (
    select rank, step, device, layer, s, e,
           case when s <= max(e) over (partition by rank, step, device, layer order by s, e
                                       rows between unbounded preceding and 1 preceding)
                then 0 else 1 end as opens
    from upto
),
numbered as (
    select rank, step, device, layer, s, e,
           sum(opens) over (partition by rank, step, device, layer order by s, e
                            rows between unbounded preceding and current row) as island
    from marked
),
islands as (
    select rank, step, device, layer, max(e) - min(s) as length
    from numbered group by rank, step, device, layer, island
),
unions as (
    select rank, step, device, layer, sum(length) as covered from islands group by rank, step, device, layer
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
