"""``with_stack=True`` on a training loop: a 4-layer GPT-style transformer (CPU, AdamW), trained
unprofiled, under torch.profiler and under polyprof.profiler, both with ``with_stack=True``, in the same
process, in interleaved rounds.

    .venv/bin/python benchmarks/with_stack_training.py [--rounds 31] [--steps 4]

torch runs one intra-op thread (``--threads``) so that the step times vary less. Reports medians over
the rounds of: the step time unprofiled and profiled, the step time each profiler adds (each profiled
run against the unprofiled runs just before and after it, so that the machine's drift cancels; the two
profilers take turns going first), the trace's bytes (Kineto JSON, uncompressed), the stop to the trace
written and the events in each trace; and the time each adds to one traced call (a Python call and a C
call, fib(20), 15 rounds). Targets (issue #50): polyprof adds at most torch.profiler's step time (ratio
<= 1.0) and writes at most torch's bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from _common import report, scratch_folder


def gpt(torch, layers: int = 4, width: int = 128, heads: int = 4, vocab: int = 512):
    """A small GPT: token and position embeddings, pre-norm blocks of causal attention and an MLP."""
    nn, F = torch.nn, torch.nn.functional

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(x).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, t, c))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.attn = Attention()
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(64, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return GPT()


def training_step(torch):
    """One AdamW step of the GPT on a fixed batch of 8 sequences of 64 tokens (seeded)."""
    torch.manual_seed(0)
    model = gpt(torch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 512, (8, 65))

    def step() -> None:
        logits = model(data[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), data[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step


def fib(n: int) -> int:
    """A Python call and a C call (len) per call: what with_stack records, without torch ops."""
    return 1 if n < 2 else fib(n - 1) + fib(n - 2) + len(())


FIB_N, FIB_CALLS = 20, 2 * 21891  # fib(20): 21,891 Python calls and as many C calls


def per_call(torch, pp, rounds: int) -> dict:
    """The time with_stack adds to one traced call, fib(20) unprofiled and under each profiler."""
    def run() -> int:
        t0 = time.perf_counter_ns()
        fib(FIB_N)
        return time.perf_counter_ns() - t0

    run()
    samples: dict[str, list[int]] = {"plain": [], "torch": [], "polyprof": []}
    modules = {"torch": torch.profiler, "polyprof": pp}
    for r in range(rounds):
        samples["plain"].append(run())
        for name in ("torch", "polyprof") if r % 2 == 0 else ("polyprof", "torch"):
            prof = modules[name].profile(activities=[modules[name].ProfilerActivity.CPU], with_stack=True)
            prof.__enter__()
            samples[name].append(run())
            prof.__exit__(None, None, None)
    med = {k: statistics.median(v) for k, v in samples.items()}
    added = {k: (med[k] - med["plain"]) / FIB_CALLS for k in ("torch", "polyprof")}
    return {"added_ns_per_call": {k: round(v, 1) for k, v in added.items()},
            "ratio_polyprof_over_torch": round(added["polyprof"] / added["torch"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (1: the OpenMP pool "
                    "spinning on this VM's 2 cores made step times vary by +-15%%)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)

    import polyprof.profiler as pp

    step = training_step(torch)

    def steps(n: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            step()
        return (time.perf_counter_ns() - t0) / n

    folder = scratch_folder()
    samples: dict[str, list[float]] = {k: [] for k in ("plain", "torch", "polyprof", "torch_stop", "polyprof_stop",
                                                       "torch_bytes", "polyprof_bytes")}
    events: dict[str, int] = {}

    def profiled(name: str, module, r: int) -> None:
        prof = module.profile(activities=[module.ProfilerActivity.CPU], with_stack=True)
        prof.__enter__()
        samples[name].append(steps(args.steps))
        t0 = time.perf_counter_ns()
        prof.__exit__(None, None, None)
        path = os.path.join(folder, f"{name}{r}.json")
        prof.export_chrome_trace(path)
        samples[f"{name}_stop"].append(time.perf_counter_ns() - t0)
        samples[f"{name}_bytes"].append(os.path.getsize(path))
        with open(path) as f:
            trace = json.load(f)["traceEvents"]
        events[name] = sum(1 for e in trace if e.get("ph") == "X")
        events[f"{name}_python"] = sum(1 for e in trace if e.get("cat") == "python_function")
        os.remove(path)

    steps(3)  # warm up
    added_by_round: dict[str, list[float]] = {"torch": [], "polyprof": []}
    modules = {"torch": torch.profiler, "polyprof": pp}
    for r in range(args.rounds):  # plain, A, plain, B, plain; A and B swap every round
        before = steps(args.steps)
        samples["plain"].append(before)
        for name in ("torch", "polyprof") if r % 2 == 0 else ("polyprof", "torch"):
            profiled(name, modules[name], r)
            after = steps(args.steps)
            samples["plain"].append(after)
            added_by_round[name].append(samples[name][-1] - (before + after) / 2)  # against its neighbours
            before = after
    med = {k: statistics.median(v) for k, v in samples.items()}
    added = {k: statistics.median(v) for k, v in added_by_round.items()}
    report(
        "with_stack=True on a training loop (4-layer GPT, AdamW, CPU)",
        {
            "step_ms": {k: round(med[k] / 1e6, 2) for k in ("plain", "torch", "polyprof")},
            "added_step_ms": {k: round(v / 1e6, 2) for k, v in added.items()},
            "added_ratio_polyprof_over_torch": round(added["polyprof"] / added["torch"], 3),
            "trace_mb": {k: round(med[f"{k}_bytes"] / 1e6, 2) for k in ("torch", "polyprof")},
            "bytes_ratio": round(med["polyprof_bytes"] / med["torch_bytes"], 3),
            "stop_to_trace_ms": {k: round(med[f"{k}_stop"] / 1e6, 1) for k in ("torch", "polyprof")},
            "events": events,
            "every_round_ms": {k: [round(x / 1e6, 1) for x in samples[k]] for k in ("plain", "torch", "polyprof")},
            "per_traced_call (fib(20), a Python and a C call each)": per_call(torch, pp, 15),
        },
    )


if __name__ == "__main__":
    main()
