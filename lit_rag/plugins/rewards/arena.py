"""ARENA's adaptive reward: format + accuracy + relevance + bonus (ARENA Section 3.3).

Paper: the generator writes ``<relevance>[ids]</relevance><analysis>..</analysis>
<answer>..</answer>`` (Table 1). Format is 1 when the output consists of the three parts in
order; accuracy is normalized EM of the ``<answer>`` content against the gold answer (any
alias, Appendix B); relevance compares the predicted reference numbers with the gold ones
(full match 1, partial overlap 0.5, no overlap 0); a bonus of 10 is added when all three are
1. The total is the weighted sum with all weights 1, so a perfect output scores 13.

What we do: exactly that, with these decisions where the paper is silent:

- Format follows the release (``format_check: release``, the default): the paper says only
  "the three parts in order", and ARENA's released code scores format in training
  (``src/rewards.py``) and evaluation with ``format_score`` (``src/evaluate.py``), the regex
  ``^<relevance>[^<]*</relevance>\\s*<analysis>[^<]*</analysis>\\s*<answer>[^<]*</answer>$``
  under ``re.DOTALL | re.MULTILINE``. So, beyond the parts in order: nothing may come before
  ``<relevance>`` (not even whitespace); no section may contain a ``<``; and since ``$`` matches
  at any line end, text after a line break that follows ``</answer>`` is accepted (on the same
  line it is not). Format gates the bonus of 10, so the rule matters. ``format_check: parts`` is
  our earlier reading of the paper: each of the six tags exactly once, in order, with only
  whitespace before, between and after the parts (leading whitespace and ``<`` inside a part
  accepted, any text after ``</answer>`` rejected). Either way, empty parts still count as
  well-formed; they lose accuracy/relevance instead.
- Accuracy and relevance read the last complete ``<answer>`` / ``<relevance>`` pair
  (:func:`~lit_rag.plugins.rewards.qa.extract_tag`) whether or not the format is right, so the
  components stay independent as in the paper (the release reads the first pair; the two only
  differ when a part is repeated, which already fails the format). A missing part scores 0.
- Accuracy normalizes as the release does (punctuation becomes a space, see
  :mod:`lit_rag.plugins.rewards.qa`); ``punctuation="delete"`` selects the SQuAD rule. An
  answer that normalizes to nothing (``"A"``, ``"the"``) is never accurate.
- Reference numbers must be written as Table 1 asks, a list "in square brackets, e.g. [1,5]",
  and are read as ARENA's released scorer reads them (``relevance_score`` in ``src/evaluate.py``
  of ren258/ARENA: ``json.loads`` of the ``<relevance>`` body, inside a try). The body must be a
  JSON array of integers: ``[1, 5]``, ``[5,1,5]``, ``[]``, with any JSON whitespace. Anything
  else is no prediction and scores relevance 0: ``1, 5`` (no brackets), ``[1-3]``, ``[1.3]``,
  ``[1e3]``, ``[[1], [5]]``, ``["1"]``, ``{"1": true}``, ``[1, two]``, full-width digits. We
  are stricter than the release in one place: it compares Python values, so ``[1.0, 5.0]`` and
  ``[true]`` pass there as 1, 5 and 1; floats and booleans are no reference numbers here.
  Numbers that name no reference (``99``, ``-1``, ``0``) are *kept*: they are wrong citations,
  so ``[1, 2, 99]`` against gold ``[1, 2]`` is a partial match (0.5), not a full one, and
  ``[-1, -3]`` against gold ``[1, 3]`` has no overlap (0), as in the release.
- Gold numbers are the 1-based positions of ``example.references`` whose ``id`` is in
  ``example.gold_ids`` (Appendix B numbers references 1..n in their original order).
  Full match means equal sets (duplicates and order do not matter). If an example has no gold
  references, only a present, empty prediction (``"[]"``) is a full match.
- The reward reads only what the policy wrote (``Trajectory.policy_text``). An ``<answer>``
  that lists more candidates than the gold (``"Paris or Lyon"``) earns the accuracy that
  ``hedging`` leaves it (:class:`~lit_rag.api.Hedging`), and the bonus only when that accuracy
  is still 1. The default, ``count``, is the paper's reward: the guard only measures
  (``rollout/hedged_answers``); ``zero`` or ``cap`` is a lit-rag guard a recipe opts into
  (docs/methods/arena.md, "Hedged answers").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import torch

from lit_rag.api import (
    Example,
    Hedging,
    Reward,
    RewardBreakdown,
    Trajectory,
    check_punctuation,
    exact_match,
    extract_tag,
)

SECTIONS = ("relevance", "analysis", "answer")
FORMAT_CHECKS = ("release", "parts")

#: ARENA's released ``format_score`` (src/evaluate.py), verbatim but for the verbose layout.
#: ``[^<]*`` cannot overlap a tag, so matching is linear in the text.
RELEASE_FORMAT = re.compile(
    r"^<relevance>[^<]*</relevance>\s*<analysis>[^<]*</analysis>\s*<answer>[^<]*</answer>$",
    re.DOTALL | re.MULTILINE,
)


@dataclass
class ArenaParse:
    """An ARENA completion taken apart.

    Args:
        relevance: Reference numbers in the order written (duplicates kept); ``None`` if there
            is no complete ``<relevance>`` pair or its body is not a JSON list of integers.
        analysis: Content of the last ``<analysis>`` pair, stripped, or ``None``.
        answer: Content of the last ``<answer>`` pair, stripped, or ``None``.
        well_formed: True when the text is exactly the three parts in order (see module doc).
    """

    relevance: list[int] | None
    analysis: str | None
    answer: str | None
    well_formed: bool


def parse_relevance(content: str) -> list[int] | None:
    """Reference numbers of a ``<relevance>`` body that is a JSON list of integers, else ``None``.

    Strict, like ARENA's released scorer (``json.loads``; see the module doc). Never raises:
    malformed JSON, nesting too deep for the parser and integers over Python's 4300-digit
    conversion limit all give ``None``. ``json`` parses, it never evaluates.

    Example:
        >>> parse_relevance("[1, 3, 3]")
        [1, 3, 3]
        >>> [parse_relevance(s) for s in ("[1-3]", "[1.3]", "[1e3]", "1, 3", '{"1": true}')]
        [None, None, None, None, None]
    """
    try:
        value = json.loads(content)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None
    if not isinstance(value, list) or any(type(i) is not int for i in value):
        return None  # type(...) is int: rejects bool (a subclass of int) and float
    return value


def is_well_formed(text: str, check: str = "release") -> bool:
    """True when ``text`` is the three ARENA parts in order (see the module doc).

    ``release``: ARENA's released ``format_score`` regex (:data:`RELEASE_FORMAT`). ``parts``: each
    of the six tags exactly once, in that order, with only whitespace outside the three parts
    (linear time: six ``count`` and six ``find`` calls). Never raises.

    Example:
        >>> ok = "<relevance>[1]</relevance><analysis>a</analysis><answer>b</answer>"
        >>> is_well_formed(" " + ok), is_well_formed(" " + ok, "parts")
        (False, True)
        >>> is_well_formed(ok + "\\nmore"), is_well_formed(ok + "\\nmore", "parts")
        (True, False)
    """
    if check == "release":
        return RELEASE_FORMAT.match(text) is not None
    markers = [m for name in SECTIONS for m in (f"<{name}>", f"</{name}>")]
    if any(text.count(m) != 1 for m in markers):
        return False
    positions = [text.find(m) for m in markers]
    if positions != sorted(positions):
        return False
    # Gaps: before <relevance>, </relevance>..<analysis>, </analysis>..<answer>, after </answer>.
    ends = [0] + [positions[i] + len(markers[i]) for i in (1, 3, 5)]
    starts = [positions[i] for i in (0, 2, 4)] + [len(text)]
    return all(not text[a:b].strip() for a, b in zip(ends, starts, strict=True))


def parse_arena(text: str, format_check: str = "release") -> ArenaParse:
    """Split an ARENA completion into its parts. Never raises.

    Example:
        >>> text = "<relevance>[1, 3]</relevance><analysis>..</analysis><answer>Paris</answer>"
        >>> p = parse_arena(text)
        >>> p.relevance, p.answer, p.well_formed
        ([1, 3], 'Paris', True)
    """
    relevance = extract_tag(text, "relevance")
    return ArenaParse(
        relevance=None if relevance is None else parse_relevance(relevance),
        analysis=extract_tag(text, "analysis"),
        answer=extract_tag(text, "answer"),
        well_formed=is_well_formed(text, format_check),
    )


def gold_reference_numbers(example: Example) -> set[int]:
    """1-based positions of the example's references whose id is in ``gold_ids``."""
    gold = set(example.gold_ids)
    return {i + 1 for i, ref in enumerate(example.references) if ref.id in gold}


def relevance_score(predicted: list[int] | None, gold: set[int]) -> float:
    """1.0 for equal sets, 0.5 for a partial overlap, 0.0 for none or a missing/invalid list."""
    if predicted is None:
        return 0.0
    pred = set(predicted)
    if pred == gold:
        return 1.0
    return 0.5 if pred & gold else 0.0


class ArenaReward(Reward):
    """ARENA's four-part reward (Section 3.3); weights all 1 by default.

    Example:
        Five references with gold ids at positions 2 and 4, answers ``["Paris"]``:

        ``"<relevance>[2, 4]</relevance>\\n<analysis>[2] and [4] say ...</analysis>\\n"``
        ``"<answer>paris</answer>"`` -> format 1, accuracy 1, relevance 1, bonus 10,
        total = 1*1 + 1*1 + 1*1 + 1*10 = 13.

        The same text with ``<relevance>[2]</relevance>`` -> relevance 0.5, bonus 0,
        total = 1 + 1 + 0.5 + 0 = 2.5. With ``<relevance>[2-4]</relevance>`` (not a JSON list of
        integers) -> relevance 0, total = 1 + 1 + 0 + 0 = 2.

    ``hedging`` defaults to ``count``, the paper's reward. A recipe may set ``zero``: exact
    match can pay a list of candidates whose separators normalization drops (``"Simon;
    Garfunkel"`` is ``"simon garfunkel"``), and with no credit for a hedge, committing to one
    answer is strictly better than listing several.

    Args:
        format_weight: Weight of the format component.
        accuracy_weight: Weight of the accuracy (EM) component.
        relevance_weight: Weight of the relevance component.
        bonus_weight: Weight of the bonus component.
        bonus: Bonus value when format, accuracy and relevance are all 1.
        punctuation: How accuracy's normalization treats punctuation: ``space`` (ARENA's
            release) or ``delete`` (SQuAD); see
            :func:`~lit_rag.plugins.rewards.qa.normalize_answer`.
        format_check: ``release`` (ARENA's released ``format_score`` regex) or ``parts`` (the
            six tags once each, in order, whitespace around); see the module doc.
        hedging: Accuracy of an answer that lists more candidates than the gold: ``zero``,
            ``cap`` (divided by the number of candidates) or ``count`` (the paper's); see
            :class:`~lit_rag.api.Hedging`.
    """

    def __init__(
        self,
        format_weight: float = 1.0,
        accuracy_weight: float = 1.0,
        relevance_weight: float = 1.0,
        bonus_weight: float = 1.0,
        bonus: float = 10.0,
        punctuation: str = "space",
        format_check: str = "release",
        hedging: str = "count",
    ) -> None:
        if format_check not in FORMAT_CHECKS:
            raise ValueError(
                f"arena format_check '{format_check}' is not known; "
                f"allowed: {', '.join(FORMAT_CHECKS)}"
            )
        self.bonus, self.format_check = bonus, format_check
        self.punctuation = check_punctuation(punctuation, "arena punctuation")
        self.hedging = Hedging(hedging, key="reward arena hedging")
        self.weights = {
            "format": format_weight,
            "accuracy": accuracy_weight,
            "relevance": relevance_weight,
            "bonus": bonus_weight,
        }

    def score(self, text: str, example: Example) -> dict[str, float]:
        """Unweighted components for one completion."""
        parsed = parse_arena(text, self.format_check)
        fmt = float(parsed.well_formed)
        acc = (
            0.0
            if parsed.answer is None
            else self.hedging.apply(
                exact_match(parsed.answer, example.answers, self.punctuation),
                parsed.answer,
                example.answers,
            )
        )
        rel = relevance_score(parsed.relevance, gold_reference_numbers(example))
        bonus = self.bonus if fmt == acc == rel == 1.0 else 0.0
        return {"format": fmt, "accuracy": acc, "relevance": rel, "bonus": bonus}

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        """Score what each trajectory's policy wrote against ``trajectory.example``."""
        scores = [self.score(t.policy_text, t.example) for t in trajectories]
        components = {
            name: torch.tensor([s[name] for s in scores], dtype=torch.float32)  # [N]
            for name in self.weights
        }
        total = torch.zeros(len(trajectories), dtype=torch.float32)  # [N]
        for name, value in components.items():
            total = total + self.weights[name] * value
        return RewardBreakdown(total=total, components=components)
