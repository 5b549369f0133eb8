"""Help in lit-rag's words: ``fit``/``validate``/``test --help`` speak of recipes, plugins and
checkpoint files, not of Lightning's API, and what the help offers the parser takes.

The trainer commands' help runs in this process (``main([command, "--help"])``, Lightning
imported once, each command's help built once per module); the one child process checks that a
missing recipe is reported before Lightning or torch is imported.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import one_line_error

from lit_rag import registry
from lit_rag.cli import commands as cli
from lit_rag.cli.console import split_verbose
from lit_rag.cli.fit import resolve_last
from lit_rag.cli.help import (
    CKPT_PATH_HELP,
    OPTION_HELP,
    OWN_MODEL_GROUPS,
    RUN_GROUPS,
    TRAINER_GROUPS,
    plain,
)
from lit_rag.errors import InputError
from lit_rag.evaluate.suites import SUITES

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
TINY = str(RECIPES / "tiny.yaml")

#: what Lightning's own help said, each seen in ``lit-rag fit/validate/test --help`` before
LIGHTNING_WORDS = (
    "Customize every aspect of training via flags",
    "Runs the full optimization routine",
    "Perform one evaluation epoch",
    "never run on your",
    "Lightning Model Registry",
    "model_registry",
    "limit_predict_batches",
    "Trains a policy with an RL algorithm",  # the module's docstring as a group title
    "VersionedEngine",
    "FunctionReward",
    "<class '",
)


def _main_output(args: list[str]) -> str:
    """stdout of ``lit-rag ARGS``, which ends with exit 0 (a help)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        cli.main(args)
    assert stop.value.code == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def trainer_help() -> dict[str, str]:
    """``lit-rag COMMAND --help`` of each trainer command."""
    return {name: _main_output([name, "--help"]) for name in cli.TRAINER_COMMANDS}


def _flat(text: str) -> str:
    return " ".join(text.split())


def _sections(text: str) -> list[str]:
    """The group titles of a help: the lines that end with ``:`` and start a section."""
    return [line[:-1] for line in text.splitlines() if re.fullmatch(r"[A-Z][^ ].*:", line)]


@pytest.mark.parametrize("name", ["fit", "validate", "test"])
def test_groups_have_lit_rag_titles(trainer_help, name):
    titles = _sections(trainer_help[name])
    assert titles == [*TRAINER_GROUPS.values(), RUN_GROUPS[name]]
    assert "Trainer (lightning.pytorch.Trainer): devices" in titles[0]


def test_a_recipe_naming_its_own_model_class_gets_lit_rag_titles():
    """EVO-RAG's reward model recipe: any LightningModule, its optimizer and schedule."""
    out = _main_output(["fit", "--config", str(RECIPES / "evo_rag_reward_model.yaml"), "--help"])
    own = OWN_MODEL_GROUPS
    assert _sections(out) == [
        TRAINER_GROUPS["trainer"],
        own["model"],
        TRAINER_GROUPS["data"],
        own["optimizer"],
        own["lr_scheduler"],
        RUN_GROUPS["fit"],
    ]
    assert "Base class for all optimizers" not in out and "<class '" not in out


@pytest.mark.parametrize("name", ["fit", "validate", "test"])
def test_no_lightning_words_and_no_markup(trainer_help, name):
    out = trainer_help[name]
    for words in LIGHTNING_WORDS:
        assert words not in out
    assert "`" not in out  # ``literal``, :class:`X`, `link <url>`_ all use backticks
    for listed in re.findall(r"known subclasses: ([^)]*)\)", out):  # the Trainer's options
        paths = re.sub(r"\s", "", listed).split(",")  # a long path may wrap mid-word
        assert all(path.startswith("lightning.") for path in paths), paths
    assert not re.search(r":(class|mod|func|meth|data|paramref|attr):", out)


@pytest.mark.parametrize("name", ["fit", "validate", "test"])
def test_ckpt_path_and_lightnings_options_say_what_lit_rag_does(trainer_help, name):
    assert _flat(CKPT_PATH_HELP[name]) in _flat(trainer_help[name])
    for text in OPTION_HELP.values():  # --config, --seed_everything, --trainer.precision, ...
        assert _flat(text) in _flat(trainer_help[name])


@pytest.mark.parametrize(
    ("option", "kind"),
    [
        ("--model.reward", "reward"),
        ("--model.environment", "environment"),
        ("--model.algorithm", "algorithm"),
        ("--model.engine", "engine"),
    ],
)
def test_plugin_options_list_registered_names(trainer_help, option, kind):
    out = trainer_help["fit"]
    block = out.split(f"\n  {option} ", 1)[1].split("\n  --", 1)[0]
    names = ", ".join(registry.available(kind))
    assert f"registered: {names} (lit-rag plugins)" in _flat(block)
    helper = out.split(f"\n  {option}.help [NAME]", 1)[1].split("\n  --", 1)[0]
    assert f"Print the options of the {kind} NAME ({names}) and exit." == _flat(helper)


@pytest.mark.parametrize(
    ("args", "title", "option"),
    [
        (["--model.reward.help", "arena"], "reward arena", "--model.reward.bonus "),
        (["--model.algorithm.help=grpo"], "algorithm grpo", "--model.algorithm.beta "),
        (["--model.engine.help", "hf"], "engine hf", None),
        (
            ["--model.environment.help", "single_turn"],
            "environment single_turn",
            "--model.environment.system_prompt ",
        ),
    ],
)
def test_help_of_a_plugin_takes_its_registered_name(args, title, option):
    out = _main_output(["fit", "--config", TINY, *args])
    assert f"The options of the {title} (lit_rag.plugins." in _flat(out)
    if option:
        assert option in out
    assert "`" not in out


def test_help_of_an_unknown_plugin_lists_the_names(capsys):
    line = one_line_error(["fit", "--model.reward.help", "arena2"], capsys)
    assert line == "lit-rag: error: unknown reward 'arena2'; installed: " + ", ".join(
        registry.available("reward")
    )


@pytest.mark.parametrize("name", ["validate", "test"])
def test_verbose_is_lit_rags_switch_in_help_and_parser(trainer_help, name):
    """Lightning's ``--verbose {true,false}`` is gone; lit-rag's ``--verbose`` takes the same
    spellings, so ``validate --verbose false`` parses."""
    assert "--verbose {true,false}" not in trainer_help[name]
    assert "--verbose also shows" in _flat(trainer_help["fit"])
    assert split_verbose([name, "--verbose", "false", "-c", "r.yaml"]) == (
        [name, "-c", "r.yaml"],
        False,
    )
    assert split_verbose([name, "--verbose=true"])[1] is True
    assert split_verbose([name, "--verbose"])[1] is True
    config = _main_output([name, "--config", TINY, "--verbose", "false", "--print_config"])
    assert "\nckpt_path: null\n" in config and "verbose" not in config


@pytest.mark.parametrize("special", ["best", "registry:my-model"])
def test_ckpt_path_best_and_registry_are_one_line(special, capsys):
    line = one_line_error(["validate", "--config", TINY, f"--ckpt_path={special}"], capsys)
    assert line.startswith(f"lit-rag: error: --ckpt_path {special} is not offered: ")
    assert "or last" in line


def _whole_checkpoint(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:  # torch.save writes a zip archive
        archive.writestr("data.pkl", b"")
    return path


def _trainer(tmp_path: Path, **changes) -> SimpleNamespace:
    """What :func:`resolve_last` reads of a Trainer: a CSV logger at runs/quickstart."""
    logger = SimpleNamespace(save_dir=str(tmp_path / "runs"), name="quickstart")
    fields = {
        "checkpoint_callbacks": [],
        "loggers": [logger],
        "default_root_dir": str(tmp_path),
        "global_rank": 0,
    }
    return SimpleNamespace(**{**fields, **changes})


def test_ckpt_path_last_is_the_newest_checkpoint_of_the_recipes_runs(tmp_path):
    """Over every version of the logger's runs: the newest whole .ckpt file (by time)."""
    runs = tmp_path / "runs" / "quickstart"
    older = _whole_checkpoint(runs / "version_0" / "checkpoints" / "last.ckpt")
    step = _whole_checkpoint(runs / "version_1" / "checkpoints" / "epoch=0-step=4.ckpt")
    newest = _whole_checkpoint(runs / "version_1" / "checkpoints" / "last.ckpt")
    (runs / "version_2" / "checkpoints").mkdir(parents=True)
    (runs / "version_2" / "checkpoints" / "last.ckpt").write_bytes(b"cut off")  # not whole
    for age, path in enumerate([newest, step, older]):
        os.utime(path, (1000 - age, 1000 - age))
    assert resolve_last(_trainer(tmp_path), "validate") == str(newest)
    os.utime(step, (2000, 2000))  # a recipe without save_last: the latest step's
    assert resolve_last(_trainer(tmp_path), "validate") == str(step)
    assert resolve_last(_trainer(tmp_path, loggers=[]), "fit") is None  # no checkpoints/ here


def test_ckpt_path_last_without_a_checkpoint(tmp_path, capsys):
    """fit starts from the beginning (a requeued job passes last from its first start);
    validate and test have nothing to score."""
    assert resolve_last(_trainer(tmp_path), "fit") is None
    assert capsys.readouterr().err.startswith("lit-rag: --ckpt_path last: no checkpoint in ")
    with pytest.raises(InputError, match=r"--ckpt_path last: no checkpoint in .*runs/quickstart"):
        resolve_last(_trainer(tmp_path), "test")


def test_compare_without_a_checkpoint_says_what_it_takes(capsys):
    line = one_line_error(["compare", "--config", TINY], capsys)
    assert line == (
        "lit-rag: error: compare: give at least one checkpoint (lit-rag compare --config RECIPE "
        "runs/NAME/version_N/checkpoints/last.ckpt ...); the untrained policy alone: "
        f"lit-rag validate --config {TINY}"
    )


@pytest.mark.parametrize("spelling", ["search_r1", "search-r1", "eval_rar", "evo_rag"])
def test_evaluate_takes_the_spellings_of_lit_rag_data(spelling, tmp_path, capsys):
    """``lit-rag data search_r1`` writes the files ``evaluate --suite search_r1`` reads: the
    suite is found (the error is about the empty data folder, after the name is accepted)."""
    args = ["evaluate", "--suite", spelling, "--config", TINY, "--data", str(tmp_path)]
    line = one_line_error(args, capsys)
    assert f"no test file of suite {spelling.replace('_', '-')} in {tmp_path}" in line


def test_evaluate_unknown_suite_lists_both_spellings(capsys):
    line = one_line_error(["evaluate", "--suite", "search_r2"], capsys)
    assert line == (
        "lit-rag: error: evaluate: unknown suite 'search-r2'; suites: "
        f"{', '.join(SUITES)} (also written search_r1, eval_rar, evo_rag)"
    )


def test_index_build_names_a_missing_corpus(tmp_path, capsys):
    missing = tmp_path / "corpus.jsonl"
    args = ["index", "build", "--corpus", str(missing), "--out", str(tmp_path / "index")]
    line = one_line_error(args, capsys)
    assert line.startswith(
        f"lit-rag: error: index build: corpus file or folder not found: {missing}"
    )
    assert "a folder of .txt / .md documents, or synthetic[:SEED]" in line
    assert "dataset" not in line
    assert not (tmp_path / "index").exists()


def test_index_usage_errors_are_one_line(capsys):
    line = one_line_error(["index", "build", "--corpus", "synthetic"], capsys)
    assert line == (
        "lit-rag: error: index build: the following arguments are required: --out "
        "(options: lit-rag index build --help)"
    )


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("write", "message"),
    [
        (None, "does not exist"),
        ("model: [1\n", "is not valid YAML"),
        ("- a list\n", "must be a mapping of sections"),
    ],
)
def test_a_bad_recipe_is_reported_before_lightning_is_imported(tmp_path, write, message):
    recipe = tmp_path / "recipe.yaml"
    if write is not None:
        recipe.write_text(write, encoding="utf-8")
    script = (
        "import sys\n"
        "from lit_rag.cli.commands import main\n"
        "try:\n"
        f"    main(['fit', '--config', {str(recipe)!r}])\n"
        "except SystemExit as stop:\n"
        "    assert stop.code == 2, stop.code\n"
        "print(sorted({'lightning', 'torch', 'transformers'} & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert done.stderr.startswith(f"lit-rag: error: recipe '{recipe}'") and message in done.stderr


def test_plain_removes_sphinx_markup():
    """Lightning's ``barebones`` text, as its docstring writes it, and a link."""
    text = (
        "The following features are deactivated: "
        ":paramref:`~lightning.pytorch.trainer.trainer.Trainer.enable_checkpointing`, "
        ":meth:`~lightning.pytorch.core.LightningModule.log`. Default: ``False``. Set it to "
        "`-1`; see :class:`datetime.timedelta` and `the notes <https://pytorch.org/x>`_."
    )
    assert plain(text) == (
        "The following features are deactivated: enable_checkpointing, log. Default: False. "
        "Set it to -1; see datetime.timedelta and the notes (https://pytorch.org/x)."
    )
