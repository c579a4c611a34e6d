"""Train a small MLP for a few steps under a schedule, writing TensorBoard-style traces.

    polyprof run examples/torch_mlp.py          # or: python examples/torch_mlp.py

The only change from a torch.profiler script is the import line. Traces go to traces/torch_mlp/
as {host}_{pid}.{ns}.pt.trace.json, one per recorded cycle; the operator table is printed at the end.
"""

import os
import sys

import torch
from torch import nn

from polyprof.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler


def main(steps: int = 8, out_dir: str = "traces/torch_mlp") -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, targets = torch.randn(32, 64), torch.randint(0, 10, (32,))
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
        on_trace_ready=tensorboard_trace_handler(out_dir),
        record_shapes=True,
    ) as prof:
        for _ in range(steps):
            with record_function("forward"):
                loss = nn.functional.cross_entropy(model(inputs), targets)
            with record_function("backward"):
                optimizer.zero_grad()
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
            prof.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    print(f"loss {loss.item():.4f}; traces in {os.path.abspath(out_dir)}: {sorted(os.listdir(out_dir))}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
