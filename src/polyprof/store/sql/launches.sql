-- Each launch call (a runtime or driver row with a correlation id) and when it started, per rank:
-- what the idle and launch analyses join device rows to.
select rank, correlation, min(start_ns) as launched
from activities where kind in ('runtime', 'driver') and correlation <> 0
group by rank, correlation
