"""Rewards for multi-turn search agents: Eval-RAR (Section 4.2, Eq. 2-5) and Search-R1.

Eval-RAR:

- outcome, Eq. 2: ``R_ans = 1`` if the extracted final answer equals a gold answer (EM after
  normalization), else 0;
- evaluation, Eq. 3-4: concatenate every ``<evaluate>...</evaluate>`` block of the trajectory
  into ``y_eval``; ``R_eval = r_eval`` if some gold answer is a substring of ``y_eval``, else 0;
- total, Eq. 5: ``R_ans`` when it is positive, else ``R_eval``.

Search-R1's reward is the outcome alone (the "w/o evaluation reward" rows of Table 2).

Both read only what the policy wrote (:func:`policy_text`: the environment's steps, never the
inserted ``<information>`` documents, so a document containing ``<answer>`` or
``<evaluate>`` cannot score). The paper does not say how "``a ⊆ y_eval``" normalizes; we
compare normalized texts (:func:`normalize_answer` on both sides), so case, punctuation and
articles do not matter, and an empty normalized answer never matches. The final answer is the
last complete ``<answer>`` block (a trajectory without one scores 0 on the outcome).
"""

from __future__ import annotations

import torch

from lit_rag.api import (
    Reward,
    RewardBreakdown,
    Trajectory,
    exact_match,
    final_answer,
    normalize_answer,
    policy_text,
    tag_blocks,
)


def answer_in_text(text: str, answers: list[str]) -> bool:
    """True when a normalized gold answer is a substring of the normalized ``text`` (Eq. 4)."""
    haystack = normalize_answer(text)
    return any((needle := normalize_answer(a)) and needle in haystack for a in answers)


class EvalRarReward(Reward):
    """Eval-RAR's reward: EM outcome, else ``r_eval`` for a gold answer inside ``<evaluate>``.

    Example:
        Gold answer "Paris". A trajectory that evaluates "the capital is Paris" and answers
        "Lyon" scores ``outcome 0``, ``evaluation 0.1``, ``total 0.1`` (Eq. 5: the outcome is 0,
        so the total is the evaluation reward). Answering "Paris" scores ``total 1.0`` whatever
        the evaluation says.

    Args:
        r_eval: The evaluation reward (the paper: 0.1, Section 5.1).
        answer_tag: Tag of the final answer.
        evaluate_tag: Tag of the evaluation blocks.
    """

    def __init__(
        self, r_eval: float = 0.1, answer_tag: str = "answer", evaluate_tag: str = "evaluate"
    ) -> None:
        self.r_eval = r_eval
        self.answer_tag = answer_tag
        self.evaluate_tag = evaluate_tag
        self.weights = {"outcome": 1.0, "evaluation": r_eval}

    def set_weights(self, weights: dict[str, float]) -> None:
        super().set_weights(weights)
        self.r_eval = self.weights["evaluation"]

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        outcome, evaluation, total = [], [], []
        for t in trajectories:
            answer = final_answer(t, self.answer_tag)
            r_ans = 0.0 if answer is None else exact_match(answer, t.example.answers)  # Eq. 2
            y_eval = " ".join(tag_blocks(policy_text(t), self.evaluate_tag))  # Eq. 3
            r_eval = self.r_eval if answer_in_text(y_eval, t.example.answers) else 0.0  # Eq. 4
            outcome.append(r_ans)
            evaluation.append(r_eval)
            total.append(self.weights["outcome"] * r_ans if r_ans > 0 else r_eval)  # Eq. 5
        return RewardBreakdown(
            total=torch.tensor(total, dtype=torch.float32),
            components={
                "outcome": torch.tensor(outcome, dtype=torch.float32),
                "evaluation": torch.tensor(evaluation, dtype=torch.float32),
            },
        )


class SearchR1Reward(Reward):
    """Search-R1's outcome-only reward: EM of the final answer (1/0).

    Args:
        answer_tag: Tag of the final answer.
        weight: Multiplies the outcome in ``total``.
    """

    def __init__(self, answer_tag: str = "answer", weight: float = 1.0) -> None:
        self.answer_tag = answer_tag
        self.weights = {"outcome": weight}

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        scores = []
        for t in trajectories:
            answer = final_answer(t, self.answer_tag)
            scores.append(0.0 if answer is None else exact_match(answer, t.example.answers))
        outcome = torch.tensor(scores, dtype=torch.float32)
        return RewardBreakdown(
            total=self.weights["outcome"] * outcome, components={"outcome": outcome}
        )
