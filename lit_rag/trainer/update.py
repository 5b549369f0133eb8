"""The update of one RL step (docs/DESIGN.md step 5): the reference and old log-probs, then mu
passes over the batch, each one optimizer step per mini-batch accumulated over micro-batches.

Micro-batches are planned within a token budget (:func:`~lit_rag.models.packing.
plan_micro_batches`), a group's rows together so their prompt runs once. With several ranks
every backward pass (DDP's gradient all-reduce, FSDP's reduce-scatter) and every sharded forward
is a collective: all ranks run as many optimizer steps as the rank with the most mini-batches
and, in each, as many passes as the rank with the most micro-batches; the others run idle
passes (zero loss through every trainable parameter).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from lit_rag.contracts.algorithm import Algorithm, Prepared, TrainBatch
from lit_rag.models.facts import has_adapters
from lit_rag.models.packing import Packed, balance, pack, plan_micro_batches, split_rows
from lit_rag.models.strategies import (
    accumulates_unsynced,
    ddp_module,
    deepspeed_engine,
    deepspeed_forward_starts,
    forward_gathers,
)
from lit_rag.trainer.flops import Arithmetic
from lit_rag.trainer.logprobs import _base_model, packed_logprobs
from lit_rag.trainer.optimizer import optimizer_step
from lit_rag.trainer.phases import Clock, Mismatch
from lit_rag.trainer.ranks import Ranks


@dataclass
class Plan:
    """One rank's micro-batches: over the whole batch (the fixed log-probs) and per mini-batch
    (``(rows, loss scale)``, the algorithm's ``mini_batches``; default: the whole batch, scale
    1), with the counts every rank agrees on."""

    batch: TrainBatch
    size: int
    width: int
    minis: list
    slices: list[torch.Tensor]
    mini_slices: list[list[torch.Tensor]]
    steps: int = 0  # optimizer steps per pass: the most mini-batches on any rank
    idle_forwards: int = 0  # passes a rank with fewer micro-batches runs idle
    passes: list[int] = field(default_factory=list)  # each optimizer step's passes, any rank's most
    packs: dict = field(default_factory=dict)  # each micro-batch packed once per step


@dataclass
class Tally:
    """What the passes of one update add up: sums kept as device tensors, read once per step
    (no host sync inside the micro-batch loop)."""

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    micro_count: int = 0
    trained: float = 0.0  # token positions through forward and backward (this rank)
    predicted: float = 0.0  # completion tokens the head ran on in those passes
    rates: list[float] = field(default_factory=list)  # each optimizer step's learning rate
    seen: set[int] = field(default_factory=set)  # rows whose engine log-probs were compared
    mismatch: Mismatch = field(default_factory=Mismatch)

    def add(self, key: str, value: torch.Tensor | float) -> None:
        value = value.detach().float() if torch.is_tensor(value) else torch.tensor(float(value))
        self.sums[key] = self.sums[key] + value if key in self.sums else value


@dataclass(frozen=True)
class UpdateSettings:
    """The numbers an update reads (:class:`~lit_rag.trainer.policy.PolicyModule` documents the
    recipe keys of the same names).

    Attributes:
        micro_batch_size: Most rows per forward/backward pass; ``None``: tokens alone bound it.
        micro_batch_tokens: Most packed token positions per forward/backward pass.
        share_prefix: Rows with the same prompt run it once.
        logprob_chunk_tokens: Output-head rows computed at once.
        temperature: The sampling temperature the log-probs are taken at (0, greedy: 1).
        top_p: The sampling's nucleus mass; ``rollout/logprob_diff_*`` leaves out the gap it
            explains (:class:`~lit_rag.trainer.phases.Mismatch`).
        top_k: The sampling's top-k cut-off (0: off), likewise.
        max_grad_norm: Clip the gradient norm; ``None``: no clipping.
        pad_id: The tokenizer's padding token (0 when it has none).
    """

    micro_batch_size: int | None = None
    micro_batch_tokens: int | None = 4096
    share_prefix: bool = True
    logprob_chunk_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_grad_norm: float | None = 1.0
    pad_id: int = 0


def _key(rows: torch.Tensor) -> tuple[int, ...]:
    """A micro-batch's key in a step's packs (:attr:`Plan.packs`): its rows."""
    return tuple(rows.tolist())


def _balanced(slices: list[torch.Tensor], count: int, unit: int) -> list[torch.Tensor]:
    """:func:`~lit_rag.models.packing.balance` on micro-batches of row-index tensors."""
    if len(slices) >= count:
        return slices
    return [
        torch.tensor(rows, dtype=torch.long)
        for rows in balance([s.tolist() for s in slices], count, unit)
    ]


class LightningHooks(Protocol):
    """The LightningModule hooks an update calls (manual optimization)."""

    def manual_backward(self, loss: torch.Tensor) -> None: ...

    def optimizers(self) -> Any: ...

    def lr_schedulers(self) -> Any: ...

    def clip_gradients(
        self, optimizer: Any, gradient_clip_val: float, gradient_clip_algorithm: str
    ) -> None: ...


class Update:
    """Log-probs and the update of a policy.

    Args:
        settings: The micro-batching, log-prob and clipping numbers.
        algorithm: The loss, its passes (``mu``) and what it needs (a reference, pi_old).
        model: The policy being trained.
        reference: The frozen reference copy, or ``None`` (LoRA disables the adapters instead;
            an algorithm without a reference).
        ranks: The run's ranks (the counts every rank agrees on).
        hooks: The LightningModule's backward, optimizer, scheduler and clipping hooks.
    """

    def __init__(
        self,
        settings: UpdateSettings,
        algorithm: Algorithm,
        model: torch.nn.Module,
        reference: torch.nn.Module | None,
        ranks: Ranks,
        hooks: LightningHooks,
    ) -> None:
        self.settings, self.algorithm = settings, algorithm
        self.model, self.reference = model, reference
        self.ranks, self.hooks = ranks, hooks
        #: micro-batches but an optimizer step's last run inside ``no_sync()`` (FSDP with CPU
        #: offload: :func:`~lit_rag.models.strategies.accumulates_unsynced`)
        self.unsynced = accumulates_unsynced(ranks.strategy)
        #: the model's matmul weights, for the update's FLOPs (``None``: not a decoder's config)
        self.arithmetic = Arithmetic.of_model(_base_model(model)) if model is not None else None

    # ---- log-probs ---------------------------------------------------------------------------
    def logprobs(
        self, model: torch.nn.Module, batch: TrainBatch, width: int, packs=None, rows=None
    ) -> torch.Tensor:
        """``[b, width]`` log-probs of the completion tokens of a micro-batch (packed once per
        step: ``packs`` keeps each micro-batch's, by its ``rows``)."""
        return self.packed_logprobs(model, self.pack(batch, width, packs, rows))

    def reference_logprobs(
        self, batch: TrainBatch, width: int, packs=None, rows=None
    ) -> torch.Tensor:
        """Reference log-probs: adapters disabled under LoRA, else the frozen copy, sharded as
        the policy is under FSDP (``configure_model``) and ZeRO-3
        (:func:`~lit_rag.models.strategies.zero3_reference`)."""
        if has_adapters(self.model):
            with self.model.disable_adapter():
                return self.logprobs(self.model, batch, width, packs, rows)
        reference, device = self.reference, self.ranks.device
        if not forward_gathers(reference) and next(reference.parameters()).device != device:
            reference.to(device)
        return self.logprobs(reference, batch, width, packs, rows)

    def pack(self, batch: TrainBatch, width: int, packs=None, rows=None) -> Packed:
        """A micro-batch as packed sequences: rows with one prompt share it (``share_prefix``),
        and no row is padded to the rollout's longest prompt or completion. With ``packs`` (a
        step's) and the micro-batch's ``rows``, each micro-batch is packed and moved to the
        device once for the reference, pi_old and every pass."""
        key = _key(rows) if packs is not None and rows is not None else None
        if key is not None and key in packs:
            return packs[key]
        packed = self._pack(batch, width)
        if key is not None:
            packs[key] = packed
        return packed

    def _pack(self, batch: TrainBatch, width: int) -> Packed:
        return pack(
            batch.input_ids,
            batch.attention_mask,
            width,
            share=self.settings.share_prefix,
            pad_id=self.settings.pad_id,
        ).to(self.ranks.device)

    def packed_logprobs(self, model: torch.nn.Module, packed: Packed) -> torch.Tensor:
        temperature = self.settings.temperature
        return packed_logprobs(
            model,
            packed,
            temperature=temperature if temperature > 0 else 1.0,
            chunk_tokens=self.settings.logprob_chunk_tokens,
            through_forward=forward_gathers(model),
        )

    # ---- planning ----------------------------------------------------------------------------
    def micro_slices(self, batch: TrainBatch, rows: torch.Tensor, width: int) -> list[torch.Tensor]:
        """Micro-batches of ``rows`` within ``micro_batch_tokens`` packed token positions and
        ``micro_batch_size`` rows: a group's rows together (they share their prompt), longest
        first (the least padding). The loss is a sum over rows with batch-normalized weights, so
        the order does not matter. Algorithms whose loss couples rows (DPO: chosen, rejected)
        keep each unit of ``row_group`` consecutive rows inside one micro-batch."""
        settings, unit = self.settings, self.algorithm.row_group
        split = split_rows(batch.input_ids[rows], batch.attention_mask[rows], width)
        max_rows = None
        if settings.micro_batch_size is not None:
            max_rows = max(unit, settings.micro_batch_size - settings.micro_batch_size % unit)
        plan = plan_micro_batches(
            [p for p, _ in split],
            [len(c) for _, c in split],
            settings.micro_batch_tokens,
            max_rows=max_rows,
            row_group=unit,
            share=settings.share_prefix,
        )
        return [rows[torch.tensor(micro, dtype=torch.long)] for micro in plan]

    def plan(self, prepared: Prepared) -> Plan:
        batch, size = prepared.batch, prepared.size
        width = batch.width if size else 1
        minis = list(batch.mini_batches or [(torch.arange(size), 1.0)]) if size else []
        slices = self.micro_slices(batch, torch.arange(size), width) if size else []
        mini_slices = [self.micro_slices(batch, torch.as_tensor(rows), width) for rows, _ in minis]
        plan = Plan(batch, size, width, minis, slices, mini_slices)
        # what every rank must agree on, in two collectives per step whatever the micro-batches
        declares = int(size > 0 and batch.normalizer is not None)
        plan.steps, most_slices, declared = self.ranks.max_each([len(minis), len(slices), declares])
        if plan.steps:  # a rank without rows runs only idle passes and the shared steps
            own = [len(mini_slices[m]) if m < len(minis) else 0 for m in range(plan.steps)]
            plan.passes = self.ranks.max_each(own)
            # fewer micro-batches than another rank: smaller real passes, not idle ones
            unit = self.algorithm.row_group
            if self.model is not None and forward_gathers(self.model):  # sharded: collectives
                plan.slices = _balanced(slices, most_slices, unit)
            plan.idle_forwards = most_slices - len(plan.slices)
            plan.mini_slices = [
                _balanced(pieces, plan.passes[m], unit) for m, pieces in enumerate(mini_slices)
            ]
            plan.minis = self._global_scales(plan, bool(declared))
        return plan

    def _global_scales(self, plan: Plan, declared: bool) -> list:
        """Each mini-batch's loss scale for a mean over the global batch.

        The algorithm's scale makes mini-batch m's loss ``sum(terms) / count_m`` over this
        rank's rows (``count_m = normalizer / scale``: its tokens, rows or pairs). Every rank's
        gradient is then averaged over the W ranks (DDP's all-reduce, FSDP's reduce-scatter,
        DeepSpeed), so a rank's loss must be ``W * sum(terms) / sum over ranks of count_m``.
        Example (token mean, 2 ranks): 30 tokens here, 10 on the other rank: scale
        2 * 30 / 40 = 1.5 on this rank's mean, so the average of the two ranks' losses is the
        sum of all 40 tokens' terms / 40, not the mean of the two ranks' means.
        """
        world, normalizer = self.ranks.world_size, None
        if plan.size:
            normalizer = plan.batch.normalizer
        # every rank takes part in the sum (a collective) when any rank declares a count
        if world < 2 or not declared:
            return plan.minis
        counts = [0.0] * plan.steps  # [steps]: this rank's count of each mini-batch, 0 if none
        for m, (_, scale) in enumerate(plan.minis):
            counts[m] = normalizer / float(scale) if normalizer is not None else 0.0
        totals = self.ranks.sum_over_ranks(counts)
        return [
            (rows, world * normalizer / total if count else scale)
            for (rows, scale), count, total in zip(plan.minis, counts, totals, strict=False)
        ]

    # ---- the update --------------------------------------------------------------------------
    def __call__(self, prepared: Prepared) -> dict[str, torch.Tensor]:
        """mu passes over the batch; each pass is one optimizer step per mini-batch, accumulated
        over micro-batches. Returns the step's ``train/``, ``tokens/`` and ``time/`` metrics
        (``train/skipped_step`` when no rank had anything to learn from)."""
        plan = self.plan(prepared)
        if plan.steps == 0:  # no rank has anything to learn from: no optimizer step anywhere
            return {"train/skipped_step": torch.tensor(1.0)}
        s = self.settings  # the engine's truncation is no engine / trainer gap
        clock, tally = (
            Clock(self.ranks.device),
            Tally(mismatch=Mismatch(s.temperature, s.top_p, s.top_k)),
        )
        with torch.no_grad(), clock("time/reference_s"):
            self._fixed_logprobs(plan)
        optimizer, scheduler = self.hooks.optimizers(), self.hooks.lr_schedulers()
        for epoch in range(self.algorithm.mu):
            for m in range(plan.steps):
                own, scale = ([], 0.0)
                if m < len(plan.minis):
                    own, scale = plan.mini_slices[m], float(plan.minis[m][1])
                self._accumulate(plan, own, plan.passes[m], (scale, epoch), tally, clock)
                with clock("time/optimizer_s"):
                    tally.rates.append(self._optimizer_step(optimizer, scheduler))
        return self._metrics(plan, tally, clock)

    def _optimizer_step(self, optimizer, scheduler) -> float:
        return optimizer_step(
            self.model,
            self.hooks.clip_gradients,
            optimizer,
            scheduler,
            self.settings.max_grad_norm,
        )

    def _fixed_logprobs(self, plan: Plan) -> None:
        """The reference's log-probs and, when the policy takes more than one optimizer step on
        the batch, pi_old's: the policy that sampled, before any update (every optimizer step
        after the first would otherwise take the updated policy as pi_old). A rank without rows
        runs only the idle forwards."""
        algorithm, batch = self.algorithm, plan.batch
        if algorithm.needs_reference:
            ref = self._per_row(
                plan, lambda micro, width, s: self.reference_logprobs(micro, width, plan.packs, s)
            )
            if plan.size:
                batch.ref_logprobs = ref
        if algorithm.mu * algorithm.steps_per_pass > 1:
            model = self.model
            old = self._per_row(
                plan, lambda micro, width, s: self.logprobs(model, micro, width, plan.packs, s)
            )
            if plan.size:
                batch.old_logprobs = old

    def _per_row(self, plan: Plan, fn) -> torch.Tensor:
        """``fn(micro, width)`` over the micro-batches, ``[N, width]`` in batch order. Sharded
        forwards are collectives, so a rank with fewer micro-batches runs idle ones, through
        the same ``fn``: the reference's gathers pair with the reference's on the other ranks,
        the policy's with the policy's."""
        # on the device, fp32 (bf16-true: not the default): no host copy per micro-batch
        out = torch.zeros(plan.size, plan.width, dtype=torch.float32, device=self.ranks.device)
        for s in plan.slices:
            out[s.to(out.device)] = fn(plan.batch.rows(s), plan.width, s).float()
        if forward_gathers(self.model):
            for _ in range(plan.idle_forwards):
                fn(self._idle_batch(), 1, None)
        return out

    def _accumulate(
        self, plan: Plan, own: list, passes: int, at: tuple, tally: Tally, clock: Clock
    ) -> None:
        """One optimizer step's forward and backward passes: this rank's micro-batches, then
        idle passes up to the ``passes`` any rank runs (agreed in :meth:`plan`). ``at``: the
        mini-batch's loss scale and the epoch."""
        engine = deepspeed_engine(self.ranks.strategy)
        for index in range(passes):
            # DeepSpeed reduces gradients at its boundary: the last micro-batch
            if engine is not None:
                engine.set_gradient_accumulation_boundary(index == passes - 1)
                deepspeed_forward_starts(engine)
            with self._reduction(last=index == passes - 1):
                if index >= len(own):
                    with clock("time/backward_s"):
                        self.hooks.manual_backward(self._idle_loss())
                    continue
                self._train_micro(plan, own[index], *at, tally, clock)

    def _reduction(self, last: bool):
        """No gradient reduction before an optimizer step's last pass: where the strategy cannot
        accumulate reduced gradients (:attr:`unsynced`), and under DDP, whose all-reduce then
        runs once per optimizer step on the summed gradient instead of once per micro-batch.
        Every rank runs the same passes, so they reduce together at the last."""
        if last:
            return contextlib.nullcontext()
        if self.unsynced:
            return self.model.no_sync()
        ddp = ddp_module(self.ranks.strategy)
        return ddp.no_sync() if ddp is not None else contextlib.nullcontext()

    def _train_micro(
        self, plan: Plan, rows: torch.Tensor, scale: float, epoch: int, tally: Tally, clock: Clock
    ) -> None:
        micro = plan.batch.rows(rows)
        packed = self.pack(micro, plan.width, plan.packs, rows)
        with clock("time/forward_s"):
            micro.logprobs = self.packed_logprobs(self.model, packed)
        if plan.batch.old_logprobs is None:
            micro.old_logprobs = micro.logprobs.detach()
        fresh = [i for i in micro.on_policy_rows() if int(rows[i]) not in tally.seen]
        if epoch == 0 and fresh:  # trainer vs engine, same weights (not a stale sample's)
            tally.seen.update(rows[fresh].tolist())
            tally.mismatch.add(
                micro.old_logprobs[fresh],
                micro.sampling_logprobs[fresh],
                micro.completion_mask[fresh],
            )
        tally.trained += packed.real_tokens
        tally.predicted += len(packed.targets)
        with clock("time/forward_s"):
            out = self.algorithm.loss(micro.to(self.ranks.device))
        with clock("time/backward_s"):
            self.hooks.manual_backward(out.loss * scale if scale != 1.0 else out.loss)
        # token weights are normalized over the (mini-)batch: its loss is the sum of the
        # micro-batch losses; the other metrics are micro-batch means
        tally.add("train/loss", out.loss.detach() * scale)
        tally.micro_count += 1
        for key, value in out.metrics.items():
            tally.add(f"train/{key}", value)

    def _metrics(self, plan: Plan, tally: Tally, clock: Clock) -> dict[str, torch.Tensor]:
        optimizer_steps = self.algorithm.mu * plan.steps
        metrics = {
            k: v / (optimizer_steps if k == "train/loss" else max(1, tally.micro_count))
            for k, v in tally.sums.items()
        }
        metrics.update(tally.mismatch.metrics())
        # the mean rate of the step's optimizer steps (mu x mini-batches), read before each
        # scheduler.step(): after it the optimizer holds the next step's rate
        metrics["train/lr"] = torch.tensor(sum(tally.rates) / len(tally.rates))
        metrics["tokens/trained"] = torch.tensor(tally.trained)
        flops = self._flops(plan, tally)
        if flops is not None:
            metrics["perf/update_tflop"] = torch.tensor(flops / 1e12)
        metrics.update(clock.metrics())
        if plan.steps > 1:
            metrics["train/optimizer_steps"] = torch.tensor(float(optimizer_steps))
        return metrics

    def _flops(self, plan: Plan, tally: Tally) -> float | None:
        """The model FLOPs of this rank's update (:mod:`~lit_rag.trainer.flops`): its training
        passes and its fixed log-prob forwards (each micro-batch's packing, kept in the plan)."""
        if self.arithmetic is None:
            return None
        algorithm = self.algorithm
        forwards = int(algorithm.needs_reference) + int(algorithm.mu * algorithm.steps_per_pass > 1)
        fixed = [plan.packs[_key(s)] for s in plan.slices if _key(s) in plan.packs]
        positions = sum(p.real_tokens for p in fixed)
        predicted = sum(len(p.targets) for p in fixed)
        trains = not has_adapters(self.model)
        return self.arithmetic.training(
            tally.trained, tally.predicted, trains
        ) + forwards * self.arithmetic.forward(positions, predicted)

    # ---- idle passes -------------------------------------------------------------------------
    def _idle_batch(self) -> TrainBatch:
        return TrainBatch(
            input_ids=torch.full((1, 2), self.settings.pad_id, dtype=torch.long),
            attention_mask=torch.ones(1, 2, dtype=torch.long),
            completion_mask=torch.zeros(1, 1),
            sampling_logprobs=torch.zeros(1, 1),
        )

    def _idle_loss(self) -> torch.Tensor:
        """Zero times the log-prob of one token: a backward pass through every trainable
        parameter that contributes nothing (a rank with fewer micro-batches joins the others'
        gradient reduction with it)."""
        return self.logprobs(self.model, self._idle_batch(), 1).sum() * 0.0
