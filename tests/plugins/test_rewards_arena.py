"""ARENA reward (Section 3.3): format, accuracy, relevance, bonus."""

from __future__ import annotations

import random
import time
from functools import partial

import pytest
import torch
from helpers import require_package
from kit import trajectory

from lit_rag.plugins.rewards.arena import ArenaReward, parse_arena, parse_relevance
from lit_rag.types import Example, Passage

# Five references; gold ids "p2" and "p4" are at 1-based positions 2 and 4.
EXAMPLE = Example(
    id="q1",
    question="Where is the Louvre?",
    answers=["Paris", "Paris, France"],
    references=[Passage(f"p{i}", f"T{i}", f"text {i}") for i in range(1, 6)],
    gold_ids=["p4", "p2"],
)
PERFECT = (
    "<relevance>[2, 4]</relevance>\n"
    "<analysis>[2] says the Louvre is a museum; [4] places it in Paris.</analysis>\n"
    "<answer>paris</answer>"
)
TAGS = ["<relevance>", "</relevance>", "<analysis>", "</analysis>", "<answer>", "</answer>"]


traj = partial(trajectory, example=EXAMPLE, prompt=[1, 2], tokens=2)


def score(text: str, example: Example = EXAMPLE, **kwargs: float) -> dict[str, float]:
    out = ArenaReward(**kwargs)([traj(text, example=example)])
    values = {name: float(value[0]) for name, value in out.components.items()}
    values["total"] = float(out.total[0])
    return values


def with_relevance(body: str) -> str:
    return PERFECT.replace("[2, 4]", body)


def test_perfect_output_scores_13() -> None:
    # format 1 + accuracy 1 + relevance 1 + bonus 10 = 13
    assert score(PERFECT) == {
        "format": 1.0,
        "accuracy": 1.0,
        "relevance": 1.0,
        "bonus": 10.0,
        "total": 13.0,
    }


def test_wrong_answer_loses_accuracy_and_bonus() -> None:
    # format 1 + accuracy 0 + relevance 1 + bonus 0 = 2
    s = score(PERFECT.replace("paris", "Lyon"))
    assert (s["format"], s["accuracy"], s["relevance"], s["bonus"], s["total"]) == (
        1.0,
        0.0,
        1.0,
        0.0,
        2.0,
    )


def test_alias_and_normalization_count_as_accurate() -> None:
    assert score(PERFECT.replace("paris", "Paris, France."))["accuracy"] == 1.0


def test_issue_14_hyphen_matches_space_as_in_the_release() -> None:
    sartre = Example(
        id="q",
        question="?",
        answers=["Jean Paul Sartre"],
        references=EXAMPLE.references,
        gold_ids=["p2", "p4"],
    )
    text = PERFECT.replace("paris", "Jean-Paul Sartre")
    # "jean paul sartre" == "jean paul sartre": 1 + 1 + 1 + 10 = 13
    assert score(text, sartre)["total"] == 13.0
    # SQuAD rule: "jeanpaul sartre" != "jean paul sartre": 1 + 0 + 1 + 0 = 2 (11 points lost)
    assert score(text, sartre, punctuation="delete")["total"] == 2.0


def test_issue_14_empty_normalized_answer_is_never_accurate() -> None:
    blank = Example(
        id="q",
        question="?",
        answers=["", "The"],
        references=EXAMPLE.references,
        gold_ids=["p2", "p4"],
    )
    for answer in ("A", "the", "", "?!"):
        # every side normalizes to "": accuracy 0, so 1 + 0 + 1 + 0 = 2
        assert score(PERFECT.replace("paris", answer), blank)["total"] == 2.0


def test_unknown_punctuation_mode_is_rejected() -> None:
    with pytest.raises(
        ValueError, match="arena punctuation 'strip' is not known; allowed: delete, space"
    ):
        ArenaReward(punctuation="strip")


@pytest.mark.parametrize(
    ("body", "relevance"),
    [
        ("[2, 4]", 1.0),
        ("[4,2]", 1.0),  # order does not matter
        ("[2, 2, 4]", 1.0),  # duplicates collapse to a set
        ("[\n 2 ,\t4 ]", 1.0),  # JSON whitespace anywhere
        ("[2]", 0.5),  # partial: {2} & {2, 4} non-empty, sets differ
        ("[2, 3]", 0.5),  # partial: one right, one wrong
        ("[1, 2, 4]", 0.5),  # superset is partial
        ("[2, 4, 99]", 0.5),  # out-of-range numbers are kept as wrong citations
        ("[-2, 4]", 0.5),  # -2 is an integer naming no reference: {-2, 4} & {2, 4} = {4}
        ("[1, 3]", 0.0),  # no overlap
        ("[]", 0.0),  # empty prediction
        ("[2, 4, 12345678901234567890]", 0.5),  # a huge integer is a wrong citation
        # Not a JSON list of integers (Table 1: "in square brackets, e.g. [1,5]"): relevance 0
        ("4, 2", 0.0),  # no brackets
        ("none", 0.0),
        ("[2, two, 4]", 0.0),
        ("[[2], [4]]", 0.0),  # nested
        ("[2-4]", 0.0),  # a range
        ("[2.4]", 0.0),
        ("[2.0, 4.0]", 0.0),  # floats are no reference numbers (the release accepts these)
        ("[true, 4]", 0.0),  # nor are booleans
        ("[2e0, 4]", 0.0),
        ('["2", "4"]', 0.0),
        ('{"2": true, "4": true}', 0.0),
        ("[2, 4] and [5]", 0.0),  # trailing text
        ("[２, 4]", 0.0),  # full-width digit
        ("[2, 4,]", 0.0),  # trailing comma is not JSON
        ("[02, 4]", 0.0),  # leading zero is not JSON
        ("[" + "1" * 5000 + "]", 0.0),  # over Python's 4300-digit int limit: no prediction
    ],
)
def test_relevance(body: str, relevance: float) -> None:
    s = score(with_relevance(body))
    assert s["relevance"] == relevance
    assert s["format"] == 1.0
    # bonus only when all three are 1: total = 1 + 1 + relevance + (10 if relevance == 1 else 0)
    assert s["total"] == 2.0 + relevance + (10.0 if relevance == 1.0 else 0.0)


def test_partial_relevance_total() -> None:
    # format 1 + accuracy 1 + relevance 0.5 + bonus 0 = 2.5
    assert score(with_relevance("[2]"))["total"] == 2.5


@pytest.mark.parametrize("body", ["[-1,-3]", "[1-3]", "[1.3]", "[1e3]", '{"1":true,"3":false}'])
def test_issue_13_lenient_lists_earn_no_relevance_or_bonus(body: str) -> None:
    # Gold [1, 3]: references p1 and p3 at positions 1 and 3.
    example = Example(
        id="q",
        question="?",
        answers=["Paris"],
        references=EXAMPLE.references,
        gold_ids=["p1", "p3"],
    )
    s = score(with_relevance(body), example)
    # [-1,-3] parses, but {-1, -3} & {1, 3} is empty; the others are not lists of integers.
    # format 1 + accuracy 1 + relevance 0 + bonus 0 = 2 (the lenient parser gave 1+1+1+10 = 13)
    assert (s["relevance"], s["bonus"], s["total"]) == (0.0, 0.0, 2.0)
    assert score(with_relevance("[3, 1]"), example)["total"] == 13.0  # 1 + 1 + 1 + 10


def test_deeply_nested_relevance_is_no_prediction() -> None:
    # json.loads raises RecursionError at this depth; the parser returns None, never raises
    assert parse_relevance("[" * 100_000 + "]" * 100_000) is None
    assert score(with_relevance("[" * 100_000 + "]" * 100_000))["relevance"] == 0.0


@pytest.mark.parametrize(
    "text",
    [
        # sections out of order
        "<analysis>..</analysis><relevance>[2, 4]</relevance><answer>paris</answer>",
        "<relevance>[2, 4]</relevance><answer>paris</answer><analysis>..</analysis>",
        # a duplicated section
        PERFECT + "<answer>paris</answer>",
        PERFECT.replace("<analysis>", "<analysis><relevance>[2, 4]</relevance>"),
        # extra text outside the sections
        "Sure! " + PERFECT,
        PERFECT + " Hope this helps.",
        PERFECT.replace("</relevance>\n", "</relevance>\nthen\n"),
        # the answer nested inside the analysis
        "<relevance>[2, 4]</relevance><analysis>so <answer>paris</answer></analysis>",
    ],
)
def test_malformed_keeps_accuracy_and_relevance(text: str) -> None:
    # format 0 removes the bonus; the last <answer>/<relevance> pairs are still scored
    s = score(text)
    assert (s["format"], s["accuracy"], s["relevance"], s["bonus"], s["total"]) == (
        0.0,
        1.0,
        1.0,
        0.0,
        2.0,
    )


@pytest.mark.parametrize(
    "text, release, parts",
    [
        # whitespace before <relevance>: the release's ^<relevance> rejects it
        (" " + PERFECT, 0.0, 1.0),
        ("\n" + PERFECT, 0.0, 1.0),
        # a "<" inside a section: the release's [^<]* rejects it
        (PERFECT.replace("a museum", "a museum < 1 km from the Seine"), 0.0, 1.0),
        (PERFECT.replace("a museum;", "a museum;<br>"), 0.0, 1.0),
        # text after a line break after </answer>: the release's $ (MULTILINE) accepts it
        (PERFECT + "\nHope this helps.", 1.0, 0.0),
        (PERFECT + "\n\n<answer>Lyon</answer>", 1.0, 0.0),
        # on the same line neither accepts it; trailing whitespace both accept
        (PERFECT + " Hope this helps.", 0.0, 0.0),
        (PERFECT + "\n", 1.0, 1.0),
    ],
)
def test_format_check_release_and_parts(text: str, release: float, parts: float) -> None:
    """ARENA's released format_score regex (the default) against the earlier 'parts in order'
    reading: the three cases where they differ, each both ways. Format gates the bonus of 10:
    PERFECT's relevance is right, so total = format + accuracy + 1 + (10 if both are 1): 13
    well-formed, 2 malformed; the appended <answer>Lyon</answer> is the last pair, so accuracy 0
    (1 + 0 + 1 + 0 = 2 even where the release accepts the format)."""
    for check, expected in (("release", release), ("parts", parts)):
        s = score(text, format_check=check)
        assert s["format"] == expected, check
        accurate = float("Lyon" not in text)  # the last <answer> pair is scored
        assert s["total"] == expected + accurate + 1.0 + (10.0 if expected and accurate else 0.0)


def test_unknown_format_check_is_rejected() -> None:
    with pytest.raises(
        ValueError, match="arena format_check 'regex' is not known; allowed: release, parts"
    ):
        ArenaReward(format_check="regex")


def test_missing_answer_section() -> None:
    # answer only stated in the analysis: accuracy 0, format 0; total = relevance 1
    text = "<relevance>[2, 4]</relevance><analysis>The answer is Paris.</analysis>"
    s = score(text)
    assert (s["format"], s["accuracy"], s["relevance"], s["total"]) == (0.0, 0.0, 1.0, 1.0)
    assert parse_arena(text).answer is None


def test_missing_relevance_section() -> None:
    s = score("<analysis>..</analysis><answer>Paris</answer>")
    assert (s["format"], s["accuracy"], s["relevance"], s["total"]) == (0.0, 1.0, 0.0, 1.0)


def test_unclosed_tags() -> None:
    s = score("<relevance>[2, 4]<analysis>..</analysis><answer>Paris")
    # no complete relevance or answer pair: everything 0
    assert s == {"format": 0.0, "accuracy": 0.0, "relevance": 0.0, "bonus": 0.0, "total": 0.0}


def test_empty_sections_are_well_formed_but_score_nothing_else() -> None:
    s = score("<relevance></relevance><analysis></analysis><answer></answer>")
    assert (s["format"], s["accuracy"], s["relevance"], s["total"]) == (1.0, 0.0, 0.0, 1.0)


def test_parse_arena_fields() -> None:
    p = parse_arena(PERFECT)
    assert p.relevance == [2, 4]
    assert p.analysis is not None and p.analysis.startswith("[2] says")
    assert p.answer == "paris"
    assert p.well_formed
    assert parse_arena("").relevance is None
    assert not parse_arena("").well_formed


def test_no_gold_references_only_empty_prediction_is_full() -> None:
    example = Example(id="q", question="?", answers=["Paris"], references=EXAMPLE.references)
    assert score(with_relevance("[]"), example)["relevance"] == 1.0  # {} == {}
    assert score(with_relevance("[2]"), example)["relevance"] == 0.0  # {2} & {} empty


def test_weights_and_set_weights() -> None:
    # 0.5*1 + 2*1 + 1*0.5 + 1*0 = 3.0 (partial relevance, no bonus)
    assert score(with_relevance("[2]"), format_weight=0.5, accuracy_weight=2.0)["total"] == 3.0
    reward = ArenaReward(bonus=5.0)
    reward.set_weights({"bonus": 0.5})
    # 1 + 1 + 1 + 0.5 * 5 = 5.5; the component reports the unweighted bonus 5
    out = reward([traj(PERFECT)])
    assert out.total.tolist() == [5.5]
    assert out.components["bonus"].tolist() == [5.0]


def test_batch_shapes_and_dtype() -> None:
    out = ArenaReward()([traj(PERFECT), traj("junk"), traj(with_relevance("[2]"))])
    assert out.total.tolist() == [13.0, 0.0, 2.5]
    assert set(out.components) == {"format", "accuracy", "relevance", "bonus"}
    assert all(v.shape == (3,) and v.dtype == torch.float32 for v in out.components.values())
    assert ArenaReward()([]).total.shape == (0,)


@pytest.mark.parametrize(
    "text, total",
    [
        # 200 KB of unclosed nested tags: no closed part, every component 0
        ("<answer>" * 25_000, 0.0),
        # the innermost pair answers "paris": accuracy 1; "<" inside the answer part fails the
        # format regex, no relevance part: 0 + 1 + 0 + 0 = 1
        ("<answer>" * 12_500 + "paris" + "</answer>" * 12_500, 1.0),
        # "[1,[1,..." is not a JSON list of integers (relevance 0), no answer, no format
        ("<relevance>" + "[1," * 70_000 + "</relevance>", 0.0),
        # the regex must end after the first </answer> (format 0); the parts are empty:
        # relevance 0, and an empty answer never matches (accuracy 0)
        ("".join(TAGS) * 5_000, 0.0),
        ("None", 0.0),
        ("null", 0.0),
        # NUL, ANSI escape, lone surrogate, RTL: text before the parts (format 0), no gold answer
        ("\x00\x01\x1b[31m<answer>\udc80\u202e</answer>", 0.0),
        # the three parts in order (format 1); fullwidth / Arabic-Indic digits are not JSON
        # integers (relevance 0) and fullwidth "Ｐａｒｉｓ" is not "paris" (accuracy 0): 1
        (
            "<relevance>[２, ٤]</relevance><analysis>日本語 🎉</analysis>"
            "<answer>Ｐａｒｉｓ</answer>",
            1.0,
        ),
    ],
)
def test_adversarial_inputs_return_numbers(text: str, total: float) -> None:
    start = time.perf_counter()
    out = ArenaReward()([traj(text)])
    assert time.perf_counter() - start < 5.0  # linear scans: milliseconds
    assert out.total.tolist() == [total]


def test_nested_answer_uses_innermost_pair() -> None:
    s = score("<answer>" * 12_500 + "paris" + "</answer>" * 12_500)
    assert (s["accuracy"], s["format"]) == (1.0, 0.0)


def check_parse_and_reward(text: str) -> None:
    p = parse_arena(text)
    assert p.relevance is None or all(type(i) is int for i in p.relevance)
    s = score(text)
    assert s["format"] in (0.0, 1.0) and s["accuracy"] in (0.0, 1.0)
    assert s["relevance"] in (0.0, 0.5, 1.0) and s["bonus"] in (0.0, 10.0)
    # total = sum of unit-weighted components
    assert s["total"] == s["format"] + s["accuracy"] + s["relevance"] + s["bonus"]
    assert (s["bonus"] == 10.0) == (s["format"] == s["accuracy"] == s["relevance"] == 1.0)


ALPHABET = [*TAGS, "<", ">", "/", "[", "]", ",", " ", "\n", "2", "4", "13", "paris", "x", "é"]


def test_never_raise_on_seeded_random_text() -> None:
    # Runs without hypothesis: strings built from tag pieces, and random code points.
    rng = random.Random(0)
    for _ in range(300):
        check_parse_and_reward("".join(rng.choices(ALPHABET, k=rng.randrange(30))))
        check_parse_and_reward("".join(chr(rng.randrange(0x30000)) for _ in range(30)))


def test_never_raise_hypothesis() -> None:
    require_package("hypothesis", "pip install hypothesis")
    import hypothesis

    st = hypothesis.strategies
    texts = st.text() | st.lists(st.sampled_from(ALPHABET)).map("".join)

    @hypothesis.settings(max_examples=300, deadline=None)
    @hypothesis.given(texts)
    def run(text: str) -> None:
        check_parse_and_reward(text)

    run()


def test_round_trip_hypothesis() -> None:
    require_package("hypothesis", "pip install hypothesis")
    import hypothesis

    st = hypothesis.strategies
    body = st.text(alphabet=st.characters(blacklist_characters="<"))
    numbers = st.lists(st.integers(min_value=1, max_value=20))

    @hypothesis.settings(max_examples=200, deadline=None)
    @hypothesis.given(numbers, body, body)
    def run(ids: list[int], analysis: str, answer: str) -> None:
        text = (
            f"<relevance>{ids}</relevance><analysis>{analysis}</analysis><answer>{answer}</answer>"
        )
        p = parse_arena(text)
        assert p.well_formed and p.relevance == ids
        assert (p.analysis, p.answer) == (analysis.strip(), answer.strip())

    run()


def test_round_trip_seeded() -> None:
    rng = random.Random(1)
    for _ in range(200):
        ids = [rng.randrange(1, 21) for _ in range(rng.randrange(5))]
        analysis = "".join(rng.choices(" ab\n.[]1/>é", k=rng.randrange(12)))
        answer = "".join(rng.choices(" xy,\t2", k=rng.randrange(6)))
        text = (
            f"<relevance>{ids}</relevance>\n<analysis>{analysis}</analysis>"
            f"<answer>{answer}</answer>\n"
        )
        p = parse_arena(text)
        assert p.well_formed and p.relevance == ids
        assert (p.analysis, p.answer) == (analysis.strip(), answer.strip())
        # the earlier reading also takes whitespace before the first part; the release does not
        assert (
            parse_arena(" " + text, "parts").well_formed and not parse_arena(" " + text).well_formed
        )
