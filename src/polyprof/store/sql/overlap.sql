-- Per rank and device with communication, HTA's communication/computation overlap: the time both run
-- at once, and its share of the communication time.
with comm as (
    select rank, device, sum(e - s) as communication from islands where work_set = 'COMMUNICATION'
    group by rank, device
),
both_ as (
    select a.rank, a.device, sum(least(a.e, b.e) - greatest(a.s, b.s)) as overlapped
    from islands a
    join islands b on b.rank = a.rank and b.device = a.device and b.work_set = 'COMPUTATION'
                  and b.s < a.e and a.s < b.e
    where a.work_set = 'COMMUNICATION'
    group by a.rank, a.device
),
names as (
    select rank, device, min(device_name) as device_name from activities where work is not null group by rank, device
)
select c.rank, c.device, n.device_name, cast(c.communication as bigint) as communication_ns,
       cast(coalesce(o.overlapped, 0) as bigint) as overlapped_ns,
       coalesce(o.overlapped, 0) / greatest(c.communication, 1) as overlap_share
from comm c
join names n on n.rank = c.rank and n.device = c.device
left join both_ o on o.rank = c.rank and o.device = c.device
order by c.rank, c.device
