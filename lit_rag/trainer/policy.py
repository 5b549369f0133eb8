"""``PolicyModule``: one RL step of the GRPO family as a LightningModule
(docs/DESIGN.md, steps 1-6).

The module owns the policy (and its reference) and reads as the step does: rollout, reward,
prepare, update, log. Each job has its own home: the update loop with its micro-batches and
idle passes (:mod:`~lit_rag.trainer.update`), DAPO's refill (:mod:`~lit_rag.trainer.refill`),
the optimizer settings (:mod:`~lit_rag.trainer.optimizer`), the checkpoint's state
(:mod:`~lit_rag.trainer.state`), cross-rank agreement and logging
(:mod:`~lit_rag.trainer.ranks`); the environment, reward, algorithm and rollout engine are
plugins chosen in the recipe.
"""

from __future__ import annotations

import copy
import functools
import time

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_warn

from lit_rag import registry
from lit_rag.checkpoints.provenance import BASE_ATTRIBUTE
from lit_rag.contracts.algorithm import Algorithm, Prepared
from lit_rag.contracts.environment import Environment
from lit_rag.contracts.reward import Reward
from lit_rag.contracts.step import StepOutput
from lit_rag.health.signals import health_metrics
from lit_rag.metrics.qa import ExactMatch, TokenF1
from lit_rag.models.facts import has_adapters
from lit_rag.models.loading import ModelConfig, load_model, load_tokenizer
from lit_rag.models.precision import PURE_LOW_PRECISION_LINE, hold_masters, master_dtype
from lit_rag.models.strategies import fsdp_wrap, is_fsdp, outside_zero_init, zero3_reference
from lit_rag.rollout.base import Placement, RolloutEngine, SamplingParams
from lit_rag.rollout.workers.pool import RolloutSettings
from lit_rag.rollout.workers.scheduler import rollout_scheduler
from lit_rag.text import PUNCTUATION_MODES, exact_match, f1_score
from lit_rag.trainer.failures import (
    OUTAGE_SECONDS,
    Outage,
    check_setting,
    environment_failed,
    first_failure,
    keep_rows,
)
from lit_rag.trainer.flops import peak_tflops, throughput
from lit_rag.trainer.optimizer import OptimizerSettings, SchedulePlan, fused_adamw
from lit_rag.trainer.phases import Phases, memory_metrics, rollout_metrics
from lit_rag.trainer.ranks import Ranks, any_rank, log_metrics
from lit_rag.trainer.refill import Refill, draw_from_pool
from lit_rag.trainer.state import check_model, load_state, save_state
from lit_rag.trainer.update import Update, UpdateSettings
from lit_rag.types import Example, RewardBreakdown, Trajectory

__all__ = ["PolicyModule"]


class PolicyModule(LightningModule):
    """Trains a policy with an RL algorithm on rollouts from an environment.

    Args:
        policy: The model to train (path, dtype, LoRA, quantization).
        environment: Builds prompts and runs episodes.
        reward: Scores trajectories.
        algorithm: Advantages and loss (``grpo``).
        engine: Generates completions (default: ``hf`` on the live policy).
        group_size: Samples per prompt (GRPO's G).
        sampling: Sampling settings for training rollouts.
        val_sampling: Sampling settings for validation (default: greedy, same budget).
        micro_batch_size: Most rows per forward/backward pass (gradient accumulation);
            ``None``: only ``micro_batch_tokens`` bounds a micro-batch.
        micro_batch_tokens: Most token positions per forward/backward pass, counted as packed
            (a shared prompt once) with padding: what bounds the update's activation memory
            (about 1.4 MiB per token for a 135M model under bf16 autocast); a single row
            longer than this runs alone.
        share_prefix: Rows of a micro-batch with the same prompt (a GRPO group) run it once
            (:mod:`lit_rag.models.packing`); exact, so on by default. ``false``: every row
            computes its own prompt.
        optimizer: AdamW, its learning-rate schedule and gradient clipping
            (:class:`~lit_rag.trainer.optimizer.OptimizerSettings`: ``lr``, ``weight_decay``,
            ``betas``, ``warmup_steps``, ``warmup_ratio``, ``lr_schedule``, ``max_grad_norm``).
        logprob_chunk_tokens: Output-head rows computed at once (memory bound).
        answer_punctuation: How validation EM / F1 normalize punctuation: ``delete`` (SQuAD,
            Search-R1) or ``space`` (ARENA's released evaluation).
        rollout: Where rollouts run: ``workers: N`` separate rollout processes, each with its
            own engine, and the staleness they may run ahead with (:class:`RolloutSettings`);
            default: the engine in this process.
        environment_failures: Episodes the environment failed (a dead tool server, a tool
            timeout, a judge with no verdict): ``drop`` (default) takes them out of the loss
            and their group's baseline; ``keep`` trains on them as scored
            (:mod:`~lit_rag.trainer.failures`).
        environment_outage_s: With ``drop``, the run stops with one line once the environment
            failed every episode for 3 steps in a row over at least this many seconds (such
            steps train on nothing).
        peak_tflops: The device's peak TFLOP/s for ``perf/mfu`` (dense bf16, per rank);
            ``None``: read from the GPU's name (H100, H200, A100, L40S), none on a CPU
            (:mod:`~lit_rag.trainer.flops`).
    """

    def __init__(
        self,
        policy: ModelConfig,
        environment: Environment,
        reward: Reward,
        algorithm: Algorithm,
        engine: RolloutEngine | None = None,
        group_size: int = 4,
        sampling: SamplingParams | None = None,
        val_sampling: SamplingParams | None = None,
        micro_batch_size: int | None = None,
        micro_batch_tokens: int | None = 4096,
        share_prefix: bool = True,
        optimizer: OptimizerSettings | None = None,
        logprob_chunk_tokens: int = 512,
        answer_punctuation: str = "delete",
        rollout: RolloutSettings | None = None,
        environment_failures: str = "drop",
        environment_outage_s: float = OUTAGE_SECONDS,
        peak_tflops: float | None = None,
    ) -> None:
        super().__init__()
        self.environment_failures = check_setting(environment_failures)
        self.outage = Outage(seconds=environment_outage_s)
        _check_batching(group_size, micro_batch_size, micro_batch_tokens, logprob_chunk_tokens)
        self.optim = optimizer or OptimizerSettings()
        if answer_punctuation not in PUNCTUATION_MODES:
            raise ValueError(
                f"model answer_punctuation '{answer_punctuation}' is not known; "
                f"allowed: {', '.join(PUNCTUATION_MODES)}"
            )
        self.automatic_optimization = False
        self.policy_config = policy
        self.environment, self.reward, self.algorithm = environment, reward, algorithm
        # the registered ``hf`` engine (core names plugins only through the registry)
        self.engine = engine if engine is not None else registry.load("engine", "hf")()
        self.group_size = group_size
        self.sampling = sampling or SamplingParams()
        self.val_sampling = val_sampling or SamplingParams(
            max_new_tokens=self.sampling.max_new_tokens, temperature=0.0, stop=self.sampling.stop
        )
        self.micro_batch_size, self.micro_batch_tokens = micro_batch_size, micro_batch_tokens
        self.share_prefix = share_prefix
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self.model: torch.nn.Module | None = None
        self.tokenizer = None
        self._reference: list[torch.nn.Module] = []  # a list keeps it out of the module tree
        self.val_em = ExactMatch(punctuation=answer_punctuation)
        self.val_f1 = TokenF1(punctuation=answer_punctuation)
        self.strict_loading = policy.lora is None  # LoRA checkpoints carry adapters only
        self.update: Update | None = None  # built once the policy is loaded
        self.schedule_plan = SchedulePlan()
        self.rollout_settings = rollout or RolloutSettings()
        self.workers = rollout_scheduler(self, self.rollout_settings)
        self._step_started: float | None = None
        if peak_tflops is not None and peak_tflops <= 0:
            raise ValueError(f"model peak_tflops must be > 0, got {peak_tflops}")
        self.peak_tflops = peak_tflops

    # ---- model ---------------------------------------------------------------------------
    def configure_model(self) -> None:
        """Load the policy (deferred, so recipes build without weights)."""
        if self.model is not None:
            return
        if self.workers is None:  # else each rollout worker opens its own (an index, say)
            self.environment.setup()
        self.tokenizer = load_tokenizer(self.policy_config)
        shared = self._loads_once()
        empty = shared and self.trainer.global_rank != 0
        with outside_zero_init():
            # from_pretrained returns eval mode
            self.model = load_model(self.policy_config, empty=empty).train()
        if shared:  # the first rank's fingerprint (a collective): what a checkpoint records
            base = self.trainer.strategy.broadcast(getattr(self.model, BASE_ATTRIBUTE), src=0)
            setattr(self.model, BASE_ATTRIBUTE, base)
        if self.algorithm.needs_reference and not has_adapters(self.model):
            reference = copy.deepcopy(self.model).eval()
            reference.requires_grad_(False)
            self._reference = [reference]
        self._hold_masters()
        if self._trainer is not None and is_fsdp(self.trainer.strategy):
            self.model = fsdp_wrap(self.model, self.trainer.strategy)
            # sharded as the policy is: a whole frozen copy per rank would undo the sharding
            self._reference = [fsdp_wrap(r, self.trainer.strategy) for r in self._reference]
        if self._trainer is not None:  # e.g. a vLLM per rank (or per tensor-parallel group)
            trainer = self.trainer
            placement = Placement(
                rank=trainer.global_rank,
                world_size=trainer.world_size,
                local_rank=trainer.local_rank,
                local_world_size=trainer.num_devices,
            )
            self.engine.place(placement)
            self.algorithm.place(placement)
        self.engine.bind(self.model, self.tokenizer)
        self.update = self._build_update()

    def _loads_once(self) -> bool:
        """Under FSDP on several ranks, every rank but the first builds the policy empty (the
        meta device: no weights read, no host memory) and receives the first rank's weights as
        FSDP wraps it (:func:`~lit_rag.models.strategies.fsdp_wrap`), so a node holds one copy
        of the weights and of the reference while loading, not one per rank (verl's
        ``sync_module_states``)."""
        trainer = self.trainer if self._trainer is not None else None
        return trainer is not None and is_fsdp(trainer.strategy) and trainer.world_size > 1

    def _hold_masters(self) -> None:
        """The trained weights in their master dtype (:func:`~lit_rag.models.precision.
        master_dtype`: fp32 unless the precision is a pure low one), whatever dtype the recipe
        loads (``policy.dtype``: the reference copied above keeps it); AdamW's states follow the
        weights. Under FSDP every weight (a unit's are flattened into one tensor of one dtype);
        FSDP computes in bf16 (:func:`~lit_rag.models.precision.sharded_mixed_precision`)."""
        trainer = self.trainer if self._trainer is not None else None
        precision = trainer.precision if trainer is not None else None
        dtype = master_dtype(precision)
        sharded = trainer is not None and is_fsdp(trainer.strategy)
        hold_masters(self.model, dtype, every_weight=sharded)
        if dtype != torch.float32:
            name = str(dtype).removeprefix("torch.")
            rank_zero_warn(PURE_LOW_PRECISION_LINE.format(precision=precision, dtype=name))

    def _build_update(self) -> Update:
        """The update of this policy, its reference and the ranks as they now are."""
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else None
        settings = UpdateSettings(
            micro_batch_size=self.micro_batch_size,
            micro_batch_tokens=self.micro_batch_tokens,
            share_prefix=self.share_prefix,
            logprob_chunk_tokens=self.logprob_chunk_tokens,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            top_k=self.sampling.top_k,
            max_grad_norm=self.optim.max_grad_norm,
            pad_id=pad if pad is not None else 0,
        )
        reference = self._reference[0] if self._reference else None
        return Update(settings, self.algorithm, self.model, reference, Ranks.of(self), hooks=self)

    def setup(self, stage: str) -> None:
        """DeepSpeed clips gradients inside its engine, from its config: give it ``max_grad_norm``
        (Lightning would take ``trainer.gradient_clip_val``, which manual optimization forbids)."""
        from lightning.pytorch.strategies import DeepSpeedStrategy

        strategy, clip = self.trainer.strategy, self.optim.max_grad_norm
        if isinstance(strategy, DeepSpeedStrategy) and clip is not None:
            strategy.config.setdefault("gradient_clipping", clip)

    # ---- one RL step (docs/DESIGN.md, "Who calls whom") ---------------------------------------
    def training_step(self, batch: list[Example], batch_idx: int) -> dict[str, StepOutput] | None:
        started = time.perf_counter()
        step_s, self._step_started = _since(self._step_started, started), started
        extra: dict[str, float] = {}
        phases = Phases(self.device)
        with phases.time("rollout"):  # steps 1-2
            if self.workers is None:
                trajectories = self.rollout(batch, self.sampling, self.group_size)
            else:  # from rollout workers, up to max_staleness versions old
                trajectories, extra = self.workers.train_batch(
                    batch, batch_idx, self.group_size, self.sampling
                )
        if trajectories is None:  # a worker died and the run stops (checkpoint saved)
            return None
        with phases.time("reward"):  # step 3
            rewards = self.reward(trajectories)
        with phases.time("prepare"):  # step 4
            trajectories, rewards, prepared = self.prepare(trajectories, rewards, len(batch))
            self._watch_outage(prepared, trajectories)
        if self.workers is not None and self.workers.stopped:  # a worker fault in the refill
            return None
        with phases.time("update"):  # step 5
            metrics = self.update(prepared)
        with phases.time("sync"):
            extra.update(self._sync_weights(moved="train/skipped_step" not in metrics))
        if step_s is not None:
            extra["time/step_s"] = step_s
        metrics.update({k: torch.tensor(float(v)) for k, v in extra.items()})
        metrics.update(
            rollout_metrics(trajectories, rewards, "reward", self.environment, self.reward)
        )
        with phases.time("health"):
            metrics.update(health_metrics(trajectories, rewards, self.environment))
        metrics.update({f"rollout/{k}": v for k, v in prepared.metrics.items()})
        generated = sum(t.num_generated for t in trajectories)
        metrics["tokens/generated"] = torch.tensor(float(generated))
        metrics.update(phases.metrics())
        metrics.update(self._throughput(metrics))
        metrics.update(memory_metrics(self.device))
        log_metrics(self, metrics, batch_size=len(batch))
        # step 6: Lightning hands this to every callback's on_train_batch_end as ``outputs``
        return StepOutput(trajectories, rewards, metrics, batch_size=len(batch)).as_outputs()

    def _throughput(self, metrics: dict) -> dict:
        """The update's tokens and TFLOPs per second and, where the peak is known, its MFU."""
        if "perf/update_tflop" not in metrics or "time/update_s" not in metrics:
            return {}
        return throughput(
            float(metrics["perf/update_tflop"]),
            float(metrics["tokens/trained"]),
            float(metrics["time/update_s"]),
            peak_tflops(self.device, self.peak_tflops),
        )

    def _sync_weights(self, moved: bool) -> dict[str, float]:
        """The engine (or the rollout workers) samples the weights the update ``moved``; returns
        the engine's and the workers' metrics."""
        extra: dict[str, float] = {}
        if self.workers is not None:
            extra.update(self.workers.after_update(moved))
        elif moved:
            self.engine.sync_weights()
        extra.update(self.engine.metrics())
        return extra

    @torch.no_grad()
    def rollout(
        self, examples: list[Example], params: SamplingParams, group_size: int | None
    ) -> list[Trajectory]:
        """Training rollout with ``group_size`` samples each; ``None``: validation rollout."""
        if self.workers is not None:  # from the current weights, on the rollout workers
            return self.workers.rollout(examples, params, group_size)
        was_training = self.model.training
        self.model.eval()
        try:
            with self.engine.generating():  # e.g. the hf engine gathers an FSDP policy once
                if group_size is None:
                    return self.environment.validation_rollout(examples, self.engine, params)
                return self.environment.rollout(examples, self.engine, group_size, params)
        finally:
            self.engine.idle()
            self.model.train(was_training)

    def prepare(
        self, trajectories: list[Trajectory], rewards: RewardBreakdown, prompts: int
    ) -> tuple[list[Trajectory], RewardBreakdown, Prepared]:
        """The algorithm's training batch, without the episodes the environment failed
        (``environment_failures: drop``); an algorithm with DAPO's dynamic sampling first
        refills the groups that carry no gradient (up to ``prompts`` informative groups).
        Returns every trajectory (the step logs them all) and the batch."""
        rounds = self.algorithm.dynamic_sampling_rounds
        if rounds:
            trajectories, rewards, used = self.refill().run(trajectories, rewards, prompts, rounds)
        failed = environment_failed(trajectories, rewards)
        trained, trained_rewards = trajectories, rewards
        if self.environment_failures == "drop" and bool(failed.any()):
            trained, trained_rewards = keep_rows(trajectories, rewards, ~failed)
        if not trained:
            prepared = Prepared(batch=None)
        elif rounds:
            prepared = self.algorithm.prepare(trained, trained_rewards, max_groups=prompts)
        else:
            prepared = self.algorithm.prepare(trained, trained_rewards)
        if rounds:
            prepared.metrics["dynamic_sampling_rounds"] = torch.tensor(float(used))
        prepared.metrics["environment_failed"] = failed.float().mean()
        return trajectories, rewards, prepared

    def _watch_outage(self, prepared: Prepared, trajectories: list[Trajectory]) -> None:
        """Stop the run (one line) once the environment failed every episode on every rank
        for :data:`~lit_rag.trainer.failures.OUTAGE_STEPS` steps in a row over at least
        ``environment_outage_s`` seconds (``drop`` only)."""
        if self.environment_failures != "drop":
            return
        everything = float(prepared.metrics["environment_failed"]) == 1.0
        self.outage.record(not any_rank(self, not everything))
        # the streak is agreed on every rank; the ranks' clocks differ, so the stop is agreed
        # in a second collective, run only once the streak is long enough (on every rank)
        if self.outage.steps >= self.outage.limit and any_rank(self, self.outage.due()):
            raise self.outage.error(first_failure(trajectories))

    def refill(self) -> Refill:
        """This step's refill: extra prompts from the datamodule's pool, drawn with an RNG
        seeded by the step, round and rank (a resumed run draws the same)."""
        datamodule = self.trainer.datamodule if self._trainer is not None else None

        def draw(n: int, round_index: int) -> list[Example]:
            key = f"{self.global_step}-{round_index}-{self.global_rank}"
            return draw_from_pool(datamodule, n, key)

        return Refill(
            rollout=lambda examples: self.rollout(examples, self.sampling, self.group_size),
            score=self.reward,
            informative=self.algorithm.informative_groups,
            draw=draw,
            any_rank=functools.partial(any_rank, self),
        )

    # ---- validation ----------------------------------------------------------------------
    def validation_step(self, batch: list[Example], batch_idx: int) -> dict[str, list[dict]]:
        """Greedy rollouts scored and logged; returns each question's answer (``predictions``:
        id, question, gold answers, answer, completion, EM, F1) for callbacks such as
        ``lit-rag evaluate``'s."""
        trajectories = self.rollout(batch, self.val_sampling, None)
        if trajectories is None:  # a rollout worker fault stops the run (checkpoint saved)
            return {"predictions": []}
        rewards = self.reward(trajectories)
        answers = [self.environment.extract_answer(t) for t in trajectories]
        targets = [t.example.answers for t in trajectories]
        self.val_em.update(answers, targets)
        self.val_f1.update(answers, targets)
        metrics = rollout_metrics(
            trajectories, rewards, "val/reward", self.environment, self.reward
        )
        log_metrics(self, metrics, batch_size=len(batch), on_step=False, on_epoch=True)
        self.log("val/em", self.val_em, on_epoch=True, batch_size=len(batch), prog_bar=True)
        self.log("val/f1", self.val_f1, on_epoch=True, batch_size=len(batch))
        return {"predictions": self._predictions(trajectories, answers)}

    def _predictions(self, trajectories: list[Trajectory], answers: list[str]) -> list[dict]:
        mode = self.val_em.punctuation
        return [
            {
                "id": t.example.id,
                "question": t.example.question,
                "answers": list(t.example.answers),
                "prediction": answer,
                "completion": t.text,
                "em": exact_match(answer, list(t.example.answers), mode),
                "f1": f1_score(answer, list(t.example.answers), mode),
            }
            for t, answer in zip(trajectories, answers, strict=True)
        ]

    def test_step(self, batch: list[Example], batch_idx: int) -> dict[str, list[dict]]:
        return self.validation_step(batch, batch_idx)

    # ---- optimizer and checkpoints -------------------------------------------------------
    def configure_optimizers(self):
        trained = [p for p in self.model.parameters() if p.requires_grad]
        strategy = getattr(self._trainer, "strategy", None)  # none: built without a trainer
        optimizer = self.optim.adamw(trained, fused=fused_adamw(trained, strategy))
        steps_per_batch = self.algorithm.mu * self.algorithm.steps_per_pass
        # resuming (a checkpoint restored before this hook): the checkpoint's plan wins
        self.schedule_plan.start(self.optim.plan(self.trainer, steps_per_batch))
        scheduler = self.schedule_plan.scheduler(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        save_state(
            checkpoint,
            policy=self.policy_config,
            model=self.model,
            schedule=self.schedule_plan,
            plugins=self._stateful_plugins(),
            world_size=Ranks.of(self).world_size,
        )

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._restored = True
        trainer = self.trainer if self._trainer is not None else None
        check_model(
            checkpoint, policy=self.policy_config, model=self.model, weights=self, trainer=trainer
        )
        load_state(
            checkpoint,
            plugins=self._stateful_plugins(),
            schedule=self.schedule_plan,
            trainer=trainer,
        )

    def _stateful_plugins(self) -> dict:
        """The plugins whose ``state_dict`` the checkpoint carries, by checkpoint key."""
        plugins = {
            "algorithm": self.algorithm,
            "reward": self.reward,
            "environment": self.environment,
            "engine": self.engine,
        }
        if self.workers is not None:  # the policy version the workers hold
            plugins["rollout_workers"] = self.workers.workers
        return plugins

    #: a checkpoint's weights were loaded since the engine last synced (``on_load_checkpoint``)
    _restored: bool = False

    def on_fit_start(self) -> None:
        """Under DeepSpeed ZeRO-3 the frozen reference is partitioned as the policy is (its own
        engine, no optimizer), once the strategy has set up the ranks."""
        if self._reference:
            self._reference = [zero3_reference(r, self.trainer.strategy) for r in self._reference]
        self.update = self._build_update()  # the reference and the ranks' device as set up

    def on_train_start(self) -> None:
        self._sync_restored_weights()

    def on_validation_start(self) -> None:
        self._sync_restored_weights()

    def on_test_start(self) -> None:
        self._sync_restored_weights()

    def _sync_restored_weights(self) -> None:
        """The engine samples with the weights a checkpoint just loaded (Lightning loads them
        after ``on_load_checkpoint``): an engine that already holds a copy, from an earlier
        ``validate`` in the same process (``lit-rag compare``), would sample the old one."""
        if self._restored:
            self._restored = False
            if self.workers is not None:
                self.workers.resync()
            else:
                self.engine.sync_weights()

    def teardown(self, stage: str) -> None:
        """The rollout workers stop with the run."""
        if self.workers is not None:
            self.workers.close()


def _since(previous: float | None, now: float) -> float | None:
    """Seconds from the previous step's start to this one's (``time/step_s``)."""
    return None if previous is None else now - previous


def _check_batching(
    group_size: int,
    micro_batch_size: int | None,
    micro_batch_tokens: int | None,
    logprob_chunk_tokens: int,
) -> None:
    if group_size < 1 or (micro_batch_size is not None and micro_batch_size < 1):
        raise ValueError(
            "model group_size and micro_batch_size must be >= 1, "
            f"got {group_size}, {micro_batch_size}"
        )
    if micro_batch_tokens is not None and micro_batch_tokens < 1:
        raise ValueError(
            f"model micro_batch_tokens must be >= 1 or null (rows only), got {micro_batch_tokens}"
        )
    if logprob_chunk_tokens < 1:
        raise ValueError(f"model logprob_chunk_tokens must be >= 1, got {logprob_chunk_tokens}")
