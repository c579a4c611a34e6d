-- Each rank's steps: a step is the longest ProfilerStep#N span of its number (a trace can hold a
-- step's span twice, torch's and polyprof's), with the thread and the host device it ran on.
with step_rows as (
    select rank, cast(substr(name, 14) as bigint) as step, start_ns as lo, end_ns as hi, resource as thread,
           device as host_device, name,
           row_number() over (partition by rank, name order by dur_ns desc, start_ns) as longest
    from activities where regexp_matches(name, '^ProfilerStep#[0-9]+$')
)
select rank, step, lo, hi, thread, host_device, name from step_rows where longest = 1
