"""``RunProgressBar``: Lightning's rich progress bar, described by what ends the run.

A lit-rag run is usually bounded by ``trainer.max_steps`` with ``max_epochs`` left at -1, and
Lightning's rich bar then reads "Epoch 0/-2" (it prints ``max_epochs - 1``). This bar says
"Epoch 0 · 24 steps" there and keeps Lightning's text otherwise. ``lit-rag`` puts it in place of
Lightning's default rich bar; a recipe's own progress bar is left alone.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar


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
