"""Example lit-rag plugins: rewards that prefer concise answers, and a median-baseline advantage.

Registered in this package's pyproject.toml, so a recipe names them without importing anything:
``length_penalty`` (:class:`LengthPenaltyReward`, below) and ``brevity`` (a plain function,
:mod:`lit_rag_length_penalty.brevity`) in ``lit_rag.rewards``; ``median_baseline``
(:mod:`lit_rag_length_penalty.median_baseline`) in ``lit_rag.advantages``.
"""

from __future__ import annotations

import torch

from lit_rag.api import Reward, RewardBreakdown, Trajectory, extract_tag

__all__ = ["LengthPenaltyReward", "length_score"]


def length_score(answer: str | None, max_words: int) -> float:
    """1.0 up to ``max_words`` words, linear down to 0.0 at ``2 * max_words``; 0.0 if ``None``.

    Example:
        >>> length_score("the Eiffel Tower", 5)
        1.0
        >>> length_score("the tall iron tower in central Paris", 5)
        0.6

        7 words with ``max_words = 5``: 1 - (7 - 5) / 5 = 0.6.

    Args:
        answer: The answer text (words are whitespace-separated runs), or ``None``.
        max_words: Longest answer that keeps the full score (>= 1).

    Returns:
        The score in [0, 1].
    """
    if answer is None:
        return 0.0
    words = len(answer.split())
    return max(0.0, min(1.0, 1.0 - (words - max_words) / max_words))


class LengthPenaltyReward(Reward):
    """Rewards a short ``<answer>``: "answer in a few words".

    Example:
        With ``max_words=5``, ``"<answer>Paris</answer>"`` (1 word) scores 1.0;
        ``"<answer>the tall iron tower in central Paris</answer>"`` (7 words) scores
        1 - (7 - 5) / 5 = 0.6; 10 or more words, or no complete ``<answer>`` pair, score 0.0.
        ``total = weight * length``.

    Args:
        max_words: Longest answer (in whitespace-separated words) that keeps the full score;
            the score falls linearly to 0 at ``2 * max_words``.
        weight: Multiplies the score in ``total``.
    """

    def __init__(self, max_words: int = 5, weight: float = 1.0) -> None:
        if max_words < 1:
            raise ValueError(f"max_words: got {max_words}; give a whole number >= 1")
        self.max_words = max_words
        self.weights = {"length": weight}

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        """Score the last complete ``<answer>`` of each trajectory by its word count."""
        scores = [
            length_score(extract_tag(t.policy_text, "answer"), self.max_words) for t in trajectories
        ]
        length = torch.tensor(scores, dtype=torch.float32)  # [N]
        return RewardBreakdown(total=self.weights["length"] * length, components={"length": length})
