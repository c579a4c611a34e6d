"""PyTorch Lightning, unchanged: Trainer(profiler=PyTorchProfiler(...)) with a schedule, fit on a small
model whose training_step also runs OpenCL work (a copy, a fill, a kernel, a copy back) through
pyopencl. Writes its traces where Lightning writes them: ``python lightning_fit.py OUT_DIR``.
``fit(OUT_DIR, accelerator="gpu", opencl=False)`` is the GPU check's run (plugins/polyprof-cuda)."""

import sys

import lightning as L
import numpy as np
import torch
from lightning.pytorch.profilers import PyTorchProfiler

KERNEL = "__kernel void twice(__global float *x) { int i = get_global_id(0); x[i] = 2.0f * x[i]; }"


class Model(L.LightningModule):
    def __init__(self, opencl: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(8, 1)
        self.with_opencl = opencl
        self.cl = None

    def opencl(self, x: torch.Tensor) -> None:
        import pyopencl as cl

        if self.cl is None:  # created once training runs (queues made while profiling are timed)
            ctx = cl.create_some_context(interactive=False)
            self.cl = (ctx, cl.CommandQueue(ctx), cl.Kernel(cl.Program(ctx, KERNEL).build(), "twice"))
        ctx, queue, twice = self.cl
        host = x.detach().numpy().astype(np.float32).ravel().copy()
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, host.nbytes)
        cl.enqueue_fill_buffer(queue, buf, np.float32(0), 0, host.nbytes)
        cl.enqueue_copy(queue, buf, host)
        twice(queue, host.shape, None, buf)
        cl.enqueue_copy(queue, host, buf)
        queue.finish()

    def training_step(self, batch: tuple, index: int) -> torch.Tensor:
        x, y = batch
        if self.with_opencl:
            self.opencl(x.cpu())
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(out: str, accelerator: str = "cpu", opencl: bool = True) -> None:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    profiler = PyTorchProfiler(dirpath=out, filename="fit", export_to_chrome=True,
                               schedule=torch.profiler.schedule(wait=1, warmup=1, active=2))
    trainer = L.Trainer(max_epochs=1, limit_train_batches=8, profiler=profiler, accelerator=accelerator, devices=1,
                        enable_checkpointing=False, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Model(opencl), torch.utils.data.DataLoader(data, batch_size=8))


if __name__ == "__main__":
    fit(sys.argv[1])
