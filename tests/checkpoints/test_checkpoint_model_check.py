"""A checkpoint records what it was trained on (the base weights' fingerprint, the architecture,
the LoRA settings); loading it with a recipe that builds another model is one line naming both,
exit code 2, for every command that loads one: ``fit --ckpt_path`` (resume), ``validate``,
``compare``, ``evaluate`` and ``export``. A checkpoint written before the record existed loads
as before, with one line saying it cannot be checked, and a tensor of another shape is one line
either way (``load_state_dict``'s ``RuntimeError`` before).

Two checkpoints of the tiny recipe (one step each): full fine-tuning, and LoRA r=4 alpha=8.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import lightning_logs_to_this_stderr

from lit_rag.cli.commands import main

TINY = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml")
LORA = '--model.policy.lora={"r":4,"alpha":8}'  # no space: compare's argparse takes it as an option
#: what the tiny recipe's model is (recipes/tiny.yaml: hidden_size 32, 2 layers, 2 heads)
TINY_MODEL = "a tiny random model, seed 0"
ADVICE = "load it with the recipe (and model.policy overrides) it was trained with"
QUIET = ["--trainer.logger=false", "--trainer.limit_val_batches=0"]


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    """LightningCLI writes config.yaml into the working directory when the logger is off."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _log_to_this_tests_stderr():
    """Lightning logs to this test's stderr (:func:`helpers.lightning_logs_to_this_stderr`)."""
    lightning_logs_to_this_stderr()
    yield


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """``{"full": CKPT, "lora": CKPT}``: one step of the tiny recipe each."""
    found = {}
    for kind, extra in (("full", []), ("lora", [LORA])):
        root = tmp_path_factory.mktemp(kind)
        main(
            [
                "fit",
                "--config",
                TINY,
                *QUIET,
                "--trainer.enable_checkpointing=true",
                f"--trainer.default_root_dir={root}",
                "--trainer.max_steps=1",
                *extra,
            ]
        )
        (found[kind],) = (root / "checkpoints").glob("*.ckpt")
    return found


def _error(args: list[str], capsys) -> str:
    """Run ``lit-rag ARGS``; its one ``lit-rag: error:`` line (exit 2, no traceback)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("lit-rag: error:")]
    return line


def test_a_checkpoint_records_what_it_was_trained_on(checkpoints) -> None:
    full = torch.load(checkpoints["full"], weights_only=True)["lit_rag"]["trained_on"]
    lora = torch.load(checkpoints["lora"], weights_only=True)["lit_rag"]["trained_on"]
    assert full["source"] == TINY_MODEL
    assert full["architecture"]["hidden_size"] == 32
    assert full["architecture"]["num_hidden_layers"] == 2
    assert full["lora"] is None
    assert lora["lora"] == {"r": 4, "alpha": 8, "target_modules": "all-linear"}
    # the base weights are the untrained ones: the same for both runs, though the full run
    # changed every weight
    assert len(full["base"]) == 16 and full["base"] == lora["base"]


def test_validate_refuses_a_full_checkpoint_under_lora(checkpoints, capsys) -> None:
    ckpt = checkpoints["full"]
    line = _error(["validate", "--config", TINY, *QUIET, f"--ckpt_path={ckpt}", LORA], capsys)
    assert line == (
        f"lit-rag: error: checkpoint {ckpt} was trained on {TINY_MODEL} (full fine-tuning, no "
        f"LoRA); the recipe builds {TINY_MODEL} (LoRA r=4 alpha=8 on all-linear): {ADVICE}"
    )


def test_validate_refuses_another_hidden_size_in_one_line(checkpoints, capsys) -> None:
    ckpt = checkpoints["full"]
    wider = "--model.policy.tiny.hidden_size=64"
    line = _error(["validate", "--config", TINY, *QUIET, f"--ckpt_path={ckpt}", wider], capsys)
    # the tiny model's MLP is twice its width (intermediate_size 64 at hidden_size 32)
    assert line == (
        f"lit-rag: error: checkpoint {ckpt} was trained on {TINY_MODEL} (hidden_size 32, "
        f"intermediate_size 64); the recipe builds {TINY_MODEL} (hidden_size 64, "
        f"intermediate_size 128): {ADVICE}"
    )


def test_resume_refuses_lora_adapters_of_another_base(checkpoints, capsys) -> None:
    ckpt = checkpoints["lora"]
    seed = "--model.policy.tiny.seed=1"
    args = ["fit", "--config", TINY, *QUIET, f"--ckpt_path={ckpt}", LORA, seed]
    line = _error([*args, "--trainer.max_steps=2"], capsys)
    assert line.startswith(
        f"lit-rag: error: checkpoint {ckpt} was trained on {TINY_MODEL} (base weights "
    )
    assert "; the recipe builds a tiny random model, seed 1 (base weights " in line


def test_compare_refuses_another_lora_rank(checkpoints, capsys) -> None:
    ckpt = checkpoints["lora"]
    other = '--model.policy.lora={"r":8,"alpha":8}'
    line = _error(["compare", "--config", TINY, str(ckpt), other], capsys)
    assert line == (
        f"lit-rag: error: checkpoint {ckpt} was trained on {TINY_MODEL} (LoRA r=4 alpha=8 on "
        f"all-linear); the recipe builds {TINY_MODEL} (LoRA r=8 alpha=8 on all-linear): {ADVICE}"
    )


def test_export_refuses_to_merge_adapters_into_another_base(checkpoints, tmp_path, capsys):
    ckpt, out = checkpoints["lora"], tmp_path / "exported"
    seed = "--model.policy.tiny.seed=1"
    line = _error(["export", str(ckpt), "--config", TINY, "--out", str(out), LORA, seed], capsys)
    assert f"checkpoint {ckpt} was trained on {TINY_MODEL} (base weights " in line
    assert not out.exists()
    main(["export", str(ckpt), "--config", TINY, "--out", str(out), LORA])  # its own base
    assert (out / "config.json").is_file()


def test_evaluate_refuses_a_checkpoint_of_another_model(checkpoints, tmp_path, capsys) -> None:
    data = tmp_path / "search_r1"
    data.mkdir()
    row = {"id": "n1", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}
    (data / "test_nq.jsonl").write_text(json.dumps(row) + "\n")
    ckpt = checkpoints["full"]
    args = ["evaluate", "--suite", "search-r1", "--config", TINY, "--data", str(data)]
    line = _error([*args, "--out", str(tmp_path / "out"), str(ckpt), LORA], capsys)
    assert line.startswith(f"lit-rag: error: checkpoint {ckpt} was trained on {TINY_MODEL} (full")


def test_an_old_checkpoint_loads_with_one_line_and_a_wrong_shape_is_one_line(
    checkpoints, tmp_path, capsys
) -> None:
    """A checkpoint without the record (an earlier lit-rag's) loads as it did."""
    state = torch.load(checkpoints["full"], weights_only=True)
    del state["lit_rag"]["trained_on"]
    old = tmp_path / "old.ckpt"
    torch.save(state, old)
    main(["validate", "--config", TINY, "--trainer.logger=false", f"--ckpt_path={old}"])
    err = capsys.readouterr().err
    assert (
        f"lit-rag: checkpoint {old} records no base model (written by an earlier lit-rag): it "
        "cannot be checked against the recipe's model; loading it as it is"
    ) in err.splitlines()
    wider = "--model.policy.tiny.hidden_size=64"
    line = _error(["validate", "--config", TINY, *QUIET, f"--ckpt_path={old}", wider], capsys)
    # the tiny model's vocabulary: 411 tokens (its in-code tokenizer's)
    assert line.startswith(
        f"lit-rag: error: checkpoint {old}: model.model.embed_tokens.weight has shape (411, 32), "
        "the recipe's model (411, 64) ("
    )
    assert line.endswith(f"tensors differ): it was trained on another model; {ADVICE}")
