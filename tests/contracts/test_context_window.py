"""Prompts fit the engine's context window: references dropped or cut, a question
too long alone is one line naming the example, and a multi-turn episode whose context fills
the window ends as truncated. The ``hf`` engine on a tiny random model whose config declares a
160-token window; ``tests/contracts/test_context_window_cli.py`` runs ``lit-rag`` on both
engines."""

from __future__ import annotations

import pytest
import torch

from lit_rag.api import (
    ContextLimit,
    Episode,
    EpisodeLoop,
    Example,
    Generate,
    InputError,
    Passage,
    SamplingParams,
    fit_passages,
)
from lit_rag.models.loading import ModelConfig, TinyConfig, load_model, load_tokenizer
from lit_rag.plugins.engines.hf import HFEngine
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment

WINDOW = 560  # ARENA's instruction alone is ~380 tokens of the tiny tokenizer
BUDGET = SamplingParams(max_new_tokens=16, temperature=1.0)


@pytest.fixture(scope="module")
def engine() -> HFEngine:
    config = ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2))
    torch.manual_seed(0)
    model = load_model(config).eval()
    model.config.max_position_embeddings = WINDOW
    engine = HFEngine()
    engine.bind(model, load_tokenizer(config))
    return engine


def example(question: str = "Who founded the company?", references: int = 10) -> Example:
    refs = [
        Passage(f"p{i}", f"Title {i}", " ".join(f"the word{i}x{j}" for j in range(8)))
        for i in range(references)
    ]
    return Example("q1", question, ["Paris"], refs, gold_ids=["p0"])


def length(env, ex: Example, tokenizer) -> int:
    return len(tokenizer(env.build_prompt(ex, tokenizer), add_special_tokens=False)["input_ids"])


def test_the_window_comes_from_the_models_config(engine):
    assert engine.context_window() == WINDOW
    assert ContextLimit.of(engine, BUDGET) == ContextLimit(WINDOW, 16)


def test_the_lowest_ranked_references_are_dropped(engine):
    env, ex, tok = SingleTurnEnvironment(), example(), engine.tokenizer
    assert length(env, ex, tok) + 16 > WINDOW  # it would not fit whole
    trajectories = env.rollout([ex], engine, 2, BUDGET)
    kept = trajectories[0].example.references
    n = len(kept)
    assert 0 < n < 10 and kept == ex.references[:n]  # the first (highest-ranked) ones
    assert length(env, trajectories[0].example, tok) + 16 <= WINDOW
    one_more = Example("q1", ex.question, ["Paris"], ex.references[: n + 1])
    assert length(env, one_more, tok) + 16 > WINDOW  # the most whole references that fit
    for t in trajectories:
        assert len(t.prompt_ids) + len(t.completion_ids) <= WINDOW
        assert t.example.meta["references_dropped"] == 10 - n
        assert t.example.gold_ids == ["p0"] and t.example.id == "q1"


def test_cut_fills_the_room_with_part_of_the_next_reference(engine):
    tok = engine.tokenizer
    drop = SingleTurnEnvironment().rollout([example()], engine, 1, BUDGET)[0].example.references
    cut_env = SingleTurnEnvironment(context_overflow="cut")
    (t,) = cut_env.rollout([example()], engine, 1, BUDGET)
    refs = t.example.references
    assert refs[:-1] == drop and len(refs) == len(drop) + 1
    last = refs[-1]
    assert last.id == f"p{len(drop)}" and last.text.endswith(" ...")
    whole = example().references[len(drop)].text.split()
    shown = last.text[: -len(" ...")].split()
    assert 0 < len(shown) < len(whole) and shown == whole[: len(shown)]
    assert t.example.meta == {"references_dropped": 10 - len(drop), "reference_cut": last.id}
    assert len(t.prompt_ids) + 16 <= WINDOW
    one_more = [
        *refs[:-1],
        Passage(last.id, last.title, " ".join(whole[: len(shown) + 1]) + " ..."),
    ]
    longer = Example("q1", t.example.question, ["Paris"], one_more)
    assert length(cut_env, longer, tok) + 16 > WINDOW  # the most words that fit


def test_a_question_too_long_alone_is_one_line(engine):
    env, tok = SingleTurnEnvironment(), engine.tokenizer
    ex = example(question="why " * 200, references=3)
    bare = length(env, Example("q1", ex.question, ["Paris"]), tok)
    with pytest.raises(InputError) as info:
        env.rollout([ex], engine, 2, BUDGET)
    assert str(info.value) == (
        f"example 'q1': its prompt is {bare} tokens without any reference; with the 16-token "
        f"budget (max_new_tokens) that is {bare + 16}, over the engine's context window of "
        f"{WINDOW} tokens; shorten the question, lower max_new_tokens, or use a model with a "
        "longer context"
    )
    assert "\n" not in str(info.value)


def test_context_overflow_error_names_the_choice(engine):
    with pytest.raises(
        InputError,
        match=r"^example 'q1': its prompt is \d+ tokens with its "
        r"references; .*\(context_overflow: drop would leave out references\)$",
    ):
        SingleTurnEnvironment(context_overflow="error").rollout([example()], engine, 1, BUDGET)
    with pytest.raises(ValueError, match="context_overflow: got 'trim'; allowed: drop, cut, error"):
        SingleTurnEnvironment(context_overflow="trim")


def test_fit_passages_by_hand():
    passages = [Passage(f"p{i}", "", "w " * 10) for i in range(5)]  # 10 words each

    def encode(kept):  # 5 tokens of question, then one token a word
        return [0] * (5 + sum(len(p.text.split()) for p in kept))

    assert fit_passages(passages, encode, 60) == passages
    assert fit_passages(passages, encode, 37) == passages[:3]
    cut = fit_passages(passages, encode, 37, "cut")
    assert cut[:3] == passages[:3] and cut[3].text == "w ..."  # 35 + "w ..." (2 words) = 37
    assert fit_passages(passages, encode, 4) is None


def test_an_episode_whose_context_fills_the_window_ends_truncated(engine):
    """The first insertion leaves the next segment 5 tokens of room: it gets a 5-token budget
    instead of 16; the second fills the window: the episode ends as truncated instead of
    asking the engine for more than it holds."""
    tok = engine.tokenizer
    prompt = tok("Who founded the company?", add_special_tokens=False)["input_ids"]
    the = tok(" the", add_special_tokens=False)["input_ids"]

    def ask(loop, e, _=None):
        return Generate("generated", e.context, BUDGET)

    def generated(loop, e, gen):
        e.generated(gen)
        words = WINDOW - 5 - len(e.context) if len(e.turns) == 1 else 50
        e.insert(the * words, " the" * words)
        return ask(loop, e)

    loop = EpisodeLoop(engine, BUDGET)
    (e,) = loop.run([Episode(example(), 0, prompt)], {"start": ask, "generated": generated})
    assert (
        e.truncated
        and e.stop_reason
        == f"context full: {WINDOW + 50 - 5 + len(e.turns[1].generation.token_ids)} "
        f"tokens of {WINDOW}"
    )
    assert [len(t.prompt_ids) for t in e.turns] == [len(prompt), WINDOW - 5]
    assert e.turns[1].generation.token_ids.numel() <= 5
