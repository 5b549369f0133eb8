"""R2AG's Top-Survivor reward (r2ag.md Section 2.4, Eq. 5; Appendix B.2).

For one expansion with base branches ``b_1..b_xb`` and predicted branches ``p_1..p_xp`` (each a
query and its retrieved documents), gold set ``g`` and documents retrieved before ``r_prior``:

- Multi-Hit@top-1: ``R_MH = R_MH^b + l * R_MH^p``, the number of *new* gold documents the base
  (resp. predicted) branches retrieved;
- Joint-Hit@top-1: ``R_JH = 1`` when every gold document is retrieved by now and the output
  says "stop retrieval";
- Top-t/x AP: ``R_AP = R_AP^b + R_AP^p`` with
  ``R_AP^* = 1/|g| * sum_{u=1..t} precision@u * 1{r_u in g}`` over the first ``t`` branches
  (``t = 4`` base, ``t = 2`` predicted);
- format: 0.01 per ``<base-Q>`` / ``<predicted-Q>`` segment after a ``<think>`` block, at most
  0.02 in all;
- ``R = alpha * R_MH + beta * R_JH + gamma * R_AP + R_f`` (alpha 0.2, beta 0.3, gamma 0.2,
  l 1.25), and ``R = 0`` when the output has no ``<think>`` block, when it stops before all
  gold is retrieved, or when it hit the length limit.

Decisions where the formula and the text differ, or are silent:

- Eq. 5 sums indicators over branches, so two branches retrieving the same new gold document
  would count it twice; the text says "the number of newly retrieved gold documents". We count
  each new gold document once (base branches first), so repeating a query earns nothing.
- AP is an average precision (<= 1) and, under Assumption 2.1 (no duplicate documents in the
  database), a repeat brings nothing new (Eq. 2's event E_A is a gold document not in G_r). So
  ``1{r_u in g}`` counts a branch only when it brings a gold document that neither an earlier
  step (``r_prior``) nor an earlier branch of this expansion brought (``ap_hits="new"``, the
  default); base branches come first, then predicted ones, so each gold document is credited at
  most once and ``R_AP = R_AP^b + R_AP^p <= 1``. Read literally, the indicator would credit a
  known gold document every time: four branches re-finding a known gold document of three
  would score ``R_AP = 4/3`` and, at the paper's weights, as much as one new gold document and
  three misses. ``ap_hits="any"`` keeps that literal reading (the earlier behaviour).
- With ``k > 1`` documents per query a branch hits when any of its documents is gold (and, with
  ``ap_hits="new"``, new).

What it reads beyond the steps comes from the environment as an
:class:`~lit_rag.api.R2AGEpisode` (``retrieval_tree``'s): a trajectory without one (another
environment's) is an error naming both, never a zero reward.
"""

from __future__ import annotations

from typing import Literal

import torch

from lit_rag.api import R2AGEpisode, Reward, RewardBreakdown, Trajectory

#: ``ap_hits`` values: credit only new gold (Assumption 2.1), or every gold branch (literal).
AP_HITS = ("new", "any")


def new_gold(branches: list[list[str]], gold: set[str], seen: set[str]) -> int:
    """New gold documents among ``branches`` (each a list of ids); updates ``seen``."""
    count = 0
    for ids in branches:
        for pid in ids:
            if pid in gold and pid not in seen:
                count += 1
                seen.add(pid)
    return count


def top_t_ap(
    branches: list[list[str]], gold: set[str], t: int, seen: set[str] | None = None
) -> float:
    """``1/|g| * sum_{u<=t} precision@u * 1{branch u hits gold}`` over the first ``t`` branches.

    With ``seen`` (the gold already credited: earlier steps and earlier branches), a branch hits
    only when it brings a gold document not in ``seen``, and ``seen`` is updated, so a repeat is
    a miss and the score is at most 1. Without ``seen`` every gold branch counts (the literal
    ``1{r_u in g}``).

    Example:
        >>> top_t_ap([["g1"], ["x"], ["g2"]], {"g1", "g2"}, t=4)  # (1/1 + 2/3) / 2
        0.8333333333333333
        >>> top_t_ap([["g1"], ["g1"]], {"g1", "g2"}, t=4, seen=set())  # repeat: (1/1) / 2
        0.5
    """
    if not gold:
        return 0.0
    hits, total = 0, 0.0
    for u, ids in enumerate(branches[:t], start=1):
        if seen is None:
            hit = any(pid in gold for pid in ids)
        else:
            fresh = {pid for pid in ids if pid in gold and pid not in seen}
            seen |= fresh
            hit = bool(fresh)
        if hit:
            hits += 1
            total += hits / u
    return total / len(gold)


class R2AGReward(Reward):
    """Top-Survivor reward of one retrieval-tree expansion (Eq. 5).

    Args:
        alpha: Weight of Multi-Hit@top-1 (0.2).
        beta: Weight of Joint-Hit@top-1 (0.3).
        gamma: Weight of top-t/x AP (0.2).
        predicted_scale: ``l``, the Multi-Hit multiplier of predicted queries (1.25).
        base_top_t: ``t`` for base queries (4).
        predicted_top_t: ``t`` for predicted queries (2).
        format_per_segment: Format reward per query segment after ``<think>`` (0.01).
        format_max: Cap of the format reward (0.02).
        zero_on_truncation: Total 0 for outputs that hit the length limit (B.2).
        ap_hits: Which gold branches AP counts: ``"new"`` (default) a gold document no earlier
            step or branch brought, each at most once, so AP <= 1 (Assumption 2.1); ``"any"``
            every branch whose document is gold, repeats included (can exceed 1).
    """

    def __init__(
        self,
        alpha: float = 0.2,
        beta: float = 0.3,
        gamma: float = 0.2,
        predicted_scale: float = 1.25,
        base_top_t: int = 4,
        predicted_top_t: int = 2,
        format_per_segment: float = 0.01,
        format_max: float = 0.02,
        zero_on_truncation: bool = True,
        ap_hits: Literal["new", "any"] = "new",
    ) -> None:
        if ap_hits not in AP_HITS:
            raise ValueError(f"reward ap_hits must be one of {', '.join(AP_HITS)}; got {ap_hits!r}")
        for name, value in (("base_top_t", base_top_t), ("predicted_top_t", predicted_top_t)):
            if value < 0:
                raise ValueError(f"reward {name} must be >= 0; got {value}")
        self.weights = {"multi_hit": alpha, "joint_hit": beta, "ap": gamma, "format": 1.0}
        self.predicted_scale = predicted_scale
        self.base_top_t, self.predicted_top_t = base_top_t, predicted_top_t
        self.format_per_segment, self.format_max = format_per_segment, format_max
        self.zero_on_truncation = zero_on_truncation
        self.ap_hits = ap_hits

    def score(self, t: Trajectory) -> dict[str, float]:
        episode = R2AGEpisode.of(t, "reward r2ag")
        gold = set(t.example.gold_ids)
        prior = set(episode.prior)
        base = [s.passage_ids for s in t.steps if s.action == "base"]
        predicted = [s.passage_ids for s in t.steps if s.action == "predicted"]
        seen = set(prior)
        mh_base = new_gold(base, gold, seen)
        mh_predicted = new_gold(predicted, gold, seen)
        complete = bool(gold) and gold <= seen  # seen = prior + everything retrieved now
        stop = episode.stop
        values = {
            "multi_hit": mh_base + self.predicted_scale * mh_predicted,
            "joint_hit": float(complete and stop),
            "ap": self.ap(base, predicted, gold, prior),
            "format": min(self.format_max, self.format_per_segment * episode.segments),
        }
        truncated = self.zero_on_truncation and t.truncated
        zero = not episode.think or (stop and not complete) or truncated
        values["zeroed"] = float(zero)
        return values

    def ap(
        self, base: list[list[str]], predicted: list[list[str]], gold: set[str], prior: set[str]
    ) -> float:
        """``R_AP = R_AP^b + R_AP^p``; with ``ap_hits="new"`` the two share one record of the
        gold already credited (``prior`` first, then base branches), so the sum is at most 1."""
        seen = set(prior) if self.ap_hits == "new" else None
        return top_t_ap(base, gold, self.base_top_t, seen) + top_t_ap(
            predicted, gold, self.predicted_top_t, seen
        )

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        rows = [self.score(t) for t in trajectories]
        components = {
            k: torch.tensor([r[k] for r in rows], dtype=torch.float32)
            for k in ("multi_hit", "joint_hit", "ap", "format", "zeroed")
        }
        total = sum(self.weights[k] * components[k] for k in self.weights)
        total = torch.where(components["zeroed"] > 0, torch.zeros_like(total), total)
        return RewardBreakdown(total=total, components=components)
