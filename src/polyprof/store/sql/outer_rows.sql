-- Each rank's outermost rows of its training thread that are not steps, collectives or instants:
-- what it was doing (operators, annotations, data loading), as blame reads it.
select rank, kind, name, start_ns, end_ns
from activities
where training_thread and level = 0 and not collective and kind <> 'instant' and name not like 'ProfilerStep#%'
