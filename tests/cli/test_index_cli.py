"""``lit-rag index build | search | eval`` end to end with BM25 on the synthetic world's corpus."""

from __future__ import annotations

import json

import pytest

from lit_rag.cli.commands import main
from lit_rag.data.readers import write_litrag
from lit_rag.data.synthetic import SyntheticWorld
from lit_rag.retrieval.corpus import write_corpus
from tests.helpers import require_package, tiny_bert_folder


@pytest.fixture
def world_files(tmp_path):
    world = SyntheticWorld(seed=0)
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(world.corpus(), corpus)
    questions = tmp_path / "questions.jsonl"
    write_litrag(world.examples(20, hops=(2,), num_distractors=2, seed=5), questions)
    return corpus, questions


def test_build_search_eval(tmp_path, world_files, capsys):
    corpus, questions = world_files
    index = tmp_path / "idx"
    main(["index", "build", "--corpus", str(corpus), "--retriever", "bm25", "--out", str(index)])
    assert (index / "manifest.json").exists()
    manifest = json.loads((index / "manifest.json").read_text())
    assert manifest["retriever"] == "bm25" and manifest["passage_count"] == len(
        SyntheticWorld(seed=0).corpus()
    )
    capsys.readouterr()
    main(["index", "search", str(index), "Drosstead", "-k", "3"])
    lines = capsys.readouterr().out.strip().splitlines()
    # k lines; first the passage whose title and text both name the city (w0)
    rank, _score, pid = lines[0].split()[:3]
    assert len(lines) == 3 and (rank, pid) == ("1", "w0")
    main(["index", "eval", str(index), "--data", str(questions), "-k", "1", "5", "10"])
    result = json.loads(capsys.readouterr().out)
    assert result["queries"] == 20
    # 20 two-hop questions, 2 gold passages each (40). A question names its first-hop entity,
    # never the bridge entity of the second hop: BM25 ranks the first-hop gold passage 1st for
    # 12 questions, 2nd-5th for 7, 6th for 1, and the second-hop one never in the top 10.
    # recall@1 = 12/40, recall@5 = 19/40, recall@10 = 20/40; no question has both (full 0)
    assert result["recall@1"] == pytest.approx(12 / 40)
    assert result["recall@5"] == pytest.approx(19 / 40)
    assert result["recall@10"] == pytest.approx(20 / 40)
    assert result["full_recall@10"] == 0.0


def test_missing_index_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["index", "search", str(tmp_path / "nope"), "query"])
    assert info.value.code == 2
    err = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("lit-rag: error:")
    ]
    assert len(err) == 1 and "nope" in err[0]


def test_eval_without_gold_is_one_line(tmp_path, world_files, capsys):
    corpus, _ = world_files
    index = tmp_path / "idx"
    main(["index", "build", "--corpus", str(corpus), "--out", str(index)])
    flashrag = tmp_path / "nq.jsonl"
    flashrag.write_text('{"id": "1", "question": "who?", "golden_answers": ["x"]}\n')
    with pytest.raises(SystemExit):
        main(["index", "eval", str(index), "--data", str(flashrag)])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("lit-rag: error:") and "no example has gold passage ids" in err[-1]


def test_index_from_another_corpus_is_one_line(tmp_path, world_files, capsys):
    from lit_rag.plugins.retrievers.bm25 import BM25Retriever
    from lit_rag.retrieval.manifest import IndexMismatchError

    corpus, _ = world_files
    index = tmp_path / "idx"
    main(["index", "build", "--corpus", str(corpus), "--out", str(index)])
    changed = tmp_path / "changed.jsonl"
    changed.write_text(corpus.read_text().replace("founded", "started", 1))
    retriever = BM25Retriever(index=str(index), expected_corpus=str(changed))
    with pytest.raises(IndexMismatchError) as info:
        retriever.search(["Arden"], 3)
    assert "\n" not in str(info.value) and "corpus" in str(info.value)


def _tiny_encoder(folder):
    """A 1-layer, 16-wide random BERT (plain HF folder, no download)."""
    return tiny_bert_folder(
        folder, ["arden", "city", "river", "founded", "mills", "the", "of", "in"]
    )


def test_hybrid_search_needs_the_encoder_passed_or_allowed(tmp_path, world_files, capsys):
    require_package("faiss", "pip install faiss-cpu")
    require_package("sentence_transformers", "pip install sentence-transformers")
    corpus, questions = world_files
    encoder = _tiny_encoder(tmp_path / "enc")
    index = tmp_path / "hyb"
    main(
        [
            "index",
            "build",
            "--corpus",
            str(corpus),
            "--retriever",
            "hybrid",
            "--encoder",
            encoder,
            "--out",
            str(index),
        ]
    )
    capsys.readouterr()
    # the manifest's encoder path is not followed unasked: one line saying how to pass it
    with pytest.raises(SystemExit) as info:
        main(["index", "search", str(index), "Arden"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1
    assert f"was built with encoder '{encoder}'; pass that encoder" in err[0]
    main(["index", "search", str(index), "Arden", "-k", "3", "--encoder", encoder])
    passed = capsys.readouterr().out
    main(["index", "search", str(index), "Arden", "-k", "3", "--trust-manifest-encoder"])
    assert capsys.readouterr().out == passed and len(passed.splitlines()) == 3
    main(["index", "eval", str(index), "--data", str(questions), "-k", "5", "--encoder", encoder])
    assert json.loads(capsys.readouterr().out)["queries"] == 20
    for k in ("0", "-1"):
        with pytest.raises(SystemExit):
            main(["index", "search", str(index), "Arden", "-k", k, "--encoder", encoder])
        assert (
            capsys.readouterr().err.strip()
            == f"lit-rag: error: -k: got {k}; expected an integer >= 1"
        )


def test_eval_finds_a_repeated_title_by_its_text(tmp_path, capsys):
    """MuSiQue gives one title to several paragraphs: eval credits the gold paragraph's text,
    not its namesake. Corpus pooled from a MuSiQue-style file: "Orbel" twice, different texts."""

    def record(qid, question, paragraphs, gold):
        return {
            "id": qid, "question": question, "answer": "-",
            "paragraphs": [
                {"idx": i, "title": title, "paragraph_text": text, "is_supporting": i == gold}
                for i, (title, text) in enumerate(paragraphs)
            ],
        }  # fmt: skip

    mill = ("Orbel", "Orbel Mills makes paper.")
    born = ("Orbel", "Mira Tolvan was born in Kessa.")
    quay = ("Quay", "The quay was built of stone.")
    rows = [  # q1's gold is the second "Orbel" text
        record("q1", "Where was Mira Tolvan born?", [mill, born], 1),
        record("q2", "What does Orbel Mills make?", [mill, quay], 0),
    ]
    data = tmp_path / "musique.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    index = tmp_path / "idx"
    main(["index", "build", "--corpus", str(data), "--out", str(index)])
    capsys.readouterr()
    main(["index", "eval", str(index), "--data", str(data), "-k", "1"])
    result = json.loads(capsys.readouterr().out)
    # each question's top passage is its gold text; a title-keyed pool dropped q1's gold text
    # (one "Orbel", the paper mill) and scored recall@1 0.5
    assert result["recall@1"] == 1.0
