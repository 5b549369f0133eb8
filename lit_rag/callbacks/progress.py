"""``RunProgressBar``: Lightning's rich progress bar, described by what ends the run, and one
line per optimizer step.

A lit-rag run is usually bounded by ``trainer.max_steps`` with ``max_epochs`` left at -1, and
Lightning's rich bar then reads "Epoch 0/-2" (it prints ``max_epochs - 1``). This bar says
"Epoch 0 · 24 steps" there and keeps Lightning's text otherwise. Above the bar, each step leaves
one line: reward (and its components), KL, and where the step's time went::

    step 3/24 · reward 1.41 (format 0.91, relevance 0.50, accuracy 0.00) · kl 0.0021
        · rollout 3.1 s · reward 0.02 s · update 8.5 s · sync 0.35 s

``lit-rag`` puts it in place of Lightning's default rich bar; a recipe's own progress bar is
left alone.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import RichProgressBar

#: the time split of a step line: metric -> label (the step's phases that take the time,
#: lit_rag.trainer.phases.PHASES)
TIMES = (
    ("time/rollout_s", "rollout"),
    ("time/reward_s", "reward"),
    ("time/update_s", "update"),
    ("time/sync_s", "sync"),
)


class RunProgressBar(RichProgressBar):
    """Lightning's ``RichProgressBar`` without the "/-2" of a run that ``max_steps`` ends."""

    def _get_train_description(self, current_epoch: int) -> str:
        trainer = self.trainer
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        text = f"Epoch {current_epoch}"
        if trainer.max_steps is not None and trainer.max_steps > 0:
            text += f" · {trainer.max_steps} steps"
        return text

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        line = step_line(trainer.global_step, trainer.max_steps, trainer.callback_metrics)
        if line and trainer.is_global_zero and not self.is_disabled:
            if self._console is not None:  # above the live bar, never wrapped
                self._console.print(line, markup=False, highlight=False, soft_wrap=True)
            else:
                print(line)


def step_line(step: int, max_steps: int | None, metrics: dict[str, Any]) -> str:
    """One step's line from the metrics it logged; "" when it logged no reward."""

    def value(key: str) -> float | None:
        item = metrics.get(key)
        return None if item is None else float(item)

    total = value("reward/total")
    if total is None:
        return ""
    parts = [f"step {step}/{max_steps}" if max_steps and max_steps > 0 else f"step {step}"]
    components = [
        f"{k.removeprefix('reward/')} {float(v):.2f}"
        for k, v in sorted(metrics.items())
        if k.startswith("reward/") and k != "reward/total" and k.count("/") == 1
    ]
    parts.append(f"reward {total:.2f}" + (f" ({', '.join(components)})" if components else ""))
    kl = value("train/kl")
    if kl is not None:
        parts.append(f"kl {kl:.4f}")
    for key, label in TIMES:
        seconds = value(key)
        if seconds is not None:
            parts.append(f"{label} {seconds:.2f} s" if seconds < 1 else f"{label} {seconds:.1f} s")
    return " · ".join(parts)
