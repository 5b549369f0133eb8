"""Text helpers every plugin may use: answer normalization, exact match, token F1, tag extraction.

Paper (ARENA, Appendix C.1): EM lowercases, removes punctuation and the articles a/an/the,
replaces underscores with spaces and collapses whitespace, then compares with every gold
answer; gold answers are lists of aliases and a prediction is right if it matches any of them
(Appendix B). F1 (C.2) is SQuAD-style token F1 on normalized text, maximised over the gold
answers.

What we do: lowercase, punctuation goes, the whole words a/an/the become a space, whitespace
collapses. "Removing punctuation" does not say whether a character is deleted or replaced, and
the methods' reference code differs, so :func:`normalize_answer` takes ``punctuation``:

- ``delete`` (the default here): ASCII punctuation is deleted, as in SQuAD's script and in
  Search-R1's ``qa_em.py`` (the EM that Search-R1 and Eval-RAR train and report with), and as
  C.1 reads literally. ``"Jean-Paul Sartre"`` -> ``"jeanpaul sartre"``, ``"U.S.A."`` -> ``"usa"``.
  ``_`` is ASCII punctuation (it is in ``string.punctuation``), so it is deleted too, as those
  scripts do: ``"New_York"`` -> ``"newyork"``. C.1's "replacing underscores with spaces" is
  ARENA's rule, which ``space`` follows.
- ``space``: ARENA's release (``src/evaluate.py`` and ``src/rewards.py`` of ren258/ARENA, the
  scorer of its training reward and its tables) replaces each punctuation character with a
  space and also counts the typographic quotes ``‘ ’ ´`` as punctuation (that set exactly;
  ``“ ”`` are not in it). ``"Jean-Paul Sartre"`` and ``"Jean Paul Sartre"`` both give
  ``"jean paul sartre"``; ``"U.S.A."`` gives ``"u s"`` (the last ``a`` is then an article);
  ``"New_York"`` gives ``"new york"`` (C.1's underscores replaced with spaces). The ARENA
  reward (``arena``) uses this mode by default.

The shared default stays ``delete`` because these functions also score every method's
validation EM/F1 (:mod:`lit_rag.metrics.qa`) and the search rewards, whose reference code
deletes; one rule keeps the methods' validation numbers comparable.

Departures and decisions where the paper is silent:

- Empty answers never match. A text that normalizes to nothing (``"A"``, ``"the"``, ``"!"``,
  ``""``) scores EM 0 and F1 0 against every alias, also against an alias that normalizes to
  nothing. ARENA's release compares the two empty strings and scores EM 1; SQuAD v2 scores F1 1
  when both sides are empty (its "no answer" case, which our datasets do not have). An empty
  list of gold answers scores 0.0 for both EM and F1.
- :func:`extract_tag` takes the content of the last *complete* ``<tag>...</tag>`` pair, so a
  truncated trailing ``<answer>`` without its closing tag does not hide an earlier complete one.
  It uses ``str.rfind`` / ``str.find`` only, so it is linear in the text length.
- A missing answer tag scores 0 (the model did not answer in the required format).
"""

from __future__ import annotations

import re
import string
from collections import Counter

from lit_rag.types import Trajectory

#: ARENA's released punctuation set: ASCII punctuation plus the typographic quotes ‘ ’ ´.
ARENA_PUNCTUATION = string.punctuation + "\u2018\u2019\u00b4"
_TO_SPACE = str.maketrans(ARENA_PUNCTUATION, " " * len(ARENA_PUNCTUATION))
_DELETE = str.maketrans("", "", string.punctuation)
#: ``punctuation`` modes: ``delete`` (SQuAD, Search-R1; the default), ``space`` (ARENA's release).
PUNCTUATION_MODES = {"delete": _DELETE, "space": _TO_SPACE}
# Alternation of three literals between word boundaries: no nested quantifiers, linear time.
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def check_punctuation(punctuation: str, key: str = "punctuation") -> str:
    """``punctuation`` if it is a known mode, else a ``ValueError`` naming ``key``."""
    if punctuation not in PUNCTUATION_MODES:
        allowed = ", ".join(PUNCTUATION_MODES)
        raise ValueError(f"{key} '{punctuation}' is not known; allowed: {allowed}")
    return punctuation


def normalize_answer(s: str, punctuation: str = "delete") -> str:
    """Normalize an answer (ARENA Appendix C.1; see the module doc for ``punctuation``).

    Steps, in order: lowercase; delete ASCII punctuation, ``_`` included (``delete``), or
    replace it and ``‘ ’ ´`` with a space (``space``); replace the whole words ``a``, ``an``,
    ``the`` with a space; collapse runs of whitespace into one space and strip.

    Example:
        >>> normalize_answer("  The  Battle_of Hastings, a.k.a. 1066!")
        'battleof hastings aka 1066'
        >>> normalize_answer("  The  Battle_of Hastings, a.k.a. 1066!", punctuation="space")
        'battle of hastings k 1066'
        >>> normalize_answer("Jean-Paul Sartre", punctuation="space")
        'jean paul sartre'

        With ``space`` the dots of ``"a.k.a."`` leave the words ``a``, ``k``, ``a``, and both
        ``a`` are articles.

    Args:
        s: Any text.
        punctuation: ``delete`` deletes ASCII punctuation (SQuAD, Search-R1); ``space``
            replaces punctuation with a space (ARENA's release).

    Returns:
        The normalized text (possibly empty).

    Raises:
        ValueError: ``punctuation`` is not a known mode (a configuration error, never caused by
            the text).
    """
    table = PUNCTUATION_MODES.get(punctuation)
    if table is None:
        check_punctuation(punctuation)
    s = s.lower().translate(table)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, answers: list[str], punctuation: str = "delete") -> float:
    """Normalized exact match against any alias; an empty normalized text never matches.

    Example:
        >>> exact_match("the Eiffel Tower.", ["Eiffel Tower", "La tour Eiffel"])
        1.0
        >>> exact_match("A", ["the"])  # both normalize to "": no answer, no match
        0.0

    Args:
        prediction: The model's answer.
        answers: Acceptable gold answers (aliases).
        punctuation: See :func:`normalize_answer`.

    Returns:
        1.0 if the normalized prediction is non-empty and equals a normalized answer, else 0.0
        (also 0.0 when ``answers`` is empty).
    """
    pred = normalize_answer(prediction, punctuation)
    return float(bool(pred) and any(pred == normalize_answer(a, punctuation) for a in answers))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:  # also when either side has no tokens
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, answers: list[str], punctuation: str = "delete") -> float:
    """SQuAD token F1 on normalized text, maximised over the aliases.

    Example:
        >>> round(f1_score("the city of Paris", ["Paris France"]), 4)
        0.4

        Tokens ``[city, of, paris]`` vs ``[paris, france]``: 1 in common, precision 1/3,
        recall 1/2, F1 = 2 * (1/3) * (1/2) / (1/3 + 1/2) = 0.4.

    Args:
        prediction: The model's answer.
        answers: Acceptable gold answers (aliases).
        punctuation: See :func:`normalize_answer`.

    Returns:
        The best F1 over ``answers`` in [0, 1]; 0.0 when ``answers`` is empty or when a side has
        no tokens (ARENA's release: no common token, no score).
    """
    pred_tokens = normalize_answer(prediction, punctuation).split()
    return max(
        (_token_f1(pred_tokens, normalize_answer(a, punctuation).split()) for a in answers),
        default=0.0,
    )


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


def policy_text(trajectory: Trajectory) -> str:
    """What the policy wrote, without the environment's insertions
    (:attr:`Trajectory.policy_text`)."""
    return trajectory.policy_text


def final_answer(trajectory: Trajectory, tag: str = "answer") -> str | None:
    """Content of the last complete ``<tag>`` block in the policy's own text, or None."""
    return extract_tag(policy_text(trajectory), tag)
