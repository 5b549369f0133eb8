"""The single-turn environment: ARENA's Table 1 prompt, groups, prefix, answer extraction."""

import zlib

import pytest
import torch

from lit_rag.plugins.environments.single_turn import ARENA_SYSTEM_PROMPT, SingleTurnEnvironment
from lit_rag.rollout.base import Generation, RolloutEngine, SamplingParams
from lit_rag.types import Example, Passage

EX = Example(
    id="q1",
    question="Where was the founder of Orbel Mills born?",
    answers=["Kessa"],
    references=[
        Passage("a", "Orbel Mills", "Orbel Mills was founded by Mira Tolvan."),
        Passage("b", "Mira Tolvan", "Mira Tolvan was born in Kessa."),
    ],
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
        self.texts = self.texts[len(prompts) :]
        return out


TABLE_1_USER = (
    "<question>Where was the founder of Orbel Mills born?</question>\n"
    # references numbered from 1, in their original order
    "<references>1. Orbel Mills: Orbel Mills was founded by Mira Tolvan.\n"
    "2. Mira Tolvan: Mira Tolvan was born in Kessa.</references>"
)


def test_prompt_is_table_1_as_one_user_message(tiny_policy):
    # ARENA's released data maker: [{"role": "user", "content": <all of Table 1>}]
    _, tok = tiny_policy
    text = SingleTurnEnvironment().build_prompt(EX, tok)
    message = ARENA_SYSTEM_PROMPT + "\nUser:\n" + TABLE_1_USER
    expected = tok.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False
    )
    assert text == expected
    assert "<|im_start|>user\nA conversation between User and Assistant." in text
    assert "<|im_start|>system\n" + ARENA_SYSTEM_PROMPT not in text
    assert text.endswith("<|im_start|>assistant\n")


def test_system_user_layout_keeps_the_split(tiny_policy):
    _, tok = tiny_policy
    text = SingleTurnEnvironment(prompt_layout="system_user").build_prompt(EX, tok)
    assert text.startswith("<|im_start|>system\n" + ARENA_SYSTEM_PROMPT)
    assert "<|im_start|>user\n" + TABLE_1_USER + "<|im_end|>" in text
    assert "User:" not in text.split("<|im_start|>user")[1]  # no header in the split layout
    assert text.endswith("<|im_start|>assistant\n")


def test_example_output_goes_before_the_user_header(tiny_policy):
    _, tok = tiny_policy
    text = SingleTurnEnvironment(example_output="<answer>x</answer>").build_prompt(EX, tok)
    assert (
        ARENA_SYSTEM_PROMPT + "\nExample of a response:\n<answer>x</answer>\nUser:\n<question>"
        in text
    )


def test_example_outputs_pick_one_per_question_from_its_id(tiny_policy):
    _, tok = tiny_policy
    outputs = [f"<answer>example {i}</answer>" for i in range(5)]
    env = SingleTurnEnvironment(example_outputs=outputs)
    examples = [
        Example(id=f"q{i}", question="Who?", answers=["a"], references=EX.references)
        for i in range(40)
    ]
    picks = [env.example_output_for(ex) for ex in examples]
    assert picks == [outputs[zlib.crc32(f"q{i}".encode()) % 5] for i in range(40)]
    assert set(picks) == set(outputs)  # 40 ids reach all five
    text = env.build_prompt(examples[0], tok)
    assert "Example of a response:\n" + picks[0] + "\nUser:" in text
    assert sum(out in text for out in outputs) == 1
    assert SingleTurnEnvironment(example_outputs=outputs).build_prompt(examples[0], tok) == text


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"example_output": "a", "example_outputs": ["b"]}, "both set"),
        ({"example_outputs": ["a", ""]}, "non-empty strings"),
    ],
)
def test_example_outputs_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SingleTurnEnvironment(**kwargs)


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
    engine = ScriptedEngine(
        tok, ["<relevance>[2]</relevance><analysis>a</analysis><answer> Kessa </answer>"]
    )
    (t,) = env.rollout([EX], engine, 1, SamplingParams())
    assert env.extract_answer(t) == "Kessa"
    t.text = "no tags at all"
    assert env.extract_answer(t) == ""


def test_plain_text_prompt_for_base_models(tiny_policy):
    _, tok = tiny_policy
    text = SingleTurnEnvironment(
        use_chat_template=False, assistant_prefix="<relevance>"
    ).build_prompt(EX, tok)
    assert text == ARENA_SYSTEM_PROMPT + "\nUser:\n" + TABLE_1_USER + "\nAssistant: <relevance>"
    split = SingleTurnEnvironment(
        use_chat_template=False, prompt_layout="system_user"
    ).build_prompt(EX, tok)
    assert split == ARENA_SYSTEM_PROMPT + "\n\nUser: " + TABLE_1_USER + "\nAssistant: "


def test_template_without_fields_is_rejected():
    with pytest.raises(ValueError, match="user_template must contain \\{references\\}"):
        SingleTurnEnvironment(user_template="{question}")


def test_unknown_layout_is_rejected():
    with pytest.raises(
        ValueError, match="prompt_layout 'system' is not known; allowed: one_message, system_user"
    ):
        SingleTurnEnvironment(prompt_layout="system")
