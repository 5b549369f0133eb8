"""AdamW's step on the host, as FSDP with ``cpu_offload`` runs it: the sharded fp32 master
weights, their gradient and AdamW's two states live in host memory and every optimizer step
updates them on the CPU, ``--steps-per-batch`` times a batch (the Eval-RAR and Search-R1
recipes: ten mini-batches).

Times one step over ``--params`` fp32 weights for each of torch's AdamW implementations
(``for-loop``, ``foreach``, ``fused``) at 1 thread (``OMP_NUM_THREADS=1``, what torchrun gives
each rank) and at every core of this machine, then scales the fastest to a rank's shard of the
paper recipes (Qwen2.5-7B over 4 ranks: 1.9B weights a rank) times the steps of a batch. Run it
with nothing else on the machine::

    python benchmarks/host_optimizer.py [--params 50000000] [--steps-per-batch 10]
    python benchmarks/host_optimizer.py --quick   # 10M weights

Prints a table (seconds per step, ns per weight, seconds per batch at a 7B rank's shard), then
the date, commit, machine, library versions and command (``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import os
import time

import _bench
import torch

#: --quick: fewer weights (the same table)
QUICK = {"params": 10_000_000, "repeats": 2}
#: a rank's shard of Qwen2.5-7B-Instruct's 7,615,616,512 weights over 4 ranks (Eval-RAR A.2)
SHARD_7B_4 = 7_615_616_512 // 4
IMPLEMENTATIONS = {
    "for-loop": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def step_seconds(params: int, threads: int, options: dict, repeats: int) -> float:
    """The fastest of ``repeats`` AdamW steps over ``params`` weights (in 8 tensors, as a
    model's flat parameters come) at ``threads`` threads."""
    torch.set_num_threads(threads)
    weights = [torch.nn.Parameter(torch.randn(params // 8) * 0.02) for _ in range(8)]
    for w in weights:
        w.grad = torch.randn_like(w) * 1e-3
    optimizer = torch.optim.AdamW(weights, lr=1e-6, **options)
    optimizer.step()  # the states are allocated at the first step
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        optimizer.step()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=50_000_000, help="weights in one step")
    parser.add_argument("--steps-per-batch", type=int, default=10, help="optimizer steps a batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps (the fastest counts)")
    args = _bench.parse_args(parser, QUICK, argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"| AdamW | threads | s / step ({args.params:,} weights) | ns / weight | "
          f"s / batch, 7B over 4 ranks ({args.steps_per_batch} steps) |")  # fmt: skip
    print("|---|---|---|---|---|")
    for name, options in IMPLEMENTATIONS.items():
        for threads in sorted({1, cores}):
            seconds = step_seconds(args.params, threads, options, args.repeats)
            per_weight = seconds / args.params
            batch = per_weight * SHARD_7B_4 * args.steps_per_batch
            print(f"| {name} | {threads} | {seconds:.3f} | {per_weight * 1e9:.2f} | {batch:.0f} |")
    _bench.print_provenance(__file__, argv)


if __name__ == "__main__":
    main()
