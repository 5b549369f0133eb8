"""The ``lit-rag`` command: plugin-name rewriting, every shipped recipe, overrides, errors.

Every recipe in ``recipes/*.yaml`` is parsed and instantiated by the real LightningCLI with
``run=False`` (docs/STYLE.md item 6), so a recipe cannot rot. Nothing here loads model weights: the
policy loads in ``configure_model``, which ``run=False`` never calls.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from helpers import one_line_error

from lit_rag import registry
from lit_rag.api import Algorithm, Environment, Reward
from lit_rag.cli import commands as cli
from lit_rag.cli.commands import build_cli, main, resolve_args, resolve_config
from lit_rag.data.datamodule import QADataModule
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.plugins.rewards.arena import ArenaReward
from lit_rag.plugins.rewards.qa import ExactMatchReward
from lit_rag.registry import PluginError
from lit_rag.rollout.base import RolloutEngine
from lit_rag.trainer.policy import PolicyModule

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
TINY = REPO / "recipes" / "tiny.yaml"

ARENA = "lit_rag.plugins.rewards.arena.ArenaReward"
EM = "lit_rag.plugins.rewards.qa.ExactMatchReward"
F1 = "lit_rag.plugins.rewards.qa.F1Reward"
COMPOSITE = "lit_rag.plugins.rewards.composite.CompositeReward"
GRPO_PATH = "lit_rag.plugins.algorithms.grpo.GRPO"
SINGLE_TURN = "lit_rag.plugins.environments.single_turn.SingleTurnEnvironment"
HF = "lit_rag.plugins.engines.hf.HFEngine"

#: recipe -> third-party modules it needs (the example packages in plugins/, installed separately)
THIRD_PARTY = {
    "tiny_plugin.yaml": ["lit_rag_length_penalty"],
    "tiny_worked_plugins.yaml": [
        "lit_rag_closed_book",
        "lit_rag_reinforce_loo",
        "lit_rag_lagged_engine",
    ],
}


def require_module(module: str) -> None:
    """Skip when a separately installed plugin is absent, but fail in CI, which installs it."""
    if importlib.util.find_spec(module) is not None:
        return
    message = f"{module} is not installed (bash scripts/install.sh dev installs plugins/)"
    if os.environ.get("CI"):
        pytest.fail(f"CI must install the example plugin: {message}")
    pytest.skip(message)


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path: Path) -> None:
    """Fresh plugin cache, no stray argv, and anything the CLI writes lands in ``tmp_path``."""
    registry.clear_cache()
    monkeypatch.setattr(sys, "argv", ["lit-rag"])
    monkeypatch.chdir(tmp_path)
    yield
    registry.clear_cache()


def write_recipe(path: Path, recipe: dict) -> str:
    path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    return str(path)


def tiny_recipe() -> dict:
    return yaml.safe_load(TINY.read_text(encoding="utf-8"))


# ---- resolve_config ----------------------------------------------------------------------
def test_resolve_config_rewrites_every_plugin_key() -> None:
    config = {
        "model": {
            "reward": {"class_path": "arena", "init_args": {"bonus": 5.0}},
            "algorithm": {"class_path": "grpo"},
            "environment": {"class_path": "single_turn"},
            "engine": "hf",  # a bare name is short for {class_path: hf}
        }
    }
    assert resolve_config(config) == {
        "model": {
            "reward": {"class_path": ARENA, "init_args": {"bonus": 5.0}},
            "algorithm": {"class_path": GRPO_PATH},
            "environment": {"class_path": SINGLE_TURN},
            "engine": {"class_path": HF},
        }
    }


def test_resolve_config_rewrites_lists_under_rewards() -> None:
    config = {
        "reward": {
            "class_path": "composite",
            "init_args": {
                "rewards": ["exact_match", {"class_path": "f1"}, {"class_path": EM}],
                "weights": [1, 2, 3],
            },
        }
    }
    assert resolve_config(config)["reward"] == {
        "class_path": COMPOSITE,
        "init_args": {
            "rewards": [{"class_path": EM}, {"class_path": F1}, {"class_path": EM}],
            "weights": [1, 2, 3],
        },
    }


def test_resolve_config_leaves_dotted_paths_and_other_keys_alone() -> None:
    config = tiny_recipe()
    config["model"]["reward"] = {"class_path": ARENA}
    config["model"]["algorithm"]["class_path"] = GRPO_PATH
    config["model"]["environment"]["class_path"] = SINGLE_TURN
    # trainer.logger.class_path is not a plugin key; data.train: synthetic is not a plugin name
    assert resolve_config(config) == config


def test_resolve_config_does_not_modify_its_input() -> None:
    config = {"model": {"reward": {"class_path": "arena"}}}
    resolve_config(config)
    assert config == {"model": {"reward": {"class_path": "arena"}}}


def test_resolve_config_unknown_name_lists_installed() -> None:
    with pytest.raises(PluginError) as info:
        resolve_config({"model": {"reward": {"class_path": "arena2"}}})
    message = str(info.value)
    assert message.startswith("unknown reward 'arena2'; installed: ")
    installed = message.split("installed: ")[1].split(", ")
    assert {"arena", "composite", "exact_match", "f1"} <= set(installed)


# ---- resolve_args ------------------------------------------------------------------------
def test_resolve_args_rewrites_overrides() -> None:
    assert resolve_args(["fit", "--model.reward=arena"]) == ["fit", f"--model.reward={ARENA}"]
    key = "--model.reward.class_path"
    assert resolve_args([key, "arena"]) == [key, ARENA]
    key = "--model.algorithm.class_path"
    assert resolve_args([f"{key}=grpo"]) == [f"{key}={GRPO_PATH}"]
    assert resolve_args(["--model.engine", "hf"]) == ["--model.engine", HF]


def test_resolve_args_leaves_dotted_paths_and_other_options_alone() -> None:
    args = [
        "fit",
        f"--model.reward={ARENA}",
        "--model.algorithm.init_args.beta=0.5",
        "--trainer.max_steps",
        "3",
        "--data.train",
        "synthetic",
        "--print_config",
    ]
    assert resolve_args(args) == args


def test_resolve_args_unknown_override_lists_installed() -> None:
    with pytest.raises(PluginError, match=r"^unknown algorithm 'ppo2'; installed: .*grpo"):
        resolve_args(["--model.algorithm.class_path=ppo2"])


def test_resolve_args_passes_config_inline_only_when_rewritten(tmp_path: Path) -> None:
    named = write_recipe(tmp_path / "named.yaml", {"model": {"reward": {"class_path": "arena"}}})
    out = resolve_args(["fit", "--config", named])
    assert out[:2] == ["fit", "--config"]
    assert yaml.safe_load(out[2]) == {"model": {"reward": {"class_path": ARENA}}}
    dotted = write_recipe(tmp_path / "dotted.yaml", {"model": {"reward": {"class_path": ARENA}}})
    assert resolve_args(["fit", f"--config={dotted}"]) == ["fit", "--config", dotted]


# ---- every shipped recipe builds -----------------------------------------------------------
def test_recipes_exist() -> None:
    assert TINY in RECIPES


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
def test_every_recipe_parses_and_instantiates(recipe: Path) -> None:
    for module in THIRD_PARTY.get(recipe.name, []):
        require_module(module)
    trainer = yaml.safe_load(recipe.read_text(encoding="utf-8")).get("trainer") or {}
    if "fsdp" in str(trainer.get("strategy", "")).lower():  # FSDP builds only where CUDA is
        from helpers import pretend_cuda

        with pretend_cuda():
            built = build_cli(["--config", str(recipe)], run=False)
    else:
        built = build_cli(["--config", str(recipe)], run=False)
    if "class_path" in (yaml.safe_load(recipe.read_text(encoding="utf-8")).get("model") or {}):
        from lit_rag.trainer.reward_model import PairDataModule, RewardModelModule

        assert isinstance(built.model, RewardModelModule) and isinstance(
            built.datamodule, PairDataModule
        )
        return
    assert isinstance(built.model, PolicyModule)
    assert isinstance(built.datamodule, QADataModule)
    assert isinstance(built.model.reward, Reward)
    assert isinstance(built.model.algorithm, Algorithm)
    assert isinstance(built.model.environment, Environment)
    assert isinstance(built.model.engine, RolloutEngine)
    assert built.model.model is None  # weights load in configure_model, not here


def test_tiny_recipe_values() -> None:
    built = build_cli(["--config", str(TINY)], run=False)
    model = built.model
    assert type(model.algorithm) is GRPO
    assert model.algorithm.beta == 0.04
    assert type(model.environment) is SingleTurnEnvironment
    assert type(model.reward) is ArenaReward
    assert model.group_size == 2 and model.micro_batch_size == 4
    assert model.policy_config.tiny is not None and model.policy_config.tiny.hidden_size == 32
    assert built.trainer.max_steps == 2


def test_recipe_with_missing_model_path_still_builds(tmp_path: Path) -> None:
    recipe = tiny_recipe()
    recipe["model"]["policy"] = {"path": str(tmp_path / "no-such-model")}
    built = build_cli(["--config", write_recipe(tmp_path / "r.yaml", recipe)], run=False)
    assert built.model.policy_config.path == str(tmp_path / "no-such-model")
    assert built.model.model is None


# ---- overrides through the real CLI --------------------------------------------------------
def test_override_init_arg() -> None:
    built = build_cli(["--config", str(TINY), "--model.algorithm.init_args.beta=0.5"], run=False)
    assert built.model.algorithm.beta == 0.5


def test_override_plugin_by_name() -> None:
    built = build_cli(["--config", str(TINY), "--model.reward=exact_match"], run=False)
    assert type(built.model.reward) is ExactMatchReward
    args = ["--config", str(TINY), "--model.reward.class_path", "exact_match"]
    built = build_cli(args, run=False)
    assert type(built.model.reward) is ExactMatchReward


# ---- lit-rag plugins -------------------------------------------------------------------------
def plugin_rows(out: str) -> dict[tuple[str, str], list[str]]:
    """``kind name package version target`` rows of ``lit-rag plugins``, by (kind, name)."""
    lines = out.strip().splitlines()
    assert lines[0].split() == ["kind", "name", "package", "target"]
    return {tuple(line.split()[:2]): line.split()[2:] for line in lines[1:]}


def test_plugins_lists_builtins_with_their_package(capsys) -> None:
    main(["plugins"])
    rows = plugin_rows(capsys.readouterr().out)
    version = registry.available("reward")["arena"].version
    builtins = {
        ("algorithm", "grpo"): GRPO_PATH,
        ("reward", "arena"): ARENA,
        ("reward", "exact_match"): EM,
        ("reward", "f1"): F1,
        ("reward", "composite"): COMPOSITE,
        ("environment", "single_turn"): SINGLE_TURN,
        ("engine", "hf"): HF,
    }
    for key, dotted in builtins.items():
        module, _, attr = dotted.rpartition(".")
        assert rows[key] == ["lit-rag", version, f"{module}:{attr}"], key


def test_plugins_lists_third_party_package(capsys) -> None:
    require_module("lit_rag_length_penalty")
    main(["plugins"])
    rows = plugin_rows(capsys.readouterr().out)
    package, _, target = rows[("reward", "length_penalty")]
    assert package == "lit-rag-length-penalty"
    assert target == "lit_rag_length_penalty:LengthPenaltyReward"


# ---- one-line errors -------------------------------------------------------------------------
def run_main_error(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


class FakeDist:
    def __init__(self, name: str) -> None:
        self.metadata, self.version = {"Name": name}, "1.0"


def test_plugins_with_duplicate_registration_is_one_line(monkeypatch, capsys) -> None:

    group = "lit_rag.rewards"
    target = "lit_rag.plugins.rewards.qa:F1Reward"
    eps = [metadata.EntryPoint("f1", target, group)._for(FakeDist(p)) for p in ("lit-rag", "rag-x")]
    monkeypatch.setattr(registry, "_entry_points", lambda g: eps if g == group else [])
    registry.clear_cache()
    line = run_main_error(["plugins"], capsys)
    assert line.startswith("lit-rag: error: reward plugin 'f1' is registered twice")


def test_unknown_plugin_in_recipe_is_one_line(tmp_path: Path, capsys) -> None:
    recipe = tiny_recipe()
    recipe["model"]["reward"] = {"class_path": "arena2"}
    line = run_main_error(["fit", "--config", write_recipe(tmp_path / "bad.yaml", recipe)], capsys)
    assert line.startswith("lit-rag: error: unknown reward 'arena2'; installed: ")
    installed = line.split("installed: ")[1].split(", ")
    assert installed == sorted(installed) and {"arena", "composite", "exact_match", "f1"} <= set(
        installed
    )


def test_unknown_plugin_in_override_is_one_line(capsys) -> None:
    line = run_main_error(["fit", "--config", str(TINY), "--model.algorithm=grpo2"], capsys)
    assert line.startswith("lit-rag: error: unknown algorithm 'grpo2'; installed: ")
    assert "grpo" in line.split("installed: ")[1].split(", ")


def test_missing_recipe_is_one_line(tmp_path: Path, capsys) -> None:
    missing = str(tmp_path / "nope.yaml")
    line = run_main_error(["fit", "--config", missing], capsys)
    assert line == f"lit-rag: error: recipe '{missing}' does not exist"


def test_invalid_yaml_recipe_names_file_and_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("model:\n  reward:\n    class_path: [arena\ndata: 1\n", encoding="utf-8")
    line = run_main_error(["fit", "--config", str(path)], capsys)
    # the flow list opened on line 3 is found unclosed at the ':' of line 4
    assert line.startswith(f"lit-rag: error: recipe '{path}' line 4 is not valid YAML: ")


def test_recipe_that_is_not_a_mapping_is_one_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- model\n- data\n", encoding="utf-8")
    line = run_main_error(["fit", "--config", str(path)], capsys)
    expected = f"recipe '{path}' must be a mapping of sections (model, data, trainer, ...)"
    assert line == f"lit-rag: error: {expected}"


def test_no_arguments_prints_usage_and_exits_2(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert capsys.readouterr().out.startswith(cli.USAGE.splitlines()[0])


def test_list_override_of_plugins_is_resolved(monkeypatch) -> None:
    from lit_rag.cli.commands import build_cli
    from lit_rag.plugins.rewards.arena import ArenaReward
    from lit_rag.plugins.rewards.qa import F1Reward

    monkeypatch.setattr("sys.argv", ["lit-rag"])
    recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny_plugin.yaml")
    cli = build_cli(
        [
            "--config",
            recipe,
            "--model.reward.init_args.rewards=[arena, f1]",
            "--model.reward.init_args.weights=[1.0, 2.0]",
        ],
        run=False,
    )
    assert [type(r) for r in cli.model.reward.rewards] == [ArenaReward, F1Reward]


def _one_error_line(capsys) -> str:
    err = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("lit-rag: error:")
    ]
    assert len(err) == 1
    return err[0]


def test_dataset_row_missing_a_field_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    from lit_rag.cli.commands import main

    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "1", "question": "q", "answers": ["a"]}\n{"id": "2", "answers": ["b"]}\n'
    )
    recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml")
    with pytest.raises(SystemExit) as info:
        main(
            [
                "fit",
                "--config",
                recipe,
                f"--data.train={bad}",
                "--data.format=litrag",
                f"--trainer.default_root_dir={tmp_path}",
                "--trainer.logger=false",
            ]
        )
    assert info.value.code == 2
    line = _one_error_line(capsys)
    assert f"{bad}:2:" in line and "'question'" in line


def test_model_path_that_does_not_exist_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    from lit_rag.cli.commands import main

    monkeypatch.chdir(tmp_path)
    recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml")
    with pytest.raises(SystemExit):
        main(
            [
                "fit",
                "--config",
                recipe,
                "--model.policy.path=/no/such/model",
                "--data.num_train=4",
                f"--trainer.default_root_dir={tmp_path}",
                "--trainer.logger=false",
                "--trainer.callbacks=[]",
            ]
        )
    assert "model path '/no/such/model' does not exist" in _one_error_line(capsys)


def test_progress_bar_says_what_ends_the_run(tmp_path, monkeypatch):
    """Lightning's rich bar reads "Epoch 0/-2" when max_steps ends the run (max_epochs -1);
    lit-rag's bar says "Epoch 0 · 2 steps" there and keeps Lightning's text with max_epochs."""
    from lit_rag.callbacks import RunProgressBar

    monkeypatch.chdir(tmp_path)
    built = build_cli(["--config", str(TINY)], run=False)
    (bar,) = [c for c in built.trainer.callbacks if isinstance(c, RunProgressBar)]
    assert built.trainer.progress_bar_callback is bar
    bar._trainer = built.trainer
    assert bar._get_train_description(0).strip() == "Epoch 0 · 2 steps"
    epochs = build_cli(
        ["--config", str(TINY), "--trainer.max_epochs=3", "--trainer.max_steps=-1"], run=False
    )
    (bar,) = [c for c in epochs.trainer.callbacks if isinstance(c, RunProgressBar)]
    bar._trainer = epochs.trainer
    assert bar._get_train_description(1).strip() == "Epoch 1/2"


def test_fit_prints_a_header_and_the_report_command(tmp_path, monkeypatch, capsys):
    """The run's console opens with what runs and where it writes, and ends with the report
    command."""
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(TINY), "--trainer.max_steps=1", "--trainer.limit_val_batches=0"])
    out = capsys.readouterr().out
    assert (
        "lit-rag fit: tiny random model, single_turn + arena + grpo, engine hf, 1 process (single "
        "device), 1 step of 2 prompts x 2 samples, precision 32-true"
    ) in out
    assert "  logs: runs/tiny/version_0   checkpoints: runs/tiny/version_0/checkpoints" in out
    assert "lit-rag report runs/tiny/version_0   (plots and sample rollouts)" in out
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 1 and steps[0].startswith("step 1/1 · reward "), out
    assert " · kl " in steps[0] and " · rollout " in steps[0] and " · update " in steps[0]


def test_step_line_by_hand():
    import torch

    from lit_rag.callbacks.progress import step_line

    metrics = {
        "reward/total": torch.tensor(1.4125),
        "reward/format": 0.91,
        "reward/relevance": 0.5,
        "train/kl": 0.00213,
        "time/rollout_s": 3.14,
        "time/reward_s": 0.0213,
        "time/prepare_s": 0.004,  # not on the line
        "time/update_s": 8.46,
        "time/sync_s": 0.347,
        "val/reward/total": 0.2,
        "reward/x/y": 1.0,
    }
    assert step_line(3, 24, metrics) == (
        "step 3/24 · reward 1.41 (format 0.91, relevance 0.50) · "
        "kl 0.0021 · rollout 3.1 s · reward 0.02 s · update 8.5 s · sync 0.35 s"
    )
    assert step_line(3, -1, {"reward/total": 0.5}) == "step 3 · reward 0.50"
    assert step_line(3, 24, {"train/loss": 0.5}) == ""


def test_val_check_interval_past_the_epoch_is_one_line(tmp_path, monkeypatch, capsys):
    """Lightning finds it only once the data is read (a ValueError in the fit loop)."""
    monkeypatch.chdir(tmp_path)
    line = one_line_error(
        ["fit", "--config", str(TINY), "--trainer.max_steps=20", "--trainer.val_check_interval=12"],
        capsys,
    )
    assert line.startswith(
        "lit-rag: error: trainer.val_check_interval: `val_check_interval` (12) must be less than "
        "or equal to the number of the training batches (8)."
    )
    assert line.endswith("set `check_val_every_n_epoch=None`.")
