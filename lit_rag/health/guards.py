"""Guards on what a reward scores (docs/DESIGN.md, "Run health"): answers that hedge by listing
several candidates, answers copied from the prompt's worked example, and policy text copied
verbatim from a retrieved passage.

Each is a plain function over text, so a reward applies it and a run measures it the same way
(``rollout/hedged_answers``, ``rollout/example_copy_rate``, ``rollout/passage_copy_rate``). They
read untrusted model text: they never raise and never eval.

Hedging. A substring or token-overlap score pays an answer that lists candidates ("Paris or
Lyon or Nice" contains "Paris"; its token F1 against "Paris" is 0.5), and exact match pays
one whenever the gold answer is itself a list. An answer hedges when it lists more candidates
than every gold alias does, candidates being what disjunctions separate ("or", "and/or",
"/" between words, "|", ";", and the commas of "A, B or C"). A plain comma does not separate
candidates ("Paris, France" is one answer), nor does "and" (a gold answer may be a pair).
What a reward does with a hedged answer is :class:`Hedging`'s mode: ``count`` (the paper's
score: the guard only measures; every reward's default, so a paper recipe trains on the paper's
reward), ``zero`` (no credit) or ``cap`` (the credit divided by the number of candidates: what
one guess among them would earn in expectation), which a recipe opts into. A reward applies it
to an extracted answer only, never to prose (Eval-RAR's ``<evaluate>`` blocks), where ";" and
"or" occur in ordinary sentences; :func:`hedged_text` measures prose.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from lit_rag.text import exact_match, normalize_answer, tag_blocks

#: What a reward may do with a hedged answer (:class:`Hedging`).
HEDGING_MODES = ("zero", "cap", "count")

_DISJUNCTION = re.compile(
    r",\s*or\s+|\s+and/or\s+|\s+or\s+|\s/\s|(?<=[^\W\d])/(?=[^\W\d])|\s*\|\s*|\s*;\s*",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def answer_candidates(answer: str) -> list[str]:
    """The candidates ``answer`` lists, normalized: split at disjunctions and, when it has one,
    at its commas too ("A, B or C" is three). One candidate for an answer without any.

    >>> answer_candidates("Paris or Lyon, or Nice")
    ['paris', 'lyon', 'nice']
    >>> answer_candidates("Paris, France")
    ['paris france']
    """
    parts = _DISJUNCTION.split(answer or "")
    if len(parts) > 1:
        parts = [piece for part in parts for piece in part.split(",")]
    return [p for p in (normalize_answer(part) for part in parts) if p]


def hedged(answer: str | None, answers: Sequence[str]) -> bool:
    """Whether ``answer`` lists more candidates than every gold alias (and at least two)."""
    if not answer:
        return False
    n = len(answer_candidates(answer))
    gold = max((len(answer_candidates(a)) for a in answers), default=1)
    return n > max(gold, 1)


def hedged_text(text: str | None, answers: Sequence[str]) -> bool:
    """Whether free text (Eval-RAR's ``<evaluate>`` blocks) names a gold answer only inside
    hedges: every sentence that contains a gold answer lists more candidates than the gold."""
    if not text:
        return False
    golds = [g for g in (normalize_answer(a) for a in answers) if g]
    naming = [s for s in _SENTENCE.split(text) if any(g in normalize_answer(s) for g in golds)]
    return bool(naming) and all(hedged(s, answers) for s in naming)


def check_hedging(mode: str, key: str = "hedging") -> str:
    if mode not in HEDGING_MODES:
        raise ValueError(f"{key} '{mode}' is not known; allowed: {', '.join(HEDGING_MODES)}")
    return mode


class Hedging:
    """What a reward does with a score earned by a hedged answer (module doc).

    Example:
        >>> Hedging("cap").apply(1.0, "Paris or Lyon", ["Paris"])
        0.5
        >>> Hedging("zero").apply(0.5, "Paris or Lyon", ["Paris"])
        0.0

    Args:
        mode: ``count`` (the default: the score as it is), ``zero`` or ``cap``.
        key: The recipe key named in an error (e.g. ``reward eval_rar hedging``).
    """

    def __init__(self, mode: str = "count", key: str = "hedging") -> None:
        self.mode = check_hedging(mode, key)

    def apply(self, score: float, answer: str | None, answers: Sequence[str]) -> float:
        """``score`` as this mode leaves it for the extracted ``answer``."""
        if self.mode == "count" or not score:
            return score
        if not hedged(answer, answers):
            return score
        if self.mode == "zero":
            return 0.0
        return score / max(2, len(answer_candidates(answer or "")))


def shown_answers(prompt_text: str, tag: str = "answer") -> set[str]:
    """The answers a prompt shows in ``<tag>`` blocks (a worked example's), normalized."""
    return {a for a in (normalize_answer(b) for b in tag_blocks(prompt_text or "", tag)) if a}


def copies_example(
    answer: str | None, prompt_text: str, answers: Sequence[str], tag: str = "answer"
) -> bool:
    """Whether ``answer`` is an answer the prompt shows (its worked example's) and not a gold
    answer: the policy wrote the example back instead of answering."""
    if not answer or exact_match(answer, list(answers)):
        return False
    return normalize_answer(answer) in shown_answers(prompt_text, tag)


def _ngrams(words: list[str], n: int) -> Iterable[tuple[str, ...]]:
    return (tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def copied_span(text: str, sources: Sequence[str], words: int = 12) -> bool:
    """Whether ``text`` repeats ``words`` consecutive words of one of ``sources`` verbatim
    (case-insensitive): a passage copied out rather than read."""
    mine = (text or "").lower().split()
    if len(mine) < words:
        return False
    seen = {g for s in sources for g in _ngrams((s or "").lower().split(), words)}
    return any(g in seen for g in _ngrams(mine, words))
