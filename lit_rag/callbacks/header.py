"""``RunHeader``: a run's console opens with what runs and where it writes, and ends with the
command that reports it.

    lit-rag fit: SmolLM2-135M-Instruct.Q4_1.gguf (LoRA r=16), single_turn + arena + grpo, engine
      vllm, 1 process (single device), 24 steps of 4 prompts x 4 samples  (one line)
      logs: runs/quickstart/version_0   checkpoints: runs/quickstart/version_0/checkpoints
    ...
    lit-rag report runs/quickstart/version_0   (plots and sample rollouts)

``lit-rag fit`` adds it to every run (rank zero prints); it reads only what the run already holds.
``Trainer.log_dir`` is a collective (it broadcasts rank zero's folder), so every rank reads it and
only the printing is rank zero's: asked on rank zero alone, it waits forever for the others.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Callback

from lit_rag import registry
from lit_rag.callbacks.preemption import checkpoint_dir


def _name(obj: object, kind: str) -> str:
    """The registered name of a plugin object (``arena``), else its class name; read from the
    registry's entry-point targets, nothing is imported."""
    cls = type(obj)
    target = f"{cls.__module__}:{cls.__qualname__}"
    return next(
        (name for name, info in registry.available(kind).items() if info.target == target),
        cls.__name__,
    )


class RunHeader(Callback):
    """Prints the run's header at the start of ``fit`` and the report command at its end."""

    def __init__(self) -> None:
        self._log_dir: str | None = None

    @staticmethod
    def lines(trainer, pl_module, log_dir: str | None = None) -> list[str]:
        """The header; ``log_dir`` as every rank read it (asked here when not given: a
        collective, so then every rank must call this)."""
        policy = getattr(pl_module, "policy_config", None)
        if policy is None:  # another LightningModule (the reward-model recipe): no header
            return []
        model = Path(str(policy.path)).name if policy.path else "tiny random model"
        if policy.lora is not None:
            model += f" (LoRA r={policy.lora.r})"
        method = " + ".join(
            _name(getattr(pl_module, kind), kind) for kind in ("environment", "reward", "algorithm")
        )
        engine = _name(pl_module.engine, "engine")
        settings = getattr(pl_module, "rollout_settings", None)
        if settings is not None and settings.workers:
            workers = f"{settings.workers} rollout worker" + ("s" if settings.workers > 1 else "")
            engine += f" in {workers} (max_staleness {settings.max_staleness})"
        names = {
            "SingleDeviceStrategy": "single device",
            "DDPStrategy": "ddp",
            "FSDPStrategy": "fsdp",
            "DeepSpeedStrategy": "deepspeed",
        }
        strategy = next(  # lit-rag's CPU FSDP and DeepSpeed are subclasses: the base names them
            (names[c.__name__] for c in type(trainer.strategy).__mro__ if c.__name__ in names),
            type(trainer.strategy).__name__,
        )
        processes = f"{trainer.world_size} process" + ("es" if trainer.world_size > 1 else "")
        if trainer.max_steps and trainer.max_steps > 0:
            length = f"{trainer.max_steps} step" + ("s" if trainer.max_steps > 1 else "")
        else:
            length = f"{trainer.max_epochs} epochs"
        batch = (
            getattr(trainer.datamodule, "batch_size", None)
            if trainer.datamodule is not None
            else None
        )
        shape = f" of {batch} prompts x {pl_module.group_size} samples" if batch else ""
        logs = (log_dir if log_dir is not None else trainer.log_dir) or trainer.default_root_dir
        first = (
            f"lit-rag fit: {model}, {method}, engine {engine}, "
            f"{processes} ({strategy}), {length}{shape}, precision {trainer.precision}"
        )
        checkpoints = checkpoint_dir(trainer, logs)
        return [first, f"  logs: {logs}   checkpoints: {checkpoints}"]

    def on_fit_start(self, trainer, pl_module) -> None:
        self._log_dir = trainer.log_dir  # every rank: a collective
        lines = self.lines(trainer, pl_module, self._log_dir)
        if trainer.is_global_zero:
            for line in lines:
                print(line, flush=True)

    def on_fit_end(self, trainer, pl_module) -> None:
        log_dir = self._log_dir  # read at the start by every rank; no collective at the end
        if trainer.is_global_zero and log_dir and (Path(log_dir) / "metrics.csv").is_file():
            print(f"lit-rag report {log_dir}   (plots and sample rollouts)", flush=True)
