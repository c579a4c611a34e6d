"""The store's schema: one folder per table, one Parquet file per rank under ``rank=N/`` (Hive-style
partitions that DuckDB, Spark, Polars and pandas read without polyprof), and ``store.json`` naming the
schema version. Rows in a rank's file are sorted by ``step`` and written in row groups whose min/max
statistics let an engine skip the steps a query does not ask for.

::

    job.polyprof/
        store.json                          {"schema": "polyprof.store", "version": 1, "ranks": [...]}
        activities/rank=0/part-0.parquet    every span, instant and device row
        collectives/rank=0/part-0.parquet   one row per collective this rank took part in
        counters/rank=0/part-0.parquet
        backends/rank=0/part-0.parquet      each backend's status
        ranks/rank=0/part-0.parquet         the rank's place and clock (one row)

Times are Unix-epoch nanoseconds on the job's clock: rank 0's, each rank shifted by the offset it
recorded to rank 0 (``ranks.offset_ns``). The ``rank`` column comes from the folder name. The
documentation page ``docs/store.md`` describes every column; :data:`TABLES` is the one definition.
"""

from __future__ import annotations

import pyarrow as pa

from polyprof.formats.common.paths import MANIFEST  # noqa: F401 - a store's names, in one place

SCHEMA_NAME = "polyprof.store"
#: bumped whenever a column changes meaning or is removed (adding a column keeps the version)
SCHEMA_VERSION = 1
#: rows per Parquet row group (the unit an engine skips by its step statistics)
ROW_GROUP_ROWS = 128 * 1024

_string = pa.dictionary(pa.int32(), pa.string())  # names repeat: stored once per row group

ACTIVITIES = pa.schema([
    ("step", pa.int64()),           # the ProfilerStep#N the row falls in (device rows: their launch's); -1: none
    ("kind", pa.string()),          # cpu_op, user_annotation, kernel, gpu_memcpy, runtime, ... (ActivityKind, lower case)
    ("category", _string),          # Kineto's cat
    ("name", _string),
    ("device", _string),            # the device's key ("host", "cuda:0", "opencl:0", ...)
    ("device_type", _string),       # cpu, gpu, ...
    ("device_name", _string),       # as summaries name it ("GPU 0", "GPU 0 (gpu:0)", the host's name)
    ("resource", pa.int64()),       # thread id on the host, stream or queue on a device
    ("resource_name", _string),
    ("training_thread", pa.bool_()),  # the host thread of the rank's steps
    ("level", pa.int32()),          # nesting on its row, ProfilerStep spans not counted; 0: outermost
    ("start_ns", pa.int64()),
    ("end_ns", pa.int64()),
    ("dur_ns", pa.int64()),
    ("correlation", pa.int64()),    # 0: none (ids are the rank's own: join within a rank)
    ("external_id", pa.int64()),
    ("flow_id", pa.int64()),
    ("flow_type", pa.int8()),       # 0 none, 1 fwdbwd, 2 ac2g
    ("flow_start", pa.bool_()),
    ("collective", pa.bool_()),     # the row is a collective (see the collectives table)
    ("work", _string),              # device work: COMPUTATION, COMMUNICATION, MEMORY or OTHER (HTA's); null elsewhere
    ("input_dims", pa.string()),    # JSON, where shapes were recorded
    ("input_types", pa.string()),
    ("args", pa.string()),          # the row's other args, JSON; null when none
])

COLLECTIVES = pa.schema([
    ("process_group", pa.string()),  # "Process Group Name" ("0": the default group)
    ("group_description", pa.string()),
    ("seq", pa.int64()),             # the instance: the n-th collective on the group (the same on every rank)
    ("op", pa.string()),             # allreduce, broadcast, allgather, ...
    ("name", pa.string()),           # the row it was read from (gloo:all_reduce, record_param_comms, nccl kernel)
    ("on_device", pa.bool_()),
    ("synchronizing", pa.bool_()),  # every rank leaves only after every rank entered (allreduce, allgather, ...)
    ("group_size", pa.int64()),
    ("in_nelems", pa.int64()),
    ("out_nelems", pa.int64()),
    ("dtype", pa.string()),
    ("bytes", pa.int64()),           # in_nelems x the dtype's size; null where the dtype is unknown
    ("step", pa.int64()),
    ("entry_ns", pa.int64()),        # when this rank entered it, on the job's clock
    ("exit_ns", pa.int64()),
])

COUNTERS = pa.schema([
    ("name", _string),
    ("device", _string),
    ("resource", pa.int64()),        # -1: process-wide
    ("ts_ns", pa.int64()),
    ("value", pa.float64()),
    ("step", pa.int64()),
])

BACKENDS = pa.schema([
    ("backend", pa.string()),
    ("state", pa.string()),          # ran, unavailable, failed
    ("reason", pa.string()),
    ("activities", pa.int64()),
    ("rejected", pa.int64()),
    ("dropped", pa.string()),        # JSON {what: count}
    ("errors", pa.string()),         # JSON list
    ("warnings", pa.string()),
    ("status", pa.string()),         # the whole status, JSON
])

RANKS = pa.schema([
    ("world_size", pa.int64()),
    ("host", pa.string()),
    ("source", pa.string()),         # the trace file it was read from
    ("epoch_offset_ns", pa.int64()), # the trace's host clock -> Unix epoch
    ("offset_ns", pa.int64()),       # recorded offset to rank 0's clock (0 for rank 0 or when none)
    ("offset_uncertainty_ns", pa.int64()),  # null: none recorded
    ("window_start_ns", pa.int64()),
    ("window_end_ns", pa.int64()),
    ("events", pa.int64()),
    ("metadata", pa.string()),       # the trace's metadata, JSON (distributedInfo, ...)
])

#: table name -> schema (without the ``rank`` partition column)
TABLES: dict[str, pa.Schema] = {
    "activities": ACTIVITIES,
    "collectives": COLLECTIVES,
    "counters": COUNTERS,
    "backends": BACKENDS,
    "ranks": RANKS,
}
