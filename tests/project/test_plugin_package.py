"""Third-party plugins, installed as their own package, used from a recipe by their names.

``plugins/lit-rag-length-penalty`` registers a class reward ``length_penalty`` and a plain-
function reward ``brevity`` in the ``lit_rag.rewards`` entry-point group, and the advantage
estimator ``median_baseline`` in ``lit_rag.advantages``; ``recipes/tiny_plugin.yaml`` names all
three with no import line, and fits for its 2 steps here. Skipped when the package is not
installed, except in CI (``CI`` set), which installs it: there it must run.
"""

from __future__ import annotations

import ast
import csv
import sys
from functools import partial
from pathlib import Path

import pytest
from kit import trajectory

import lit_rag.contracts.function_rewards
from lit_rag import registry
from lit_rag.api import FunctionReward, advantage_estimator
from lit_rag.cli.commands import build_cli, main
from lit_rag.plugins.rewards.arena import ArenaReward
from lit_rag.plugins.rewards.composite import CompositeReward
from lit_rag.types import Example, Passage
from tests.helpers import require_package

require_package("lit_rag_length_penalty", "pip install --no-deps -e plugins/lit-rag-length-penalty")
import lit_rag_length_penalty

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny_plugin.yaml"

EXAMPLE = Example(
    id="q",
    question="Which city is the capital of France?",
    answers=["Paris"],
    references=[
        Passage("p1", "", "Lyon is in France."),
        Passage("p2", "", "Paris is the capital."),
    ],
    gold_ids=["p2"],
)


traj = partial(trajectory, example=EXAMPLE, prompt=[1, 2], tokens=2)


@pytest.fixture
def built(monkeypatch, tmp_path: Path):
    registry.clear_cache()
    monkeypatch.setattr(sys, "argv", ["lit-rag"])
    monkeypatch.chdir(tmp_path)
    yield build_cli(["--config", str(RECIPE)], run=False)
    registry.clear_cache()


def test_entry_point_comes_from_the_plugin_package() -> None:
    registry.clear_cache()
    info = registry.available("reward")["length_penalty"]
    assert info.package == "lit-rag-length-penalty"
    assert registry.load("reward", "length_penalty") is lit_rag_length_penalty.LengthPenaltyReward


def test_plugin_modules_import_only_the_public_api() -> None:
    """A third-party package needs nothing of lit-rag but ``lit_rag.api`` (read from the source)."""
    package = Path(lit_rag_length_penalty.__file__).parent
    imports = {}
    for path in sorted(package.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imports[path.name] = sorted(m for m in names if m.split(".")[0] == "lit_rag")
    assert imports == {
        "__init__.py": ["lit_rag.api"],
        "brevity.py": ["lit_rag.api"],
        "median_baseline.py": [],
    }


def test_function_reward_and_estimator_load_by_name() -> None:
    from lit_rag_length_penalty.brevity import brevity
    from lit_rag_length_penalty.median_baseline import median_baseline

    registry.clear_cache()
    assert registry.available("reward")["brevity"].package == "lit-rag-length-penalty"
    assert registry.available("advantage")["median_baseline"].package == "lit-rag-length-penalty"
    assert registry.load("reward", "brevity") is brevity
    assert advantage_estimator("median_baseline") is median_baseline
    # a function reward is named like a class: the CLI builds lit-rag's wrapper class for it
    assert registry.class_path("reward", "brevity") == "lit_rag.contracts.function_rewards.brevity"
    assert issubclass(lit_rag.contracts.function_rewards.brevity, FunctionReward)


def test_recipe_builds_the_composite_with_the_plugins(built) -> None:
    reward = built.model.reward
    assert isinstance(reward, CompositeReward)
    plugin_class = lit_rag_length_penalty.LengthPenaltyReward
    assert [type(r) for r in reward.rewards] == [
        ArenaReward,
        plugin_class,
        lit_rag.contracts.function_rewards.brevity,
    ]
    assert reward.weights == {"arena": 1.0, "length_penalty": 0.5, "brevity": 0.25}
    assert reward.rewards[1].max_words == 3
    assert reward.rewards[2].kwargs == {"max_words": 2}  # the recipe's init_args


def test_recipe_selects_the_plugin_estimator(built) -> None:
    from lit_rag_length_penalty.median_baseline import median_baseline

    algorithm = built.model.algorithm
    assert algorithm.advantage == "median_baseline" and algorithm.advantage_fn is median_baseline


def test_plugin_scores_inside_the_composite(built) -> None:
    texts = [
        "<relevance>[2]</relevance>\n<analysis>[2] says so.</analysis>\n<answer>Paris</answer>",
        "<relevance>[1, 2]</relevance>\n<analysis>[2].</analysis>\n<answer>it is in Paris</answer>",
        "I do not know.",
    ]
    out = built.model.reward([traj(t) for t in texts])
    # recipe: arena weight 1.0; length_penalty weight 0.5, max_words 3; brevity weight 0.25,
    # max_words 2
    # 1st: arena format 1 + accuracy 1 + relevance 1 + bonus 10 = 13; length 1 word <= 3 -> 1.0;
    #      brevity 1 word <= 2 -> 1.0; total = 1.0 * 13 + 0.5 * 1.0 + 0.25 * 1.0 = 13.75
    # 2nd: arena format 1, accuracy 0 ("it is in paris" != "paris"), relevance 0.5 ({1,2} vs {2}),
    #      bonus 0 -> 1.5; length 4 words -> 1 - (4 - 3) / 3 = 2/3; brevity 4 words > 2 -> 0;
    #      total = 1.5 + 0.5 * 2/3 + 0 = 11/6
    # 3rd: no tags -> arena 0, length 0 and brevity 0 (no answer); total 0
    assert set(out.components) == {"format", "accuracy", "relevance", "bonus", "length", "brevity"}
    assert out.components["length"].tolist() == pytest.approx([1.0, 2 / 3, 0.0])
    assert out.components["brevity"].tolist() == [1.0, 0.0, 0.0]
    assert out.components["relevance"].tolist() == pytest.approx([1.0, 0.5, 0.0])
    assert out.total.tolist() == pytest.approx([13.75, 11 / 6, 0.0])


def test_recipe_fits_for_its_two_steps(monkeypatch, tmp_path: Path) -> None:
    """``lit-rag fit`` on the recipe: 2 optimizer steps, the plugin rewards logged, and the
    plugin estimator computing the advantages of every step."""
    import lit_rag_length_penalty.median_baseline as module

    calls: list[int] = []
    estimator = module.median_baseline

    def spy(rewards, groups, scale_rewards="none"):
        calls.append(int(rewards.numel()))
        return estimator(rewards, groups, scale_rewards)

    monkeypatch.setattr(module, "median_baseline", spy)  # what the entry point loads
    monkeypatch.setattr(sys, "argv", ["lit-rag"])
    monkeypatch.chdir(tmp_path)
    registry.clear_cache()
    try:
        main(
            [
                "fit",
                "--config",
                str(RECIPE),
                "--trainer.default_root_dir",
                str(tmp_path),
                "--trainer.logger.init_args.save_dir",
                str(tmp_path),
            ]
        )
    finally:
        registry.clear_cache()
    (metrics,) = tmp_path.rglob("metrics.csv")
    with metrics.open(newline="") as f:
        steps = [row for row in csv.DictReader(f) if row.get("reward/total")]
    assert [int(row["step"]) for row in steps] == [0, 1]
    # both rewards score 0 without a complete <answer> pair, which the random model's 8 sampled
    # tokens never spell out ("<answer>" and "</answer>" are 3 + 4 specific tokens of 512)
    for row in steps:
        assert float(row["reward/brevity"]) == 0.0
        assert float(row["reward/length"]) == 0.0
        float(row["train/loss"])
    # batch_size 2 x group_size 2 = 4 rollouts per step; one estimator call per step
    assert calls == [4, 4]
