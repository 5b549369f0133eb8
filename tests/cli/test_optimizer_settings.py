"""The policy's optimizer settings are one recipe group, ``model.optimizer``; the flat keys they
had before (``model.lr``, ...) still work, in a recipe and on the command line, with one line on
stderr naming the new key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lit_rag.cli.commands import build_cli
from lit_rag.cli.recipe_args import RENAMED_KEYS, RecipeError, resolve_args
from lit_rag.trainer.optimizer import OptimizerSettings

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
WANTED = OptimizerSettings(lr=3e-5, betas=(0.9, 0.95), max_grad_norm=0.5)


def _recipe(tmp_path: Path, **model) -> str:
    """tiny.yaml with ``model``'s keys replaced (its optimizer group removed)."""
    recipe = yaml.safe_load(TINY.read_text())
    recipe["model"].pop("optimizer", None)
    recipe["model"].update(model)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return str(path)


def _settings(args: list[str]) -> OptimizerSettings:
    return build_cli(args, run=False).model.optim


def _renamed_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "the old name still works" in line]


def test_the_optimizer_group_sets_the_settings(tmp_path, capsys):
    group = {"lr": 3e-5, "betas": [0.9, 0.95], "max_grad_norm": 0.5}
    assert _settings(["--config", _recipe(tmp_path, optimizer=group)]) == WANTED
    override = ["--config", str(TINY), "--model.optimizer.lr=3e-5"]
    assert _settings(override) == OptimizerSettings(lr=3e-5)
    assert not _renamed_lines(capsys.readouterr().err)


def test_old_keys_in_a_recipe_give_the_same_settings_and_say_the_new_names(tmp_path, capsys):
    path = _recipe(tmp_path, lr=3e-5, betas=[0.9, 0.95], max_grad_norm=0.5)
    assert _settings(["--config", path]) == WANTED
    assert _renamed_lines(capsys.readouterr().err) == [
        f"lit-rag: model.{k} is now model.optimizer.{k}; the old name still works"
        for k in ("lr", "betas", "max_grad_norm")
    ]


@pytest.mark.parametrize("split", [False, True], ids=["key=value", "key value"])
def test_an_old_key_on_the_command_line_still_works_with_one_line(split, capsys):
    option = ["--model.lr", "3e-5"] if split else ["--model.lr=3e-5"]
    assert _settings(["--config", str(TINY), *option]) == OptimizerSettings(lr=3e-5)
    assert _renamed_lines(capsys.readouterr().err) == [
        "lit-rag: model.lr is now model.optimizer.lr; the old name still works"
    ]


def test_an_old_key_said_twice_is_told_once(tmp_path, capsys):
    args = resolve_args(["--config", _recipe(tmp_path, lr=1e-5), "--model.lr=3e-5"])
    assert args[-1] == "--model.optimizer.lr=3e-5"  # the command line still wins
    assert len(_renamed_lines(capsys.readouterr().err)) == 1


def test_a_recipe_with_both_names_fails_naming_them(tmp_path):
    path = _recipe(tmp_path, lr=1e-5, optimizer={"lr": 2e-5})
    with pytest.raises(RecipeError, match="gives both model.lr and model.optimizer.lr"):
        resolve_args(["--config", path])


def test_a_module_that_names_its_own_class_keeps_its_keys(tmp_path, capsys):
    """The EVO-RAG reward model recipe's ``model`` is another LightningModule with its own
    ``lr``: nothing is renamed there."""
    recipe = {"model": {"class_path": "some.Module", "init_args": {"lr": 1e-3}}}
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert resolve_args(["--config", str(path), "--model.lr=2e-3"])[-1] == "--model.lr=2e-3"
    assert not _renamed_lines(capsys.readouterr().err)


def test_every_old_key_has_a_field_of_the_group():
    fields = set(OptimizerSettings.__dataclass_fields__)
    assert {new.removeprefix("model.optimizer.") for new in RENAMED_KEYS.values()} == fields
