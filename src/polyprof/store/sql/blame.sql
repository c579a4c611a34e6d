-- Who made everyone wait: for every synchronizing collective instance (allreduce, allgather, barrier...:
-- no rank leaves before the last has entered) (a process group's n-th collective, on the
-- ranks that took part), the rank that entered last is blamed for the wait each other rank paid from
-- its own entry to that last entry, on the job's clock refined by `clock`. What the late rank was
-- doing meanwhile is read from the outermost rows of its training thread (outer_rows: operators,
-- annotations, data loading) that overlap each waiter's interval; what none covers is idle host time, or "not
-- recorded" before the late rank's recording began. One row per instance and cause; `setup`: the
-- instance came before the first step of a job that has steps (DDP's construction, the first
-- all-gathers), a wait apart from the steps'.
with aligned as (
    select c.*, c.entry_ns - k.applied_correction_ns as entry, c.exit_ns - k.applied_correction_ns as leave
    from collectives c join clock k on k.rank = c.rank
    where c.synchronizing
),
instances as (
    select process_group, seq, min(op) as op, count(*) as ranks,
           max(entry) as last_entry, max_by(rank, entry) as late_rank, max_by(step, entry) as step
    from aligned group by process_group, seq
    having count(*) > 1
),
waits as (
    select i.process_group, i.seq, i.op, i.step, i.late_rank, i.ranks, i.last_entry,
           a.rank as waiter, a.entry as waiter_entry, i.last_entry - a.entry as wait_ns
    from instances i
    join aligned a on a.process_group = i.process_group and a.seq = i.seq
    where a.rank <> i.late_rank and i.last_entry > a.entry
),
late_work as (
    select a.rank, a.kind, a.name,
           a.start_ns - k.applied_correction_ns as s, a.end_ns - k.applied_correction_ns as e
    from outer_rows a join clock k on k.rank = a.rank
),
nearby as materialized (  -- the late rank's rows within the instance's earliest wait (a few rows, met once per instance)
    select i.process_group, i.seq, l.kind, l.name, l.s, l.e
    from (select process_group, seq, min(late_rank) as late_rank, min(last_entry) as last_entry,
                 min(waiter_entry) as first_entry
          from waits group by process_group, seq) i
    join late_work l on l.rank = i.late_rank and l.s < i.last_entry and l.e > i.first_entry
),
covered as (
    select w.process_group, w.seq, n.kind, n.name,
           cast(sum(least(n.e, w.last_entry) - greatest(n.s, w.waiter_entry)) as bigint) as ns
    from waits w
    join nearby n on n.process_group = w.process_group and n.seq = w.seq and n.s < w.last_entry and n.e > w.waiter_entry
    group by w.process_group, w.seq, n.kind, n.name
),
totals as (
    select process_group, seq, min(op) as op, min(step) as step, min(late_rank) as late_rank,
           min(ranks) as ranks, cast(sum(wait_ns) as bigint) as wait_ns, max(wait_ns) as max_wait_ns
    from waits group by process_group, seq
),
unrecorded as (
    select w.process_group, w.seq, 'unrecorded' as kind, 'not recorded' as name,
           cast(sum(greatest(least(k.recorded_from_ns, w.last_entry) - w.waiter_entry, 0)) as bigint) as ns
    from waits w join clock k on k.rank = w.late_rank
    group by w.process_group, w.seq
),
idle as (
    select t.process_group, t.seq, 'idle' as kind, 'idle host' as name,
           t.wait_ns - cast(coalesce(sum(c.ns), 0) as bigint) - min(u.ns) as ns
    from totals t
    join unrecorded u on u.process_group = t.process_group and u.seq = t.seq
    left join covered c on c.process_group = t.process_group and c.seq = t.seq
    group by t.process_group, t.seq, t.wait_ns
)
select t.process_group, t.seq, t.op, t.step, t.late_rank, t.ranks, t.wait_ns, t.max_wait_ns,
       x.kind as cause_kind, x.name as cause, x.ns as cause_ns,
       coalesce(t.step < 0, false) and (select count(*) from step_spans) > 0 as setup
from totals t
join (select * from covered union all select * from unrecorded where ns > 0
      union all select * from idle where ns > 0) x
  on x.process_group = t.process_group and x.seq = t.seq
order by t.process_group, t.seq, x.ns desc
