"""``PreemptionCheckpoint``: a SIGTERM ends a run at the next step boundary with a checkpoint.

SLURM (before ``--time`` runs out, or on preemption) and Kubernetes send SIGTERM and wait a
grace period before SIGKILL. Lightning's signal connector records the signal and raises
``SIGTERMException`` once the current training batch is done (optimizer step and logging
included), on every rank; this callback then saves a checkpoint there, so the run loses nothing
and ``lit-rag fit ... --ckpt_path <it>`` continues it as if it had not stopped. ``lit-rag fit``
adds it to every run; a recipe may list it to choose the folder.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException


def checkpoint_dir(trainer) -> Path:
    """Where a run's checkpoints go: the first ``ModelCheckpoint``'s folder, else
    ``<log dir>/checkpoints`` (where Lightning's default ``ModelCheckpoint`` writes)."""
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return Path(callback.dirpath)
    return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints"


class PreemptionCheckpoint(Callback):
    """Save ``last.ckpt`` when a SIGTERM stops training.

    Args:
        dirpath: Folder of the checkpoint; default: the run's (:func:`checkpoint_dir`).
        filename: The checkpoint's file name.
    """

    def __init__(self, dirpath: str | None = None, filename: str = "last.ckpt") -> None:
        self.dirpath, self.filename = dirpath, filename
        self.saved: Path | None = None

    def path(self, trainer) -> Path:
        folder = Path(self.dirpath) if self.dirpath is not None else checkpoint_dir(trainer)
        return folder / self.filename

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or not trainer.training:
            return
        path = self.path(trainer)
        trainer.save_checkpoint(path)  # every rank calls it (sharded strategies gather)
        self.saved = path
        rank_zero_info(
            f"lit-rag: SIGTERM: saved {path} at step {trainer.global_step}; "
            f"continue with --ckpt_path {path}"
        )
