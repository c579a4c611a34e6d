-- Each rank's outermost rows of its training thread that say what it was doing (operators,
-- annotations, data loading, a Python function), as blame reads them: not steps, collectives or
-- instants, and not the rows around the steps (with Python calls recorded, the script's and the
-- training loop's frames hold every step: the rows one level inside them are what the rank was doing).
with thread_rows as (
    select rank, kind, name, level, start_ns, end_ns, collective
    from activities
    where training_thread and kind <> 'instant' and not regexp_matches(name, '^ProfilerStep#[0-9]+$')
),
step_rows as (
    select rank, start_ns as lo, end_ns as hi from activities
    where training_thread and regexp_matches(name, '^ProfilerStep#[0-9]+$')
),
shortest as (
    select rank, min(hi - lo) as ns from step_rows group by rank
),
around as (  -- the rows that hold a step (only a row at least as long as the shortest step can)
    select distinct t.rank, t.level, t.start_ns, t.end_ns
    from thread_rows t
    join shortest m on m.rank = t.rank and t.end_ns - t.start_ns >= m.ns
    join step_rows s on s.rank = t.rank and t.start_ns <= s.lo and t.end_ns >= s.hi
),
inside as (  -- the rows whose parent holds a step
    select distinct t.rank, t.level, t.start_ns, t.end_ns
    from thread_rows t
    join around a on a.rank = t.rank and a.level = t.level - 1 and a.start_ns <= t.start_ns and a.end_ns >= t.end_ns
)
select t.rank, t.kind, t.name, t.start_ns, t.end_ns
from thread_rows t
left join around a on a.rank = t.rank and a.level = t.level and a.start_ns = t.start_ns and a.end_ns = t.end_ns
left join inside i on i.rank = t.rank and i.level = t.level and i.start_ns = t.start_ns and i.end_ns = t.end_ns
where not t.collective and a.rank is null and (t.level = 0 or i.rank is not null)
