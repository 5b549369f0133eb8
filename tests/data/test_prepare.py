"""``lit-rag data``: each paper's files, sampled in its counts, from sources in their own layouts.

Small sources are written here in the original layouts (HotpotQA JSON list, 2Wiki, MuSiQue
JSONL) and FlashRAG's; the real samples in ``../shared/data`` are used where present (those
tests skip without them). Nothing touches the network: ``--hub`` runs against a stand-in for
``huggingface_hub.hf_hub_download`` that serves local files.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lit_rag.cli.commands import main
from lit_rag.data.prepare import command as prepare
from lit_rag.data.prepare import files as prepare_files
from lit_rag.data.prepare.sampling import question_key
from lit_rag.data.readers import read_litrag
from lit_rag.errors import InputError
from lit_rag.retrieval.corpus import read_corpus
from lit_rag.version import build_version

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"the shared real-data samples are not here ({SHARED})"
)
DEVS = ("hotpotqa-dev", "2wiki-dev", "musique-dev")


# --------------------------------------------------------------------------- tiny sources


def _context(prefix: str, i: int) -> tuple[list, list]:
    titles = [f"{prefix} A{i}", f"{prefix} B{i}", f"{prefix} C{i}"]
    context = [[t, [f"{t} is a place.", f" It has {i} rooms."]] for t in titles]
    return context, [[titles[0], 0], [titles[1], 1]]  # gold: the first two paragraphs


def hotpotqa(path: Path, n: int, prefix: str, questions: dict[int, str] | None = None) -> Path:
    """``n`` HotpotQA records (a JSON list, as the official files); every 3rd is hard-level."""
    records = []
    for i in range(n):
        context, facts = _context(prefix, i)
        question = (questions or {}).get(i, f"Which {prefix} place has {i} rooms?")
        level = "hard" if i % 3 == 0 else "medium"
        records.append(
            {"_id": f"{prefix}-{i}", "question": question, "answer": f"A{i}", "level": level,
             "type": "bridge", "context": context, "supporting_facts": facts}
        )  # fmt: skip
    path.write_text(json.dumps(records))
    return path


def twowiki(path: Path, n: int, prefix: str) -> Path:
    """``n`` 2WikiMultihopQA records (JSONL: 2Wiki's keys, ``evidences`` included)."""
    with path.open("w") as handle:
        for i in range(n):
            context, facts = _context(prefix, i)
            record = {"_id": f"{prefix}-{i}", "type": "comparison", "answer": f"B{i}",
                      "question": f"Which {prefix} thing came first, {i}?", "context": context,
                      "supporting_facts": facts, "evidences": []}  # fmt: skip
            handle.write(json.dumps(record) + "\n")
    return path


def musique(path: Path, n: int, prefix: str) -> Path:
    """``n`` MuSiQue-Ans records; two paragraphs share a title, as MuSiQue's do."""
    with path.open("w") as handle:
        for i in range(n):
            paragraphs = [
                {"idx": 0, "title": f"{prefix} T{i}", "paragraph_text": f"First {i}.",
                 "is_supporting": True},
                {"idx": 1, "title": f"{prefix} T{i}", "paragraph_text": f"Second {i}.",
                 "is_supporting": True},
                {"idx": 2, "title": f"{prefix} U{i}", "paragraph_text": f"Other {i}.",
                 "is_supporting": False},
            ]  # fmt: skip
            record = {"id": f"2hop__{prefix}{i}", "question": f"What {prefix} follows {i}?",
                      "answer": f"C{i}", "answer_aliases": [], "answerable": True,
                      "paragraphs": paragraphs, "question_decomposition": [{}, {}]}  # fmt: skip
            handle.write(json.dumps(record) + "\n")
    return path


def flashrag(path: Path, n: int, prefix: str) -> Path:
    """``n`` FlashRAG QA records (``id, question, golden_answers``), questions without '?'."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for i in range(n):
            record = {"id": f"{prefix}_{i}", "question": f"who is {prefix} {i}",
                      "golden_answers": [f"{prefix}{i}"]}  # fmt: skip
            handle.write(json.dumps(record) + "\n")
    return path


def original_sources(
    tmp: Path, train: int, dev: int, musique_train: int | None = None
) -> dict[str, Path]:
    """The six original-layout sources ARENA and R2AG read, ``train`` / ``dev`` records each
    (MuSiQue train: ``musique_train`` when given)."""
    return {
        "hotpotqa-train": hotpotqa(tmp / "hotpot_train.json", train, "htr"),
        "hotpotqa-dev": hotpotqa(tmp / "hotpot_dev.json", dev, "hdv"),
        "2wiki-train": twowiki(tmp / "2wiki_train.jsonl", train, "wtr"),
        "2wiki-dev": twowiki(tmp / "2wiki_dev.jsonl", dev, "wdv"),
        "musique-train": musique(tmp / "musique_train.jsonl", musique_train or train, "mtr"),
        "musique-dev": musique(tmp / "musique_dev.jsonl", dev, "mdv"),
    }


def run(paper: str, out: Path, sources: dict[str, Path], *extra: str) -> list[str]:
    args = ["data", paper, "--out", str(out), *extra]
    for name, path in sources.items():
        args += ["--source", f"{name}={path}"]
    main(args)
    return args


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def sources_of(rows) -> dict[str, int]:
    counts: dict[str, int] = {}
    for example in rows:
        counts[example.meta["source"]] = counts.get(example.meta["source"], 0) + 1
    return counts


# --------------------------------------------------------------------------- counts


def test_arena_writes_table_2_counts_and_keeps_evaluation_out_of_train(tmp_path, capsys):
    """10,300 train records a source (MuSiQue 5,200), 520 dev: train 10,000 + 10,000 + 5,000
    (Table 2), shuffled together; test 500 of each dev set; val 200 + 200 + 100 more train
    questions (10,300 >= 10,000 + 200 and 5,200 >= 5,000 + 100: no source runs short)."""
    sources = original_sources(tmp_path, train=10_300, dev=520, musique_train=5_200)
    run("arena", tmp_path / "out", sources)
    out = tmp_path / "out"
    train = read_litrag(out / "train.jsonl")
    val = read_litrag(out / "val.jsonl")
    assert sources_of(train) == {"hotpotqa-train": 10_000, "2wiki-train": 10_000,
                                 "musique-train": 5_000}  # fmt: skip
    assert sources_of(val) == {"hotpotqa-train": 200, "2wiki-train": 200, "musique-train": 100}
    assert [e.meta["source"] for e in train[:30]] != sorted(e.meta["source"] for e in train[:30])
    for name, source in zip(("hotpotqa", "2wiki", "musique"), DEVS, strict=True):
        test = read_litrag(out / f"test_{name}.jsonl")
        assert sources_of(test) == {source: 500}
        assert all(e.references and e.gold_ids for e in test)  # paragraphs kept as references
    ids = [e.id for e in train + val]
    assert len(set(ids)) == len(ids) == 25_500  # val is disjoint from train
    assert train[0].id.split("/")[0] in {"hotpotqa-train", "2wiki-train", "musique-train"}
    assert set(manifest(out)["files"]) == {
        "train.jsonl", "val.jsonl", "test_hotpotqa.jsonl", "test_2wiki.jsonl", "test_musique.jsonl"
    }  # fmt: skip
    printed = capsys.readouterr().out
    assert "train.jsonl" in printed and "25,000" in printed and "lit-rag fit" in printed


def test_a_train_question_that_is_an_evaluation_question_is_dropped_and_counted(tmp_path):
    """Train records 0-4 ask dev questions 0-4 word for word (another id, other punctuation
    and case): none reaches train.jsonl, and the manifest counts them."""
    dev = hotpotqa(tmp_path / "dev.json", 20, "hdv")
    dev_questions = {i: f"WHICH hdv place has {i} rooms" for i in range(5)}  # no '?', upper
    train = hotpotqa(tmp_path / "train.json", 60, "htr", questions=dev_questions)
    out = tmp_path / "out"
    run("evo_rag", out, {"hotpotqa-train": train, "hotpotqa-dev": dev}, "--eval-only")
    assert not (out / "train.jsonl").exists()  # --eval-only: the test files only
    prepare.prepare(prepare.paper("evo_rag"), out, {"hotpotqa-train": train, "hotpotqa-dev": dev})
    written = read_litrag(out / "train.jsonl")
    keys = {question_key(e.question) for e in written}
    assert not keys & {question_key(q) for q in dev_questions.values()}
    assert len(written) == 55  # 60 records, 5 of them evaluation questions
    assert manifest(out)["dropped_duplicates"] == {"train.jsonl": {"hotpotqa-train": 5}}


def test_a_small_source_is_taken_whole_with_one_line(tmp_path, capsys):
    sources = original_sources(tmp_path, train=30, dev=12)
    run("arena", tmp_path / "out", sources)
    lines = capsys.readouterr().out.splitlines()
    assert "lit-rag data: hotpotqa-dev has 12 records, the paper samples 500: took 12" in lines
    entry = manifest(tmp_path / "out")["files"]["test_hotpotqa.jsonl"]["sources"]["hotpotqa-dev"]
    assert (entry["requested"], entry["written"]) == (500, 12)
    assert "Table 2" in entry["section"]
    # 30 train records shared by val (200) and train (10,000) in proportion: 30 x 200 / 10,200
    # = 0.6 -> at least 1 for val, 30 x 10,000 / 10,200 = 29 for train
    val = manifest(tmp_path / "out")["files"]["val.jsonl"]["sources"]["hotpotqa-train"]
    train = manifest(tmp_path / "out")["files"]["train.jsonl"]["sources"]["hotpotqa-train"]
    assert (val["written"], train["written"]) == (1, 29)


# --------------------------------------------------------------------------- seeds


def test_same_seed_same_bytes_other_seed_other_sample(tmp_path):
    sources = original_sources(tmp_path, train=80, dev=30)
    for name, seed in (("a", "42"), ("b", "42"), ("c", "7")):
        run("r2ag", tmp_path / name, sources, "--seed", seed)
    for file in ("train.jsonl", "val.jsonl", "test_2wiki.jsonl", "corpus.jsonl"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()
    assert (tmp_path / "a" / "train.jsonl").read_bytes() != (
        tmp_path / "c" / "train.jsonl"
    ).read_bytes()
    assert manifest(tmp_path / "c")["seed"] == 7


def test_one_sources_sample_does_not_move_when_another_changes(tmp_path):
    sources = original_sources(tmp_path, train=300, dev=40)
    run("arena", tmp_path / "a", sources)
    sources["musique-train"] = musique(tmp_path / "other_musique.jsonl", 250, "zzz")
    run("arena", tmp_path / "b", sources)

    def hotpot(folder: str) -> list[str]:
        return sorted(
            e.id for e in read_litrag(tmp_path / folder / "train.jsonl")
            if e.meta["source"] == "hotpotqa-train"
        )  # fmt: skip

    assert hotpot("a") == hotpot("b") and len(hotpot("a")) > 200


# --------------------------------------------------------------------------- corpora


@pytest.mark.parametrize("paper", ["r2ag", "evo_rag"])
def test_every_gold_and_reference_id_is_a_corpus_id(tmp_path, paper):
    sources = original_sources(tmp_path, train=60, dev=20)
    sources["bamboogle-test"] = flashrag(tmp_path / "bamboogle.jsonl", 5, "bam")
    if paper == "r2ag":
        del sources["bamboogle-test"]
    else:
        for name in ("2wiki-train", "musique-train"):
            del sources[name]
    out = tmp_path / "out"
    run(paper, out, sources)
    corpus = {p.id for p in read_corpus(out / "corpus.jsonl")}
    spec = prepare.paper(paper)
    files = [f.name for f in spec.files if (out / f.name).exists()]
    assert "corpus.jsonl" in manifest(out)["files"]
    gold = 0
    for name in files:
        for example in read_litrag(out / name):
            assert set(example.gold_ids) <= corpus, (name, example.id)
            assert {p.id for p in example.references} <= corpus
            gold += len(example.gold_ids)
    assert gold > 0
    # MuSiQue's two paragraphs under one title are two corpus passages
    assert any(pid.endswith(" (2)") for pid in corpus) == ("musique-dev" in sources)


def test_r2ag_takes_hard_level_hotpotqa(tmp_path):
    sources = original_sources(tmp_path, train=90, dev=20)  # every 3rd train record is hard
    run("r2ag", tmp_path / "out", sources)
    train = read_litrag(tmp_path / "out" / "train.jsonl")
    hotpot = [e for e in train if e.meta["source"] == "hotpotqa-train"]
    assert len(hotpot) == 30 and {e.meta["level"] for e in hotpot} == {"hard"}


# --------------------------------------------------------------------------- search_r1


def test_search_r1_names_absent_test_sources_and_writes_the_rest(tmp_path, capsys):
    nq = flashrag(tmp_path / "nq_test.jsonl", 8, "nq")
    out = tmp_path / "out"
    run("eval_rar", out, {"nq-test": nq}, "--eval-only")
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "test_nq.jsonl"]
    absent = manifest(out)["absent"]
    assert set(absent) == {"triviaqa-test", "popqa-test", "hotpotqa-dev", "2wiki-dev",
                           "musique-dev", "bamboogle-test", "wiki18"}  # fmt: skip
    assert "lit-rag data: absent: popqa-test (pass --source popqa-test=PATH" in printed
    rows = read_litrag(out / "test_nq.jsonl")
    assert rows[0].question == "who is nq 0?"  # Search-R1 appends '?'
    assert manifest(out)["paper"] == "search_r1"


def test_search_r1_without_train_sources_is_one_line(tmp_path, capsys):
    nq = flashrag(tmp_path / "nq_test.jsonl", 8, "nq")
    with pytest.raises(SystemExit) as exit_:
        run("search_r1", tmp_path / "out", {"nq-test": nq})
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lit-rag: error: data: search_r1 needs nq-train")
    assert "--eval-only" in err[0]


def test_search_r1_from_a_flashrag_folder_and_the_hub(tmp_path, monkeypatch):
    """Train from ``--flashrag DIR``; the test sets it lacks through ``--hub`` (a stand-in for
    hf_hub_download serving local files); val is the tests merged; wiki18 recorded."""
    folder = tmp_path / "FlashRAG_datasets"
    flashrag(folder / "nq" / "train.jsonl", 40, "nqtrain")
    flashrag(folder / "hotpotqa" / "train.jsonl", 30, "hptrain")
    hub = tmp_path / "hub"
    for name in ("nq/test", "triviaqa/test", "popqa/test", "hotpotqa/dev", "2wikimultihopqa/dev",
                 "musique/dev", "bamboogle/test"):  # fmt: skip
        flashrag(hub / f"{name}.jsonl", 3, name.replace("/", "_"))
    # a train question that is also an NQ test question: dropped from train
    with (folder / "nq" / "train.jsonl").open("a") as handle:
        handle.write(json.dumps({"id": "x", "question": "Who is NQ_test 1?",
                                 "golden_answers": ["y"]}) + "\n")  # fmt: skip
    asked = []

    def fake_download(repo_id, filename, repo_type):
        asked.append((repo_id, repo_type, filename))
        return str(hub / filename)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    wiki = tmp_path / "wiki.jsonl"
    wiki.write_text('{"id": "0", "contents": "\\"T\\"\\ntext"}\n{"id": "1", "contents": "x"}\n')
    out = tmp_path / "out"
    run("search_r1", out, {"wiki18": wiki}, "--flashrag", str(folder), "--hub")
    assert {f for _, _, f in asked} == {"nq/test.jsonl", "triviaqa/test.jsonl",
        "popqa/test.jsonl", "hotpotqa/dev.jsonl", "2wikimultihopqa/dev.jsonl",
        "musique/dev.jsonl", "bamboogle/test.jsonl"}  # fmt: skip
    assert {r for r, _, _ in asked} == {"RUC-NLPIR/FlashRAG_datasets"}
    assert {t for _, t, _ in asked} == {"dataset"}
    found = manifest(out)
    assert found["sources"]["nq-train"]["from"] == "--flashrag"
    assert found["sources"]["popqa-test"]["from"] == "--hub"
    assert found["sources"]["wiki18"]["records"] == 2 and found["absent"] == {}
    assert found["files"]["train.jsonl"]["records"] == 70  # 41 + 30, less the duplicate
    assert found["dropped_duplicates"] == {"train.jsonl": {"nq-train": 1}}
    assert found["files"]["val.jsonl"]["records"] == 21  # the seven test files, 3 each
    assert not (out / "corpus.jsonl").exists()  # wiki18 is recorded, never copied


def test_a_failed_hub_download_is_one_line(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    def offline(**kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(SystemExit):
        run("search_r1", tmp_path / "out", {}, "--eval-only", "--hub")
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("lit-rag: error: data: --hub could not download ")
    assert "for nq-test" in err and "pass --source nq-test=PATH" in err


# --------------------------------------------------------------------------- manifest


def test_manifest_records_sources_files_and_checksums(tmp_path):
    sources = original_sources(tmp_path, train=40, dev=15)
    args = run("r2ag", tmp_path / "out", sources)
    found = manifest(tmp_path / "out")
    assert found["paper"] == "r2ag" and found["seed"] == 42
    assert found["command"] == "lit-rag " + " ".join(args)
    assert found["lit_rag_version"] == build_version()
    for name, path in sources.items():
        entry = found["sources"][name]
        assert entry["path"] == str(path.resolve())
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert entry["records"] in (40, 15)
    for name, entry in found["files"].items():
        data = (tmp_path / "out" / name).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["records"] == data.count(b"\n")
        assert all("section" in part for part in entry["sources"].values())
    train = found["files"]["train.jsonl"]["sources"]
    assert train["musique-train"]["requested"] == 1_174
    assert "B.2" in train["musique-train"]["section"]
    assert found["absent"] == {} and isinstance(found["notes"], list)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "train.jsonl"
    target.write_text("old\n")

    def write(temp: Path) -> None:
        with temp.open("w") as handle:
            handle.write("new\n")
            raise RuntimeError("cut")  # killed half-way

    with pytest.raises(RuntimeError):
        prepare_files.atomic(target, write)
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["train.jsonl"]


# --------------------------------------------------------------------------- command line


@pytest.mark.parametrize(
    "args, message",
    [
        (["nope"], "data: unknown paper 'nope'; papers: arena, r2ag, search_r1 (alias eval_rar)"),
        (["arena", "--source", "hotpotqa-train"], "data: --source expects NAME=PATH, got"),
        (["arena", "--source", "hotpot=x.json"], "data: unknown source 'hotpot'; sources: "),
        (["arena", "--source", "hotpotqa-train=/no/such.json"], "file not found: /no/such.json"),
        (["arena", "--bogus"], "data: unrecognized arguments: --bogus (usage: lit-rag data"),
        (["arena"], "data: arena needs hotpotqa-train, 2wiki-train, musique-train: pass "
                    "--source hotpotqa-train=PATH (HotpotQA's hotpot_train_v1.1.json, "
                    "https://hotpotqa.github.io)"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["data", *args])
    assert exit_.value.code == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("lit-rag: error: ") and message in err
    assert not (tmp_path / "data").exists()  # nothing written


def test_a_source_without_paragraphs_is_refused_where_they_are_needed(tmp_path, capsys):
    sources = original_sources(tmp_path, train=20, dev=10)
    sources["hotpotqa-train"] = flashrag(tmp_path / "hotpot_flashrag.jsonl", 20, "h")
    with pytest.raises(SystemExit):
        run("arena", tmp_path / "out", sources)
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "hotpotqa-train" in err and "has no paragraphs" in err
    assert "hotpot_train_v1.1.json" in err


def test_list_names_every_paper_its_files_and_sources(capsys):
    main(["data", "--list"])
    out = capsys.readouterr().out
    for name in ("arena", "r2ag", "search_r1 (alias eval_rar)", "evo_rag"):
        assert f"\n{name}" in f"\n{out}"
    assert "train.jsonl" in out and "nq-train all" in out and "musique-train 1,174" in out


def test_test_files_maps_datasets_to_the_files_written():
    assert prepare.test_files("eval_rar", "data/search_r1") == {
        name: Path("data/search_r1") / f"test_{name}.jsonl"
        for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle")
    }
    assert list(prepare.test_files("arena", "d")) == ["hotpotqa", "2wiki", "musique"]
    assert list(prepare.test_files("evo-rag", "d")) == ["hotpotqa", "2wiki", "musique", "bamboogle"]
    for spec in prepare.PAPERS.values():
        assert spec.outputs[-1] == "manifest.json" and "train.jsonl" in spec.outputs


def test_data_list_imports_no_torch():
    code = (
        "import sys; from lit_rag.cli.commands import main; main(['data', '--list']); "
        "print([m for m in ('torch', 'lightning', 'transformers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_unknown_paper_from_python_is_an_input_error():
    with pytest.raises(InputError, match="unknown paper"):
        prepare.paper("arena2")


# --------------------------------------------------------------------------- real samples


@needs_shared
def test_search_r1_eval_only_on_the_real_samples(tmp_path, capsys):
    sources = {
        "nq-test": SHARED / "nq_test16_flashrag.jsonl",
        "bamboogle-test": SHARED / "bamboogle_flashrag.jsonl",
        "hotpotqa-dev": SHARED / "hotpotqa_dev10.jsonl",
        "2wiki-dev": SHARED / "2wikimultihopqa_dev10.jsonl",
        "musique-dev": SHARED / "musique_dev10.jsonl",
        "wiki18": SHARED / "wiki_corpus1000_flashrag.jsonl",
    }
    out = tmp_path / "sr1"
    run("search_r1", out, sources, "--eval-only")
    printed = capsys.readouterr().out
    found = manifest(out)
    assert set(found["absent"]) == {"triviaqa-test", "popqa-test"}
    assert found["files"]["test_bamboogle.jsonl"]["records"] == 125
    assert found["sources"]["wiki18"]["records"] == 1000
    assert "lit-rag index build --corpus" in printed and "wiki18-e5" in printed
    nq = read_litrag(out / "test_nq.jsonl")
    assert all(e.question.endswith("?") for e in nq)
    assert len({e.id for e in nq}) == len(nq)


@needs_shared
def test_r2ag_on_the_real_samples(tmp_path):
    sources = {
        "hotpotqa-train": SHARED / "hotpotqa_train100.json",
        "musique-train": SHARED / "musique_train100.json",
        "2wiki-train": twowiki(tmp_path / "2wiki_train.jsonl", 40, "wtr"),
        "hotpotqa-dev": SHARED / "hotpotqa_dev10.jsonl",
        "2wiki-dev": SHARED / "2wikimultihopqa_dev10.jsonl",
        "musique-dev": SHARED / "musique_dev10.jsonl",
    }
    out = tmp_path / "r2ag"
    run("r2ag", out, sources)
    train = read_litrag(out / "train.jsonl")
    assert sources_of(train)["hotpotqa-train"] == 15  # the 15 hard-level records of the 100
    corpus = {p.id for p in read_corpus(out / "corpus.jsonl")}
    for name in ("train.jsonl", "val.jsonl", "test_musique.jsonl", "test_hotpotqa.jsonl"):
        for example in read_litrag(out / name):
            assert example.gold_ids and set(example.gold_ids) <= corpus
