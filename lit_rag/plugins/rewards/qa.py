"""Question-answering rewards: exact match and token F1 of the extracted answer.

The scoring rules (normalization, empty answers, tag extraction) and where they depart from the
papers are in :mod:`lit_rag.text`, which every plugin shares through :mod:`lit_rag.api`. Both
read only what the policy wrote (``Trajectory.policy_text``; a tool agent's answer is the one
it gave, the answer tool's argument), and both apply a
:class:`~lit_rag.api.Hedging` guard to answers that list candidates.
"""

from __future__ import annotations

import torch

from lit_rag.api import (
    Hedging,
    Reward,
    RewardBreakdown,
    ToolEpisode,
    Trajectory,
    check_punctuation,
    exact_match,
    extract_tag,
    f1_score,
)


def _predictions(trajectories: list[Trajectory], answer_tag: str | None) -> list[str | None]:
    """Each trajectory's answer: a tool agent's (the answer it gave, :class:`ToolEpisode`), else
    the ``answer_tag`` block of the policy's text (the whole text without a tag)."""
    found = []
    for t in trajectories:
        episode = ToolEpisode.find(t, "reward (answer)")
        if episode is not None:
            found.append(episode.answer)
        elif not answer_tag:
            found.append(t.policy_text)
        else:
            found.append(extract_tag(t.policy_text, answer_tag))
    return found


class _AnswerReward(Reward):
    """Scores the extracted answer with ``score`` against the gold aliases (one component)."""

    component: str = ""

    def __init__(
        self,
        answer_tag: str | None = "answer",
        weight: float = 1.0,
        punctuation: str = "delete",
        hedging: str = "count",
    ) -> None:
        self.answer_tag = answer_tag
        self.weights = {self.component: weight}
        self.punctuation = check_punctuation(punctuation, f"{self.component} punctuation")
        self.hedging = Hedging(hedging, key=f"reward {self.component} hedging")

    @staticmethod
    def score(prediction: str, answers: list[str], punctuation: str = "delete") -> float:
        raise NotImplementedError

    def _score(self, prediction: str | None, answers: list[str]) -> float:
        """``score``, as the hedging mode leaves it; 0 without an answer."""
        if prediction is None:
            return 0.0
        return self.hedging.apply(
            self.score(prediction, answers, self.punctuation), prediction, answers
        )

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        """Score each trajectory's answer against ``trajectory.example.answers``."""
        scores = [
            self._score(pred, t.example.answers)
            for pred, t in zip(
                _predictions(trajectories, self.answer_tag), trajectories, strict=True
            )
        ]
        values = torch.tensor(scores, dtype=torch.float32)  # [N]
        total = self.weights[self.component] * values
        return RewardBreakdown(total=total, components={self.component: values})


class ExactMatchReward(_AnswerReward):
    """Normalized exact match of the answer against any gold alias (ARENA's accuracy reward).

    Example:
        A completion ``"<answer>The Eiffel Tower</answer>"`` for an example with answers
        ``["Eiffel Tower"]`` scores ``total = weight * 1.0 = 1.0``; ``"Eiffel Tower"`` without
        tags scores 0.0 (no ``<answer>`` tag) unless ``answer_tag=None``.

    ``hedging`` defaults to ``count`` (plain exact match). A recipe may set ``zero``: a list of
    candidates can still match a gold alias once normalization drops its separators
    (``"Simon; Garfunkel"`` is ``"simon garfunkel"``); with no credit for a hedge, committing to
    one answer is strictly better than listing several.

    Args:
        answer_tag: Tag whose last content is the answer; ``None`` (or ``""``) scores the whole
            completion text.
        weight: Multiplies the score in ``total``.
        punctuation: ``delete`` (SQuAD, Search-R1) or ``space`` (ARENA's release); see
            :func:`normalize_answer`.
        hedging: What an answer that lists more candidates than the gold earns: ``zero``,
            ``cap`` (the score divided by the number of candidates) or ``count`` (the score);
            see :class:`~lit_rag.api.Hedging`.
    """

    component = "exact_match"
    score = staticmethod(exact_match)


class F1Reward(_AnswerReward):
    """SQuAD token F1 of the answer, maximised over the gold aliases.

    Example:
        ``"<answer>the city of Paris</answer>"`` against ``["Paris France"]``: precision 1/3,
        recall 1/2, so ``total = weight * 0.4 = 0.4``. ``"<answer>Paris or Lyon</answer>"``
        against ``["Paris"]`` has F1 0.5 (precision 1/3, recall 1); it hedges, so with
        ``hedging: zero`` it scores 0.0.

    ``hedging`` defaults to ``count`` (plain F1). A recipe may set ``zero``: token F1 pays an
    answer that lists candidates (the gold is among them), and with no credit for a hedge,
    committing to one answer is strictly better than listing several.

    Args:
        answer_tag: Tag whose last content is the answer; ``None`` (or ``""``) scores the whole
            completion text.
        weight: Multiplies the score in ``total``.
        punctuation: ``delete`` (SQuAD, Search-R1) or ``space`` (ARENA's release); see
            :func:`normalize_answer`.
        hedging: What an answer that lists more candidates than the gold earns: ``zero``,
            ``cap`` (the score divided by the number of candidates) or ``count`` (the score);
            see :class:`~lit_rag.api.Hedging`.
    """

    component = "f1"
    score = staticmethod(f1_score)
