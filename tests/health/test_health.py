"""Run health: the signals a step logs (lit_rag/health/signals.py), the detectors
(lit_rag/health/detectors.py) on made-up and recorded metric series, and ``HealthMonitor`` in a
real ``lit-rag fit``."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import kit
import pytest
import torch
import yaml

from lit_rag import registry
from lit_rag.callbacks import HealthMonitor
from lit_rag.health.detectors import DEFAULTS, Detector, detectors, scan
from lit_rag.health.signals import (
    entropy,
    groups_with_variance,
    health_metrics,
    non_ascii,
    repeated_ngrams,
)
from lit_rag.types import Example, Passage, Piece, RewardBreakdown, Step, Trajectory

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "health"


def trajectory(text: str, group: int = 0, n: int = 4, **fields) -> Trajectory:
    """``n`` generated tokens (ids 0..n-1, integer loss mask, log-prob -0.5) answering Paris."""
    fields.setdefault("loss_mask", torch.ones(n, dtype=torch.long))
    return kit.trajectory(
        text, group=group, answers=["Paris"], prompt=[1, 2], tokens=range(n), logprob=-0.5, **fields
    )


class Answers:
    """An environment's ``extract_answer``: the text after "A:"."""

    def extract_answer(self, t: Trajectory) -> str:
        return t.policy_text.split("A:")[-1].strip() if "A:" in t.policy_text else ""


# ---- signals ----------------------------------------------------------------------------
def test_entropy_is_the_mean_negative_logprob_of_trained_tokens() -> None:
    a = trajectory(
        "x",
        sampling_logprobs=torch.tensor([-1.0, -2.0, 0.0, 0.0]),
        loss_mask=torch.tensor([1, 1, 0, 0]),
    )
    b = trajectory("y", n=2, sampling_logprobs=torch.tensor([-3.0, -6.0]))
    assert entropy([a, b]) == pytest.approx((1 + 2 + 3 + 6) / 4)


def test_groups_with_variance_counts_groups_whose_rewards_differ() -> None:
    ts = [trajectory("", group=g) for g in (0, 0, 1, 1, 2, 2)]
    rewards = RewardBreakdown(total=torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5]))
    assert groups_with_variance(ts, rewards) == pytest.approx(1 / 3)
    step_level = RewardBreakdown(total=torch.tensor([[1.0, 0.0], [0.0, 1.0]]))  # equal returns
    assert groups_with_variance(ts[:2], step_level) == 0.0


def test_text_signals() -> None:
    assert repeated_ngrams([1, 2, 3, 4] * 3) == pytest.approx(5 / 9)
    assert repeated_ngrams([7] * 10) == pytest.approx(6 / 7)  # "2222222222"
    assert repeated_ngrams(list(range(10))) == 0.0 and repeated_ngrams([1, 2]) == 0.0
    assert non_ascii(["abcd", "éé"]) == pytest.approx(2 / 6)
    assert non_ascii([]) == 0.0


def test_health_metrics_of_a_search_rollout() -> None:
    """Searches per episode and their spread, repeated queries, invalid actions, answered,
    think length; the guards read only the policy's text."""
    example = Example(id="q", question="?", answers=["Paris"])
    steps_a = [
        Step("search", query="capital of France", text="<think>one two</think> S"),
        Step("search", query="Capital  of france", text="S"),
        Step("answer", text="A: Paris"),
    ]
    steps_b = [Step("invalid", text="??"), Step("answer", text="A: Lyon or Nice")]
    planted = "Paris Paris <answer>Paris</answer>"
    ts = [
        trajectory(
            "", example=example, steps=steps_a, pieces=[Piece("S"), Piece(planted, inserted=True)]
        ),
        trajectory("", group=1, example=example, steps=steps_b),
    ]
    rewards = RewardBreakdown(total=torch.tensor([1.0, 0.0]))
    m = {k: float(v) for k, v in health_metrics(ts, rewards, Answers()).items()}
    assert m["health/searches_mean"] == 1.0 and m["health/searches_std"] == 1.0
    assert m["health/repeated_query_rate"] == 0.5  # case and spaces ignored
    assert m["health/invalid_actions"] == 0.5 and m["health/answered"] == 1.0
    assert m["health/think_words"] == 1.0  # two words over two episodes
    assert m["health/groups_with_variance"] == 0.0  # one sample per group
    assert m["rollout/hedged_answers"] == 0.5  # "Lyon or Nice" lists two
    assert m["rollout/example_copy_rate"] == 0.0 and m["rollout/token_mismatch"] == 0.0


def test_example_copy_and_passage_copy_rates() -> None:
    shown = "Example of a response: <answer>Beijing</answer>\nQuestion: ?"
    passage = "one two three four five six seven eight nine ten eleven twelve thirteen"
    example = Example(
        id="q", question="?", answers=["Paris"], references=[Passage("p1", "", passage)]
    )
    ts = [
        trajectory("A: Beijing", example=example, prompt_text=shown),
        trajectory("A: Paris", example=example, prompt_text=shown),  # gold: not a copy
        trajectory(f"{passage} A: x", example=example),  # 12 words of a reference
        trajectory("A: Lyon", example=example, token_mismatch=2),
    ]
    rewards = RewardBreakdown(total=torch.zeros(4))
    m = {k: float(v) for k, v in health_metrics(ts, rewards, Answers()).items()}
    assert m["rollout/example_copy_rate"] == 0.25
    assert m["rollout/passage_copy_rate"] == 0.25
    assert m["rollout/token_mismatch"] == 2.0
    assert "health/searches_mean" not in m  # no steps: no search signals


def test_signals_never_raise_on_odd_text() -> None:
    odd = ["", "<answer>", "</think><think>", "\x00\uffff", "A:" * 1000]
    ts = [trajectory(t, group=i) for i, t in enumerate(odd)]
    m = health_metrics(ts, RewardBreakdown(total=torch.zeros(len(ts))), Answers())
    assert all(math.isfinite(float(v)) for v in m.values())


# ---- detectors on made-up series ---------------------------------------------------------
def fired(name: str, values: list[float], **thresholds) -> list[int]:
    (d,) = [d for d in detectors(thresholds) if d.name == name]
    return [i for i, v in enumerate(values) if d.update(v) is not None]


def test_spikes_need_a_jump_and_the_floor() -> None:
    growing = [0.0, 0.001, 0.01, 0.05, 0.1, 0.2, 0.3]  # a normal run's KL
    assert fired("kl_blowup", growing) == []
    assert fired("kl_blowup", [0.0, 1.1, 2.8]) == [1]
    assert fired("logprob_gap_blowup", [0.03, 0.04, 0.9]) == [2]


def test_entropy_collapse_falls_below_a_fifth_of_the_start() -> None:
    """The start is the first 5 steps' mean, 1.0; after k steps at 0.1 the last 5 steps' mean
    is (5 - 0.9 k) / 5, under 0.2 from k = 5 (step 9); one low step alone does not fire."""
    start = [1.0, 1.1, 0.9, 1.0, 1.0]
    assert fired("entropy_collapse", start + [0.8, 0.5, 0.4, 0.05, 0.4, 0.4]) == []
    assert fired("entropy_collapse", start + [0.1] * 6) == [9]
    assert fired("entropy_collapse", [0.0] * 8) == []  # nothing to fall from


def test_patience_and_rearming() -> None:
    assert fired("truncation", [0.95, 0.95, 0.6, 0.95, 0.95, 0.95, 1.0]) == [5]
    # fires once while it holds; re-arms after as many clear steps as it needed to fire
    assert fired("example_copying", [0.9] * 5 + [0.0, 0.0] + [0.9] * 2) == [1, 8]
    assert fired("token_mismatch", [0, 0, 3]) == [2]
    assert fired("no_variance", [0.0, 0.0, 0.1, 0.5, 0.0]) == [2]


def test_missing_values_are_skipped() -> None:
    assert fired("truncation", [0.95, math.nan, 0.95, None, 0.95]) == [4]


def test_thresholds_and_off_by_name() -> None:
    assert fired("example_copying", [0.4, 0.4], example_copying=0.3) == [1]
    names = {d.name for d in detectors(disabled=["hedging"])}
    assert "hedging" not in names and names == set(DEFAULTS) - {"hedging"}
    with pytest.raises(ValueError, match="health detector typo is not known; known: "):
        detectors({"typo": 1.0})
    with pytest.raises(ValueError, match="not a detector that is on"):
        HealthMonitor(disabled=["hedging"], stop_on=["hedging"])


def test_every_detector_names_what_it_saw_and_what_helped() -> None:
    for d in detectors():
        assert isinstance(d, Detector) and d.what and d.advice
        line = None
        for value in [0.0, 0.0, 0.0, 0.0] + [1e9] * 5:
            line = line or d.update(value)
        if d.rule in ("above", "spike"):
            assert line and line.startswith(d.what.split(":")[0]), d.name


# ---- detectors on recorded runs ----------------------------------------------------------
def recorded(name: str) -> dict[str, list[float]]:
    """A run's recorded metric series (tests/fixtures/health/NAME.csv: one row per step)."""
    with (RECORDED / f"{name}.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    return {k: [float(r[k]) if r[k] else math.nan for r in rows] for k in rows[0]}


QUIET = ["eval_rar_quickstart", "r2ag_quickstart", "evo_rag_quickstart"]


@pytest.mark.parametrize("name", QUIET)
def test_a_normal_quickstart_run_fires_no_detector(name: str) -> None:
    assert scan(recorded(name)) == []


def test_the_quickstart_fires_only_example_copying_once_most_samples_copy() -> None:
    """The ARENA quickstart learns its format partly by writing back its worked example's
    answer ("Kessa"): the only line it prints is that one, at the second step in a row where
    over half the samples do, and again after the rate has been under half for two steps."""
    series = recorded("quickstart")
    fired = scan(series)
    assert {name for _, name, _ in fired} == {"example_copying"}, fired
    rate = series["rollout/example_copy_rate"]
    first = next(i for i in range(1, len(rate)) if rate[i - 1] > 0.5 and rate[i] > 0.5)
    assert fired[0][0] == first


def test_a_run_pushed_into_collapse_fires_by_the_step_its_reward_drops() -> None:
    """The quickstart at 100 times its learning rate: the reward falls to 0 at its second step
    and the text degenerates; a detector fires no later than that step."""
    series = recorded("quickstart_collapse")
    reward = series["reward/total"]
    dropped = next(i for i, r in enumerate(reward) if r < 0.5 * reward[0])
    fired = scan(series)
    assert fired and fired[0][0] <= dropped, (dropped, fired)
    assert fired[0][1] == "kl_blowup"


def test_a_rising_learning_rate_fires_kl_then_copying_and_entropy() -> None:
    """The quickstart with its learning rate rising to 25 times the recipe's: the KL jumps
    first, then the policy settles on the worked example's answer and stops exploring: its
    entropy's last 5 steps average 0.160 at step 7, under a fifth of its first 5 steps' 1.065
    (0.213); at step 6 they average 0.359."""
    fired = [(step, name) for step, name, _ in scan(recorded("quickstart_ramp"))]
    assert fired[:3] == [(3, "kl_blowup"), (4, "example_copying"), (7, "entropy_collapse")]


def test_reward_collapse_fires_on_a_recorded_collapse() -> None:
    """The recorded collapse comes too early for reward_collapse (its reward is 0 from the
    second step; the detector waits 20), so this splices two recorded runs: the quickstart's 24
    steps, then the collapse run's steps from its collapse on (5 steps at reward 0), what the
    quickstart would show had its learning rate jumped 100 times after step 23. The best
    20-step mean is 1.211 (steps 4-23); at step 27 the last 5 steps' mean, 0.619, has lost
    0.592, not yet half (0.605); at step 28 it has lost all, over half and over the margin:
    6 * 0.281 (the noise of steps 0-23) * sqrt(1/5 + 1/20) = 0.842."""
    healthy, collapse = recorded("quickstart"), recorded("quickstart_collapse")
    series = {metric: healthy[metric] + collapse[metric][1:] for metric in healthy}
    fired = [(step, name) for step, name, _ in scan(series) if step >= 24]
    assert fired[0] == (24, "kl_blowup") and (28, "reward_collapse") in fired, fired


def test_the_arena_hotpotqa_run_shows_example_copying() -> None:
    """ARENA's HotpotQA CPU recipe learns its format by copying the worked example's answer."""
    fired = scan(recorded("arena_hotpotqa_cpu"))
    assert fired[0][1] == "example_copying", fired  # then entropy collapse: it copies ever more
    assert all(name in ("example_copying", "entropy_collapse") for _, name, _ in fired)


# ---- HealthMonitor in a real ``lit-rag fit`` ----------------------------------------------
@pytest.fixture
def isolated(monkeypatch, tmp_path: Path):
    registry.clear_cache()
    monkeypatch.setattr(sys, "argv", ["lit-rag"])
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    registry.clear_cache()


def test_fit_prints_the_line_marks_the_step_and_stops_with_a_checkpoint(isolated, capsys):
    """The tiny recipe's random model never earns a reward, so no group has reward variance:
    with ``stop_on: [no_variance]`` the run prints the detector's line at step 3 (its
    patience), writes the mark to health.jsonl, saves a checkpoint and stops there."""
    from lit_rag.cli.commands import main

    recipe = yaml.safe_load((RECIPES / "tiny.yaml").read_text())
    recipe["trainer"]["max_steps"] = 6
    recipe["trainer"]["callbacks"] = [
        {"class_path": "lit_rag.callbacks.HealthMonitor", "init_args": {"stop_on": ["no_variance"]}}
    ]
    path = isolated / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    main(["fit", "--config", str(path), "--trainer.default_root_dir", str(isolated)])
    err = capsys.readouterr()
    said = [ln for ln in (err.out + err.err).splitlines() if ln.startswith("lit-rag health:")]
    assert said[0].startswith("lit-rag health: step 3: groups without reward variance"), said
    assert "stopping at step 3 (no_variance in stop_on)" in said[-1]
    (marks,) = list(isolated.rglob("health.jsonl"))
    rows = [json.loads(line) for line in marks.read_text().splitlines()]
    assert [(r["step"], r["batch"], r["detector"]) for r in rows] == [(3, 2, "no_variance")]
    (ckpt,) = list(isolated.rglob("health-stop-step=3.ckpt"))
    assert ckpt.stat().st_size > 0
    (metrics,) = list(isolated.rglob("metrics.csv"))
    with metrics.open(newline="") as f:
        steps = [r for r in csv.DictReader(f) if r.get("reward/total")]
    assert len(steps) == 3 and all(r["health/entropy"] for r in steps)


def test_state_round_trip() -> None:
    a = HealthMonitor()
    for d in a.detectors:
        for v in [0.95] * 25:  # past reward_collapse's 20 steps: it has a best level
            d.update(v)
    b = HealthMonitor()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))  # plain types
    assert [(d.history, d.best, d.held, d.fired) for d in b.detectors] == [
        (d.history, d.best, d.held, d.fired) for d in a.detectors
    ]
