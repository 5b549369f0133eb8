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

Not in the papers, a lit-rag guard a recipe opts into (docs/methods/eval_rar.md, "Hedged
answers"): a final answer that lists more candidates than the gold ("Paris or Lyon") earns
what ``hedging`` leaves it (:class:`~lit_rag.api.Hedging`). The default, ``count``, is the
papers' reward. The guard reads the extracted answer only, never the ``<evaluate>`` prose,
where ";" and "or" occur in ordinary sentences: R_eval is always Eq. 4's.
"""

from __future__ import annotations

import torch

from lit_rag.api import (
    Hedging,
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


def _outcome(answer: str | None, answers: list[str], hedging: Hedging) -> float:
    """EM of the final answer (Eq. 2), as ``hedging`` leaves it; 0 without an answer."""
    if answer is None:
        return 0.0
    return hedging.apply(exact_match(answer, answers), answer, answers)


class EvalRarReward(Reward):
    """Eval-RAR's reward: EM outcome, else ``r_eval`` for a gold answer inside ``<evaluate>``.

    Example:
        Gold answer "Paris". A trajectory that evaluates "the capital is Paris" and answers
        "Lyon" scores ``outcome 0``, ``evaluation 0.1``, ``total 0.1`` (Eq. 5: the outcome is 0,
        so the total is the evaluation reward). Answering "Paris" scores ``total 1.0`` whatever
        the evaluation says. Evaluating "the capital is Paris or Lyon" and answering "Lyon"
        also scores ``evaluation 0.1``: Eq. 4 asks only that a gold answer occurs in y_eval.

    ``hedging`` defaults to ``count``, the paper's reward. It applies to the final answer only
    (R_ans): with ``cap``, answering "Paris or Lyon" for "Paris" earns ``1 / 2``; the
    evaluation reward is never changed by it.

    Args:
        r_eval: The evaluation reward (the paper: 0.1, Section 5.1).
        answer_tag: Tag of the final answer.
        evaluate_tag: Tag of the evaluation blocks.
        hedging: What a final answer that lists more candidates than the gold earns: ``count``
            (the paper's), ``zero`` or ``cap`` (divided by the number of candidates); see
            :class:`~lit_rag.api.Hedging`.
    """

    def __init__(
        self,
        r_eval: float = 0.1,
        answer_tag: str = "answer",
        evaluate_tag: str = "evaluate",
        hedging: str = "count",
    ) -> None:
        self.r_eval = r_eval
        self.answer_tag = answer_tag
        self.evaluate_tag = evaluate_tag
        self.hedging = Hedging(hedging, key="reward eval_rar hedging")
        self.weights = {"outcome": 1.0, "evaluation": r_eval}

    def set_weights(self, weights: dict[str, float]) -> None:
        super().set_weights(weights)
        self.r_eval = self.weights["evaluation"]

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        outcome, evaluation, total = [], [], []
        for t in trajectories:
            answers = t.example.answers
            r_ans = _outcome(final_answer(t, self.answer_tag), answers, self.hedging)  # Eq. 2
            y_eval = " ".join(tag_blocks(policy_text(t), self.evaluate_tag))  # Eq. 3
            r_eval = self.r_eval if answer_in_text(y_eval, answers) else 0.0  # Eq. 4
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

    ``hedging`` defaults to ``count``, the paper's reward. A recipe may set ``zero``: exact
    match can pay a list of candidates whose separators normalization drops (``"Simon;
    Garfunkel"`` is ``"simon garfunkel"``), and with no credit for a hedge, committing to one
    answer is strictly better than listing several.

    Args:
        answer_tag: Tag of the final answer.
        weight: Multiplies the outcome in ``total``.
        hedging: What an answer that lists more candidates than the gold earns: ``count``
            (the paper's), ``zero`` or ``cap`` (divided by the number of candidates); see
            :class:`~lit_rag.api.Hedging`.
    """

    def __init__(
        self, answer_tag: str = "answer", weight: float = 1.0, hedging: str = "count"
    ) -> None:
        self.answer_tag = answer_tag
        self.hedging = Hedging(hedging, key="reward search_r1 hedging")
        self.weights = {"outcome": weight}

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        scores = [
            _outcome(final_answer(t, self.answer_tag), t.example.answers, self.hedging)
            for t in trajectories
        ]
        outcome = torch.tensor(scores, dtype=torch.float32)
        return RewardBreakdown(
            total=self.weights["outcome"] * outcome, components={"outcome": outcome}
        )
