"""Eval-RAR's reward (Section 4.2, Eq. 2-5) and Search-R1's outcome reward, case by case."""

from hypothesis import given, settings
from hypothesis import strategies as st
from kit import trajectory

from lit_rag import registry
from lit_rag.plugins.rewards.search import EvalRarReward, SearchR1Reward, answer_in_text, tag_blocks
from lit_rag.types import Example, Step, Trajectory

GOLD = Example(
    id="q", question="Where was the founder of Orbel Mills born?", answers=["Kessa", "Kessa Town"]
)
INFO = "\n\n<information>Doc 1(Title: Mira Tolvan) Mira Tolvan was born in Kessa.</information>\n\n"


def traj(*steps: tuple[str, str], text: str | None = None) -> Trajectory:
    """A trajectory whose policy wrote ``steps`` (action, text); documents sit between them."""
    full = text if text is not None else INFO.join(t for _, t in steps)
    return trajectory(full, example=GOLD, steps=[Step(action=a, text=t) for a, t in steps])


def score(t: Trajectory, **kw) -> tuple[float, float, float]:
    out = EvalRarReward(**kw)([t])
    return (
        round(float(out.total[0]), 6),
        float(out.components["outcome"][0]),
        round(float(out.components["evaluation"][0]), 6),
    )


def test_correct_answer_scores_one_whatever_the_evaluation():
    # Eq. 2: R_ans = 1 (normalized EM with an alias); Eq. 5: total = R_ans
    t = traj(
        ("search", "<search>Orbel Mills</search>"),
        ("evaluate", "<evaluate>missing</evaluate>"),
        ("answer", "<answer> the kessa town. </answer>"),
    )
    assert score(t) == (1.0, 1.0, 0.0)
    t = traj(
        ("search", "<search>x</search>"),
        ("evaluate", "<evaluate>born in Kessa</evaluate>"),
        ("answer", "<answer>Kessa</answer>"),
    )
    assert score(t) == (1.0, 1.0, 0.1)  # R_eval is earned too, but Eq. 5 takes R_ans


def test_wrong_answer_with_gold_in_evaluation_scores_r_eval():
    # Eq. 3: y_eval = "Mira Tolvan was born in Kessa"; Eq. 4: "kessa" in it -> 0.1; Eq. 5: 0.1
    t = traj(
        ("search", "<search>Mira Tolvan</search>"),
        ("evaluate", "<evaluate>Mira Tolvan was born in Kessa.</evaluate>"),
        ("answer", "<answer>Dorvale</answer>"),
    )
    assert score(t) == (0.1, 0.0, 0.1)
    assert score(t, r_eval=0.25) == (0.25, 0.0, 0.25)


def test_no_answer_at_all_still_earns_the_evaluation_reward():
    t = traj(("search", "<search>Mira</search>"), ("evaluate", "<evaluate>KESSA!</evaluate>"))
    assert score(t) == (0.1, 0.0, 0.1)


def test_gold_outside_evaluate_blocks_earns_nothing():
    # in <think>, in the search query, in the (inserted) documents: none is y_eval
    t = traj(
        ("search", "<think>maybe Kessa</think><search>Kessa</search>"),
        ("evaluate", "<evaluate>the founder is Mira Tolvan</evaluate>"),
        ("answer", "<answer>Dorvale</answer>"),
    )
    assert "Kessa" in t.text and score(t) == (0.0, 0.0, 0.0)


def test_evaluation_blocks_are_concatenated():
    # Eq. 3 over two blocks: "founder Mira" + "born in Kessa Town" -> contains "kessa town"
    t = traj(
        ("search", "<search>a</search>"),
        ("evaluate", "<evaluate>founder Mira</evaluate>"),
        ("search", "<search>b</search>"),
        ("evaluate", "<evaluate>born in Kessa Town</evaluate>"),
        ("answer", "<answer>no</answer>"),
    )
    assert score(t) == (0.1, 0.0, 0.1)
    assert tag_blocks("<evaluate>a</evaluate>x<evaluate>b</evaluate>", "evaluate") == ["a", "b"]


def test_unclosed_evaluation_and_unclosed_answer_score_nothing():
    t = traj(
        ("search", "<search>a</search>"),
        ("evaluate", "<evaluate>born in Kessa"),
        ("invalid", "<answer>Kessa"),
    )
    assert score(t) == (0.0, 0.0, 0.0)


def test_tags_inside_retrieved_documents_do_not_count():
    # the document says <answer>Kessa</answer><evaluate>Kessa</evaluate>; the policy said neither
    doc = (
        "<information>Doc 1(Title: t) "
        "<answer>Kessa</answer><evaluate>Kessa</evaluate></information>"
    )
    t = traj(
        ("search", "<search>q</search>"),
        ("evaluate", "<evaluate>nothing</evaluate>"),
        text="<search>q</search>" + doc + "<evaluate>nothing</evaluate>",
    )
    assert score(t) == (0.0, 0.0, 0.0)


def test_last_complete_answer_is_final():
    t = traj(("answer", "<answer>Dorvale</answer>"), ("answer", "<answer>Kessa</answer><answer>x"))
    assert score(t) == (1.0, 1.0, 0.0)


def test_without_steps_the_whole_text_is_read():
    t = traj(text="<evaluate>Kessa</evaluate><answer>no</answer>")
    assert score(t) == (0.1, 0.0, 0.1)


def test_substring_rule_and_empty_answers():
    assert answer_in_text("It was in Kessa-Town, surely", ["kessa town"]) is False  # '-' is deleted
    assert answer_in_text("It was in Kessa Town, surely", ["kessa town"]) is True
    assert answer_in_text("anything", ["", "the"]) is False  # empty after normalization


def test_search_r1_reward_is_the_outcome_alone():
    t = traj(
        ("search", "<search>a</search>"),
        ("evaluate", "<evaluate>Kessa</evaluate>"),
        ("answer", "<answer>Dorvale</answer>"),
    )
    out = SearchR1Reward()([t, traj(("answer", "<answer>Kessa</answer>"))])
    assert out.total.tolist() == [0.0, 1.0] and set(out.components) == {"outcome"}


def test_registered_names():
    assert registry.resolve("reward", "eval_rar") is EvalRarReward
    assert registry.resolve("reward", "search_r1") is SearchR1Reward
    assert registry.resolve("environment", "search_agent").__name__ == "SearchAgentEnvironment"


def test_set_weights_changes_r_eval():
    reward = EvalRarReward()
    reward.set_weights({"evaluation": 0.3})
    t = traj(("evaluate", "<evaluate>Kessa</evaluate>"))
    assert score(t) == (0.1, 0.0, 0.1) and round(float(reward([t]).total[0]), 6) == 0.3


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(alphabet=st.sampled_from(list("<>/evaluteanswrKs ")), max_size=40), max_size=4)
)
def test_never_raises_on_model_text(texts):
    t = traj(*[("evaluate", x) for x in texts])
    out = EvalRarReward()([t])
    assert float(out.total[0]) in (0.0, 0.1, 1.0)
