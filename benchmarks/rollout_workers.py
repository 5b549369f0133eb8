"""Colocated rollout against rollout workers, on the same recipe, seed and steps.

Runs ``lit-rag fit`` once per mode, one after another (never two at once), each in its own
folder under ``--out``:

- ``colocated``: the recipe as it is: the engine in the training process, all cores;
- ``workers k=K``: ``--model.rollout.workers=1 --model.rollout.max_staleness=K`` for each K in
  ``--staleness``: rollout in one worker process pinned to one core (``cores_per_worker``),
  the trainer on the other cores.

Every run validates once, at its last step. Then it prints, per run, from ``metrics.csv``: the
mean step time (``time/step_s``, wall seconds from one step's start to the next, the first
step left out: it includes starting vLLM), samples per second (samples per step / step time), where
the step's time went (the trainer's wait for rollouts, the worker's seconds on the batch,
the update, the weight push), the staleness trained on, the reward of every step and the
validation EM. Each run's folder is kept for ``benchmarks/async_sim.py --check``.

    python benchmarks/rollout_workers.py --config recipes/quickstart.yaml --steps 8
    python benchmarks/rollout_workers.py --config recipes/eval_rar_quickstart.yaml --steps 8
    python benchmarks/rollout_workers.py --quick

``--quick`` (a few minutes): ``recipes/quickstart.yaml`` unless ``--config`` names another, 3
steps (the fewest with a step time after the first), colocated against ``k=1`` only, 2 prompts a
step (``--data.batch_size=2``) and one validation batch. Other options go to every ``lit-rag
fit`` (after --quick's, so they win), e.g. ``--trainer.precision=32-true``; the recipes' own
``precision: auto`` is bf16 where the CPU computes it natively, else fp32. Under the table: the
precision that ran, the date, commit, machine, library versions and command
(``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import csv
import shlex
import subprocess
import time
from pathlib import Path

import _bench

#: --quick: the quickstart, 3 steps, colocated against k=1
QUICK = {"config": "recipes/quickstart.yaml", "steps": 3, "staleness": [1]}
#: --quick's overrides of every fit, before the user's (the last one given wins)
QUICK_OVERRIDES = ["--data.batch_size=2", "--trainer.limit_val_batches=1"]


def _override(overrides: list[str], key: str) -> str | None:
    """The value the last ``--key=value`` of ``overrides`` gives, if any."""
    found = None
    for arg in overrides:
        name, eq, value = arg.partition("=")
        if eq and name == f"--{key}":
            found = value
    return found


def _precision(recipe: dict, overrides: list[str]) -> str:
    """The ``trainer.precision`` the fits run at, ``auto`` resolved for this machine."""
    from lit_rag.models.precision import resolve_precision

    trainer = recipe.get("trainer") or {}
    asked = _override(overrides, "trainer.precision") or trainer.get("precision", "32-true")
    accelerator = _override(overrides, "trainer.accelerator") or trainer.get("accelerator")
    resolved = str(resolve_precision(asked, accelerator))
    return resolved if resolved == str(asked) else f"{resolved} ({asked} on this machine)"


def run(config: str, steps: int, folder: Path, extra: list[str]) -> tuple[Path, float]:
    """One ``lit-rag fit``; its metrics.csv and wall seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    data = Path("data").resolve()  # the recipes' data files are relative to the repository
    if data.is_dir() and not (folder / "data").exists():
        (folder / "data").symlink_to(data)
    command = [
        "lit-rag", "fit", "--config", str(Path(config).resolve()),
        f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={steps}",
        "--trainer.logger.init_args.save_dir=runs", "--trainer.logger.init_args.name=run",
        "--trainer.default_root_dir=.", *extra,
    ]  # fmt: skip
    print("$", shlex.join(command), f"  (in {folder})", flush=True)
    started = time.perf_counter()
    with open(folder / "log.txt", "w", encoding="utf-8") as log:
        code = subprocess.call(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"run failed (exit {code}); see {folder / 'log.txt'}")
    versions = sorted((folder / "runs" / "run").glob("version_*"))
    return versions[-1] / "metrics.csv", seconds


def summary(path: Path, samples_per_step: int) -> dict:
    rows = list(csv.DictReader(open(path, encoding="utf-8")))
    steps = [r for r in rows if r.get("reward/total")]

    def mean(key: str, skip_first: bool = False) -> float:
        part = steps[1:] if skip_first else steps
        values = [float(r[key]) for r in part if r.get(key, "") != ""]
        return sum(values) / len(values) if values else float("nan")

    # a step's wall time is logged with the next step; the first one includes starting vLLM
    times = [float(r["time/step_s"]) for r in steps if r.get("time/step_s", "") != ""][1:]
    step_s = sum(times) / len(times) if times else float("nan")
    val = [float(r["val/em"]) for r in rows if r.get("val/em", "") != ""]
    return {
        "step_s": step_s,
        "samples_s": samples_per_step / step_s,
        "rollout_s": mean("time/rollout_s", True),
        "worker_s": mean("time/worker_rollout_s", True),
        "update_s": mean("time/update_s", True),
        "push_s": mean("time/weight_push_s", True)  # a worker run's push, else the engine's sync
        if any(r.get("time/weight_push_s") for r in steps)
        else mean("time/weight_sync_s", True),
        "staleness": mean("rollout/staleness_mean", True),
        "rewards": [round(float(r["reward/total"]), 3) for r in steps],
        "val_em": val[-1] if val else float("nan"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Other options go to every lit-rag fit, e.g. --trainer.precision=32-true.",
    )
    parser.add_argument("--config", help="the recipe (required without --quick)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--samples-per-step", type=int, default=None,
                        help="prompts x group size (default: read from the recipe)")  # fmt: skip
    parser.add_argument("--out", default="runs/rollout_workers")
    parser.add_argument(
        "--summarize", action="store_true", help="print the table of the runs in --out, run none"
    )
    args, overrides = _bench.parse_args(parser, QUICK, argv, known=True)
    if not args.config:
        parser.error("--config is required (or --quick: recipes/quickstart.yaml)")
    overrides = (QUICK_OVERRIDES if args.quick else []) + overrides
    import yaml

    recipe = yaml.safe_load(open(args.config, encoding="utf-8"))
    batch = _override(overrides, "data.batch_size") or recipe["data"]["batch_size"]
    group = _override(overrides, "model.group_size") or recipe["model"].get("group_size", 4)
    per_step = args.samples_per_step or int(batch) * int(group)
    out = Path(args.out) / Path(args.config).stem
    modes = [("colocated", [])] + [
        (f"workers k={k}", ["--model.rollout.workers=1", f"--model.rollout.max_staleness={k}"])
        for k in args.staleness
    ]
    results = []
    for name, extra in modes:
        folder = out / name.replace(" ", "_")
        if args.summarize:
            metrics, seconds = sorted(folder.glob("runs/run/version_*"))[-1] / "metrics.csv", 0.0
        else:
            metrics, seconds = run(args.config, args.steps, folder, [*overrides, *extra])
        results.append((name, summary(metrics, per_step), seconds, metrics.parent))
    print(
        f"\n{args.config}, {args.steps} steps of {per_step} samples; precision "
        f"{_precision(recipe, overrides)}"
        + (f"; overrides {shlex.join(overrides)}" if overrides else "")
    )
    head = ("mode", "step s", "samples/s", "ratio", "rollout wait s", "worker s", "update s",
            "push/sync s", "staleness", "val EM", "wall s")  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    base = results[0][1]["step_s"]
    for name, s, seconds, _ in results:
        cells = [name, f"{s['step_s']:.2f}", f"{s['samples_s']:.3f}", f"{base / s['step_s']:.2f}x",
                 f"{s['rollout_s']:.2f}", f"{s['worker_s']:.2f}", f"{s['update_s']:.2f}",
                 f"{s['push_s']:.2f}", f"{s['staleness']:.2f}", f"{s['val_em']:.3f}",
                 f"{seconds:.0f}" if seconds else "-"]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    print("\nreward per step (same seed):")
    for name, s, _, folder in results:
        print(f"  {name:<12} {s['rewards']}   ({folder})")
    _bench.print_provenance(__file__, argv)


if __name__ == "__main__":
    main()
