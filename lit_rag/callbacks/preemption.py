"""``PreemptionCheckpoint``: a SIGTERM ends a run at the next step boundary with a checkpoint.

SLURM (before ``--time`` runs out, or on preemption) and Kubernetes send SIGTERM and wait a
grace period before SIGKILL. Lightning's signal connector records the signal and raises
``SIGTERMException`` once the current training batch is done (optimizer step and logging
included); this callback then saves a checkpoint there, so the run loses nothing and
``lit-rag fit ... --ckpt_path <it>`` continues it as if it had not stopped. ``lit-rag fit``
adds it to every run; a recipe may list it to choose the folder.

Several processes stop together. Lightning's own SIGTERM handler broadcasts from inside the
signal handler, a collective at whatever point the signal interrupts (it can pair with another
rank's gradient all-reduce), and each rank then stops on its own flag, so a rank that got no
signal trains on alone. Here the handler only records the signal (and, on the launching rank,
forwards it to the ranks Lightning started, as Lightning does); at the end of every training
step all ranks agree whether any rank got one (one boolean all-reduce), and stop at that same
step boundary, where every rank takes part in writing one ``last.ckpt``.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException


def checkpoint_dir(trainer, log_dir: str | None = None) -> Path:
    """Where a run's checkpoints go: the first ``ModelCheckpoint``'s folder, else
    ``<log dir>/checkpoints`` (where Lightning's default ``ModelCheckpoint`` writes).

    Without ``log_dir`` it reads ``Trainer.log_dir``, a collective (a broadcast from rank zero):
    every rank must call it then, never rank zero alone."""
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return Path(callback.dirpath)
    if log_dir is None:
        log_dir = trainer.log_dir
    return Path(log_dir or trainer.default_root_dir) / "checkpoints"


class PreemptionCheckpoint(Callback):
    """Save ``last.ckpt`` when a SIGTERM stops training.

    Args:
        dirpath: Folder of the checkpoint; default: the run's (:func:`checkpoint_dir`).
        filename: The checkpoint's file name.
    """

    def __init__(self, dirpath: str | None = None, filename: str = "last.ckpt") -> None:
        self.dirpath, self.filename = dirpath, filename
        self.saved: Path | None = None
        self._signalled = False  # this process got a SIGTERM; the ranks have not agreed yet

    def setup(self, trainer, pl_module, stage: str) -> None:
        # Lightning registers ``_sigterm_notifier_fn`` as the SIGTERM handler when the fit
        # starts (after this hook); the instance attribute shadows its method, collective-free
        self._signalled = False
        if stage == "fit":
            trainer._signal_connector._sigterm_notifier_fn = self._record(trainer)

    def _record(self, trainer):
        def notify(signum, frame) -> None:
            if not self._signalled:
                launcher = trainer.strategy.launcher
                if launcher is not None:  # rank 0 of Lightning's launcher: its other ranks
                    launcher.kill(signum)
            self._signalled = True
            if trainer.world_size == 1:  # nobody to agree with: stop after this batch
                trainer._signal_connector.received_sigterm = True

        return notify

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        stop = self._signalled
        if trainer.world_size > 1:  # every rank, every step: did any rank get a SIGTERM?
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop:  # Lightning raises SIGTERMException after this batch, on every rank alike
            trainer._signal_connector.received_sigterm = True

    def path(self, trainer) -> Path:
        folder = Path(self.dirpath) if self.dirpath is not None else checkpoint_dir(trainer)
        return folder / self.filename

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or not trainer.training:
            return
        path = self.path(trainer)
        trainer.save_checkpoint(path)  # every rank calls it (sharded strategies gather)
        self.saved = path
        ranks = f" (all {trainer.world_size} ranks)" if trainer.world_size > 1 else ""
        rank_zero_info(
            f"lit-rag: SIGTERM: saved {path} at step {trainer.global_step}{ranks}; "
            f"continue with --ckpt_path {path}"
        )
