"""Hugging Face accelerate, unchanged: Accelerator(kwargs_handlers=[ProfileKwargs(...)]) and
``with accelerator.profile() as prof:`` around three training steps; accelerate writes the trace into
``output_trace_dir``: ``python accelerate_profile.py OUT_DIR``."""

import sys

import torch
from accelerate import Accelerator
from accelerate.utils import ProfileKwargs


def main(out: str) -> None:
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(activities=["cpu"], record_shapes=True,
                                                                        output_trace_dir=out)])
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    with accelerator.profile() as prof:
        for _ in range(3):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=5))


if __name__ == "__main__":
    main(sys.argv[1])
