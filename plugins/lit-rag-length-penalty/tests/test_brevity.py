"""brevity, the plain-function reward: its scores, odd text, and its entry point."""

from __future__ import annotations

from importlib import metadata

from lit_rag_length_penalty.brevity import brevity

from lit_rag.api import Example

EX = Example(id="q", question="?", answers=["Paris"])


def test_scores_by_hand() -> None:
    texts = [
        "<answer>Paris</answer>",
        "<answer>in Paris</answer>",
        "<answer>in central Paris</answer>",
        "Paris",
        "<answer> </answer>",
    ]
    # max_words 2: 1 word -> 1; 2 words -> 1; 3 words -> 0; no answer tag -> 0; empty answer -> 0
    assert brevity(texts, [EX] * len(texts), max_words=2) == [1.0, 1.0, 0.0, 0.0, 0.0]
    # default max_words 5: the 3-word answer fits too
    assert brevity(texts, [EX] * len(texts)) == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_never_raises_on_odd_text() -> None:
    texts = ["</answer><answer>", "<answer>" + "x " * 10_000, "\x00<answer>é</answer>", ""]
    assert brevity(texts, [EX] * len(texts)) == [0.0, 0.0, 1.0, 0.0]
    assert brevity([], []) == []


def test_registered_as_brevity() -> None:
    (ep,) = [ep for ep in metadata.entry_points(group="lit_rag.rewards") if ep.name == "brevity"]
    assert ep.dist.metadata["Name"] == "lit-rag-length-penalty"
    assert ep.load() is brevity
