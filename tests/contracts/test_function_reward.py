"""A reward as a plain function (docs/STYLE.md 14): :class:`FunctionReward` by hand, its checks on
what the function returns and on the recipe's keyword arguments, and the CLI path: a function
registered in this process, named in a recipe or on the command line like a class."""

from __future__ import annotations

import inspect
import math
import sys
from functools import partial
from pathlib import Path

import pytest
import yaml
from kit import trajectory

import lit_rag.contracts.function_rewards
from lit_rag import registry
from lit_rag.api import Example, FunctionReward, Reward, Trajectory, extract_tag, register_reward
from lit_rag.cli.commands import build_cli, main
from lit_rag.errors import InputError

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
EX = Example(id="q", question="Which city is the capital of France?", answers=["Paris"])


traj = partial(trajectory, example=EX, prompt=[5, 6], tokens=2)


def short(completions: list[str], examples: list[Example], max_words: int = 2) -> list[float]:
    """1.0 for a completion of at most ``max_words`` words, else 0.0."""
    return [1.0 if len(c.split()) <= max_words else 0.0 for c in completions]


def short_and_polite(completions: list[str], examples: list[Example]) -> dict[str, list[float]]:
    """Two named components: ``short`` (at most 2 words) and ``polite`` (says "please")."""
    return {
        "short": [float(len(c.split()) <= 2) for c in completions],
        "polite": [float("please" in c) for c in completions],
    }


def per_token(
    completions: list[str],
    examples: list[Example],
    trajectories: list[Trajectory],
    scale: float = 1.0,
) -> list[float]:
    """``scale / number of completion tokens``: reads the trajectories, not only the text."""
    return [scale / t.completion_ids.numel() for t in trajectories]


# ---------------------------------------------------------------- FunctionReward by hand


def test_list_function_is_one_component_named_after_it() -> None:
    # max_words 2: "Paris" (1 word) -> 1.0, "It is Paris" (3 words) -> 0.0
    reward = FunctionReward(short, {"max_words": 2})
    assert isinstance(reward, Reward)
    out = reward([traj("Paris"), traj("It is Paris")])
    assert out.total.tolist() == [1.0, 0.0]
    assert {k: v.tolist() for k, v in out.components.items()} == {"short": [1.0, 0.0]}
    # max_words 3: both fit
    assert FunctionReward(short, {"max_words": 3})(
        [traj("Paris"), traj("It is Paris")]
    ).total.tolist() == [1.0, 1.0]


def test_dict_function_is_a_weighted_sum_of_its_components() -> None:
    # "Paris": short 1, polite 0; "Paris please": short 1, polite 1;
    # "It is Paris please": short 0, polite 1
    # weights {polite: 0.5} (short defaults to 1): totals [1 + 0, 1 + 0.5, 0 + 0.5] = [1, 1.5, 0.5]
    reward = FunctionReward(short_and_polite, weights={"polite": 0.5})
    out = reward([traj("Paris"), traj("Paris please"), traj("It is Paris please")])
    assert out.total.tolist() == [1.0, 1.5, 0.5]
    assert out.components["short"].tolist() == [1.0, 1.0, 0.0]
    assert out.components["polite"].tolist() == [0.0, 1.0, 1.0]
    # a schedule sets weights between steps: short 2, polite 0.5 -> [2, 2.5, 0.5]
    reward.set_weights({"short": 2.0})
    assert reward(
        [traj("Paris"), traj("Paris please"), traj("It is Paris please")]
    ).total.tolist() == [2.0, 2.5, 0.5]


def test_weights_naming_an_unknown_component_is_an_error() -> None:
    with pytest.raises(
        InputError,
        match=r"reward 'short_and_polite' weights name unknown component\(s\) "
        r"\['rude'\]; it returns: short, polite",
    ):
        FunctionReward(short_and_polite, weights={"rude": 1.0})([traj("Paris")])


def test_function_taking_trajectories_gets_them() -> None:
    # scale 6: 6 / 2 tokens = 3, 6 / 3 tokens = 2
    reward = FunctionReward(per_token, {"scale": 6.0})
    assert reward.wants_trajectories
    assert reward([traj("a", tokens=2), traj("b", tokens=3)]).total.tolist() == [3.0, 2.0]


@pytest.mark.parametrize(
    ("returned", "fragment"),
    [
        ([1.0], "returned 1 value(s) for component 'bad'; expected one per completion (2)"),
        ([1.0, math.nan], "returned a NaN or infinite value for component 'bad'"),
        ([1.0, math.inf], "returned a NaN or infinite value for component 'bad'"),
        (
            ["high", "low"],
            "must return a list of numbers (or a dict of such lists); component 'bad' gave list",
        ),
        (
            None,
            "must return a list of numbers (or a dict of such lists); "
            "component 'bad' gave NoneType",
        ),
        (0.5, "component 'bad' gave float"),
        ({"fine": [1, 1], "broken": [1]}, "returned 1 value(s) for component 'broken'"),
    ],
)
def test_what_the_function_returns_is_checked_and_names_the_reward(returned, fragment) -> None:
    def bad(completions, examples):
        return returned

    with pytest.raises(InputError, match="reward 'bad'") as info:
        FunctionReward(bad)([traj("a"), traj("b")])
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_keyword_argument_lists_the_accepted_ones() -> None:
    with pytest.raises(
        InputError,
        match=r"reward 'per_token' got unknown argument\(s\) \['max_wrds'\]; "
        r"it takes: scale$",
    ):
        FunctionReward(per_token, {"max_wrds": 3})
    # ``trajectories`` is the framework's to pass, not the recipe's
    with pytest.raises(
        InputError, match=r"got unknown argument\(s\) \['trajectories'\]; it takes: scale"
    ):
        FunctionReward(per_token, {"trajectories": []})
    with pytest.raises(InputError, match="it takes: none"):
        FunctionReward(short_and_polite, {"max_words": 3})


def test_a_function_with_var_keywords_takes_any_argument() -> None:
    def anything(completions, examples, **options):
        return [float(options["bonus"])] * len(completions)

    assert FunctionReward(anything, {"bonus": 2})([traj("a")]).total.tolist() == [2.0]


def test_a_class_is_not_a_function() -> None:
    with pytest.raises(InputError, match="reward 'exact_match' is not a function"):
        FunctionReward("exact_match")  # a registered name
    with pytest.raises(InputError, match="reward 'ExactMatchReward' is not a function"):
        FunctionReward(registry.load("reward", "exact_match"))  # the class itself


# ---------------------------------------------------------------- registered in this process


@pytest.fixture
def registered():
    """``h3_answer_words`` registered in this process (a reward package would use an entry
    point)."""

    @register_reward("h3_answer_words")
    def answer_words(
        completions: list[str], examples: list[Example], max_words: int = 5, bonus: float = 0.0
    ) -> list[float]:
        """1.0 + bonus for an ``<answer>`` of at most ``max_words`` words, else 0.0."""
        answers = [extract_tag(c, "answer") for c in completions]
        return [
            1.0 + bonus if a is not None and len(a.split()) <= max_words else 0.0 for a in answers
        ]

    yield answer_words
    registry.unregister("reward", "h3_answer_words")


def test_registered_function_maps_to_a_generated_class(registered) -> None:
    assert registry.available("reward")["h3_answer_words"].package == "<this process>"
    assert (
        registry.class_path("reward", "h3_answer_words")
        == "lit_rag.contracts.function_rewards.h3_answer_words"
    )
    cls = lit_rag.contracts.function_rewards.h3_answer_words
    assert issubclass(cls, FunctionReward)
    # jsonargparse reads this signature: the function's keyword arguments, then ``weights``
    params = inspect.signature(cls.__init__).parameters
    assert list(params) == ["self", "max_words", "bonus", "weights"]
    assert params["max_words"].annotation is int and params["max_words"].default == 5
    reward = cls(max_words=1, bonus=0.5)
    # "<answer>Paris</answer>": 1 word <= 1 -> 1.0 + 0.5; "<answer>in Paris</answer>": 2 words -> 0
    assert reward(
        [traj("<answer>Paris</answer>"), traj("<answer>in Paris</answer>")]
    ).total.tolist() == [1.5, 0.0]
    # also by name
    assert FunctionReward("h3_answer_words", {"max_words": 1})(
        [traj("<answer>Paris</answer>")]
    ).total.tolist() == [1.0]


def test_a_registered_class_keeps_its_own_path() -> None:
    assert (
        registry.class_path("reward", "exact_match")
        == "lit_rag.plugins.rewards.qa.ExactMatchReward"
    )
    with pytest.raises(AttributeError, match="reward 'exact_match' is a class, not a function"):
        lit_rag.contracts.function_rewards.exact_match  # noqa: B018
    with pytest.raises(AttributeError, match="no reward function registered as 'h3_nothing'"):
        lit_rag.contracts.function_rewards.h3_nothing  # noqa: B018


# ---------------------------------------------------------------- through the real CLI


@pytest.fixture
def cli_env(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(sys, "argv", ["lit-rag"])
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_cli_builds_the_function_reward_from_overrides(registered, cli_env) -> None:
    cli = build_cli(
        [
            "--config",
            str(TINY),
            "--trainer.logger=false",
            "--model.reward.class_path=h3_answer_words",
            "--model.reward.init_args.max_words=1",
            "--model.reward.init_args.bonus=0.25",
        ],
        run=False,
    )
    reward = cli.model.reward
    assert isinstance(reward, FunctionReward) and reward.function is registered
    assert reward.kwargs == {"max_words": 1, "bonus": 0.25}
    # 1 word -> 1 + 0.25; 2 words -> 0
    assert reward(
        [traj("<answer>Paris</answer>"), traj("<answer>in Paris</answer>")]
    ).total.tolist() == [1.25, 0.0]


def test_cli_builds_the_function_reward_from_a_recipe(registered, cli_env) -> None:
    recipe = yaml.safe_load(TINY.read_text(encoding="utf-8"))
    recipe["model"]["reward"] = {
        "class_path": "composite",
        "init_args": {
            "rewards": [
                {"class_path": "exact_match"},
                {"class_path": "h3_answer_words", "init_args": {"max_words": 2}},
            ],
            "weights": [1.0, 0.5],
        },
    }
    path = cli_env / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    cli = build_cli(["--config", str(path), "--trainer.logger=false"], run=False)
    child = cli.model.reward.rewards[1]
    assert type(child) is lit_rag.contracts.function_rewards.h3_answer_words
    assert child.kwargs == {"max_words": 2, "bonus": 0.0}
    assert cli.model.reward.weights == {"exact_match": 1.0, "h3_answer_words": 0.5}
    # "<answer>Paris</answer>": exact match 1, 1 word <= 2 -> 1; total 1 * 1 + 0.5 * 1 = 1.5
    assert cli.model.reward([traj("<answer>Paris</answer>")]).total.tolist() == [1.5]


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        (
            "--model.reward.init_args.max_wrds=3",
            "'max_wrds' is not an argument of h3_answer_words; it takes: max_words, bonus, weights",
        ),
        (
            "--model.reward.init_args.max_words=many",
            "Parser key \"max_words\": Expected a <class 'int'>",
        ),
    ],
)
def test_cli_bad_keyword_argument_is_one_line(
    registered, cli_env, capsys, override, fragment
) -> None:
    with pytest.raises(SystemExit) as info:
        main(
            [
                "fit",
                "--config",
                str(TINY),
                "--trainer.logger=false",
                f"--trainer.default_root_dir={cli_env}",
                "--trainer.max_steps=1",
                "--model.reward.class_path=h3_answer_words",
                override,
            ]
        )
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("lit-rag: error:")]
    assert info.value.code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "h3_answer_words" in lines[0] and fragment in lines[0], lines[0]


def test_a_new_registration_under_an_old_name_gets_a_new_class() -> None:
    def first(completions, examples, a: int = 1):
        return [0.0] * len(completions)

    def second(completions, examples, b: int = 1):
        return [1.0] * len(completions)

    try:
        registry.register("reward", "h3_reused", first)
        assert lit_rag.contracts.function_rewards.h3_reused(a=2).kwargs == {"a": 2}
        registry.unregister("reward", "h3_reused")
        registry.register("reward", "h3_reused", second)
        assert lit_rag.contracts.function_rewards.h3_reused(b=3).kwargs == {"b": 3}
    finally:
        registry.unregister("reward", "h3_reused")
