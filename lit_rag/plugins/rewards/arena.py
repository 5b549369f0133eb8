"""ARENA's adaptive reward: format + accuracy + relevance + bonus (ARENA Section 3.3).

Paper: the generator writes ``<relevance>[ids]</relevance><analysis>..</analysis>
<answer>..</answer>`` (Table 1). Format is 1 when the output consists of the three parts in
order; accuracy is normalized EM of the ``<answer>`` content against the gold answer (any
alias, Appendix B); relevance compares the predicted reference numbers with the gold ones
(full match 1, partial overlap 0.5, no overlap 0); a bonus of 10 is added when all three are
1. The total is the weighted sum with all weights 1, so a perfect output scores 13.

What we do: exactly that, with these decisions where the paper is silent:

- Format is strict: each of the six tags occurs exactly once, in order, with only whitespace
  before, between and after the three parts. Empty parts still count as well-formed; they
  lose accuracy/relevance instead.
- Accuracy and relevance read the last complete ``<answer>`` / ``<relevance>`` pair
  (:func:`~lit_rag.plugins.rewards.qa.extract_tag`) whether or not the format is right, so the
  components stay independent as in the paper. A missing part scores 0.
- Reference numbers are every run of ASCII digits in ``<relevance>`` (``"[1, 5]"``,
  ``"1,5"``, ``"[[1]]"``, ``"[1, two, 3]"`` -> 1, 3); other characters are ignored. Ranges
  such as ``"1-3"`` are not expanded (they read as 1 and 3). Runs longer than 9 digits are
  dropped as junk. Numbers that name no reference are *kept*: they are wrong citations, so
  ``[1, 2, 99]`` against gold ``[1, 2]`` is a partial match (0.5), not a full one.
- Gold numbers are the 1-based positions of ``example.references`` whose ``id`` is in
  ``example.gold_ids`` (Appendix B numbers references 1..n in their original order).
  Full match means equal sets (duplicates and order do not matter). If an example has no gold
  references, only a present, empty prediction (``"[]"``) is a full match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from lit_rag.plugins.rewards.base import Reward
from lit_rag.plugins.rewards.qa import exact_match, extract_tag
from lit_rag.types import Example, RewardBreakdown, Trajectory

SECTIONS = ("relevance", "analysis", "answer")
_NUMBER = re.compile(r"[0-9]+")
_MAX_DIGITS = 9


@dataclass
class ArenaParse:
    """An ARENA completion taken apart.

    Args:
        relevance: Reference numbers in the order written (duplicates kept); ``None`` if there
            is no complete ``<relevance>`` pair.
        analysis: Content of the last ``<analysis>`` pair, stripped, or ``None``.
        answer: Content of the last ``<answer>`` pair, stripped, or ``None``.
        well_formed: True when the text is exactly the three parts in order (see module doc).
    """

    relevance: list[int] | None
    analysis: str | None
    answer: str | None
    well_formed: bool


def parse_relevance(content: str) -> list[int]:
    """Reference numbers in a ``<relevance>`` body; junk between them is ignored.

    Example:
        >>> parse_relevance("[1, two, 3, 3]")
        [1, 3, 3]
    """
    return [int(m) for m in _NUMBER.findall(content) if len(m) <= _MAX_DIGITS]


def is_well_formed(text: str) -> bool:
    """True when ``text`` is the three ARENA parts in order and nothing else.

    Each of the six tags must occur exactly once, in that order, with only whitespace outside
    the three parts. Linear time: six ``count`` and six ``find`` calls.
    """
    markers = [m for name in SECTIONS for m in (f"<{name}>", f"</{name}>")]
    if any(text.count(m) != 1 for m in markers):
        return False
    positions = [text.find(m) for m in markers]
    if positions != sorted(positions):
        return False
    # Gaps: before <relevance>, </relevance>..<analysis>, </analysis>..<answer>, after </answer>.
    ends = [0] + [positions[i] + len(markers[i]) for i in (1, 3, 5)]
    starts = [positions[i] for i in (0, 2, 4)] + [len(text)]
    return all(not text[a:b].strip() for a, b in zip(ends, starts))


def parse_arena(text: str) -> ArenaParse:
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
        well_formed=is_well_formed(text),
    )


def gold_reference_numbers(example: Example) -> set[int]:
    """1-based positions of the example's references whose id is in ``gold_ids``."""
    gold = set(example.gold_ids)
    return {i + 1 for i, ref in enumerate(example.references) if ref.id in gold}


def relevance_score(predicted: list[int] | None, gold: set[int]) -> float:
    """1.0 for equal sets, 0.5 for a partial overlap, 0.0 for none or a missing prediction."""
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
        total = 1 + 1 + 0.5 + 0 = 2.5.

    Args:
        format_weight: Weight of the format component.
        accuracy_weight: Weight of the accuracy (EM) component.
        relevance_weight: Weight of the relevance component.
        bonus_weight: Weight of the bonus component.
        bonus: Bonus value when format, accuracy and relevance are all 1.
    """

    def __init__(
        self,
        format_weight: float = 1.0,
        accuracy_weight: float = 1.0,
        relevance_weight: float = 1.0,
        bonus_weight: float = 1.0,
        bonus: float = 10.0,
    ) -> None:
        self.bonus = bonus
        self.weights = {
            "format": format_weight,
            "accuracy": accuracy_weight,
            "relevance": relevance_weight,
            "bonus": bonus_weight,
        }

    def score(self, text: str, example: Example) -> dict[str, float]:
        """Unweighted components for one completion."""
        parsed = parse_arena(text)
        fmt = float(parsed.well_formed)
        acc = 0.0 if parsed.answer is None else exact_match(parsed.answer, example.answers)
        rel = relevance_score(parsed.relevance, gold_reference_numbers(example))
        bonus = self.bonus if fmt == acc == rel == 1.0 else 0.0
        return {"format": fmt, "accuracy": acc, "relevance": rel, "bonus": bonus}

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        """Score each trajectory's text against ``trajectory.example``."""
        scores = [self.score(t.text, t.example) for t in trajectories]
        components = {
            name: torch.tensor([s[name] for s in scores], dtype=torch.float32)  # [N]
            for name in self.weights
        }
        total = torch.zeros(len(trajectories), dtype=torch.float32)  # [N]
        for name, value in components.items():
            total = total + self.weights[name] * value
        return RewardBreakdown(total=total, components=components)
