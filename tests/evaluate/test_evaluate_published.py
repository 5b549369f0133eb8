"""The papers' side of ``lit-rag evaluate``: every published value against a second copy typed
from the papers, the papers' protocol settings against a run's record, R2AG's t per dataset and
the Table 1 row a run matches, and the columns marked not comparable."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from lit_rag.data.papers import PAPERS
from lit_rag.evaluate.command import dataset_settings
from lit_rag.evaluate.suites import SUITES
from lit_rag.evaluate.table import r2ag_row, render, settings_lines

ROOT = Path(__file__).resolve().parents[2]
TYPED = ROOT / "tests" / "fixtures" / "published"


# ---- every published value -------------------------------------------------------------------


def _typed(paper: str) -> list[dict[str, str]]:
    """The rows of ``tests/fixtures/published/<paper>.csv`` (its ``#`` lines are comments)."""
    text = (TYPED / f"{paper}.csv").read_text(encoding="utf-8")
    return list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))


def _cells(row: dict[str, str], metrics: dict[str, tuple[str, float]]) -> dict:
    """``(dataset, metric title) -> value`` of a typed row: a column ``<dataset>_<suffix>``
    (or ``<dataset>`` alone, suffix '') is metric ``metrics[suffix] = (title, divisor)``."""
    cells = {}
    for column, text in row.items():
        dataset, _, suffix = column.partition("_")
        if column in ("row", "paper_row", "table", "average") or suffix not in metrics:
            continue
        title, divisor = metrics[suffix]
        cells[(dataset, title)] = float(text) / divisor
    return cells


#: how each paper prints its values: Eval-RAR and ARENA fractions; R2AG percent (K a count);
#: EVO-RAG percent
_METRICS = {
    "eval_rar": {"": ("EM", 1.0)},
    "arena": {"em": ("EM", 1.0), "f1": ("F1", 1.0), "lj": ("LJ", 1.0)},
    "r2ag": {
        "recall": ("Recall", 100.0),
        "fr": ("FR", 100.0),
        "k": ("K", 1.0),
        "map": ("mAP", 100.0),
    },
    "evo_rag": {"em": ("EM", 100.0), "f1": ("F1", 100.0)},
}


def _published(paper: str, tables: tuple[str, ...] = ()) -> dict[str, dict]:
    rows = [r for r in _typed(paper) if not tables or r["table"] in tables]
    return {r["row"]: _cells(r, _METRICS[paper]) for r in rows}


@pytest.mark.parametrize(
    ("suite", "typed"),
    [
        ("eval-rar", _published("eval_rar", ("1", "2"))),  # Tables 1 and 2: 12 rows x 7
        ("arena", _published("arena")),  # Table 3: 8 rows x 3 datasets x 3 metrics
        ("r2ag", _published("r2ag")),  # Table 1: 6 rows x 3 datasets x 4 metrics
        ("evo-rag", _published("evo_rag")),  # Table 3: 5 rows x 4 datasets x 2 metrics
    ],
)
def test_every_published_value_is_the_papers(suite: str, typed: dict[str, dict]) -> None:
    """Each published row of the suite, value by value, against the copy typed from the
    paper: a typo on either side fails."""
    rows = {row.name: row.values for row in SUITES[suite].published.rows}
    assert sorted(rows) == sorted(typed)
    for name, values in rows.items():
        assert sorted(values) == sorted(typed[name]), name
        for key, value in values.items():
            assert value == pytest.approx(typed[name][key], abs=1e-9), (name, key)


def test_the_search_r1_rows_are_eval_rar_table_1_rows() -> None:
    table_1 = _published("eval_rar", ("1",))
    rows = {row.name: row.values for row in SUITES["search-r1"].published.rows}
    assert len(rows) == 6 and set(rows) <= set(table_1)
    for name, values in rows.items():
        assert values == pytest.approx(table_1[name], abs=1e-9), name


def test_all_268_published_values_are_typed() -> None:
    # Eval-RAR 12 x 7 = 84, ARENA 8 x 9 = 72, R2AG 6 x 12 = 72, EVO-RAG 5 x 8 = 40: 268
    counts = [
        sum(len(row.values) for row in SUITES[s].published.rows)
        for s in ("eval-rar", "arena", "r2ag", "evo-rag")
    ]
    assert counts == [84, 72, 72, 40] and sum(counts) == 268
    typed = [sum(len(v) for v in _published(p).values()) for p in _METRICS]
    assert typed == counts


def test_our_average_column_rounds_to_eval_rars() -> None:
    """The table's Avg of a published row is the mean of its seven values; the paper prints
    it to 3 places, from unrounded values: e.g. Search-R1-Base (0.421 + 0.583 + 0.413 + 0.297
    + 0.274 + 0.066 + 0.128) / 7 = 2.182 / 7 = 0.3117, printed 0.312."""
    table = render(SUITES["eval-rar"], [])
    for row in _typed("eval_rar"):
        line = next(x for x in table.splitlines() if x.startswith(row["row"] + "  "))
        assert float(line.split()[-1]) == pytest.approx(float(row["average"]), abs=0.0015)


# ---- the papers' settings against a run's -------------------------------------------------


def _search_record(**protocol) -> dict:
    """A search-r1 record (135M model) as lit-rag evaluate writes it, ``protocol`` applied."""
    base = {
        "recipe": {"path": "recipes/search_r1_hotpotqa_cpu.yaml"},
        "retriever": {
            "class": "lit_rag.plugins.retrievers.dense.DenseRetriever",
            "index": "indexes/wiki18-e5",
            "corpus": "/data/wiki-18.jsonl",
            "encoder_path": "/models/e5-base-v2",
            "manifest": {"encoder": "/models/e5-base-v2", "passage_count": 2000},
        },
        "top_k": {"top_k": 3, "max_turns": 4},
        "decoding": {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 500},
        "answer_punctuation": "delete",
        "datasets": {"nq": {"limit": None}},
    }
    return {
        "suite": "search-r1",
        "model": {"label": "untrained", "base": {"path": "m"}, "parameters": 135_000_000},
        "metrics": {"nq": {"EM": 0.5}},
        "questions": {"nq": 3_610},
        "protocol": {**base, **protocol},
    }


def test_every_setting_names_its_source_and_says_where_the_paper_is_silent() -> None:
    for suite in SUITES.values():
        settings = suite.published.settings
        assert {"model", "questions"} <= set(settings), suite.name
        for key, setting in settings.items():
            assert setting.cite, (suite.name, key)
            if setting.stated is None:  # silent: says so, and compares nothing
                assert setting.cite.startswith("not stated in"), (suite.name, key)
                assert setting.expect is None, (suite.name, key)
    # greedy decoding is Search-R1's setting, not a statement of Eval-RAR
    decoding = SUITES["eval-rar"].published.settings["decoding"]
    assert decoding.stated is None and "Search-R1's setting" in decoding.cite


def test_a_run_is_compared_with_each_setting_eval_rar_states() -> None:
    record = _search_record(top_k={"top_k": 5, "max_turns": 4})
    lines = settings_lines(SUITES["search-r1"], [record])
    assert lines == [
        # 0.135B against 3.0B: 3.0 / 0.135 = 22 times smaller, outside 1 / 1.25 .. 1.25
        "protocol differs: model: paper Qwen2.5-3B Base and Instruct [Eval-RAR Section 5.1], "
        "run 135M",
        "protocol unstated: corpus size: not stated in Eval-RAR (it cites Karpukhin et al., 2020 "
        "for the dump); run 2,000 passages",
        "protocol differs: top-k: paper 3 [Eval-RAR Section 5.1 and the A.1 prompt], run 5",
        "protocol unstated: max turns: not stated in Eval-RAR (Algorithm 1's limit N has no "
        "value; 4 is Search-R1's script); run 4",
        "protocol unstated: decoding: not stated in Eval-RAR (greedy is Search-R1's setting, "
        "not Eval-RAR's); run greedy",
        "protocol unstated: answer normalization: not stated in Eval-RAR, which names EM only "
        "(SQuAD's, punctuation deleted, is Search-R1's qa_em.py); run punctuation delete "
        "(answer_punctuation: delete)",
        "protocol as published: corpus, retriever, encoder, questions",
    ]


def test_the_table_prints_the_settings_lines() -> None:
    record = _search_record(retriever=None, answer_punctuation="space")
    table = render(SUITES["search-r1"], [record])
    assert (
        "protocol differs: corpus: paper the December 2018 Wikipedia dump (Karpukhin et al., "
        "2020) [Eval-RAR Section 5.1], run the references in the prompt" in table
    )
    assert "protocol differs: retriever: paper dense (E5-base-v2) [Eval-RAR Section 5.1], " in table
    assert "protocol differs: encoder: paper E5-base-v2 [Eval-RAR Section 5.1], run none" in table


def test_questions_differ_per_dataset() -> None:
    record = _search_record()
    record["questions"] = {"nq": 5, "bamboogle": 125}
    (line,) = [x for x in settings_lines(SUITES["eval-rar"], [record]) if "questions" in x]
    # Bamboogle's 125 is the paper's; NQ's 5 is not its 3,610
    assert line == ("protocol differs: questions: paper NQ 3,610 [Eval-RAR A.4 Table 4], run NQ 5")


def test_arena_compares_the_judge_and_the_normalization() -> None:
    record = _search_record(retriever=None, answer_punctuation="delete")
    record.update(suite="arena", questions={"hotpotqa": 500})
    record["model"]["parameters"] = 7_615_616_512  # Qwen2.5-7B-Instruct: 7.6 / 7.6 = 1
    lines = settings_lines(SUITES["arena"], [record])
    assert (
        "protocol differs: answer normalization: paper lowercase; punctuation and articles "
        "removed; underscores to spaces (the release replaces punctuation with a space) "
        "[ARENA Appendix C.1], run punctuation delete (answer_punctuation: delete)" in lines
    )
    assert any(x.startswith("protocol differs: judge: paper GPT-4o (2024-11-20)") for x in lines)
    assert lines[-1] == "protocol as published: model, corpus, retriever, questions"


# ---- R2AG's t per dataset and its Table 1 row -------------------------------------------------


def test_the_r2ag_suite_scores_each_dataset_at_t_m_over_2() -> None:
    # M (Section 3.1): HotpotQA 2 hops, 2Wiki 4, MuSiQue 4; t = M/2: 2/2 = 1, 4/2 = 2, 4/2 = 2
    assert SUITES["r2ag"].dataset_settings == {
        "hotpotqa": {"val_top_t": 1},
        "2wiki": {"val_top_t": 2},
        "musique": {"val_top_t": 2},
    }
    assert SUITES["r2ag"].published.settings["top_t"].expect == {
        "hotpotqa": 1,
        "2wiki": 2,
        "musique": 2,
    }


def test_dataset_settings_set_t_while_a_dataset_is_scored_then_restore_the_recipes() -> None:
    env = SimpleNamespace(val_top_t=2, val_predicted_queries=True)  # r2ag.yaml's t = 2
    with dataset_settings(SUITES["r2ag"], "hotpotqa", env, []) as used:
        assert env.val_top_t == 1
    assert used == {"val_top_t": 1, "val_predicted_queries": True}
    assert env.val_top_t == 2
    # an override naming the setting is the user's: it stays
    override = ["--model.environment.init_args.val_top_t=4"]
    env.val_top_t = 4
    with dataset_settings(SUITES["r2ag"], "hotpotqa", env, override) as used:
        assert env.val_top_t == 4
    assert used["val_top_t"] == 4
    # an environment without the setting (search agent) is left alone and records nothing
    with dataset_settings(SUITES["r2ag"], "hotpotqa", SimpleNamespace(top_k=3), []) as used:
        assert used == {}


def _r2ag_record(k: int, predicted: bool, t: dict[str, int]) -> dict:
    datasets = {
        d: {"limit": None, "val_top_t": v, "val_predicted_queries": predicted} for d, v in t.items()
    }
    return {
        "suite": "r2ag",
        "model": {"label": "untrained", "base": {"path": "m"}, "parameters": 8_190_735_360},
        "metrics": {d: {"Recall": 0.9} for d in t},
        "questions": dict.fromkeys(t, 1_000),
        "protocol": {"top_k": {"val_top_k": k, "val_top_t": 2}, "datasets": datasets},
    }


def test_the_r2ag_row_a_run_matches() -> None:
    at_half = {"hotpotqa": 1, "2wiki": 2, "musique": 2}
    assert r2ag_row(_r2ag_record(1, True, at_half)) == (
        "R2AG row of this run: R2AG-0.56B@8B @top-1 (Qwen3-8B), t = M/2 "
        "(HotpotQA t = M/2 = 1, 2Wiki t = M/2 = 2, MuSiQue t = M/2 = 2)"
    )
    assert r2ag_row(_r2ag_record(2, False, at_half)).startswith(
        "R2AG row of this run: R2AG-0.56B@8B base @top-2 (Qwen3-8B)"
    )
    # the recipe's t = 2 on HotpotQA is t = M (2 hops): Table 1 has no such row
    line = r2ag_row(_r2ag_record(1, True, {"hotpotqa": 2, "2wiki": 2}))
    assert line.startswith("R2AG row: none matches (HotpotQA t = M = 2, 2Wiki t = M/2 = 2)")
    table = render(SUITES["r2ag"], [_r2ag_record(1, True, at_half)])
    assert "R2AG row of this run: R2AG-0.56B@8B @top-1 (Qwen3-8B), t = M/2" in table
    assert "protocol as published: model, top-k, top-t, questions" in table


# ---- EVO-RAG's corpus and Bamboogle -------------------------------------------------------------


def test_evo_rag_names_its_corpus_as_ours_and_marks_bamboogle() -> None:
    corpus = PAPERS["evo_rag"].corpus
    assert corpus.startswith("ours:") and "RRF-BGE" in corpus and "no corpus" in corpus
    record = {
        "suite": "evo-rag",
        "model": {"label": "untrained", "base": {"path": "m"}},
        "metrics": {"hotpotqa": {"EM": 0.5, "F1": 0.6}, "bamboogle": {"EM": 0.1, "F1": 0.2}},
        "questions": {"hotpotqa": 7_405, "bamboogle": 125},
    }
    table = render(SUITES["evo-rag"], [record])
    header = next(x for x in table.splitlines() if x.startswith("model "))
    assert re.findall(r"\S+†", header) == ["EM†", "F1†"]  # Bamboogle EM†, Bamboogle F1†
    assert "HotpotQA EM†" not in header
    (note,) = [x for x in table.splitlines() if x.startswith("† ")]
    assert note.startswith("† Bamboogle: not comparable with the paper's column: ")


def test_evaluate_records_each_datasets_t_and_names_the_row(capsys, tmp_path) -> None:
    """The R2AG CPU recipe (t = 1) on a random tiny policy: HotpotQA runs at t = M/2 = 2/2 = 1,
    MuSiQue at t = M/2 = 4/2 = 2, and the record keeps both."""
    from lit_rag.cli import commands as cli

    for dataset in ("hotpotqa", "musique"):
        lines = (ROOT / "data" / dataset / "heldout30.jsonl").read_text().splitlines()[:2]
        (tmp_path / f"test_{dataset}.jsonl").write_text("\n".join(lines) + "\n")
    retriever = "--model.environment.init_args.retriever.init_args"
    cli.main(
        ["evaluate", "--suite", "r2ag", "--config", str(ROOT / "recipes/r2ag_hotpotqa_cpu.yaml"),
         "--data", str(tmp_path), "--out", str(tmp_path / "out"),
         "--model.policy.path=null", "--model.policy.lora=null", "--model.engine=hf",
         "--model.policy.tiny.hidden_size=32", "--model.policy.tiny.num_layers=2",
         "--model.policy.tiny.num_heads=2", "--model.val_sampling.max_new_tokens=4",
         "--model.environment.init_args.reader_max_new_tokens=2",
         f"{retriever}.index={tmp_path / 'index'}",
         f"{retriever}.corpus={ROOT / 'data/hotpotqa/corpus.jsonl'}"]
    )  # fmt: skip
    table = capsys.readouterr().out
    record = json.loads((tmp_path / "out" / "untrained" / "record.json").read_text())
    datasets = record["protocol"]["datasets"]
    assert [datasets[d]["val_top_t"] for d in ("hotpotqa", "musique")] == [1, 2]
    assert all(datasets[d]["val_predicted_queries"] is True for d in ("hotpotqa", "musique"))
    assert record["protocol"]["top_k"]["val_top_t"] == 1  # the recipe's, restored
    assert "R2AG row of this run: R2AG-0.56B@8B @top-1 (Qwen3-8B), t = M/2" in table
