"""A reward as a plain function: registered in ``lit_rag.rewards`` as ``brevity`` (pyproject.toml).

lit-rag wraps it; a recipe names it ``class_path: brevity`` and its ``init_args`` are the
keyword arguments after ``completions, examples`` (here ``max_words``).
"""

from __future__ import annotations

from lit_rag.api import Example, extract_tag


def brevity(completions: list[str], examples: list[Example], max_words: int = 5) -> list[float]:
    """1.0 for a non-empty ``<answer>`` of at most ``max_words`` words, else 0.0.

    Example:
        With ``max_words=2``: ``"<answer>Paris</answer>"`` -> 1.0 (1 word);
        ``"<answer>in central Paris</answer>"`` -> 0.0 (3 words); ``"Paris"`` -> 0.0 (no answer
        tag); ``"<answer> </answer>"`` -> 0.0 (empty).
    """
    answers = [extract_tag(c, "answer") for c in completions]
    return [float(a is not None and 0 < len(a.split()) <= max_words) for a in answers]
