-- Each rank's clock against rank 0's, from its synchronizing collectives. Every rank of a group leaves
-- one only after every rank has entered it, so for ranks r and 0 and any instance both took part in:
--     entry_r - exit_0  <=  (r's clock - rank 0's clock)  <=  exit_r - entry_0
-- on the clocks as recorded (each rank already shifted by the offset it measured). The tightest such
-- bounds over all instances hold the error left in the recorded offset; the estimate is the median of
-- (exit_r - exit_0), the ranks leaving together, kept within the bounds, and its uncertainty is half
-- the bounds' width. It is applied where it is more certain than the recorded offset. Both are rounded
-- down to the nanosecond (floor), one rule on every engine (a median of two can end in .5).
with pairs as (
    select c.rank, c.exit_ns - z.exit_ns as d,
           c.entry_ns - z.exit_ns as low, c.exit_ns - z.entry_ns as high
    from collectives c
    join collectives z on z.rank = 0 and z.process_group = c.process_group and z.seq = c.seq
    where c.synchronizing and c.rank <> 0
),
fit as (
    select rank, count(*) as instances, median(d) as middle, max(low) as low, min(high) as high
    from pairs group by rank
),
estimate as (
    select rank, instances, low, high,
           case when low <= high then floor(least(greatest(middle, low), high)) end as correction,
           case when low <= high then floor((high - low) / 2) end as uncertainty
    from fit
)
select r.rank,
       r.offset_ns as recorded_offset_ns,
       r.offset_uncertainty_ns as recorded_uncertainty_ns,
       coalesce(e.instances, 0) as instances,
       cast(e.correction as bigint) as fitted_correction_ns,
       cast(e.uncertainty as bigint) as fitted_uncertainty_ns,
       case when r.rank <> 0 and e.correction is not null
                 and (r.offset_uncertainty_ns is null or e.uncertainty < r.offset_uncertainty_ns)
            then cast(e.correction as bigint) else cast(0 as bigint) end as applied_correction_ns,
       r.window_start_ns - (case when r.rank <> 0 and e.correction is not null
                 and (r.offset_uncertainty_ns is null or e.uncertainty < r.offset_uncertainty_ns)
            then cast(e.correction as bigint) else cast(0 as bigint) end) as recorded_from_ns
from ranks r
left join estimate e on e.rank = r.rank
order by r.rank
