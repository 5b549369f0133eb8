"""DPO over sibling branches (EVO-RAG, evo_rag.txt Section 3.4; Rafailov et al., 2023).

Pairs: trajectories that branch from the same state (``trajectory.meta["state"]``, else the
prompt group) are siblings; at each state the branch with the highest return and the one with
the lowest form a pair when their returns differ by at least ``margin`` (delta = 0.2). The
return is the sum over steps of a step-level reward (``[N, T]``) or the reward itself (``[N]``).

Loss per pair, with sequence log-probs ``log pi(x) = sum_t log pi(x_t)`` over the policy's tokens:

    standard:        -log sigmoid(beta * [(log pi(x+) - log ref(x+)) - (log pi(x-) - log ref(x-))])
    reference_free:  -log sigmoid(beta * [log pi(x+) - log pi(x-)])      (the paper's Eq.)

beta = 0.1. The standard form uses the reference model (the LoRA-disabled base); the paper's
equation omits it, which ``reference_free`` reproduces.

Pair selection by the reward model (Section 3.3: the multi-head preference model "ranks sibling
actions"): with ``selection: reward_model`` and a scorer attached (the
:class:`~lit_rag.callbacks.AlternatingRewardModel` callback attaches the trained
``RewardModelModule`` after its first epoch), siblings are ranked by the model's score and
``margin`` applies to the score gap. Before a scorer exists the returns are used. The paper
does not say which scale delta applies to under the reward model; this is our reading.

Effective batch (Section 3.4: 64 pairs, 8-fold accumulation): ``max_pairs`` caps the pairs of
one optimizer step (the largest gaps are kept) and the policy's ``micro_batch_size`` (in rows,
two per pair) sets the accumulation: 64 pairs in micro-batches of 16 rows = 8 micro-batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from collections.abc import Callable

from lit_rag.plugins.algorithms.base import Algorithm, LossOutput
from lit_rag.plugins.algorithms.batching import collate
from lit_rag.types import RewardBreakdown, Trajectory


SELECTIONS = ("return", "reward_model")


def preference_pairs(trajectories: list[Trajectory], returns: torch.Tensor, margin: float) -> list[tuple[int, int]]:
    """(chosen, rejected) indices: best and worst sibling per state, when apart by ``margin``."""
    states: dict[object, list[int]] = {}
    for i, t in enumerate(trajectories):
        states.setdefault((t.example.id, t.meta.get("state", t.group)), []).append(i)
    pairs = []
    for members in states.values():
        if len(members) < 2:
            continue
        best = max(members, key=lambda i: float(returns[i]))
        worst = min(members, key=lambda i: float(returns[i]))
        if float(returns[best] - returns[worst]) >= margin:
            pairs.append((best, worst))
    return pairs


class DPO(Algorithm):
    """Direct Preference Optimization on sibling branches.

    Args:
        beta: Inverse temperature (0.1).
        margin: Least return gap for a pair (delta = 0.2).
        reference_free: Drop the reference terms (the paper's equation).
        selection: Rank siblings by their ``return`` or by the ``reward_model``'s score.
        max_pairs: Most pairs per optimizer step (largest gaps first); None keeps all.
    """

    #: rows of one pair stay together in a micro-batch (chosen, rejected)
    row_group = 2

    def __init__(self, beta: float = 0.1, margin: float = 0.2, reference_free: bool = False,
                 selection: str = "return", max_pairs: int | None = None) -> None:
        if beta <= 0:
            raise ValueError(f"dpo beta must be > 0, got {beta}")
        if selection not in SELECTIONS:
            raise ValueError(f"dpo selection '{selection}' is not known; allowed: {', '.join(SELECTIONS)}")
        if max_pairs is not None and max_pairs < 1:
            raise ValueError(f"dpo max_pairs must be >= 1 or null, got {max_pairs}")
        self.beta, self.margin, self.reference_free = beta, margin, reference_free
        self.selection, self.max_pairs = selection, max_pairs
        #: ``trajectories -> [N]`` preference scores; set by the reward-model callback
        self.scorer: Callable[[list[Trajectory]], torch.Tensor] | None = None
        self.mu = 1

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        return not self.reference_free

    def prepare(self, trajectories: list[Trajectory], rewards: RewardBreakdown) -> dict:
        total = rewards.total.float()
        returns = total.sum(-1) if total.dim() == 2 else total
        metrics: dict[str, torch.Tensor] = {}
        by_model = self.selection == "reward_model" and self.scorer is not None and len(trajectories) > 0
        if by_model:
            scores = self.scorer(trajectories).float().cpu()
            pairs = preference_pairs(trajectories, scores, self.margin)
            if pairs:  # how often the reward model's choice is also the better return
                metrics["rm_agreement"] = torch.tensor([float(returns[c] > returns[r]) for c, r in pairs]).mean()
        else:
            pairs = preference_pairs(trajectories, returns, self.margin)
        metrics["pairs"] = torch.tensor(float(len(pairs)))
        if self.max_pairs is not None and len(pairs) > self.max_pairs:
            ranking = scores if by_model else returns
            pairs = sorted(pairs, key=lambda p: -float(ranking[p[0]] - ranking[p[1]]))[: self.max_pairs]
        metrics["pairs_used"] = torch.tensor(float(len(pairs)))
        if not pairs:
            return {"size": 0, "metrics": metrics}
        rows = [trajectories[i] for pair in pairs for i in pair]  # c0, r0, c1, r1, ...
        batch = collate(rows)
        gaps = torch.tensor([float(returns[c] - returns[r]) for c, r in pairs])
        metrics["return_gap"] = gaps.mean()
        batch.update(size=len(rows), metrics=metrics,
                     pair_weight=torch.full((len(rows),), 1.0 / len(pairs)))
        return batch

    def loss(self, batch: dict) -> LossOutput:
        mask = batch["completion_mask"]  # [2P, C]
        keep = mask > 0
        logp = torch.where(keep, batch["logprobs"], 0.0).sum(-1)  # [2P] sequence log-probs
        if not self.reference_free:
            logp = logp - torch.where(keep, batch["ref_logprobs"], 0.0).sum(-1)
        chosen, rejected = logp[0::2], logp[1::2]  # [P]
        margin = self.beta * (chosen - rejected)
        weight = batch["pair_weight"][0::2]
        loss = -(F.logsigmoid(margin) * weight).sum()
        return LossOutput(loss=loss, metrics={
            "reward_margin": margin.detach().mean(),
            "pair_accuracy": (margin.detach() > 0).float().mean(),
        })
