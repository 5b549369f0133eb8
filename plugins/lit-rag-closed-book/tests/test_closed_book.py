"""ClosedBookEnvironment: the prompt it writes, references kept out of prompt and trajectory,
answers, metrics, bad settings, and its entry point.

The rollout test drives a scripted engine (a fake: it returns fixed texts instead of sampling),
so the prompt and the trajectories can be checked exactly; ``tests/project/
test_worked_plugins.py`` in lit-rag runs the environment with the real ``hf`` engine in
``lit-rag fit``.
"""

from __future__ import annotations

from importlib import metadata

import pytest
import torch
from lit_rag_closed_book import DEFAULT_INSTRUCTION, ClosedBookEnvironment, without_references

from lit_rag.api import (
    Environment,
    Example,
    Generation,
    Passage,
    RolloutEngine,
    SamplingParams,
    Trajectory,
)

EXAMPLE = Example(
    id="q1",
    question="Who founded Orbel Mills?",
    answers=["Mira Tolvan"],
    references=[Passage("p1", "Orbel Mills", "Orbel Mills was founded by Mira Tolvan.")],
    gold_ids=["p1"],
    meta={"hops": 1},
)


class CharTokenizer:
    """One id per character, no chat template: prompts are plain text."""

    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(int(i)) for i in ids)


class ScriptedEngine(RolloutEngine):
    """A fake engine: the i-th prompt of a call gets ``texts[i]``, log-prob -0.5 per token."""

    def __init__(self, texts: list[str]) -> None:
        self.tokenizer, self.texts, self.prompts = CharTokenizer(), texts, []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        self.prompts.extend(self.tokenizer.decode(p) for p in prompts)
        out = []
        for text in self.texts[: len(prompts)]:
            ids = torch.tensor(self.tokenizer(text)["input_ids"])
            out.append(Generation(ids, torch.full((len(ids),), -0.5), text, finished=True))
        return out


def test_the_prompt_holds_the_instruction_and_question_only() -> None:
    prompt = ClosedBookEnvironment().build_prompt(EXAMPLE, CharTokenizer())
    assert prompt == f"{DEFAULT_INSTRUCTION}\n\nQuestion: Who founded Orbel Mills?\n"
    assert "Mira Tolvan" not in prompt  # the reference that holds the answer is not shown


def test_templates_and_prefix() -> None:
    env = ClosedBookEnvironment(
        system_prompt="", question_template="Q: {question} {not a field}", assistant_prefix="A:"
    )
    # no system message: "{user}\n"; braces other than {question} are kept as written
    assert env.build_prompt(EXAMPLE, CharTokenizer()) == (
        "Q: Who founded Orbel Mills? {not a field}\nA:"
    )


def test_rollout_hides_the_references_from_the_trajectories() -> None:
    engine = ScriptedEngine(["<answer>Mira Tolvan</answer>", "I think it was Mira."])
    env = ClosedBookEnvironment()
    trajectories = env.rollout([EXAMPLE], engine, group_size=2, params=SamplingParams())
    assert len(engine.prompts) == 2 and "Orbel Mills was founded" not in engine.prompts[0]
    assert [t.group for t in trajectories] == [0, 0]
    for t in trajectories:
        assert t.example.references == []
        assert t.example.meta == {"hops": 1, "references_hidden": 1}
        assert t.example.answers == ["Mira Tolvan"] and t.example.gold_ids == ["p1"]
    assert EXAMPLE.references and EXAMPLE.meta == {"hops": 1}  # the given example is unchanged
    assert [env.extract_answer(t) for t in trajectories] == ["Mira Tolvan", ""]
    # validation: one trajectory per example, references hidden as well
    (val,) = env.validation_rollout([EXAMPLE], ScriptedEngine(["x"]), SamplingParams())
    assert val.example.references == []


def traj(text: str) -> Trajectory:
    ids = torch.tensor([1])
    return Trajectory(EXAMPLE, 0, ids, ids, torch.ones(1), torch.zeros(1), text)


def test_metrics_by_hand() -> None:
    texts = ["<answer>Mira Tolvan</answer>", "<answer>Kessa</answer>", "no tag", "<answer>"]
    metrics = ClosedBookEnvironment().metrics([traj(t) for t in texts])
    # 2 of 4 have a complete answer tag; their words (2 + 1) / 2 = 1.5
    assert metrics["answer_rate"].item() == 0.5
    assert metrics["answer_words"].item() == 1.5
    assert ClosedBookEnvironment().metrics([]) == {}
    assert ClosedBookEnvironment().metrics([traj("none")])["answer_words"].item() == 0.0


def test_without_references_on_an_example_with_none() -> None:
    bare = Example(id="q2", question="?", answers=["x"])
    assert without_references(bare).meta == {"references_hidden": 0}


def test_bad_settings_name_the_key() -> None:
    with pytest.raises(ValueError, match="question_template: got 'Q:'; it must contain"):
        ClosedBookEnvironment(question_template="Q:")
    with pytest.raises(ValueError, match="answer_tag: got an empty tag"):
        ClosedBookEnvironment(answer_tag="")


def test_registered_as_closed_book() -> None:
    (ep,) = [
        ep for ep in metadata.entry_points(group="lit_rag.environments") if ep.name == "closed_book"
    ]
    assert ep.dist.metadata["Name"] == "lit-rag-closed-book"
    assert ep.load() is ClosedBookEnvironment
    assert issubclass(ClosedBookEnvironment, Environment)
