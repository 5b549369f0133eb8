"""``HealthMonitor``: the detectors of :mod:`lit_rag.health.detectors` run on every training step.

A detector that fires prints one line (what it saw, what helped others) and is written, with
its step (as the console counts) and batch (as ``metrics.csv`` counts, from 0), to
``<log_dir>/health.jsonl``, which ``lit-rag report`` marks on its health page. It
never stops the run unless the recipe names it in ``stop_on``; then the run saves
``<log_dir>/checkpoints/health-stop-step=N.ckpt`` first and stops.

Several processes: every rank gathers the watched metrics of every rank (one ``all_gather`` a
step, called by every rank) and runs the detectors on their mean, so all ranks see the same
values and take the same decision at the same step; only rank zero prints and writes.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from lit_rag.contracts.step import StepOutput
from lit_rag.health.detectors import Detector, detectors


class HealthMonitor(Callback):
    """Runs the run-health detectors every step; on in every recipe (the CLI adds one with
    the defaults where a recipe names none).

    Example (a recipe's ``trainer.callbacks``)::

        - class_path: lit_rag.callbacks.HealthMonitor
          init_args:
            thresholds: {example_copying: 0.3}   # defaults: lit_rag.health.detectors.DEFAULTS
            disabled: [passage_copying]
            stop_on: [reward_collapse]

    Args:
        thresholds: Detector name -> threshold, in place of its default.
        disabled: Detectors turned off.
        stop_on: Detectors that save a checkpoint and stop the run when they fire.
    """

    def __init__(
        self,
        thresholds: dict[str, float] | None = None,
        disabled: list[str] | None = None,
        stop_on: list[str] | None = None,
    ) -> None:
        self.thresholds, self.disabled = dict(thresholds or {}), disabled or []
        self.stop_on = stop_on or []
        self.detectors: list[Detector] = detectors(self.thresholds, self.disabled)
        names = {d.name for d in self.detectors}
        missing = sorted(set(self.stop_on) - names)
        if missing:
            raise ValueError(
                f"health stop_on names {', '.join(missing)}, which is not a detector that is on; "
                f"on: {', '.join(sorted(names))}"
            )
        self.marks: list[dict] = []
        #: training batches seen (a mark's ``batch`` counts as metrics.csv's ``step`` does)
        self.batches = 0
        self._folder: Path | None = None

    @property
    def metrics(self) -> list[str]:
        return sorted({d.metric for d in self.detectors})

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Trainer.log_dir is a collective (a broadcast): every rank reads it here
        self._folder = Path(trainer.log_dir or trainer.default_root_dir)

    def global_values(self, pl_module: LightningModule, step: StepOutput | None) -> list:
        """The watched metrics' means over the ranks that logged them (a collective: every rank
        calls it); None for a metric no rank logged."""
        local = {} if step is None else step.metrics
        if not self.metrics:  # every detector off
            return []
        rows = []
        for name in self.metrics:
            value = local.get(name)
            present = value is not None
            rows.append([float(value) if present else 0.0, float(present)])
        gathered = pl_module.all_gather(torch.tensor(rows, device=pl_module.device))
        gathered = gathered.reshape(-1, len(rows), 2)  # [world, metrics, 2]
        counts = gathered[..., 1].sum(0)
        sums = (gathered[..., 0] * gathered[..., 1]).sum(0)
        return [float(s / c) if c > 0 else None for s, c in zip(sums, counts, strict=True)]

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        values = dict(
            zip(self.metrics, self.global_values(pl_module, StepOutput.of(outputs)), strict=True)
        )
        self.batches += 1
        stop = []
        for detector in self.detectors:
            line = detector.update(values.get(detector.metric))
            if line is None:
                continue
            step = trainer.global_step
            mark = {"step": step, "batch": self.batches - 1, "detector": detector.name}
            mark["metric"] = detector.metric
            mark.update(value=values[detector.metric], line=line)
            self.marks.append(mark)
            if trainer.is_global_zero:
                say(trainer, f"lit-rag health: step {step}: {line}")
                self._write(mark)
            if detector.name in self.stop_on:
                stop.append(detector.name)
        if stop:
            folder = self._folder or Path(trainer.default_root_dir)
            path = folder / "checkpoints" / f"health-stop-step={trainer.global_step}.ckpt"
            trainer.save_checkpoint(path)  # every rank: a collective under FSDP / DeepSpeed
            if trainer.is_global_zero:
                say(
                    trainer,
                    f"lit-rag health: stopping at step {trainer.global_step} "
                    f"({', '.join(stop)} in stop_on); saved {path}",
                )
            trainer.should_stop = True

    def _write(self, mark: dict) -> None:
        folder = self._folder
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in mark.items()}
        with (folder / "health.jsonl").open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")

    def state_dict(self) -> dict:
        """Each detector's history (plain numbers): a resumed run continues its windows."""
        return {
            "detectors": {
                d.name: {
                    "history": list(d.history),
                    "start": list(d.start),
                    "best": d.best,
                    "held": d.held,
                    "clear": d.clear,
                    "fired": d.fired,
                }
                for d in self.detectors
            },
            "marks": list(self.marks),
            "batches": self.batches,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("detectors", {})
        for d in self.detectors:
            row = saved.get(d.name, {})
            d.history = [float(v) for v in row.get("history", [])]
            d.start = [float(v) for v in row.get("start", d.history[: d.window])]
            best = row.get("best")
            d.best = None if best is None else float(best)
            d.held, d.clear = int(row.get("held", 0)), int(row.get("clear", 0))
            d.fired = bool(row.get("fired", False))
        self.marks = list(state_dict.get("marks", []))
        self.batches = int(state_dict.get("batches", 0))


def say(trainer: Trainer, line: str) -> None:
    """One line above the run's progress bar (its console), else on stderr."""
    for callback in trainer.callbacks:
        console = getattr(callback, "_console", None)
        if console is not None and not getattr(callback, "is_disabled", True):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
            return
    print(line, file=sys.stderr, flush=True)
