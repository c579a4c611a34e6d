"""The trace store on disk, the written side: a job's traces as Parquet tables, one folder per table and
one file per rank under it, and the manifest that lists the ranks (:mod:`.schema` is the layout,
``docs/store.md`` the columns). Querying a store is :mod:`polyprof.store`'s.

::

    from polyprof.formats.store.write import write_store
    write_store(["rank0.json", "rank1.json"], "job.polyprof")    # each rank in a process of its own
    write_trace(trace, "job.polyprof")                             # one rank's tables, from its process

A rank's tables come from a loaded trace (:mod:`.rank_tables`) or, for a large file, from its chunks in
bounded memory (:mod:`.rank_stream`). pyarrow is the ``polyprof[store]`` extra.
"""

from polyprof.extras import require

require("store", "polyprof's trace store")  # before any module here imports pyarrow: one line, not a traceback
