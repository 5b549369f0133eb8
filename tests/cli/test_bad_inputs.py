"""Bad input through the real ``lit-rag`` entry point: exit code 2, one ``lit-rag: error:`` line
naming what was wrong, and no traceback.

Each row is a probe: the command line (the tiny recipe plus overrides) and a fragment the one
error line must contain. ``main`` is the function the ``lit-rag`` console script calls; a
traceback would surface here as an exception other than ``SystemExit(2)`` and fail the test.
"""

from __future__ import annotations

import gzip
import json
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import lightning_logs_to_this_stderr

from lit_rag.cli.commands import main

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
TINY = str(RECIPES / "tiny.yaml")
ROW = {"id": "q1", "question": "Who founded Orbel Mills?", "answers": ["Ada Orbel"]}


@pytest.fixture(autouse=True)
def _log_to_this_tests_stderr():
    """Lightning logs to this test's stderr (:func:`helpers.lightning_logs_to_this_stderr`)."""
    lightning_logs_to_this_stderr()
    yield


def _files(root: Path) -> dict[str, Path]:
    """The bad files the probes name, written once per test into ``root``."""
    good = json.dumps(ROW) + "\n"
    files = {
        "gzip": root / "train.jsonl.gz",
        "binary": root / "train.bin",
        "latin1": root / "latin1.jsonl",
        "surrogate": root / "surrogate.jsonl",
        "empty": root / "empty.jsonl",
        "blank": root / "blank.jsonl",
        "good": root / "good.jsonl",
        "ckpt_empty": root / "empty.ckpt",
        "ckpt_truncated": root / "truncated.ckpt",
        "ckpt_garbage": root / "garbage.ckpt",
        "ckpt_folder": root / "folder.ckpt",
        "ckpt_zip": root / "foreign.ckpt",
        "model_folder": root / "model-without-config",
    }
    files["gzip"].write_bytes(gzip.compress(good.encode()))
    files["binary"].write_bytes(bytes(range(256)) * 4)
    files["latin1"].write_bytes(good.replace("Orbel", "Orb\u00e9l").encode("latin-1"))
    # a JSON escape of half a surrogate pair: valid JSON, not valid Unicode text
    files["surrogate"].write_text(
        good.replace("Orbel Mills", "Orbel \\ud800 Mills"), encoding="utf-8"
    )
    files["empty"].write_text("")
    files["blank"].write_text("  \n\n \t\n")
    files["good"].write_text(good)
    files["ckpt_empty"].write_bytes(b"")
    torch.save({"state_dict": {"w": torch.zeros(64, 64)}, "global_step": 2}, root / "whole.ckpt")
    whole = (root / "whole.ckpt").read_bytes()
    files["ckpt_truncated"].write_bytes(whole[: len(whole) // 2])
    files["ckpt_garbage"].write_bytes(b"not a checkpoint\n" * 64)
    files["ckpt_folder"].mkdir()
    with zipfile.ZipFile(
        files["ckpt_zip"], "w"
    ) as archive:  # a complete zip, not a torch checkpoint
        archive.writestr("README.txt", "model weights are in the other archive")
    files["model_folder"].mkdir()
    (files["model_folder"] / "weights.txt").write_text("no config.json here")
    return files


#: (probe id, subcommand, overrides, fragment of the error line); in the overrides ``{name}`` is a
#: file of ``_files`` and a leading ``@recipe.yaml`` replaces the tiny recipe
PROBES = [
    # argument checks raised inside plugins and modules
    ("group_size", "fit", ["--model.group_size=-2"], "group_size"),
    ("micro_batch_size", "fit", ["--model.micro_batch_size=0"], "micro_batch_size"),
    ("batch_size", "fit", ["--data.batch_size=0"], "batch_size"),
    ("lr", "fit", ["--model.optimizer.lr=-1"], "lr"),
    ("beta", "fit", ["--model.algorithm.init_args.beta=-5"], "beta"),
    ("max_new_tokens", "fit", ["--model.sampling.max_new_tokens=0"], "max_new_tokens must be >= 1"),
    ("temperature", "fit", ["--model.sampling.temperature=-1"], "temperature must be >= 0"),
    ("top_p", "fit", ["--model.sampling.top_p=0"], "top_p"),
    ("max_grad_norm", "fit", ["--model.optimizer.max_grad_norm=0"], "max_grad_norm"),
    ("warmup", "fit", ["--model.optimizer.warmup_steps=-1"], "warmup_steps"),
    ("schedule", "fit", ["--model.optimizer.lr_schedule=exp"], "lr_schedule 'exp'"),
    (
        "warmup_ratio",
        "fit",
        ["--model.optimizer.warmup_ratio=1.5"],
        "warmup_ratio must be in [0, 1)",
    ),
    (
        "tiny_and_path",
        "fit",
        ["--model.policy.path=/models/x"],
        "sets both 'path' (/models/x) and 'tiny'",
    ),
    (
        "mini_batches",
        "fit",
        ["--model.algorithm.init_args.mini_batches=0"],
        "mini_batches must be >= 1",
    ),
    ("devices", "fit", ["--trainer.devices=0"], "devices"),
    ("max_steps", "fit", ["--trainer.max_steps=-5"], "max_steps"),
    (
        "val_check_interval",
        "fit",
        ["--trainer.val_check_interval=0"],
        "val_check_interval must be > 0",
    ),
    ("num_train", "fit", ["--data.num_train=0"], "num_train"),
    ("hops", "fit", ["--data.hops=[7]"], "hops"),
    ("mu", "fit", ["--model.algorithm.init_args.mu=0"], "mu"),
    ("kl_estimator", "fit", ["--model.algorithm.init_args.kl_estimator=k9"], "kl_estimator 'k9'"),
    (
        "advantage",
        "fit",
        ["--model.algorithm.init_args.advantage=rlooo"],
        "unknown advantage 'rlooo'; installed: grpo",
    ),
    (
        "policy_loss",
        "fit",
        ["--model.algorithm.init_args.policy_loss=gspoo"],
        "unknown policy_loss 'gspoo'; installed: gspo, ppo_clip",
    ),
    (
        "init_arg",
        "fit",
        ["--model.reward.init_args.wieght=2"],
        "'wieght' is not an argument of ArenaReward; it takes: format_weight",
    ),
    ("dtype", "fit", ["--model.policy.dtype=fp8"], "dtype 'fp8'"),
    ("lora_rank", "fit", ["--model.policy.lora.r=0"], "lora: r must be >= 1"),
    (
        "max_turns",
        "fit",
        ["@tiny_search_agent.yaml", "--model.environment.init_args.max_turns=0"],
        "max_turns",
    ),
    (
        "missing_index",
        "fit",
        ["@tiny_search_agent.yaml", "--model.environment.init_args.retriever.init_args.index=nope"],
        "index folder not found: nope",
    ),
    (
        "engine_memory",
        "fit",
        ["--model.engine=vllm", "--model.engine.init_args.gpu_memory_utilization=2"],
        "gpu_memory_utilization",
    ),
    # the parser: no abbreviations, typed values, known keys
    ("abbreviation", "fit", ["--trainer.max_step=4"], "--trainer.max_step=4"),
    ("type", "fit", ["--model.group_size=abc"], "model.group_size"),
    (
        "union_type",
        "fit",
        ["--seed_everything=abc"],
        "seed_everything: got 'abc'; expected bool or int",
    ),
    ("unknown_key", "fit", ["--model.no_such_key=1"], "model.no_such_key"),
    ("unknown_plugin", "fit", ["--model.reward=no_such_reward"], "unknown reward 'no_such_reward'"),
    # data files
    ("gzip_data", "fit", ["--data.train={gzip}"], "gzip-compressed"),
    ("binary_data", "fit", ["--data.train={binary}"], "binary"),
    ("latin1_data", "fit", ["--data.train={latin1}"], "not UTF-8"),
    ("surrogate", "fit", ["--data.train={surrogate}"], "lone surrogate"),
    ("empty_data", "fit", ["--data.train={empty}"], "holds no examples"),
    ("blank_data", "fit", ["--data.train={blank}"], "holds no examples"),
    ("missing_data", "fit", ["--data.train=no-such-file.jsonl"], "no-such-file.jsonl"),
    ("bad_format", "fit", ["--data.train={good}", "--data.format=csv"], "data.format"),
    ("empty_val", "validate", ["--data.val={empty}"], "holds no examples"),
    ("no_val", "validate", ["--data.val=null"], "needs validation data"),
    ("empty_test", "test", ["--data.test={blank}"], "holds no examples"),
    # checkpoints
    ("ckpt_empty", "fit", ["--ckpt_path={ckpt_empty}"], "empty (0 bytes)"),
    (
        "ckpt_truncated",
        "fit",
        ["--ckpt_path={ckpt_truncated}"],
        "truncated or not a torch checkpoint",
    ),
    ("ckpt_garbage", "fit", ["--ckpt_path={ckpt_garbage}"], "truncated or not a torch checkpoint"),
    ("ckpt_folder", "fit", ["--ckpt_path={ckpt_folder}"], "is a folder"),
    (
        "ckpt_foreign_zip",
        "fit",
        ["--ckpt_path={ckpt_zip}"],
        "foreign.ckpt",
    ),  # read by the trainer's load
    ("ckpt_missing", "fit", ["--ckpt_path=no-such.ckpt"], "no-such.ckpt does not exist"),
    # model paths
    (
        "model_hub_id",
        "fit",
        ["--model.policy.tiny=null", "--model.policy.path=no-such-org/no-such-model"],
        "not in the local Hugging Face cache",
    ),
    (
        "model_missing",
        "fit",
        ["--model.policy.tiny=null", "--model.policy.path=./no/such/model"],
        "does not exist",
    ),
    (
        "model_no_config",
        "fit",
        ["--model.policy.tiny=null", "--model.policy.path={model_folder}"],
        "without config.json",
    ),
]


@pytest.mark.parametrize(
    ("probe", "command", "overrides", "fragment"), PROBES, ids=[p[0] for p in PROBES]
)
def test_bad_input_is_one_line_exit_2(
    probe, command, overrides, fragment, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    files = _files(tmp_path)
    recipe = str(RECIPES / overrides[0][1:]) if overrides[0].startswith("@") else TINY
    overrides = [o.format(**files) for o in overrides if not o.startswith("@")]
    args = [
        command,
        "--config",
        recipe,
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_steps=1",
        *overrides,
    ]
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("lit-rag: error:")]
    assert info.value.code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert fragment in lines[0], lines[0]


def test_abbreviated_key_is_not_taken_for_the_full_one(tmp_path, monkeypatch, capsys) -> None:
    """argparse completes unambiguous prefixes by default: ``--trainer.max_step=4`` used to run with
    ``max_steps=4``."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", TINY, "--trainer.max_step=4", "--trainer.logger=false"])
    assert info.value.code == 2
    assert "unrecognized arguments: --trainer.max_step=4" in capsys.readouterr().err


def test_fit_does_not_print_the_recipe(tmp_path, monkeypatch, capsys) -> None:
    """With the console script's sys.argv set, Lightning used to warn "args parameter is intended
    ..." with the whole rewritten recipe in the message, at every fit."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["lit-rag", "fit", "--config", TINY])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(
            [
                "fit",
                "--config",
                TINY,
                "--trainer.max_steps=1",
                "--trainer.logger=false",
                "--trainer.limit_val_batches=0",
                f"--trainer.default_root_dir={tmp_path}",
            ]
        )
    messages = [str(w.message) for w in caught] + capsys.readouterr().err.splitlines()
    assert not [m for m in messages if "args parameter is intended" in m or "kl_estimator" in m]


def test_checkpoint_hyperparameters_choose_no_import(tmp_path, monkeypatch) -> None:
    """A checkpoint is data. Lightning's CLI parses a checkpoint's ``hyper_parameters`` into the
    config, so a ``_class_path`` written into a downloaded checkpoint chose a module to import;
    lit-rag's recipe stays the only config and the resume runs as the recipe says."""
    import sys

    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "imported"
    (tmp_path / "planted_ckpt.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nclass Evil:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    common = [
        "--config",
        TINY,
        "--trainer.logger=false",
        "--trainer.limit_val_batches=0",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    main(["fit", *common, "--trainer.max_steps=1", "--trainer.enable_checkpointing=true"])
    (ckpt,) = (tmp_path / "checkpoints").glob("*.ckpt")
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint["hyper_parameters"] = {
        "_class_path": "planted_ckpt.Evil",
        "environment": {"class_path": "planted_ckpt.Evil"},
    }
    torch.save(checkpoint, ckpt)
    main(
        [
            "fit",
            *common,
            "--trainer.max_steps=2",
            "--trainer.enable_checkpointing=false",
            f"--ckpt_path={ckpt}",
        ]
    )
    assert "planted_ckpt" not in sys.modules
    assert not marker.exists()
