"""``PolicyModule``: one RL step of the GRPO family as a LightningModule
(docs/DESIGN.md, steps 1-6).

The module owns the policy (and its reference) and the optimization; the environment, reward,
algorithm and rollout engine are plugins chosen in the recipe.
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import asdict

import numpy as np
import torch
from lightning.pytorch import LightningModule

from lit_rag.algorithm import Algorithm, Prepared, TrainBatch
from lit_rag.environment import Environment
from lit_rag.metrics.qa import ExactMatch, TokenF1
from lit_rag.models import has_adapters
from lit_rag.modules.loading import ModelConfig, load_model, load_tokenizer
from lit_rag.modules.logprobs import packed_logprobs
from lit_rag.modules.packing import Packed, pack, plan_micro_batches, split_rows
from lit_rag.modules.schedule import keep_stored_plan, lr_factor, plan_schedule
from lit_rag.modules.step_metrics import Clock, Mismatch, memory_metrics
from lit_rag.modules.strategies import (
    deepspeed_engine,
    forward_gathers,
    fsdp_wrap,
    is_fsdp,
    is_sharded,
    outside_zero_init,
)
from lit_rag.reward import Reward
from lit_rag.rollout.base import Placement, RolloutEngine, SamplingParams
from lit_rag.rollout.weights import strip_wrappers
from lit_rag.step import StepOutput
from lit_rag.text import PUNCTUATION_MODES, exact_match, f1_score
from lit_rag.types import Example, RewardBreakdown, Trajectory

SCHEDULES = ("constant", "cosine", "linear")


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
            (:mod:`lit_rag.modules.packing`); exact, so on by default. ``false``: every row
            computes its own prompt.
        lr: Peak learning rate (AdamW).
        weight_decay: AdamW weight decay (default 0: TRL's, which ARENA's release keeps; verl's
            is 0.01).
        betas: AdamW betas (default (0.9, 0.999): torch's, TRL's and verl's).
        warmup_steps: Linear warm-up optimizer steps.
        warmup_ratio: Linear warm-up as a fraction of the run's optimizer steps (verl's
            ``lr_warmup_steps_ratio``); set this or ``warmup_steps``, not both.
        lr_schedule: ``constant``, ``cosine`` or ``linear`` decay after warm-up.
        max_grad_norm: Clip the gradient norm; ``None`` disables clipping.
        logprob_chunk_tokens: Output-head rows computed at once (memory bound).
        answer_punctuation: How validation EM / F1 normalize punctuation: ``delete`` (SQuAD,
            Search-R1) or ``space`` (ARENA's released evaluation).
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
        lr: float = 1e-6,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
        warmup_ratio: float = 0.0,
        lr_schedule: str = "constant",
        max_grad_norm: float | None = 1.0,
        logprob_chunk_tokens: int = 512,
        answer_punctuation: str = "delete",
    ) -> None:
        super().__init__()
        if group_size < 1 or (micro_batch_size is not None and micro_batch_size < 1):
            raise ValueError(
                "model group_size and micro_batch_size must be >= 1, "
                f"got {group_size}, {micro_batch_size}"
            )
        if micro_batch_tokens is not None and micro_batch_tokens < 1:
            raise ValueError(
                "model micro_batch_tokens must be >= 1 or null (rows only), "
                f"got {micro_batch_tokens}"
            )
        if lr < 0 or weight_decay < 0 or warmup_steps < 0:
            raise ValueError(
                "model lr, weight_decay and warmup_steps must be >= 0, "
                f"got {lr}, {weight_decay}, {warmup_steps}"
            )
        if not 0.0 <= warmup_ratio < 1.0 or (warmup_ratio and warmup_steps):
            raise ValueError(
                f"model warmup_ratio must be in [0, 1) and not set beside warmup_steps, "
                f"got warmup_ratio {warmup_ratio}, warmup_steps {warmup_steps}"
            )
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(
                f"model max_grad_norm must be > 0 or null (no clipping), got {max_grad_norm}"
            )
        if logprob_chunk_tokens < 1:
            raise ValueError(f"model logprob_chunk_tokens must be >= 1, got {logprob_chunk_tokens}")
        if lr_schedule not in SCHEDULES:
            raise ValueError(
                f"model lr_schedule '{lr_schedule}' is not known; allowed: {', '.join(SCHEDULES)}"
            )
        self.automatic_optimization = False
        self.policy_config = policy
        self.environment = environment
        self.reward = reward
        self.algorithm = algorithm
        if (
            engine is None
        ):  # the registered ``hf`` engine (core names plugins only through the registry)
            from lit_rag import registry

            engine = registry.load("engine", "hf")()
        self.engine = engine
        self.group_size = group_size
        self.sampling = sampling or SamplingParams()
        self.val_sampling = val_sampling or SamplingParams(
            max_new_tokens=self.sampling.max_new_tokens, temperature=0.0, stop=self.sampling.stop
        )
        self.micro_batch_size = micro_batch_size
        self.micro_batch_tokens = micro_batch_tokens
        self.share_prefix = share_prefix
        self.lr, self.weight_decay, self.betas = lr, weight_decay, tuple(betas)
        self.warmup_steps, self.lr_schedule, self.max_grad_norm = (
            warmup_steps,
            lr_schedule,
            max_grad_norm,
        )
        self.warmup_ratio = warmup_ratio
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self.model: torch.nn.Module | None = None
        self.tokenizer = None
        self._reference: list[torch.nn.Module] = []  # a list keeps it out of the module tree
        if answer_punctuation not in PUNCTUATION_MODES:
            raise ValueError(
                f"model answer_punctuation '{answer_punctuation}' is not known; "
                f"allowed: {', '.join(PUNCTUATION_MODES)}"
            )
        self.val_em = ExactMatch(punctuation=answer_punctuation)
        self.val_f1 = TokenF1(punctuation=answer_punctuation)
        self.strict_loading = policy.lora is None  # LoRA checkpoints carry adapters only
        self._schedule: dict | None = (
            None  # the learning-rate plan: kind, warmup, total (optimizer steps)
        )
        self._stored_schedule: dict | None = None  # the plan of the checkpoint being resumed

    # ---- model ---------------------------------------------------------------------------
    def configure_model(self) -> None:
        """Load the policy (deferred, so recipes build without weights)."""
        if self.model is not None:
            return
        self.environment.setup()
        self.tokenizer = load_tokenizer(self.policy_config)
        with outside_zero_init():
            self.model = load_model(self.policy_config).train()  # from_pretrained returns eval mode
        if self.algorithm.needs_reference and not has_adapters(self.model):
            reference = copy.deepcopy(self.model).eval()
            reference.requires_grad_(False)
            self._reference = [reference]
        if self._trainer is not None and is_fsdp(self.trainer.strategy):
            self.model = fsdp_wrap(self.model, self.trainer.strategy)
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

    def reference_logprobs(self, batch: TrainBatch, width: int) -> torch.Tensor:
        """Reference log-probs: adapters disabled under LoRA, else the frozen copy."""
        if has_adapters(self.model):
            with self.model.disable_adapter():
                return self._logprobs(self.model, batch, width)
        reference = self._reference[0]
        if next(reference.parameters()).device != self.device:
            reference.to(self.device)
        return self._logprobs(reference, batch, width)

    def _logprobs(self, model: torch.nn.Module, batch: TrainBatch, width: int) -> torch.Tensor:
        """``[b, width]`` log-probs of the completion tokens of a micro-batch."""
        return self._packed_logprobs(model, self._pack(batch, width))

    def _pack(self, batch: TrainBatch, width: int) -> Packed:
        """A micro-batch as packed sequences: rows with one prompt share it (``share_prefix``),
        and no row is padded to the rollout's longest prompt or completion."""
        pad = (
            self.tokenizer.pad_token_id
            if self.tokenizer is not None and self.tokenizer.pad_token_id is not None
            else 0
        )
        return pack(
            batch.input_ids, batch.attention_mask, width, share=self.share_prefix, pad_id=pad
        )

    def _packed_logprobs(self, model: torch.nn.Module, packed: Packed) -> torch.Tensor:
        temperature = self.sampling.temperature if self.sampling.temperature > 0 else 1.0
        return packed_logprobs(
            model,
            packed.to(self.device),
            temperature=temperature,
            chunk_tokens=self.logprob_chunk_tokens,
            through_forward=forward_gathers(model),
        )

    def setup(self, stage: str) -> None:
        """DeepSpeed clips gradients inside its engine, from its config: give it ``max_grad_norm``
        (Lightning would take ``trainer.gradient_clip_val``, which manual optimization forbids)."""
        from lightning.pytorch.strategies import DeepSpeedStrategy

        strategy = self.trainer.strategy
        if isinstance(strategy, DeepSpeedStrategy) and self.max_grad_norm is not None:
            strategy.config.setdefault("gradient_clipping", self.max_grad_norm)

    # ---- one RL step (docs/DESIGN.md, "Who calls whom") ---------------------------------------
    def training_step(self, batch: list[Example], batch_idx: int) -> dict[str, StepOutput]:
        started = time.perf_counter()
        trajectories = self.rollout(batch, self.sampling, self.group_size)  # steps 1-2
        rewards = self.reward(trajectories)  # step 3
        rounds = self.algorithm.dynamic_sampling_rounds
        if rounds:  # DAPO dynamic sampling: refill the groups that carry no gradient
            trajectories, rewards, used = self._refill(trajectories, rewards, len(batch), rounds)
            prepared = self.algorithm.prepare(
                trajectories, rewards, max_groups=len(batch)
            )  # step 4
            prepared.metrics["dynamic_sampling_rounds"] = torch.tensor(float(used))
        else:
            prepared = self.algorithm.prepare(trajectories, rewards)  # step 4
        rolled = time.perf_counter()
        metrics = self.optimize(prepared)  # step 5
        if (
            "train/skipped_step" not in metrics
        ):  # weights moved: the engine samples with the new ones
            self.engine.sync_weights()
        metrics.update({k: torch.tensor(float(v)) for k, v in self.engine.metrics().items()})
        metrics.update(self._rollout_metrics(trajectories, rewards, prefix="reward"))
        metrics.update({f"rollout/{k}": v for k, v in prepared.metrics.items()})
        metrics["tokens/generated"] = torch.tensor(
            float(sum(t.num_generated for t in trajectories))
        )
        metrics["time/rollout_s"] = torch.tensor(rolled - started)
        metrics["time/update_s"] = torch.tensor(time.perf_counter() - rolled)
        metrics.update(memory_metrics(self.device))
        self._log(metrics, batch_size=len(batch))
        # step 6: Lightning hands this to every callback's on_train_batch_end as ``outputs``
        return StepOutput(trajectories, rewards, metrics, batch_size=len(batch)).as_outputs()

    def _refill(
        self, trajectories: list[Trajectory], rewards: RewardBreakdown, target: int, rounds: int
    ):
        """Sample extra prompts until ``target`` groups have reward variance (at most ``rounds``
        extra rounds, each drawing as many prompts as groups are missing). Extra prompts come
        from the training pool with an RNG seeded by the step, so a resumed run draws the same.

        Ranks refill together: a round runs on every rank while any rank still draws, a rank
        with nothing to draw rolling out no prompt (an engine shared by a tensor-parallel group
        of ranks needs every rank in every rollout)."""
        used = 0
        while True:
            missing = 0
            if used < rounds:
                missing = max(0, target - self.algorithm.informative_groups(trajectories, rewards))
            extra = self._extra_examples(missing, used) if missing else []
            if not self._any_rank(bool(extra)):
                break
            more = self.rollout(extra, self.sampling, self.group_size)
            used += 1
            if not more:
                continue
            offset = max(t.group for t in trajectories) + 1
            for t in more:
                t.group += offset
            more_rewards = self.reward(more)
            trajectories = trajectories + more
            rewards = RewardBreakdown(
                total=torch.cat([rewards.total, more_rewards.total]),
                components={
                    k: torch.cat([v, more_rewards.components[k]])
                    for k, v in rewards.components.items()
                },
            )
        return trajectories, rewards, used

    def _extra_examples(self, n: int, round_index: int) -> list[Example]:
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is None:
            return []
        from lit_rag.data.datamodule import QADataModule

        if not isinstance(datamodule, QADataModule):  # another datamodule has no pool to draw from
            return []
        pool, seed = datamodule.pool(), datamodule.seed
        rng = random.Random(f"{seed}-refill-{self.global_step}-{round_index}-{self.global_rank}")
        return rng.sample(pool, min(n, len(pool)))

    @torch.no_grad()
    def rollout(
        self, examples: list[Example], params: SamplingParams, group_size: int | None
    ) -> list[Trajectory]:
        """Training rollout with ``group_size`` samples each; ``None``: validation rollout."""
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

    def optimize(self, prepared: Prepared) -> dict[str, torch.Tensor]:
        """mu passes over the batch; each pass is one optimizer step per mini-batch (the
        algorithm's ``mini_batches``: ``(rows, loss scale)``; default: the whole batch, scale 1),
        accumulated over micro-batches."""
        batch, size = prepared.batch, prepared.size
        width = batch.width if size else 1
        minis = list(batch.mini_batches or [(torch.arange(size), 1.0)]) if size else []
        slices = self._micro_slices(batch, torch.arange(size), width) if size else []
        mini_slices = [self._micro_slices(batch, torch.as_tensor(rows), width) for rows, _ in minis]
        # with several ranks every backward pass (DDP's gradient all-reduce, FSDP's
        # reduce-scatter) and every sharded forward is a collective: all ranks run as many
        # optimizer steps as the rank with the most mini-batches and, in each, as many passes as
        # the rank with the most micro-batches; the others run idle passes (zero loss)
        steps = self._max_over_ranks(len(minis))
        if steps == 0:  # no rank has anything to learn from: no optimizer step anywhere
            return {"train/skipped_step": torch.tensor(1.0)}
        # a rank without rows (others have some) runs only idle passes and the shared steps
        idle_forwards = self._max_over_ranks(len(slices)) - len(slices)

        def per_row(fn) -> torch.Tensor:  # [N, width], rows in batch order
            out = torch.zeros(size, width)
            for s in slices:
                out[s] = fn(batch.rows(s)).float().cpu()
            if forward_gathers(self.model):  # sharded forwards are collectives too
                for _ in range(idle_forwards):
                    self._logprobs(self.model, self._idle_batch(), 1)
            return out

        clock = Clock()
        with (
            torch.no_grad(),
            clock("time/reference_s"),
        ):  # a rank without rows runs only the idle forwards here
            if self.algorithm.needs_reference:
                ref = per_row(lambda micro: self.reference_logprobs(micro, width))
                if size:
                    batch.ref_logprobs = ref
            # pi_old = the policy that sampled, before any update (every optimizer step after the
            # first would otherwise take the updated policy as pi_old)
            if self.algorithm.mu * self.algorithm.steps_per_pass > 1:
                old = per_row(lambda micro: self._logprobs(self.model, micro, width))
                if size:
                    batch.old_logprobs = old
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        engine = deepspeed_engine(self)
        sums: dict[str, float] = {}
        micro_count = 0
        mismatch = Mismatch()
        seen: set[int] = set()  # rows whose engine log-probs were compared (once each)
        trained = 0.0
        rates: list[float] = []  # the learning rate of each optimizer step of this training step
        for epoch in range(self.algorithm.mu):
            for m in range(steps):
                own, scale = (mini_slices[m], float(minis[m][1])) if m < len(minis) else ([], 0.0)
                passes = self._max_over_ranks(len(own))
                for index in range(passes):
                    if (
                        engine is not None
                    ):  # DeepSpeed reduces gradients at its boundary: the last micro-batch
                        engine.set_gradient_accumulation_boundary(index == passes - 1)
                    if index >= len(own):
                        with clock("time/backward_s"):
                            self.manual_backward(self._idle_loss())
                        continue
                    rows = own[index]
                    micro = batch.rows(rows)
                    packed = self._pack(micro, width)
                    with clock("time/forward_s"):
                        micro.logprobs = self._packed_logprobs(self.model, packed)
                    if batch.old_logprobs is None:
                        micro.old_logprobs = micro.logprobs.detach()
                    fresh = [i for i, r in enumerate(rows.tolist()) if r not in seen]
                    if epoch == 0 and fresh:  # trainer vs engine, same weights
                        seen.update(rows[fresh].tolist())
                        mismatch.add(
                            micro.old_logprobs[fresh],
                            micro.sampling_logprobs[fresh],
                            micro.completion_mask[fresh],
                        )
                    trained += packed.real_tokens
                    with clock("time/forward_s"):
                        out = self.algorithm.loss(micro.to(self.device))
                    with clock("time/backward_s"):
                        self.manual_backward(out.loss * scale if scale != 1.0 else out.loss)
                    # token weights are normalized over the (mini-)batch: its loss is the sum of
                    # the micro-batch losses; the other metrics are micro-batch means
                    sums["train/loss"] = (
                        sums.get("train/loss", 0.0) + float(out.loss.detach()) * scale
                    )
                    micro_count += 1
                    for key, value in out.metrics.items():
                        sums[f"train/{key}"] = sums.get(f"train/{key}", 0.0) + float(value)
                with clock("time/optimizer_s"):
                    self._optimizer_step(optimizer, scheduler, rates)
        optimizer_steps = self.algorithm.mu * steps
        metrics = {
            k: torch.tensor(v / (optimizer_steps if k == "train/loss" else max(1, micro_count)))
            for k, v in sums.items()
        }
        metrics.update(mismatch.metrics())
        # the mean rate of the step's optimizer steps (mu x mini-batches), read before each
        # scheduler.step(): after it the optimizer holds the next step's rate
        metrics["train/lr"] = torch.tensor(sum(rates) / len(rates))
        metrics["tokens/trained"] = torch.tensor(
            trained
        )  # through forward and backward (this rank)
        metrics.update(clock.metrics())
        if steps > 1:
            metrics["train/optimizer_steps"] = torch.tensor(float(optimizer_steps))
        return metrics

    def _optimizer_step(self, optimizer, scheduler, rates: list[float]) -> None:
        """Clip the accumulated gradient, step, clear it; ``rates`` gets the step's learning
        rate."""
        if self.max_grad_norm is not None:
            if is_sharded(self.model):  # the norm over all shards (FSDP's own clipping)
                self.model.clip_grad_norm_(self.max_grad_norm)
            else:  # under DeepSpeed this is a no-op: the engine clips (see ``setup``)
                self.clip_gradients(
                    optimizer, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm"
                )
        rates.append(optimizer.param_groups[0]["lr"])  # the rate this optimizer step uses
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()

    def _micro_slices(
        self, batch: TrainBatch, rows: torch.Tensor, width: int
    ) -> list[torch.Tensor]:
        """Micro-batches of ``rows`` within ``micro_batch_tokens`` packed token positions and
        ``micro_batch_size`` rows (:func:`~lit_rag.modules.packing.plan_micro_batches`): a
        group's rows together (they share their prompt), longest first (the least padding).
        The loss is a sum over rows with batch-normalized weights, so the order does not
        matter. Algorithms whose loss couples rows (DPO: chosen, rejected) keep each unit of
        ``row_group`` consecutive rows inside one micro-batch."""
        unit = self.algorithm.row_group
        split = split_rows(batch.input_ids[rows], batch.attention_mask[rows], width)
        max_rows = None
        if self.micro_batch_size is not None:
            max_rows = max(unit, self.micro_batch_size - self.micro_batch_size % unit)
        plan = plan_micro_batches(
            [p for p, _ in split],
            [len(c) for _, c in split],
            self.micro_batch_tokens,
            max_rows=max_rows,
            row_group=unit,
            share=self.share_prefix,
        )
        return [rows[torch.tensor(micro, dtype=torch.long)] for micro in plan]

    def _any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (a collective with several ranks)."""
        return self._max_over_ranks(int(flag)) > 0

    def _max_over_ranks(self, n: int) -> int:
        if self._trainer is None or self.trainer.world_size < 2:
            return n
        value = self.trainer.strategy.reduce(
            torch.tensor(float(n), device=self.device), reduce_op="max"
        )
        return int(value.item())

    def _idle_batch(self) -> TrainBatch:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return TrainBatch(
            input_ids=torch.full((1, 2), pad, dtype=torch.long),
            attention_mask=torch.ones(1, 2, dtype=torch.long),
            completion_mask=torch.zeros(1, 1),
            sampling_logprobs=torch.zeros(1, 1),
        )

    def _idle_loss(self) -> torch.Tensor:
        """Zero times the log-prob of one token: a backward pass through every trainable
        parameter that contributes nothing (a rank with fewer micro-batches joins the others'
        gradient reduction with it)."""
        return self._logprobs(self.model, self._idle_batch(), 1).sum() * 0.0

    # ---- validation ----------------------------------------------------------------------
    def validation_step(self, batch: list[Example], batch_idx: int) -> dict[str, list[dict]]:
        """Greedy rollouts scored and logged; returns each question's answer (``predictions``:
        id, question, gold answers, answer, completion, EM, F1) for callbacks such as
        ``lit-rag evaluate``'s."""
        trajectories = self.rollout(batch, self.val_sampling, None)
        rewards = self.reward(trajectories)
        answers = [self.environment.extract_answer(t) for t in trajectories]
        targets = [t.example.answers for t in trajectories]
        self.val_em.update(answers, targets)
        self.val_f1.update(answers, targets)
        metrics = self._rollout_metrics(trajectories, rewards, prefix="val/reward")
        self._log(metrics, batch_size=len(batch), on_step=False, on_epoch=True)
        self.log("val/em", self.val_em, on_epoch=True, batch_size=len(batch), prog_bar=True)
        self.log("val/f1", self.val_f1, on_epoch=True, batch_size=len(batch))
        mode = self.val_em.punctuation
        return {
            "predictions": [
                {
                    "id": t.example.id,
                    "question": t.example.question,
                    "answers": list(t.example.answers),
                    "prediction": answer,
                    "completion": t.text,
                    "em": exact_match(answer, list(t.example.answers), mode),
                    "f1": f1_score(answer, list(t.example.answers), mode),
                }
                for t, answer in zip(trajectories, answers)
            ]
        }

    def test_step(self, batch: list[Example], batch_idx: int) -> dict[str, list[dict]]:
        return self.validation_step(batch, batch_idx)

    # ---- bookkeeping ---------------------------------------------------------------------
    def _rollout_metrics(
        self, trajectories: list[Trajectory], rewards: RewardBreakdown, prefix: str
    ) -> dict:
        lengths = torch.tensor([float(t.num_generated) for t in trajectories])

        def per_trajectory(values: torch.Tensor) -> torch.Tensor:  # step-level [N, T]: the return
            return values.float().sum(-1) if values.dim() == 2 else values.float()

        metrics = {f"{prefix}/total": per_trajectory(rewards.total).mean()}
        for name, values in rewards.components.items():
            metrics[f"{prefix}/{name}"] = per_trajectory(values).mean()
        head = prefix.split("/")[0] if prefix.startswith("val") else "rollout"
        metrics[f"{head}/completion_length"] = lengths.mean()
        metrics[f"{head}/truncated_fraction"] = torch.tensor(
            [float(t.truncated) for t in trajectories]
        ).mean()
        for name, value in self.environment.metrics(trajectories).items():
            metrics[f"{head}/{name}"] = value
        return metrics

    def _log(
        self, metrics: dict, batch_size: int, on_step: bool = True, on_epoch: bool = False
    ) -> None:
        """Log a step's metrics, reduced across ranks (mean) where every rank has the metric.

        The ranks' metric sets can differ (a rank without preference pairs has no DPO margin);
        a metric only some ranks have is logged unreduced, since a reduction would wait forever
        for the ranks that lack it.
        """
        shared = set(metrics)
        world = self.trainer.world_size if self._trainer is not None else 1
        if world > 1 and on_step:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                keys: list[list[str]] = [[] for _ in range(world)]
                dist.all_gather_object(keys, sorted(metrics))
                shared = set.intersection(*(set(k) for k in keys))
        for key in sorted(metrics, key=lambda k: (k not in shared, k)):  # same order on every rank
            value = metrics[key]
            self.log(
                key,
                value.float() if torch.is_tensor(value) else float(value),
                on_step=on_step,
                on_epoch=on_epoch,
                batch_size=batch_size,
                sync_dist=world > 1 and key in shared,
                prog_bar=key in ("reward/total", "train/kl", "val/reward/total"),
            )

    def configure_optimizers(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=self.lr, weight_decay=self.weight_decay, betas=self.betas
        )
        self._schedule = self._planned_schedule()
        self._apply_stored_schedule()  # resuming (restored before this hook): the checkpoint's plan
        plan = (
            self._schedule
        )  # read at every step: a plan restored after this hook updates it in place

        def factor(
            step: int,
        ) -> float:  # LambdaLR does not save this function: the plan is in the checkpoint
            return lr_factor(step, plan["kind"], plan["warmup"], plan["total"])

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def _planned_schedule(self) -> dict:
        """This run's learning-rate plan (see :func:`plan_schedule`)."""
        return plan_schedule(
            self.trainer,
            self.lr_schedule,
            self.warmup_steps,
            self.algorithm.mu * self.algorithm.steps_per_pass,
            self.warmup_ratio,
        )

    def _apply_stored_schedule(self) -> None:
        """A resumed run follows the plan its checkpoint was made with (see
        :func:`keep_stored_plan`)."""
        if self._stored_schedule is not None and self._schedule is not None:
            keep_stored_plan(self._stored_schedule, self._schedule)
            self._stored_schedule = None

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["rng_states"] = _rng_states()
        world = self.trainer.world_size if self._trainer is not None else 1
        if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            # every rank's states (rank 0 writes the file): each resumed rank draws as it would have
            ranks: list = [None] * world
            torch.distributed.all_gather_object(ranks, checkpoint["rng_states"])
            checkpoint["rng_states"]["ranks"] = ranks
        if self.policy_config.lora is not None:  # adapters only; the base reloads from its path
            trainable = {
                f"model.{strip_wrappers(n)}"
                for n, p in self.model.named_parameters()
                if p.requires_grad
            }
            checkpoint["state_dict"] = {
                k: v for k, v in checkpoint["state_dict"].items() if k in trainable
            }
        checkpoint["lit_rag"] = {"policy": asdict(self.policy_config)}
        if (
            self._schedule is not None
        ):  # LambdaLR's state has the step, not the plan its factor reads
            checkpoint["lit_rag"]["schedule"] = dict(self._schedule)
        for name, plugin in self._stateful_plugins().items():  # e.g. DPO's stored pairs
            state = plugin.state_dict()
            if state:
                checkpoint["lit_rag"][name] = state

    def _stateful_plugins(self) -> dict:
        """The plugins whose ``state_dict`` the checkpoint carries, by checkpoint key."""
        return {
            "algorithm": self.algorithm,
            "reward": self.reward,
            "environment": self.environment,
            "engine": self.engine,
        }

    #: a checkpoint's weights were loaded since the engine last synced (``on_load_checkpoint``)
    _restored: bool = False

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
            self.engine.sync_weights()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._restored = True
        stored = checkpoint.get("lit_rag", {})
        for name, plugin in self._stateful_plugins().items():
            if stored.get(name) is not None:
                plugin.load_state_dict(stored[name])
        schedule = checkpoint.get("lit_rag", {}).get("schedule")
        if (
            schedule is not None
        ):  # before configure_optimizers (most strategies) or after (FSDP, DeepSpeed)
            self._stored_schedule = dict(schedule)
            self._apply_stored_schedule()
        states = checkpoint.get("rng_states")
        if states:
            ranks = states.get("ranks")
            if ranks and self._trainer is not None and len(ranks) == self.trainer.world_size:
                states = ranks[self.trainer.global_rank]  # this rank's own, saved by the same world
            torch.set_rng_state(states["torch"])
            random.setstate(states["python"])
            name, keys, pos, has_gauss, gauss = states["numpy"]
            np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


def _rng_states() -> dict:
    """The global RNG states of torch, Python and NumPy, as plain types (loadable with
    ``torch.load(weights_only=True)``)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [
            str(name),
            torch.from_numpy(keys.astype(np.int64)),
            int(pos),
            int(has_gauss),
            float(gauss),
        ],
    }
