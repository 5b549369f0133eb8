"""DPO over sibling branches (EVO-RAG, evo_rag.txt Sections 3.3-3.4, Algorithm 1; Rafailov et al.,
2023).

Pairs: trajectories that branch from the same state (the :class:`~lit_rag.api.Branch` an
environment hands on, EVO-RAG's ``EvoRagBranch``; else the prompt group) are siblings. At each
state one pair is selected (Section 3.4, "at each state select one positive/negative action
pair with margin delta = 0.2"): among the siblings that took different actions there (Section
3.3, "two trajectory branches ending in different actions"; two identical completions give DPO
no gradient and would only take a slot), the pair with the largest return gap, kept when that
gap is at least ``margin``. The return is the sum over steps of a step-level reward
(``[N, T]``) or the reward itself (``[N]``).

Loss per pair, with sequence log-probs ``log pi(x) = sum_t log pi(x_t)`` over the policy's tokens:

    standard:        -log sigmoid(beta * [(log pi(x+) - log ref(x+)) - (log pi(x-) - log ref(x-))])
    reference_free:  -log sigmoid(beta * [log pi(x+) - log pi(x-)])      (the paper's Eq.)

beta = 0.1, averaged over the pairs of one optimizer step. The standard form uses the reference
model (the LoRA-disabled base); the paper's equation omits it, which ``reference_free`` reproduces.

The loop (Algorithm 1, lines 3-12): ``collect_steps`` rollout steps store their pairs without
an update (M episodes = ``collect_steps`` x questions per step), then the policy is fine-tuned
for ``epochs`` epochs (E) over every stored pair, in shuffled mini-batches of ``max_pairs``
pairs, one optimizer step each (Section 3.4: effective batch 64), and the store is emptied.
``collect_steps: 1, epochs: 1`` is the online variant (each step's pairs, once, in one optimizer
step; ``max_pairs`` then keeps the largest gaps and drops the rest). The store is plain tensors
in the checkpoint (``state_dict``), so a resumed run continues the same collection. Lightning's
``global_step`` counts optimizer steps (none while collecting, ``E x ceil(pairs / max_pairs)``
at an update): bound such runs by ``max_epochs``; a decaying ``lr_schedule`` takes its length
from the training batches, not from these steps (the EVO-RAG recipes use a constant rate).

Pair selection by the reward model (an option, not the paper's default): with ``selection:
reward_model`` and a scorer attached (the :class:`~lit_rag.callbacks.AlternatingRewardModel`
callback attaches the trained ``RewardModelModule`` after its first epoch), siblings are ranked
by the model's score (the sum of its heads, a logit scale) and ``margin`` applies to the score
gap: 0.2 there means a preference probability sigmoid(0.2) = 0.55 for the chosen branch. Before
a scorer exists the returns are used.

The micro-batch size (the policy's ``micro_batch_size``, in rows, two per pair) sets the
accumulation: 64 pairs in micro-batches of 16 rows = 8 micro-batches (8-fold accumulation).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from lit_rag.api import (
    Algorithm,
    Branch,
    LossOutput,
    Prepared,
    RewardBreakdown,
    TrainBatch,
    Trajectory,
    collate,
)

SELECTIONS = ("return", "reward_model")


def preference_pairs(
    trajectories: list[Trajectory], returns: torch.Tensor, margin: float
) -> list[tuple[int, int]]:
    """(chosen, rejected) indices: per state, the siblings with different actions that are
    furthest apart, when apart by ``margin``."""
    states: dict[object, list[int]] = {}
    for i, t in enumerate(trajectories):
        branch = Branch.find(t, "algorithm dpo")
        states.setdefault((t.example.id, t.group if branch is None else branch.state), []).append(i)
    pairs = []
    for members in states.values():
        ranked = sorted(members, key=lambda i: -float(returns[i]))  # best first (stable on ties)
        best: tuple[float, int, int] | None = None
        for a_pos, a in enumerate(ranked):
            for b in ranked[a_pos + 1 :]:
                gap = float(returns[a] - returns[b])
                if (best is None or gap > best[0]) and not trajectories[a].same_completion(
                    trajectories[b]
                ):
                    best = (gap, a, b)
        if best is not None and best[0] >= margin:
            pairs.append((best[1], best[2]))
    return pairs


def _row(t: Trajectory) -> dict[str, torch.Tensor]:
    """What training needs of a trajectory (plain tensors: storable in a checkpoint)."""
    return {
        "prompt_ids": t.prompt_ids.clone(),
        "completion_ids": t.completion_ids.clone(),
        "loss_mask": t.loss_mask.clone(),
        "sampling_logprobs": t.sampling_logprobs.clone(),
    }


class _Row(SimpleNamespace):
    """A stored row as ``collate`` reads it."""


class DPO(Algorithm):
    """Direct Preference Optimization on sibling branches.

    Args:
        beta: Inverse temperature (0.1).
        margin: Least return gap for a pair (delta = 0.2).
        reference_free: Drop the reference terms (the paper's equation).
        selection: Rank siblings by their ``return`` (the paper) or by the ``reward_model``'s score.
        max_pairs: Most pairs per optimizer step over all ranks (the paper's batch, whatever
            the device count: each rank takes ``ceil(max_pairs / ranks)`` of its own pairs);
            None: all of them in one step.
        collect_steps: Rollout steps whose pairs are stored before an update (Algorithm 1's M
            episodes); 1 with ``epochs: 1`` is the online variant.
        epochs: Passes over the stored pairs per update (Algorithm 1's E).
        seed: Shuffles the stored pairs into mini-batches (with the update count).
    """

    #: rows of one pair stay together in a micro-batch (chosen, rejected)
    row_group = 2

    def __init__(
        self,
        beta: float = 0.1,
        margin: float = 0.2,
        reference_free: bool = False,
        selection: str = "return",
        max_pairs: int | None = None,
        collect_steps: int = 1,
        epochs: int = 1,
        seed: int = 0,
    ) -> None:
        if beta <= 0:
            raise ValueError(f"dpo beta must be > 0, got {beta}")
        if selection not in SELECTIONS:
            raise ValueError(
                f"dpo selection '{selection}' is not known; allowed: {', '.join(SELECTIONS)}"
            )
        if max_pairs is not None and max_pairs < 1:
            raise ValueError(f"dpo max_pairs must be >= 1 or null, got {max_pairs}")
        if collect_steps < 1 or epochs < 1:
            raise ValueError(
                f"dpo collect_steps and epochs must be >= 1, got {collect_steps}, {epochs}"
            )
        self.beta, self.margin, self.reference_free = beta, margin, reference_free
        self.selection, self.max_pairs = selection, max_pairs
        self.collect_steps, self.epochs, self.seed = collect_steps, epochs, seed
        #: ``trajectories -> [N]`` preference scores; set by the reward-model callback
        #: (``wants_scorer``)
        self.scorer: Callable[[list[Trajectory]], torch.Tensor] | None = None
        self.mu = 1
        self.stored: list[dict] = []  # {"chosen": row, "rejected": row, "gap": float}
        self.collected = 0  # rollout steps stored since the last update
        self.updates = 0

    @property
    def online(self) -> bool:
        return self.collect_steps == 1 and self.epochs == 1

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        return not self.reference_free

    @property
    def wants_scorer(self) -> bool:  # type: ignore[override]
        return self.selection == "reward_model"

    def select(
        self, trajectories: list[Trajectory], rewards: RewardBreakdown
    ) -> tuple[list[tuple[int, int]], dict]:
        """This step's pairs and their metrics (the largest gaps first when capped online)."""
        total = rewards.total.float()
        returns = total.sum(-1) if total.dim() == 2 else total
        metrics: dict[str, torch.Tensor] = {}
        by_model = (
            self.selection == "reward_model" and self.scorer is not None and len(trajectories) > 0
        )
        if by_model:
            scores = self.scorer(trajectories).float().cpu()
            pairs = preference_pairs(trajectories, scores, self.margin)
            if pairs:  # how often the reward model's choice is also the better return
                metrics["rm_agreement"] = torch.tensor(
                    [float(returns[c] > returns[r]) for c, r in pairs]
                ).mean()
        else:
            pairs = preference_pairs(trajectories, returns, self.margin)
        metrics["pairs"] = torch.tensor(float(len(pairs)))
        cap = self.pairs_per_rank()
        if self.online and cap is not None and len(pairs) > cap:
            ranking = scores if by_model else returns
            pairs = sorted(pairs, key=lambda p: -float(ranking[p[0]] - ranking[p[1]]))[:cap]
        if pairs:
            metrics["return_gap"] = torch.tensor(
                [float(returns[c] - returns[r]) for c, r in pairs]
            ).mean()
        return pairs, metrics

    def prepare(
        self,
        trajectories: list[Trajectory],
        rewards: RewardBreakdown,
        max_groups: int | None = None,
    ) -> Prepared:
        pairs, metrics = self.select(trajectories, rewards)
        self.stored += [
            {"chosen": _row(trajectories[c]), "rejected": _row(trajectories[r])} for c, r in pairs
        ]
        self.collected += 1
        if self.collected < self.collect_steps:  # Algorithm 1, lines 3-11: collect, no update yet
            metrics["pairs_stored"] = torch.tensor(float(len(self.stored)))
            return Prepared(batch=None, metrics=metrics)
        stored, self.stored, self.collected = self.stored, [], 0  # line 12: fine-tune on them
        metrics["pairs_used"] = torch.tensor(float(len(stored)))
        if not stored:
            return Prepared(batch=None, metrics=metrics)
        rows = [
            _Row(**pair[side]) for pair in stored for side in ("chosen", "rejected")
        ]  # c0, r0, c1, r1, ...
        batch = collate(rows)
        batch.mini_batches = self.mini_batches(len(stored))
        batch.normalizer = 1.0  # the loss sums its pairs; a mini-batch's scale is 1 / pairs
        self.updates += 1
        return Prepared(batch=batch, metrics=metrics)

    def mini_batches(self, n_pairs: int) -> list[tuple[torch.Tensor, float]]:
        """``epochs`` shuffled passes over the pairs in chunks of this rank's share of
        ``max_pairs``: (rows, 1 / pairs)."""
        per_step = self.pairs_per_rank() or n_pairs
        if self.online:  # one step over this step's pairs, in order
            orders = [torch.arange(n_pairs)]
        else:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.updates)
            orders = [torch.randperm(n_pairs, generator=generator) for _ in range(self.epochs)]
        out = []
        for order in orders:
            for chunk in order.split(per_step):
                # chosen, rejected together
                rows = (chunk.unsqueeze(-1) * 2 + torch.arange(2)).flatten()
                out.append((rows, 1.0 / len(chunk)))
        return out

    def pairs_per_rank(self) -> int | None:
        """This rank's pairs per optimizer step: ``max_pairs`` shared over the ranks.

        Example: ``max_pairs: 64`` on 8 ranks gives 8 pairs a rank (64 a step, as on one)."""
        if self.max_pairs is None:
            return None
        return -(-self.max_pairs // self.placement.world_size)

    def loss(self, batch: TrainBatch) -> LossOutput:
        mask = batch.completion_mask  # [2P, C]
        keep = mask > 0
        logp = torch.where(keep, batch.logprobs, 0.0).sum(-1)  # [2P] sequence log-probs
        if not self.reference_free:
            logp = logp - torch.where(keep, batch.ref_logprobs, 0.0).sum(-1)
        chosen, rejected = logp[0::2], logp[1::2]  # [P]
        margin = self.beta * (chosen - rejected)
        # the policy module scales by 1 / pairs of the optimizer step
        loss = -F.logsigmoid(margin).sum()
        return LossOutput(
            loss=loss,
            metrics={
                "reward_margin": margin.detach().mean(),
                "pair_accuracy": (margin.detach() > 0).float().mean(),
            },
        )

    # ---- checkpoint ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"stored": self.stored, "collected": self.collected, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.stored = list(state.get("stored", []))
        self.collected = int(state.get("collected", 0))
        self.updates = int(state.get("updates", 0))
