"""The real-data samples under ``data/`` that the ``*_cpu`` recipes train on: every
gold paragraph is the corpus passage with that text, and no held-out question is trained on."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_rag.data.readers import read_examples
from lit_rag.retrieval.corpus import corpus_ids, pooled_gold_ids, read_corpus

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.mark.parametrize(
    ("name", "train", "passages"),
    [("hotpotqa", "train80.json", 2094), ("musique", "train80.jsonl", 3086)],
)
def test_gold_paragraphs_are_corpus_passages_with_their_text(
    name: str, train: str, passages: int
) -> None:
    corpus = read_corpus(DATA / name / "corpus.jsonl")
    assert len(corpus) == len({p.id for p in corpus}) == passages
    texts = {p.id: p.text for p in corpus}
    ids = corpus_ids(corpus)
    trained = read_examples(DATA / name / train)
    heldout = read_examples(DATA / name / "heldout30.jsonl")
    assert (len(trained), len(heldout)) == (80, 30)
    assert not {e.question for e in trained} & {e.question for e in heldout}
    for example in trained + heldout:
        assert example.gold_ids
        refs = {ref.id: ref.text for ref in example.references}
        gold = pooled_gold_ids(example, ids)
        assert [texts[g] for g in gold] == [refs[g] for g in example.gold_ids]
        if name == "musique":  # shipped with corpus ids already: no mapping needed
            assert gold == example.gold_ids
