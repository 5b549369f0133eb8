"""The single-turn environment: ARENA's Table 1 prompt, groups, prefix, answer extraction."""

import pytest
import torch

from lit_rag.plugins.environments.single_turn import ARENA_SYSTEM_PROMPT, SingleTurnEnvironment
from lit_rag.rollout.base import Generation, RolloutEngine, SamplingParams
from lit_rag.types import Example, Passage

EX = Example(
    id="q1", question="Where was the founder of Orbel Mills born?", answers=["Kessa"],
    references=[Passage("a", "Orbel Mills", "Orbel Mills was founded by Mira Tolvan."),
                Passage("b", "Mira Tolvan", "Mira Tolvan was born in Kessa.")],
    gold_ids=["a", "b"],
)


class ScriptedEngine(RolloutEngine):
    """Returns fixed completions; records the prompts it got."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.prompts = tokenizer, list(texts), []

    def generate(self, prompts, params):
        self.prompts += prompts
        out = []
        for text in self.texts[: len(prompts)]:
            ids = torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            out.append(Generation(ids, torch.full(ids.shape, -0.5), text, finished=True))
        self.texts = self.texts[len(prompts):]
        return out


def test_prompt_is_table_1_through_chat_template(tiny_policy):
    _, tok = tiny_policy
    text = SingleTurnEnvironment().build_prompt(EX, tok)
    assert text.startswith("<|im_start|>system\n" + ARENA_SYSTEM_PROMPT)
    assert "<question>Where was the founder of Orbel Mills born?</question>" in text
    # references numbered from 1, in their original order
    assert "<references>1. Orbel Mills: Orbel Mills was founded by Mira Tolvan.\n2. Mira Tolvan:" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_rollout_groups_and_prefix(tiny_policy):
    _, tok = tiny_policy
    env = SingleTurnEnvironment(assistant_prefix="<relevance>[")
    engine = ScriptedEngine(tok, ["1, 2]</relevance>", "2]</relevance>", "x", "y"])
    trajs = env.rollout([EX, EX], engine, 2, SamplingParams())
    assert [t.group for t in trajs] == [0, 0, 1, 1]
    assert engine.prompts[0] == engine.prompts[1]  # the group shares one prompt
    assert trajs[0].text == "<relevance>[1, 2]</relevance>"  # the reward sees the prefix
    assert torch.equal(trajs[0].loss_mask, torch.ones_like(trajs[0].completion_ids))
    assert tok.decode(trajs[0].prompt_ids).endswith("assistant\n<relevance>[")


def test_extract_answer(tiny_policy):
    env = SingleTurnEnvironment()
    _, tok = tiny_policy
    engine = ScriptedEngine(tok, ["<relevance>[2]</relevance><analysis>a</analysis><answer> Kessa </answer>"])
    (t,) = env.rollout([EX], engine, 1, SamplingParams())
    assert env.extract_answer(t) == "Kessa"
    t.text = "no tags at all"
    assert env.extract_answer(t) == ""


def test_plain_text_prompt_for_base_models(tiny_policy):
    _, tok = tiny_policy
    text = SingleTurnEnvironment(use_chat_template=False, assistant_prefix="<relevance>").build_prompt(EX, tok)
    assert text.endswith("\nAssistant: <relevance>") and "<|im_start|>" not in text


def test_template_without_fields_is_rejected():
    with pytest.raises(ValueError, match="user_template must contain \\{references\\}"):
        SingleTurnEnvironment(user_template="{question}")
