"""torchtitan's profiling helper, unchanged (torchtitan.tools.profiler.Profiler: torch.profiler with a
schedule of profile_freq steps and record_shapes, one trace per profiled iteration) around a small
training loop in a one-rank gloo group: ``python torchtitan_profiler.py OUT_DIR PORT``."""

import sys

import torch
import torch.distributed as dist
from torchtitan.tools.profiler import Profiler


def main(out: str, port: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    config = Profiler.Config(enable_profiling=True, profile_freq=3, profiler_warmup=1, profiler_active=1)
    with Profiler(config, global_step=0, base_folder=out) as prof:
        for _ in range(6):
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
