"""Tokens/s of a GRPO step with 1 and 2 DDP processes on CPU (gloo), same global batch, with
the hf engine and with a vLLM on every rank.

Each configuration runs in its own process tree: ``--devices 1`` is one process with all the
machine's threads, ``--devices 2`` two processes (Lightning's DDP on gloo) with half each, and
both train on the same global batch (2 x ``--prompts-per-rank`` prompts per step, G samples
each): one process sees all of it, each of two sees half. After ``--warmup`` steps, the timed
steps report:

- generated tokens/s: completion tokens sampled by all ranks / step wall time;
- trained tokens/s: tokens through the update's forward and backward, all ranks / update time;
- update FLOP/s: 6 x parameters x trained tokens / update time (the model-FLOPs estimate), and
  MFU against this machine's bf16 or fp32 matmul peak measured in the same run (a 2048^2
  ``torch.matmul`` with all threads);
- the step split into rollout, update and weight sync (the slowest rank's), and the peak
  resident memory of the largest rank.

``--engine vllm`` rolls out with a vLLM in every training process (vLLM's external launcher; the
random model is saved as a Hugging Face folder first, since vLLM loads from disk); ``hf`` with
``transformers.generate`` on the live policy. Two processes on a 2-core machine split the cores,
so they can show what a second process costs and buys (the collectives, a second vLLM's
memory, rollout batches half as large), not what a second device would: that needs GPUs.

    python benchmarks/scaling.py                       # a 4-layer random model, both engines
    python benchmarks/scaling.py --engine vllm --model smollm2   # SmolLM2-135M's shape
    python benchmarks/scaling.py --quick     # a few minutes: 4 prompts x 2 samples x 16 tokens

``--precision`` is Lightning's ``trainer.precision``; ``auto``, the default, is what the recipes'
``precision: auto`` picks on this machine (``bf16-mixed`` where the CPU computes bf16 natively,
else ``32-true``); the vllm engine runs in bfloat16 under a bf16 precision, else in float32. The
output names the precision that ran; under the table, the date, commit, machine, library
versions and command (``benchmarks/_bench.py``).

On a GPU the same script runs there (``--accelerator gpu``); the ratio column is 2-process over
1-process throughput with the same engine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _bench
import torch

SHAPES = {
    "tiny": {"hidden_size": 256, "num_layers": 4, "num_heads": 4},
    "smollm2": {"hidden_size": 576, "num_layers": 30, "num_heads": 9},
}
#: --quick: the same table on a smaller step (still 2 timed steps after the warm-up: one alone
#: is too noisy to compare)
QUICK = {"global_prompts": 4, "samples": 2, "new_tokens": 16}


def worker(args: argparse.Namespace) -> None:
    import lightning as L
    from lightning.pytorch import Callback

    from lit_rag.contracts.step import StepOutput
    from lit_rag.data.datamodule import QADataModule
    from lit_rag.models.loading import ModelConfig
    from lit_rag.plugins.algorithms.grpo import GRPO
    from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
    from lit_rag.plugins.rewards.qa import F1Reward
    from lit_rag.rollout.base import SamplingParams
    from lit_rag.trainer.optimizer import OptimizerSettings
    from lit_rag.trainer.policy import PolicyModule

    torch.set_num_threads(max(1, args.threads // args.devices))
    L.seed_everything(0)
    from lit_rag.plugins.engines.vllm.engine import VLLMEngine

    class Clock(Callback):
        def __init__(self) -> None:
            self.rows: list[dict] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.started = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            m = StepOutput.of(outputs).metrics
            self.rows.append(
                {
                    "wall_s": time.perf_counter() - self.started,
                    "update_s": float(m["time/update_s"]),
                    "rollout_s": float(m["time/rollout_s"]),
                    "sync_s": float(m.get("time/weight_sync_s", 0.0)),
                    "generated": float(m["tokens/generated"]),
                    "trained": float(m.get("tokens/trained", 0.0)),
                    "rss_gib": float(m["mem/peak_rss_gib"]),
                }
            )

    if args.engine == "vllm":  # vLLM loads weights from disk: the random model saved by main()
        policy = ModelConfig(path=args.folder)
        dtype = "bfloat16" if "bf16" in args.precision else "float32"
        engine = VLLMEngine(dtype=dtype, enforce_eager=True, kv_cache_gib=1.0, max_model_len=2048)
    else:
        policy, engine = ModelConfig(tiny=tiny_config(args.model)), None
    module = PolicyModule(
        policy=policy,
        environment=SingleTurnEnvironment(),
        reward=F1Reward(),
        algorithm=GRPO(beta=0.04),
        group_size=args.samples,
        engine=engine,
        sampling=SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0),
        micro_batch_size=args.micro_batch,
        optimizer=OptimizerSettings(lr=1e-6),
    )
    data = QADataModule(
        num_train=args.global_prompts * (args.warmup + args.steps),
        num_val=2,
        global_batch_size=args.global_prompts,
        hops=[2],
        shuffle=False,
    )
    clock = Clock()
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        precision=args.precision,
        max_steps=args.warmup + args.steps,
        callbacks=[clock],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=data)
    params = sum(p.numel() for p in module.model.parameters())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{trainer.global_rank}.json").write_text(
        json.dumps({"params": params, "rows": clock.rows[args.warmup :]})
    )


def tiny_config(model: str):
    from lit_rag.models.loading import TinyConfig

    return TinyConfig(**SHAPES[model], vocab_size=8000)


def save_model(model: str) -> str:
    """The random model of ``model``'s shape as a Hugging Face folder (for vLLM)."""
    from lit_rag.models.loading import ModelConfig, load_model, load_tokenizer

    folder = tempfile.mkdtemp(prefix=f"scaling-{model}-")
    config = ModelConfig(tiny=tiny_config(model))
    load_model(config).save_pretrained(folder)
    load_tokenizer(config).save_pretrained(folder)
    return folder


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


def run(args: argparse.Namespace, engine: str, devices: int) -> dict:
    out = tempfile.mkdtemp(prefix=f"scaling-{devices}-")
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--devices",
        str(devices),
        "--out",
        out,
        "--engine",
        engine,
        *[
            f"--{k.replace('_', '-')}={v}"
            for k, v in vars(args).items()
            if k not in ("worker", "devices", "out", "engine", "quick")
        ],
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, args.threads // devices))}
    done = subprocess.run(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0:
        why = (
            "killed by signal 9 (out of memory?)"
            if done.returncode == -9
            else done.stderr.strip().splitlines()[-1:]
        )
        raise SystemExit(f"scaling: the {devices}-process {engine} run failed: {why}")
    ranks = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
    steps = len(ranks[0]["rows"])

    def slowest(key: str) -> float:  # per step, the slowest rank's; averaged over the steps
        return sum(max(r["rows"][i][key] for r in ranks) for i in range(steps)) / steps

    wall, update = slowest("wall_s"), slowest("update_s")
    generated = sum(row["generated"] for r in ranks for row in r["rows"]) / steps
    trained = sum(row["trained"] for r in ranks for row in r["rows"]) / steps
    return {
        "engine": engine,
        "devices": devices,
        "params": ranks[0]["params"],
        "wall_s": wall,
        "update_s": update,
        "rollout_s": slowest("rollout_s"),
        "sync_s": slowest("sync_s"),
        "rss_gib": max(row["rss_gib"] for r in ranks for row in r["rows"]),
        "generated_per_s": generated / wall,
        "trained_per_s": trained / update,
        "flops_per_s": 6 * ranks[0]["params"] * trained / update,
    }


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
    parser.add_argument(
        "--precision",
        default="auto",
        help="Lightning's trainer.precision; auto (the default): bf16-mixed where the hardware "
        "computes bf16 natively, else 32-true, as the recipes' precision: auto",
    )
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--engine", default="hf,vllm", help="hf, vllm or both (comma-separated)")
    parser.add_argument("--folder", default="", help=argparse.SUPPRESS)
    args = _bench.parse_args(parser, QUICK)
    if args.worker:
        return worker(args)
    from lit_rag.models.precision import resolve_precision

    asked = args.precision
    args.precision = str(resolve_precision(asked, args.accelerator))  # the workers get it resolved
    engines = [e.strip() for e in args.engine.split(",") if e.strip()]
    if not engines or any(e not in ("hf", "vllm") for e in engines):
        raise SystemExit(f"scaling: error: --engine takes hf, vllm or both, got {args.engine!r}")
    if "vllm" in engines:
        args.folder = save_model(args.model)
    dtype = torch.bfloat16 if "bf16" in args.precision else torch.float32
    peak = matmul_peak(dtype, args.threads) if args.accelerator == "cpu" else float("nan")
    results = [run(args, engine, devices) for engine in engines for devices in (1, 2)]
    params = results[0]["params"] / 1e6
    print(
        f"GRPO step, {args.model} shape ({params:.1f}M parameters), global batch "
        f"{args.global_prompts} prompts x {args.samples} samples x {args.new_tokens} new tokens, "
        f"{args.precision}"
        + (" (precision auto on this machine)" if asked == "auto" else "")
        + f", {args.threads} threads; {args.steps} timed steps after {args.warmup}"
    )
    print(f"matmul peak ({dtype}, 2048^2, {args.threads} threads): {peak / 1e9:.0f} GFLOP/s")
    print(
        "| engine | processes | step s | rollout s | update s | sync s | generated tok/s "
        "| trained tok/s | update GFLOP/s | MFU | peak RSS per rank | throughput vs 1 process |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        base = next(b for b in results if b["engine"] == r["engine"] and b["devices"] == 1)
        print(
            f"| {r['engine']} | {r['devices']} | {r['wall_s']:.1f} | {r['rollout_s']:.1f} | "
            f"{r['update_s']:.1f} | {r['sync_s']:.2f} | {r['generated_per_s']:.0f} | "
            f"{r['trained_per_s']:.0f} | {r['flops_per_s'] / 1e9:.1f} | "
            f"{r['flops_per_s'] / peak:.1%} | {r['rss_gib']:.2f} GiB | "
            f"{base['wall_s'] / r['wall_s']:.2f}x |"
        )
    _bench.print_provenance(__file__)


if __name__ == "__main__":
    main()
