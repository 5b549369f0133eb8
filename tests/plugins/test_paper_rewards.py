"""Each paper recipe trains on its paper's reward: the reward the recipe configures (built by the
real CLI, ``run=False``) scores hand-worked cases from the paper's equations, literal by literal.

The cases include answers and evaluations with ";", "or" and "/" in the policy's text, where a
reward guard (``hedging: zero`` or ``cap``) would pay less than the paper: a recipe default that
moves the reward away from the paper's fails here. Guards measure and report
(``rollout/hedged_answers``); only the quickstart and CPU recipes opt into them.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import yaml
from kit import trajectory

from lit_rag.api import EvoRagBranch, R2AGEpisode
from lit_rag.cli.commands import build_cli
from lit_rag.types import Example, Passage, Step, Trajectory

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@functools.cache
def configured_reward(recipe: str):
    """The reward ``recipes/<recipe>.yaml`` builds through ``lit-rag fit``'s CLI."""
    path = RECIPES / f"{recipe}.yaml"
    trainer = yaml.safe_load(path.read_text()).get("trainer") or {}
    strategy = str(trainer.get("strategy", "")).lower()
    if "fsdp" in strategy:  # Lightning builds FSDP only where CUDA is
        from helpers import pretend_cuda

        with pretend_cuda():
            return build_cli(["--config", str(path)], run=False).model.reward
    return build_cli(["--config", str(path)], run=False).model.reward


def scored(reward, t: Trajectory) -> dict[str, float]:
    out = reward([t])
    row = {k: round(float(v[0].sum()), 6) for k, v in out.components.items()}
    row["total"] = round(float(out.total[0].sum()), 6)
    return row


# ---- ARENA, Section 3.3 -------------------------------------------------------------------
ARENA_EXAMPLE = Example(
    id="duo",
    question="Which duo recorded Bridge over Troubled Water?",
    answers=["Simon & Garfunkel"],
    references=[Passage("a", "", "..."), Passage("b", "", "..."), Passage("c", "", "...")],
    gold_ids=["a", "c"],  # reference numbers [1, 3]
)


def arena_text(answer: str, relevance: str = "[1, 3]") -> str:
    return (
        f"<relevance>{relevance}</relevance>\n<analysis>[1] and [3] say so.</analysis>\n"
        f"<answer>{answer}</answer>"
    )


@pytest.mark.parametrize(
    "answer, accuracy, bonus",
    [
        # "Simon; Garfunkel" and the gold both normalize to "simon garfunkel": EM 1
        ("Simon; Garfunkel", 1.0, 10.0),
        ("Simon / Garfunkel", 1.0, 10.0),
        # "simon or garfunkel" is not "simon garfunkel": EM 0, no bonus
        ("Simon or Garfunkel", 0.0, 0.0),
    ],
)
def test_arena_recipe_pays_sections_3_3_reward(answer, accuracy, bonus):
    reward = configured_reward("arena")
    row = scored(reward, trajectory(arena_text(answer), example=ARENA_EXAMPLE))
    # format 1 (three parts in order), relevance 1 ({1, 3} = gold {1, 3}), weights all 1:
    # total = 1 + accuracy + 1 + bonus (13 when everything is right)
    assert row == {
        "format": 1.0,
        "accuracy": accuracy,
        "relevance": 1.0,
        "bonus": bonus,
        "total": 1.0 + accuracy + 1.0 + bonus,
    }


# ---- Eval-RAR, Section 4.2 (Eq. 2-5) and Search-R1 ---------------------------------------
NIXON = Example(
    id="q", question="Who gave the speech, and when did he die?", answers=["Richard Nixon"]
)


def search_episode(evaluation: str, answer: str, example: Example = NIXON) -> Trajectory:
    steps = [
        Step("search", text="<search>Checkers speech</search>"),
        Step("evaluate", text=f"<evaluate>{evaluation}</evaluate>"),
        Step("answer", text=f"<answer>{answer}</answer>"),
    ]
    return trajectory(example=example, steps=steps)


@pytest.mark.parametrize(
    "evaluation, answer, outcome, r_eval",
    [
        # Eq. 4: a gold answer occurs in y_eval -> 0.1; Eq. 5: R_ans = 0, so the total is 0.1
        ("The speech was given by Richard Nixon; now I need his death date.", "1990", 0.0, 0.1),
        ("It was Richard Nixon, so he died before or after 1990.", "1990", 0.0, 0.1),
        ("Richard Nixon / Gerald Ford gave it.", "Ford", 0.0, 0.1),
        # Eq. 2: EM of "Richard Nixon or Gerald Ford" against "Richard Nixon" is 0
        ("Not found yet.", "Richard Nixon or Gerald Ford", 0.0, 0.0),
        # EM 1: the total is R_ans (Eq. 5), R_eval is earned as well
        ("Richard Nixon; died 1994.", "Richard Nixon", 1.0, 0.1),
    ],
)
def test_eval_rar_recipe_pays_eq_2_to_5(evaluation, answer, outcome, r_eval):
    reward = configured_reward("eval_rar")
    row = scored(reward, search_episode(evaluation, answer))
    total = outcome if outcome > 0 else r_eval
    assert row == {"outcome": outcome, "evaluation": r_eval, "total": total}


DUO = Example(id="d", question=ARENA_EXAMPLE.question, answers=["Simon & Garfunkel"])


@pytest.mark.parametrize(
    "answer, em",
    [
        ("Simon; Garfunkel", 1.0),  # both "simon garfunkel" after SQuAD normalization
        ("Simon or Garfunkel", 0.0),
        ("Simon & Garfunkel / The Beatles", 0.0),
    ],
)
def test_search_r1_recipe_pays_exact_match(answer, em):
    reward = configured_reward("search_r1")
    row = scored(reward, search_episode("checking", answer, DUO))
    assert row["total"] == em


# ---- EVO-RAG, Section 3.2: answer correctness (EM + F1) / 2 at the terminal step ---------
PARIS = Example(id="p", question="Capital of France?", answers=["Paris"], gold_ids=["g"])


@pytest.mark.parametrize(
    "answer, correctness",
    [
        ("Paris", 1.0),  # EM 1, F1 1
        # EM 0; F1: precision 1/3 ("paris" of "paris or lyon"), recall 1 -> 0.5; (0 + 0.5) / 2
        ("Paris or Lyon", 0.25),
        # "paris lyon": precision 1/2, recall 1 -> F1 2/3; (0 + 2/3) / 2
        ("Paris; Lyon", 1 / 3),
    ],
)
def test_evo_rag_recipe_pays_answer_correctness(answer, correctness):
    reward = configured_reward("evo_rag")
    raw = reward.step_rewards(PARIS, [Step("answer", text=answer)])
    assert raw["answer"] == pytest.approx([correctness])
    t = trajectory(
        example=PARIS, steps=[Step("answer", text=answer)], contract=EvoRagBranch("0", 0)
    )
    assert float(reward([t]).components["answer"][0].sum()) == pytest.approx(correctness)


# ---- R2AG, Eq. 5 -------------------------------------------------------------------------
TWO_HOP = Example(
    id="h", question="Where was the founder born?", answers=["Kessa"], gold_ids=["g1", "g2"]
)


def test_r2ag_recipe_pays_eq_5():
    reward = configured_reward("r2ag")
    steps = [Step("base", "who founded it", ["g1"]), Step("predicted", "where born", ["g2"])]
    episode = R2AGEpisode(depth=1, prior=[], think=True, stop=False, segments=2)
    row = scored(reward, trajectory(example=TWO_HOP, steps=steps, contract=episode))
    # Multi-Hit = 1 (base: g1 new) + 1.25 x 1 (predicted: g2 new) = 2.25
    # AP = base (1/2)(1/1) + predicted (1/2)(1/1) = 1.0; Joint-Hit 0 (no stop); format 2 x 0.01
    # R = 0.2 x 2.25 + 0.3 x 0 + 0.2 x 1.0 + 0.02 = 0.67
    assert row == {
        "multi_hit": 2.25,
        "joint_hit": 0.0,
        "ap": 1.0,
        "format": 0.02,
        "zeroed": 0.0,
        "total": 0.67,
    }
