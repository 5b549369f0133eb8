"""A third-party reward, installed as its own package, used from a recipe by its name.

``plugins/lit-rag-length-penalty`` registers ``length_penalty`` in the ``lit_rag.rewards``
entry-point group; ``recipes/tiny_plugin.yaml`` names it with no import line. Skipped when the
package is not installed, except in CI (``CI`` set), which installs it: there it must run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from lit_rag import registry
from lit_rag.cli import build_cli
from lit_rag.plugins.rewards.arena import ArenaReward
from lit_rag.plugins.rewards.composite import CompositeReward
from lit_rag.types import Example, Passage, Trajectory

if os.environ.get("CI"):
    import lit_rag_length_penalty  # CI installs the plugin: a missing one must fail, not skip
else:
    lit_rag_length_penalty = pytest.importorskip(
        "lit_rag_length_penalty",
        reason="example plugin not installed: "
        "pip install --no-deps -e plugins/lit-rag-length-penalty",
    )

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


def traj(text: str) -> Trajectory:
    ids = torch.tensor([1, 2])
    return Trajectory(EXAMPLE, 0, ids, ids, torch.ones(2), torch.zeros(2), text)


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


def test_recipe_builds_the_composite_with_the_plugin(built) -> None:
    reward = built.model.reward
    assert isinstance(reward, CompositeReward)
    plugin_class = lit_rag_length_penalty.LengthPenaltyReward
    assert [type(r) for r in reward.rewards] == [ArenaReward, plugin_class]
    assert reward.weights == {"arena": 1.0, "length_penalty": 0.5}
    assert reward.rewards[1].max_words == 3


def test_plugin_scores_inside_the_composite(built) -> None:
    texts = [
        "<relevance>[2]</relevance>\n<analysis>[2] says so.</analysis>\n<answer>Paris</answer>",
        "<relevance>[1, 2]</relevance>\n<analysis>[2].</analysis>\n<answer>it is in Paris</answer>",
        "I do not know.",
    ]
    out = built.model.reward([traj(t) for t in texts])
    # recipe: arena weight 1.0, length_penalty weight 0.5, max_words 3
    # 1st: arena format 1 + accuracy 1 + relevance 1 + bonus 10 = 13; length 1 word <= 3 -> 1.0
    #      total = 1.0 * 13 + 0.5 * 1.0 = 13.5
    # 2nd: arena format 1, accuracy 0 ("it is in paris" != "paris"), relevance 0.5 ({1,2} vs {2}),
    #      bonus 0 -> 1.5; length 4 words -> 1 - (4 - 3) / 3 = 2/3; total = 1.5 + 0.5 * 2/3 = 11/6
    # 3rd: no tags -> arena 0, length 0 (no answer); total 0
    assert set(out.components) == {"format", "accuracy", "relevance", "bonus", "length"}
    assert out.components["length"].tolist() == pytest.approx([1.0, 2 / 3, 0.0])
    assert out.components["relevance"].tolist() == pytest.approx([1.0, 0.5, 0.0])
    assert out.total.tolist() == pytest.approx([13.5, 11 / 6, 0.0])
