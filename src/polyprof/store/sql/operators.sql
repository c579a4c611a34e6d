-- Per rank, the operator table (polyprof.analysis.operators): each op (cpu_op, user_annotation; steps
-- aside) by name with its calls, total and self host time, the device time of what it launched
-- (External id) and with what the ops nested in it launched. Self time is the op's time less its
-- direct children's on its thread (host rows: ops, annotations, runtime calls...); an op whose only
-- child is an op of its own name counts once, the child folded into it, as torch.profiler's tables do.
-- On one thread the rows in (start, longest first) order are a pre-order walk of their nesting (the
-- store's `level`): a row's descendants are the rows after it that start before it ends, its parent the
-- last row before it one level up. Sums over those are running sums read at marker points, so that
-- every step is a window or an equality join (no range join, which Spark runs as a nested loop).
with host as (
    select rank, device, resource, name, kind in ('cpu_op', 'user_annotation') as is_op, level,
           start_ns, end_ns, dur_ns, external_id
    from activities
    where kind in ('cpu_op', 'user_annotation', 'runtime', 'driver', 'sync', 'python_function', 'overhead')
      and not regexp_matches(name, '^ProfilerStep#[0-9]+$')
),
launched as (
    select rank, external_id, sum(dur_ns) as ns from activities
    where work is not null and external_id <> 0 group by rank, external_id
),
walk as (
    select h.rank, h.device, h.resource, h.name, h.is_op, h.level, h.start_ns, h.end_ns, h.dur_ns,
           case when h.is_op and h.external_id <> 0 then coalesce(l.ns, 0) else 0 end as own,
           row_number() over (partition by h.rank, h.device, h.resource order by h.start_ns, h.end_ns desc) as pos
    from host h left join launched l on l.rank = h.rank and l.external_id = h.external_id
),
-- the device time an op and its descendants launched: a running sum in (time, level) order, read
-- at the op's own start (less its own: same-start ancestors before it, descendants after) and at its
-- end (only ops launch: the other rows neither carry nor read it)
device_points as (
    select rank, device, resource, start_ns as t, cast(level as double) as tie, 1 as marker, pos, own from walk where is_op
    union all
    select rank, device, resource, end_ns, -1.0, 2, pos, 0 from walk where is_op
),
device_sums as (
    select rank, device, resource, pos,
           sum(case when marker = 2 then before_ else own - before_ end) as device_total_ns
    from (select rank, device, resource, pos, marker, own,
                 sum(own) over (partition by rank, device, resource order by t, tie
                                rows between unbounded preceding and current row) as before_
          from device_points) p
    group by rank, device, resource, pos
),
-- each row's parent: the last row before it one level up
family as (
    select rank, device, resource, level + 1 as lvl, pos, 1 as is_parent from walk
    union all
    select rank, device, resource, level, pos, 0 from walk
),
grouped as (
    select rank, device, resource, lvl, pos, is_parent,
           sum(is_parent) over (partition by rank, device, resource, lvl order by pos, is_parent desc
                                rows between unbounded preceding and current row) as family_id
    from family
),
parents as (
    select c.rank, c.device, c.resource, c.pos, p.pos as parent_pos,
           count(*) over (partition by c.rank, c.device, c.resource, c.lvl, c.family_id) as siblings
    from grouped c
    join grouped p on p.rank = c.rank and p.device = c.device and p.resource = c.resource and p.lvl = c.lvl
                  and p.family_id = c.family_id and p.is_parent = 1
    where c.is_parent = 0
),
-- the durations of each row's direct children
child_sums as (
    select p.rank, p.device, p.resource, p.parent_pos as pos, sum(w.dur_ns) as children_ns
    from parents p
    join walk w on w.rank = p.rank and w.device = p.device and w.resource = p.resource and w.pos = p.pos
    group by p.rank, p.device, p.resource, p.parent_pos
),
folded as (  -- an op that is the only child of a row of its own name
    select w.rank, w.device, w.resource, w.pos
    from walk w
    join parents f on f.rank = w.rank and f.device = w.device and f.resource = w.resource and f.pos = w.pos
    join walk p on p.rank = w.rank and p.device = w.device and p.resource = w.resource and p.pos = f.parent_pos
    where w.is_op and f.siblings = 1 and p.name = w.name
),
measured as (
    select w.*, w.dur_ns - coalesce(c.children_ns, 0) as self_ns, d.device_total_ns,
           f.pos is not null as is_folded
    from walk w
    left join child_sums c on c.rank = w.rank and c.device = w.device and c.resource = w.resource and c.pos = w.pos
    left join device_sums d on d.rank = w.rank and d.device = w.device and d.resource = w.resource and d.pos = w.pos
    left join folded f on f.rank = w.rank and f.device = w.device and f.resource = w.resource and f.pos = w.pos
),
folded_runs as (  -- a folded chain's rows are consecutive, after the row it folds into: runs of pos
    select rank, device, resource, pos,
           pos - row_number() over (partition by rank, device, resource order by pos) as run
    from measured where is_folded
),
folded_into as (
    select rank, device, resource, pos, min(pos) over (partition by rank, device, resource, run) - 1 as target
    from folded_runs
),
into_targets as (  -- each row's self and device time, a folded row's to the row it folds into
    select m.rank, m.device, m.resource, coalesce(f.target, m.pos) as pos, sum(m.self_ns) as self_ns, sum(m.own) as own
    from measured m
    left join folded_into f on f.rank = m.rank and f.device = m.device and f.resource = m.resource and f.pos = m.pos
    group by m.rank, m.device, m.resource, coalesce(f.target, m.pos)
)
select m.rank, m.name as op, count(*) as calls, cast(sum(m.dur_ns) as bigint) as total_ns,
       cast(sum(t.self_ns) as bigint) as self_ns, cast(sum(m.dur_ns) as double) / count(*) as mean_ns,
       cast(sum(t.own) as bigint) as device_ns, cast(sum(m.device_total_ns) as bigint) as device_total_ns
from measured m
join into_targets t on t.rank = m.rank and t.device = m.device and t.resource = m.resource and t.pos = m.pos
where m.is_op and not m.is_folded
group by m.rank, m.name
order by m.rank, total_ns desc, op
