"""Normalization, EM, F1 and tag extraction (ARENA Appendix B and C)."""

from __future__ import annotations

import random
import re
import string
import time
from functools import partial

import pytest
from helpers import require_package
from kit import trajectory

from lit_rag.api import exact_match, extract_tag, f1_score, normalize_answer
from lit_rag.plugins.rewards.qa import ExactMatchReward, F1Reward

traj = partial(trajectory, prompt=[1, 2], tokens=2)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Beatles", "beatles"),  # article at the start
        ("a cat and an owl", "cat and owl"),  # a / an as whole words only
        ("theatre anatomy banana", "theatre anatomy banana"),  # articles inside words stay
        ("Hello, World!", "hello world"),  # case and punctuation
        ("U.S.A.", "usa"),  # punctuation is deleted, not replaced by a space (default)
        ("Jean-Paul Sartre", "jeanpaul sartre"),
        ("Ender\u2019s Game", "ender\u2019s game"),  # only ASCII punctuation is deleted
        ("New_York", "newyork"),  # "_" is ASCII punctuation: deleted like the rest
        ("the_beatles", "thebeatles"),  # so "the" joined by "_" is no longer a word
        ("  lots \t of\n\nspace  ", "lots of space"),  # whitespace collapsed and stripped
        ("THE", ""),
        ("", ""),
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected
    assert normalize_answer(raw, punctuation="delete") == expected  # the default, named


def _squad_normalize(s: str) -> str:
    """SQuAD v1.1's ``normalize_answer`` (``evaluate-v1.1.py``), which Search-R1's
    ``search_r1/search/qa_em.py`` copies: lower, delete ``string.punctuation``, articles to a
    space, collapse whitespace. Typed here as the reference ``delete`` follows."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("New_York", "newyork"),  # "_" is in string.punctuation: deleted, not a space
        ("snake_case_name", "snakecasename"),
        ("The_Beatles", "thebeatles"),  # no space appears, so "the" is not a word
        ("the _ end", "end"),  # "_" alone goes, then "the" is an article
        ("Battle_of Hastings, a.k.a. 1066!", "battleof hastings aka 1066"),
        ("U.S.A.", "usa"),
    ],
)
def test_delete_mode_is_squad_and_search_r1_on_underscores(raw: str, expected: str) -> None:
    assert "_" in string.punctuation
    assert _squad_normalize(raw) == expected  # the reference, on the literal
    assert normalize_answer(raw) == expected


def test_delete_mode_exact_match_on_an_underscore() -> None:
    assert exact_match("New_York", ["New York"]) == 0.0  # "newyork" != "new york"
    assert exact_match("New_York", ["NewYork"]) == 1.0  # "newyork" == "newyork"
    # ARENA's rule (C.1: underscores become spaces) is the space mode: "new york" both sides
    assert exact_match("New_York", ["New York"], punctuation="space") == 1.0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("U.S.A.", "u s"),  # ARENA's release: punctuation -> space; then "a" is an article
        ("Jean-Paul Sartre", "jean paul sartre"),  # a hyphen splits words
        ("Ender\u2019s Game", "ender s game"),  # typographic apostrophe is punctuation
        ("\u2018Tis \u00b4twas", "tis twas"),  # as are \u2018 and \u00b4 (the release's set)
        ("\u201cParis\u201d", "\u201cparis\u201d"),  # double curly quotes are not in that set
        ("O'Neil's", "o neil s"),
        ("New_York", "new york"),
        ("The Beatles!", "beatles"),
        ("a.k.a.", "k"),  # "a k a": both a are articles
    ],
)
def test_normalize_answer_space_mode(raw: str, expected: str) -> None:
    assert normalize_answer(raw, punctuation="space") == expected


def test_issue_14_hyphen_matches_space_in_arena_mode() -> None:
    # space: "jean paul sartre" on both sides
    assert exact_match("Jean-Paul Sartre", ["Jean Paul Sartre"], punctuation="space") == 1.0
    # delete (default): "jeanpaul sartre" != "jean paul sartre"
    assert exact_match("Jean-Paul Sartre", ["Jean Paul Sartre"]) == 0.0
    # and the other way round: "u s" != "usa" with space, "usa" == "usa" when deleting
    assert exact_match("U.S.A.", ["USA"], punctuation="space") == 0.0
    assert exact_match("U.S.A.", ["USA"]) == 1.0
    # F1, space: [jean, paul, sartre] vs [sartre]: P 1/3, R 1, F1 = 2 * (1/3) / (4/3) = 0.5
    assert f1_score("Jean-Paul Sartre", ["Sartre"], punctuation="space") == pytest.approx(0.5)
    # delete: [jeanpaul, sartre] vs [sartre]: P 1/2, R 1, F1 = 2 * (1/2) / (3/2) = 2/3
    assert f1_score("Jean-Paul Sartre", ["Sartre"]) == pytest.approx(2 / 3)


@pytest.mark.parametrize("punctuation", ["space", "delete"])
@pytest.mark.parametrize(
    ("prediction", "answers"),
    [("A", [""]), ("the", ["An"]), ("", [""]), ("!", ["?"]), ("a", ["the", ""])],
)
def test_issue_14_empty_normalized_answer_never_matches(
    prediction: str, answers: list[str], punctuation: str
) -> None:
    # both sides normalize to "": no answer given, nothing matched
    assert exact_match(prediction, answers, punctuation) == 0.0
    assert f1_score(prediction, answers, punctuation) == 0.0


def test_unknown_punctuation_mode() -> None:
    with pytest.raises(
        ValueError, match="punctuation 'strip' is not known; allowed: delete, space"
    ):
        normalize_answer("x", punctuation="strip")
    with pytest.raises(ValueError, match="exact_match punctuation 'strip' is not known"):
        ExactMatchReward(punctuation="strip")


def test_exact_match_any_alias() -> None:
    assert exact_match("the Eiffel tower.", ["La tour Eiffel", "Eiffel Tower"]) == 1.0
    assert exact_match("Eiffel", ["La tour Eiffel", "Eiffel Tower"]) == 0.0
    assert exact_match("yes", []) == 0.0  # no gold answers: nothing can match


def test_f1_hand_worked() -> None:
    # pred [city, of, paris] vs gold [paris, france]: common {paris} = 1
    # precision 1/3, recall 1/2, F1 = 2 * (1/3) * (1/2) / (1/3 + 1/2) = (1/3) / (5/6) = 0.4
    assert f1_score("the city of Paris", ["Paris France"]) == pytest.approx(0.4)
    # against aliases the max is taken: "city of paris" is a perfect match -> 1.0
    assert f1_score("the city of Paris", ["Paris France", "City of Paris"]) == 1.0
    # repeated tokens are counted with multiplicity: pred [paris, paris] vs gold [paris]
    # common = min(2, 1) = 1, precision 1/2, recall 1/1, F1 = 2 * 0.5 * 1 / 1.5 = 2/3
    assert f1_score("Paris Paris", ["Paris"]) == pytest.approx(2 / 3)
    assert f1_score("Rome", ["Paris"]) == 0.0  # no common token


def test_f1_empty_sides_score_zero() -> None:
    assert f1_score("", ["Paris"]) == 0.0  # empty prediction
    assert f1_score("Paris", ["the"]) == 0.0  # gold normalizes to nothing
    assert f1_score("a", ["the"]) == 0.0  # both normalize to nothing (SQuAD v2 would say 1)
    assert f1_score("Paris", []) == 0.0  # no gold answers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer> Paris </answer>", "Paris"),
        ("<answer>draft</answer> ... <answer>final</answer>", "final"),  # the last pair wins
        ("<answer>done</answer><answer>trunc", "done"),  # an unclosed tail is ignored
        ("<answer><answer>inner</answer></answer>", "inner"),  # nested: innermost pair
        ("<answer>x", None),  # unclosed
        ("x</answer>", None),  # close without open
        ("</answer><answer>", None),  # wrong order
        ("no tags at all", None),
        ("<Answer>Paris</Answer>", None),  # tags are case-sensitive
        ("<answer></answer>", ""),
    ],
)
def test_extract_tag(text: str, expected: str | None) -> None:
    assert extract_tag(text, "answer") == expected


def test_extract_tag_huge_nested_input_is_fast() -> None:
    text = "<answer>" * 25_000 + "x" + "</answer>" * 25_000  # ~400 KB
    start = time.perf_counter()
    assert extract_tag(text, "answer") == "x"
    assert extract_tag("<answer>" * 50_000, "answer") is None
    assert time.perf_counter() - start < 5.0  # linear scans take milliseconds


def test_exact_match_reward() -> None:
    trajs = [
        traj("<answer>The Eiffel Tower</answer>", answers=["Eiffel Tower"]),  # 1
        traj("<answer>Louvre</answer>", answers=["Eiffel Tower"]),  # 0
        traj("Eiffel Tower", answers=["Eiffel Tower"]),  # no <answer> tag -> 0
    ]
    out = ExactMatchReward(weight=2.0)(trajs)
    assert out.components["exact_match"].tolist() == [1.0, 0.0, 0.0]
    assert out.total.tolist() == [2.0, 0.0, 0.0]  # 2 * [1, 0, 0]
    whole = ExactMatchReward(answer_tag=None)(trajs)
    assert whole.total.tolist() == [0.0, 0.0, 1.0]  # the whole text is the answer


def test_rewards_punctuation_option() -> None:
    trajs = [traj("<answer>U.S.A.</answer>", answers=["USA"])]
    # space: "u s" != "usa" -> 0; delete (default): "usa" == "usa" -> 1
    assert ExactMatchReward(punctuation="space")(trajs).total.tolist() == [0.0]
    assert ExactMatchReward()(trajs).total.tolist() == [1.0]
    # F1, space: [u, s] vs [usa] share nothing -> 0; delete: [usa] vs [usa] -> 1
    assert F1Reward(punctuation="space")(trajs).total.tolist() == [0.0]
    assert F1Reward()(trajs).total.tolist() == [1.0]


def test_f1_reward() -> None:
    trajs = [
        traj("<answer>the city of Paris</answer>", answers=["Paris France"]),
        traj("", answers=["x"]),
    ]
    out = F1Reward(weight=0.5)(trajs)
    # F1 0.4 (see test_f1_hand_worked) and 0 (no tag); total = 0.5 * [0.4, 0]
    assert out.components["f1"].tolist() == pytest.approx([0.4, 0.0])
    assert out.total.tolist() == pytest.approx([0.2, 0.0])
    assert out.total.shape == (2,)


def test_rewards_on_empty_batch() -> None:
    assert ExactMatchReward()([]).total.shape == (0,)
    assert F1Reward()([]).total.shape == (0,)


def test_set_weights() -> None:
    reward = F1Reward()
    reward.set_weights({"f1": 3.0})
    assert reward([traj("<answer>Paris</answer>", answers=["Paris"])]).total.tolist() == [
        3.0
    ]  # 3 * 1.0
    with pytest.raises(ValueError, match="exact_match"):
        reward.set_weights({"exact_match": 1.0})


def check_never_raises(text: str, answers: list[str], tag: str) -> None:
    assert 0.0 <= exact_match(text, answers) <= 1.0
    assert 0.0 <= f1_score(text, answers) <= 1.0
    found = extract_tag(text, tag)
    assert found is None or found == found.strip()
    out = F1Reward()([traj(text, answers=answers)])
    assert 0.0 <= float(out.total[0]) <= 1.0


def test_never_raise_on_seeded_random_text() -> None:
    # Runs without hypothesis: random code points (surrogates, controls, NUL included).
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(chr(rng.randrange(0x30000)) for _ in range(rng.randrange(40)))
        check_never_raises(text, [text[:5], "None"], rng.choice(["answer", "", "<", "None"]))


def test_never_raise_on_arbitrary_text_hypothesis() -> None:
    require_package("hypothesis", "pip install hypothesis")
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=200, deadline=None)
    @given(st.text(), st.lists(st.text(), max_size=3), st.text(max_size=8))
    def run(text: str, answers: list[str], tag: str) -> None:
        check_never_raises(text, answers, tag)

    run()
