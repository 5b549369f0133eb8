"""Question-answering scores: answer normalization, exact match, token F1, tag extraction.

Paper (ARENA, Appendix C): EM lowercases, removes punctuation and the articles a/an/the,
replaces underscores with spaces and collapses whitespace, then compares with every gold
answer; gold answers are lists of aliases and a prediction is right if it matches any of them
(Appendix B). F1 is SQuAD-style token F1 on normalized text, maximised over the gold answers.

What we do: exactly that, in the SQuAD order of operations, with the underscore replacement
moved *before* punctuation removal. The paper lists the steps without an order; because ``_``
is itself in ``string.punctuation``, removing punctuation first would glue ``new_york`` into
``newyork`` and make the underscore step dead code. So ``"New_York"`` normalizes to
``"new york"``.

Departures and decisions where the paper is silent:

- Punctuation is ASCII ``string.punctuation`` and is deleted, not replaced by a space
  (SQuAD's ``normalize_answer``): ``"U.S."`` -> ``"us"``.
- Empty token lists in F1 follow the official SQuAD v2 script: if either side is empty, F1 is
  1.0 when both are empty and 0.0 otherwise. An empty list of gold answers scores 0.0 for both
  EM and F1.
- :func:`extract_tag` takes the content of the last *complete* ``<tag>...</tag>`` pair, so a
  truncated trailing ``<answer>`` without its closing tag does not hide an earlier complete one.
  It uses ``str.rfind`` / ``str.find`` only, so it is linear in the text length.
- A missing answer tag scores 0 (the model did not answer in the required format).
"""

from __future__ import annotations

import re
import string
from collections import Counter

import torch

from lit_rag.plugins.rewards.base import Reward
from lit_rag.types import RewardBreakdown, Trajectory

_PUNCTUATION = str.maketrans("", "", string.punctuation)
# Alternation of three literals between word boundaries: no nested quantifiers, linear time.
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Normalize an answer as in ARENA Appendix C.1.

    Steps, in order: lowercase; replace ``_`` with a space; delete ASCII punctuation; replace
    the whole words ``a``, ``an``, ``the`` with a space; collapse runs of whitespace into one
    space and strip. Underscores go before punctuation because ``_`` is punctuation too.

    Example:
        >>> normalize_answer("  The  Battle_of Hastings, a.k.a. 1066!")
        'battle of hastings aka 1066'

    Args:
        s: Any text.

    Returns:
        The normalized text (possibly empty).
    """
    s = s.lower().replace("_", " ")
    s = s.translate(_PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, answers: list[str]) -> float:
    """Normalized exact match against any alias.

    Example:
        >>> exact_match("the Eiffel Tower.", ["Eiffel Tower", "La tour Eiffel"])
        1.0

    Args:
        prediction: The model's answer.
        answers: Acceptable gold answers (aliases).

    Returns:
        1.0 if the normalized prediction equals any normalized answer, else 0.0 (also 0.0
        when ``answers`` is empty).
    """
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(a) for a in answers))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, answers: list[str]) -> float:
    """SQuAD token F1 on normalized text, maximised over the aliases.

    Example:
        >>> round(f1_score("the city of Paris", ["Paris France"]), 4)
        0.4

        Tokens ``[city, of, paris]`` vs ``[paris, france]``: 1 in common, precision 1/3,
        recall 1/2, F1 = 2 * (1/3) * (1/2) / (1/3 + 1/2) = 0.4.

    Args:
        prediction: The model's answer.
        answers: Acceptable gold answers (aliases).

    Returns:
        The best F1 over ``answers`` in [0, 1]; 0.0 when ``answers`` is empty. If a side has no
        tokens, F1 is 1.0 when both have none and 0.0 otherwise (SQuAD v2 rule).
    """
    pred_tokens = normalize_answer(prediction).split()
    return max((_token_f1(pred_tokens, normalize_answer(a).split()) for a in answers), default=0.0)


def extract_tag(text: str, tag: str) -> str | None:
    """Content of the last complete ``<tag>...</tag>`` pair, stripped.

    The pair is the last opening tag that has a closing tag after it, closed by the first
    closing tag that follows it; the content therefore never contains either tag. Nested input
    such as ``<answer><answer>x</answer></answer>`` gives ``"x"``. Tags are matched literally
    and case-sensitively. Linear time (``str.rfind`` / ``str.find``), never raises.

    Example:
        >>> extract_tag("<answer>draft</answer> then <answer> Paris </answer>", "answer")
        'Paris'
        >>> extract_tag("<answer>Paris", "answer") is None
        True

    Args:
        text: Model output.
        tag: Tag name without brackets, e.g. ``"answer"``.

    Returns:
        The stripped content, or ``None`` if there is no complete pair.
    """
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    last_close = text.rfind(close_tag)
    if last_close < 0:
        return None
    start = text.rfind(open_tag, 0, last_close)
    if start < 0:
        return None
    start += len(open_tag)
    end = text.find(close_tag, start)  # <= last_close, so always found
    return text[start:end].strip()


def tag_blocks(text: str, tag: str) -> list[str]:
    """Stripped contents of every complete ``<tag>...</tag>`` block, in order.

    Linear time (``str.find``), never raises. In ``<t>a<t>b</t>`` the block is ``b`` (the
    innermost opening tag before the closing one).

    Example:
        >>> tag_blocks("<evaluate> a </evaluate> x <evaluate>b</evaluate> <evaluate>c", "evaluate")
        ['a', 'b']
    """
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    blocks, pos = [], 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            return blocks
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            return blocks
        inner = text[start + len(open_tag) : end]
        nested = inner.rfind(open_tag)
        blocks.append((inner[nested + len(open_tag) :] if nested >= 0 else inner).strip())
        pos = end + len(close_tag)


def _predictions(trajectories: list[Trajectory], answer_tag: str | None) -> list[str | None]:
    if not answer_tag:
        return [t.text for t in trajectories]
    return [extract_tag(t.text, answer_tag) for t in trajectories]


class _AnswerReward(Reward):
    """Scores the extracted answer with ``score`` against the gold aliases (one component)."""

    component: str = ""

    def __init__(self, answer_tag: str | None = "answer", weight: float = 1.0) -> None:
        self.answer_tag = answer_tag
        self.weights = {self.component: weight}

    @staticmethod
    def score(prediction: str, answers: list[str]) -> float:
        raise NotImplementedError

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        """Score each trajectory's answer against ``trajectory.example.answers``."""
        scores = [
            0.0 if pred is None else self.score(pred, t.example.answers)
            for pred, t in zip(_predictions(trajectories, self.answer_tag), trajectories)
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

    Args:
        answer_tag: Tag whose last content is the answer; ``None`` (or ``""``) scores the whole
            completion text.
        weight: Multiplies the score in ``total``.
    """

    component = "exact_match"
    score = staticmethod(exact_match)


class F1Reward(_AnswerReward):
    """SQuAD token F1 of the answer, maximised over the gold aliases.

    Example:
        ``"<answer>the city of Paris</answer>"`` against ``["Paris France"]``: precision 1/3,
        recall 1/2, so ``total = weight * 0.4 = 0.4``.

    Args:
        answer_tag: Tag whose last content is the answer; ``None`` (or ``""``) scores the whole
            completion text.
        weight: Multiplies the score in ``total``.
    """

    component = "f1"
    score = staticmethod(f1_score)
