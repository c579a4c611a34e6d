"""Tools built on the formats' public functions: ``polyprof convert`` (:mod:`.convert`), ``polyprof
merge`` (:mod:`.merge_ranks`) and ``polyprof recover`` (:mod:`.recover`)."""
