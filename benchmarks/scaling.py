"""Tokens/s of a GRPO step with 1 and 2 DDP processes on CPU (gloo), same global batch.

Each configuration runs in its own process tree: ``--devices 1`` is one process with all the
machine's threads, ``--devices 2`` two processes (Lightning's DDP on gloo) with half each, and
both train on the same global batch (2 x ``--prompts-per-rank`` prompts per step, G samples
each): one process sees all of it, each of two sees half. After ``--warmup`` steps, the timed
steps report:

- generated tokens/s: completion tokens sampled by all ranks / step wall time;
- trained tokens/s: tokens through the update's forward and backward, all ranks / update time;
- update FLOP/s: 6 x parameters x trained tokens / update time (the model-FLOPs estimate), and
  MFU against this machine's bf16 or fp32 matmul peak measured in the same run (a 2048^2
  ``torch.matmul`` with all threads).

    python benchmarks/scaling.py                       # a 4-layer random model, ~2 min
    python benchmarks/scaling.py --model smollm2        # SmolLM2-135M's shape, random weights

On a GPU the same script runs the hf engine there (``--accelerator gpu``); the ratio column is
2-process over 1-process throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {
    "tiny": {"hidden_size": 256, "num_layers": 4, "num_heads": 4},
    "smollm2": {"hidden_size": 576, "num_layers": 30, "num_heads": 9},
}


def worker(args: argparse.Namespace) -> None:
    import lightning as L
    from lightning.pytorch import Callback

    from lit_rag.data.datamodule import QADataModule
    from lit_rag.modules.loading import ModelConfig, TinyConfig
    from lit_rag.modules.policy import PolicyModule
    from lit_rag.plugins.algorithms.grpo import GRPO
    from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
    from lit_rag.plugins.rewards.qa import F1Reward
    from lit_rag.rollout.base import SamplingParams
    from lit_rag.step import StepOutput

    torch.set_num_threads(max(1, args.threads // args.devices))
    L.seed_everything(0)

    class Clock(Callback):
        def __init__(self) -> None:
            self.rows: list[dict] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.started = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            m = StepOutput.of(outputs).metrics
            self.rows.append({
                "wall_s": time.perf_counter() - self.started, "update_s": float(m["time/update_s"]),
                "generated": float(m["tokens/generated"]), "trained": float(m.get("tokens/trained", 0.0)),
            })

    policy = ModelConfig(tiny=TinyConfig(**SHAPES[args.model], vocab_size=8000))
    module = PolicyModule(policy=policy, environment=SingleTurnEnvironment(), reward=F1Reward(),
                          algorithm=GRPO(beta=0.04), group_size=args.samples,
                          sampling=SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0),
                          micro_batch_size=args.micro_batch, lr=1e-6)
    per_rank = args.global_prompts // args.devices
    data = QADataModule(num_train=args.global_prompts * (args.warmup + args.steps), num_val=2,
                        batch_size=per_rank, hops=[2], shuffle=False)
    clock = Clock()
    trainer = L.Trainer(accelerator=args.accelerator, devices=args.devices,
                        strategy="ddp" if args.devices > 1 else "auto", precision=args.precision,
                        max_steps=args.warmup + args.steps, callbacks=[clock], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, datamodule=data)
    params = sum(p.numel() for p in module.model.parameters())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{trainer.global_rank}.json").write_text(json.dumps(
        {"params": params, "rows": clock.rows[args.warmup :]}))


def matmul_peak(dtype: torch.dtype, threads: int) -> float:
    """FLOP/s of a 2048^2 matmul with ``threads`` threads (best of 5)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    torch.matmul(a, b)
    best = min(_timed(lambda: torch.matmul(a, b)) for _ in range(5))
    return 2 * 2048**3 / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(args: argparse.Namespace, devices: int) -> dict:
    out = tempfile.mkdtemp(prefix=f"scaling-{devices}-")
    cmd = [sys.executable, __file__, "--worker", "--devices", str(devices), "--out", out,
           *[f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
             if k not in ("worker", "devices", "out")]]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, args.threads // devices))}
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        why = "killed by signal 9 (out of memory?)" if done.returncode == -9 else done.stderr.strip().splitlines()[-1:]
        raise SystemExit(f"scaling: the {devices}-process run failed: {why}")
    ranks = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
    steps = len(ranks[0]["rows"])
    wall = sum(max(r["rows"][i]["wall_s"] for r in ranks) for i in range(steps)) / steps
    update = sum(max(r["rows"][i]["update_s"] for r in ranks) for i in range(steps)) / steps
    generated = sum(row["generated"] for r in ranks for row in r["rows"]) / steps
    trained = sum(row["trained"] for r in ranks for row in r["rows"]) / steps
    return {"devices": devices, "params": ranks[0]["params"], "wall_s": wall, "update_s": update,
            "generated_per_s": generated / wall, "trained_per_s": trained / update,
            "flops_per_s": 6 * ranks[0]["params"] * trained / update}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--global-prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--accelerator", default="cpu")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    dtype = torch.bfloat16 if "bf16" in args.precision else torch.float32
    peak = matmul_peak(dtype, args.threads) if args.accelerator == "cpu" else float("nan")
    results = [run(args, 1), run(args, 2)]
    base = results[0]
    print(f"GRPO step, {args.model} shape ({base['params'] / 1e6:.1f}M parameters), global batch "
          f"{args.global_prompts} prompts x {args.samples} samples x {args.new_tokens} new tokens, "
          f"{args.precision}, {args.threads} threads; {args.steps} timed steps after {args.warmup}")
    print(f"matmul peak ({dtype}, 2048^2, {args.threads} threads): {peak / 1e9:.0f} GFLOP/s")
    print("| processes | step s | update s | generated tok/s | trained tok/s | update GFLOP/s | MFU | throughput vs 1 process |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['devices']} | {r['wall_s']:.1f} | {r['update_s']:.1f} | {r['generated_per_s']:.0f} | "
              f"{r['trained_per_s']:.0f} | {r['flops_per_s'] / 1e9:.1f} | {r['flops_per_s'] / peak:.1%} | "
              f"{base['wall_s'] / r['wall_s']:.2f}x |")
    print("command: python benchmarks/scaling.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]))


if __name__ == "__main__":
    main()
