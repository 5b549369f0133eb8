"""A :class:`~lit_rag.trainer.policy.PolicyModule`'s rollouts through rollout workers
(``model.rollout.workers``; docs/DESIGN.md, "Rollout workers"): :class:`RolloutScheduler`
decides, step by step, which batches the rank's
:class:`~lit_rag.rollout.workers.pool.WorkerPool` rolls out, bounds the staleness of what comes
back and pushes the weights after each update; :func:`rollout_scheduler` builds it for a module.

One training step, staleness bound k and ``prefetch`` p (default k):

1. the batch Lightning hands the step is looked up among the jobs already sent (a batch sent
   ahead by an earlier step); if it is not there it is sent now;
2. the next p batches of the epoch (:meth:`~lit_rag.data.datamodule.ResumableLoader.batch_at`)
   are sent, if not yet: the workers roll them out while this step waits and updates;
3. the step waits for its batch, then bounds staleness: a group with a sample whose oldest
   segment is more than k versions behind is regenerated from the current weights or dropped
   (``stale``), counted either way;
4. after the update the new weights are pushed (policy version + 1).

With p = 0 and one worker the worker samples from this process's random stream (states sent
with the job and taken back), so a run gives the colocated engine's samples and weights.

Faults: a worker that dies or is stuck is restarted by
:class:`~lit_rag.rollout.workers.pool.WorkerPool`; when the run must stop instead, every rank
learns it at the same point (one ``any_rank``: after the step's rollout and staleness bound, or
in a rollout every rank makes together: validation, DAPO's refill), saves
``worker-fault-step=N.ckpt`` (the weights of the last update: no update is lost; the batch in
flight is not trained) and stops. A fault during a push (after an update, or of a checkpoint's
weights) is kept for the next of those points.
"""

from __future__ import annotations

import atexit
import weakref
from pathlib import Path

import torch

from lit_rag.data.datamodule import ResumableLoader
from lit_rag.errors import InputError
from lit_rag.rollout.base import Placement, SamplingParams
from lit_rag.rollout.weights import policy_path
from lit_rag.rollout.workers.pool import RolloutSettings, WorkerFault, WorkerPool, payload
from lit_rag.trainer.ranks import any_rank
from lit_rag.types import Example, Trajectory

#: the truncated importance-sampling cap a run with stale samples gets when its recipe sets none
DEFAULT_IS_CAP = 2.0


def rollout_scheduler(module, settings: RolloutSettings) -> RolloutScheduler | None:
    """The module's rollouts through rollout workers, or None where the engine runs in the
    training process; one line when the recipe's engine cannot run in a worker."""
    if settings.workers == 0:
        return None
    engine = module.engine
    if not engine.serves_pushed_weights:
        raise InputError(
            f"model rollout workers need an engine that runs in a worker process; the engine "
            f"'{type(engine).__name__}' does not; allowed: vllm (or model.rollout.workers: 0)"
        )
    if engine.lora_sync != "merge":
        raise InputError(
            "model rollout workers receive merged weights: engine lora_sync must be merge"
        )
    algorithm = module.algorithm
    if settings.ahead and not algorithm.corrects_stale_samples:
        # DPO's loss reads no sampling log-probs: an older sample is older preference data
        print(
            f"lit-rag: model.rollout lets samples be up to {settings.ahead} version(s) old and "
            f"algorithm {type(algorithm).__name__} has no importance-sampling correction: it "
            "trains on them uncorrected (max_staleness: 0 keeps them on-policy)",
            flush=True,
        )
    if settings.ahead and algorithm.accept_stale_samples(DEFAULT_IS_CAP):
        # samples from older weights are corrected by truncated importance sampling with the
        # log-probs the worker recorded; without a cap the loss would treat them as on-policy
        print(
            f"lit-rag: model.rollout lets samples be {settings.ahead} version(s) old: "
            f"algorithm importance_sampling_cap set to {DEFAULT_IS_CAP:g} (verl's); set it "
            "in the recipe to choose another",
            flush=True,
        )
    return RolloutScheduler(module, settings)


def _key(examples: list[Example]) -> tuple[str, ...]:
    return tuple(e.id for e in examples)


class RolloutScheduler:
    """Rollouts of a policy module through its rank's workers."""

    def __init__(self, module, settings: RolloutSettings) -> None:
        self.module, self.settings = module, settings
        self.workers = WorkerPool(settings, payload(module.environment, module.engine))
        self._ahead: dict[tuple[str, ...], list[int]] = {}  # a batch sent ahead -> its jobs
        self.fault: str | None = None
        self.stopped = False  # every rank agreed to stop (checkpoint saved)
        weakref.finalize(self, self.workers.close)
        atexit.register(self.workers.close)

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Start the workers (first use; every rank): they get the current weights."""
        if self.workers.started:
            return
        module = self.module
        trainer = module.trainer if module._trainer is not None else None
        placement, device = Placement(), next(module.model.parameters()).device
        if trainer is not None:
            placement = Placement(
                trainer.global_rank, trainer.world_size, trainer.local_rank, trainer.num_devices
            )
            device = trainer.strategy.root_device  # a parameter's may be the CPU (offload)
        seed = module.engine.seed
        self.seed = int(torch.initial_seed() % 2**31 if seed is None else seed)
        path = module.engine.model_path or policy_path(module.model)
        self.workers.start(module.model, module.tokenizer, path, placement, self.seed, device)

    def close(self) -> None:
        self._ahead.clear()
        self.workers.close()

    # ---- rollouts ------------------------------------------------------------------------
    def rollout(
        self, examples: list[Example], params: SamplingParams, group_size: int | None
    ) -> list[Trajectory] | None:
        """A rollout from the current weights, waited for, that every rank makes together
        (validation, DAPO's refill): None when the run stops (a worker fault on any rank;
        every rank agrees here, and the checkpoint is saved)."""
        if self.stopped:
            return None
        trajectories = None
        try:
            if self.fault is None:
                trajectories = self._rollout(examples, params, group_size)
        except WorkerFault as exc:
            self.fault = str(exc)
        return None if self._must_stop() else trajectories

    def _rollout(
        self, examples: list[Example], params: SamplingParams, group_size: int | None
    ) -> list[Trajectory]:
        """A rollout from the current weights, waited for; raises ``WorkerFault``."""
        self.start()
        ids = self.workers.submit(examples, group_size, params, self.seed)
        return self.workers.take(ids).trajectories

    def train_batch(
        self, batch: list[Example], batch_idx: int, group_size: int, params: SamplingParams
    ) -> tuple[list[Trajectory] | None, dict[str, float]]:
        """The step's trajectories within the staleness bound (None when the run must stop)
        and what they cost."""
        metrics: dict[str, float] = {}
        trajectories: list[Trajectory] = []
        try:
            if self.fault is None and not self.stopped:
                result = self.workers.take(self._submit(batch, batch_idx, group_size, params))
                metrics["time/wait_s"] = result.wait_seconds
                metrics["time/worker_rollout_s"] = result.worker_seconds
                # may regenerate on this rank only: its fault is agreed on below, with the rest
                trajectories, bounded = self.bound(result.trajectories, group_size, params)
                metrics.update(bounded)
        except WorkerFault as exc:
            self.fault = str(exc)
        if self.stopped or self._must_stop():
            return None, metrics
        metrics["rollout/worker_restarts"] = float(self.workers.total_restarts)
        metrics["policy/version"] = float(self.workers.version)
        return trajectories, metrics

    def _submit(
        self, batch: list[Example], batch_idx: int, group_size: int, params: SamplingParams
    ) -> list[int]:
        """The jobs of the step's batch (sent ahead by an earlier step, or now), and the next
        ``prefetch`` batches sent ahead."""
        self.start()
        ids = self._ahead.pop(_key(batch), None)
        if ids is None:  # not sent ahead: any batch that was will not come in order
            for other in self._ahead.values():
                self.workers.forget(other)
            self._ahead.clear()
            share = self.settings.ahead == 0
            ids = self.workers.submit(batch, group_size, params, self.seed, share)
        self._send_ahead(batch_idx, group_size, params)
        return ids

    def _send_ahead(self, batch_idx: int, group_size: int, params: SamplingParams) -> None:
        for upcoming in self._upcoming(batch_idx):
            if _key(upcoming) not in self._ahead:
                self._ahead[_key(upcoming)] = self.workers.submit(
                    upcoming, group_size, params, self.seed
                )

    def _upcoming(self, batch_idx: int) -> list[list[Example]]:
        """The next ``prefetch`` batches of this epoch, as the loader will hand them."""
        module = self.module
        loader = module.trainer.train_dataloader if module._trainer is not None else None
        if self.settings.ahead == 0 or not isinstance(loader, ResumableLoader):
            return []
        wanted = range(batch_idx + 1, batch_idx + 1 + self.settings.ahead)
        return [b for i in wanted if (b := loader.batch_at(loader.epoch, i)) is not None]

    def bound(
        self, trajectories: list[Trajectory], group_size: int, params: SamplingParams
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """Groups within the staleness bound; the others regenerated or dropped. The metrics:
        groups found too old, and the staleness of the samples the step trains on."""
        limit = self.settings.max_staleness
        ages = self.ages(trajectories)
        stale = sorted({t.group for t, age in zip(trajectories, ages, strict=True) if age > limit})
        metrics = {"rollout/stale_groups": float(len(stale))}
        metrics["rollout/stale_dropped"] = metrics["rollout/stale_regenerated"] = 0.0
        groups = sorted({t.group for t in trajectories})
        if stale and self.settings.stale == "drop" and len(stale) < len(groups):
            trajectories = [t for t in trajectories if t.group not in stale]
            renumber = {g: i for i, g in enumerate(g for g in groups if g not in stale)}
            for t in trajectories:
                t.group = renumber[t.group]
            metrics["rollout/stale_dropped"] = float(len(stale))
        elif stale:  # regenerate (or drop would leave nothing)
            examples = [next(t.example for t in trajectories if t.group == g) for g in stale]
            fresh = self._rollout(examples, params, group_size)
            for t in fresh:
                t.group = stale[t.group]
            trajectories = [t for t in trajectories if t.group not in stale] + fresh
            trajectories.sort(key=lambda t: t.group)
            metrics["rollout/stale_regenerated"] = float(len(stale))
        ages = self.ages(trajectories)
        for t, age in zip(trajectories, ages, strict=True):
            t.staleness = age  # the engine's mismatch is measured on the fresh ones only
        metrics["rollout/staleness_mean"] = sum(ages) / max(len(ages), 1)
        metrics["rollout/staleness_max"] = float(max(ages, default=0))
        return trajectories, metrics

    def ages(self, trajectories: list[Trajectory]) -> list[int]:
        """Each sample's staleness: the trainer's policy version less its oldest segment's."""
        version = self.workers.version
        return [version - min((v[0] for v in t.versions), default=version) for t in trajectories]

    # ---- weights -------------------------------------------------------------------------
    def after_update(self, moved: bool) -> dict[str, float]:
        """Push the weights an optimizer step moved (policy version + 1)."""
        if not moved or self.fault is not None or not self.workers.started:
            return {}
        try:
            seconds = self.workers.push(self.workers.version + 1)
        except WorkerFault as exc:
            self.fault = str(exc)  # the next step stops the run, every rank together
            return {}
        return {"time/weight_push_s": seconds}

    def resync(self) -> None:
        """Weights a checkpoint (or a callback) just loaded: pushed if the workers already run.
        A fault is kept for the next point where every rank agrees to stop."""
        if not self.workers.started or self.fault is not None:
            return
        try:
            self.workers.push(self.workers.version)
        except WorkerFault as exc:
            self.fault = str(exc)

    # ---- faults --------------------------------------------------------------------------
    def _must_stop(self) -> bool:
        """Whether a worker fault on any rank stops the run (a collective: every rank calls it
        at the same point); if so the checkpoint is saved, once."""
        module = self.module
        if not any_rank(module, self.fault is not None):
            return False
        self.stopped = True
        trainer = module.trainer
        callback = trainer.checkpoint_callback
        folder = Path(
            getattr(callback, "dirpath", None) or Path(trainer.default_root_dir, "checkpoints")
        )
        path = folder / f"worker-fault-step={trainer.global_step}.ckpt"
        trainer.save_checkpoint(path)  # every rank: a collective under FSDP / DeepSpeed
        if self.fault is not None or trainer.is_global_zero:  # the rank whose worker failed
            print(
                f"lit-rag: {self.fault or 'a rollout worker of another rank failed'}; "
                f"saved {path}; stopping (model.rollout.on_fault: {self.settings.on_fault})",
                flush=True,
            )
        trainer.should_stop = True
        return True
