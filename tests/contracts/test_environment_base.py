"""The Environment base: the prompt -> encode -> repeat -> Trajectory preamble, and a new
single-turn environment written in under 60 lines against ``lit_rag.api`` only."""

import inspect

import pytest
import torch
from helpers import ScriptedPolicy

from lit_rag.api import Environment, Example, Prompts, SamplingParams, Trajectory, extract_tag
from lit_rag.plugins.engines.hf import HFEngine

CLOSED_BOOK_PROMPT = (
    "Answer the question from what you know. Reply with a short answer inside <answer> and "
    "</answer>."
)


class ClosedBookEnvironment(Environment):
    """Closed-book QA: the question alone (no references, no retrieval); the answer is the
    content of the last ``<answer>`` block.

    Args:
        system_prompt: The instruction, sent as the system message.
        user_template: The user message, with ``{question}``.
        assistant_prefix: Text that starts the answer (part of the prompt).
        use_chat_template: Through the tokenizer's chat template; False writes plain text.
    """

    def __init__(
        self,
        system_prompt: str = CLOSED_BOOK_PROMPT,
        user_template: str = "Question: {question}",
        assistant_prefix: str = "",
        use_chat_template: bool = True,
    ) -> None:
        if "{question}" not in user_template:
            raise ValueError(f"environment user_template needs {{question}}: {user_template!r}")
        self.system_prompt = system_prompt
        self.user_template = user_template
        self.assistant_prefix = assistant_prefix
        self.use_chat_template = use_chat_template

    def build_prompt(self, example: Example, tokenizer) -> str:
        user = self.user_template.format(question=example.question)
        return self.chat(tokenizer, self.system_prompt, user) + self.assistant_prefix

    def extract_answer(self, trajectory: Trajectory) -> str:
        return extract_tag(trajectory.text, "answer") or ""

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, torch.Tensor]:
        """The share of trajectories that wrote an answer."""
        answered = [float(bool(self.extract_answer(t))) for t in trajectories]
        return {"answered": torch.tensor(answered).mean()} if answered else {}


EXAMPLES = [
    Example(id="q1", question="Where was Mira Tolvan born?", answers=["Kessa"]),
    Example(id="q2", question="What does Vell Works make?", answers=["boats"]),
]


def test_a_new_environment_fits_in_60_lines():
    # the claim, kept true: rollout, encoding and trajectories all come from the base
    assert len(inspect.getsource(ClosedBookEnvironment).splitlines()) <= 60


def test_closed_book_rollout_with_the_hf_engine(tiny_policy):
    model, tok = tiny_policy
    engine = HFEngine()
    engine.bind(model, tok)
    env = ClosedBookEnvironment(assistant_prefix="<answer>")
    params = SamplingParams(max_new_tokens=6)
    torch.manual_seed(0)
    trajectories = env.rollout(EXAMPLES, engine, 3, params)
    # the same draw straight from the engine: the base passes each generation through unchanged
    torch.manual_seed(0)
    direct = engine.generate(env.prompts(EXAMPLES, tok, 3).repeated, params)
    assert [t.completion_ids.tolist() for t in trajectories] == [
        g.token_ids.tolist() for g in direct
    ]
    assert all(
        torch.equal(t.sampling_logprobs, g.logprobs)
        for t, g in zip(trajectories, direct, strict=True)
    )
    assert [t.truncated for t in trajectories] == [not g.finished for g in direct]

    # example 0 three times, then example 1 three times
    assert [t.group for t in trajectories] == [0, 0, 0, 1, 1, 1]
    assert [t.example.id for t in trajectories] == ["q1"] * 3 + ["q2"] * 3
    for t in trajectories:
        expected = (
            tok.apply_chat_template(
                [
                    {"role": "system", "content": CLOSED_BOOK_PROMPT},
                    {"role": "user", "content": f"Question: {t.example.question}"},
                ],
                add_generation_prompt=True,
                tokenize=False,
            )
            + "<answer>"
        )
        assert t.prompt_text == expected
        assert t.prompt_ids.tolist() == tok(expected, add_special_tokens=False)["input_ids"]
        assert t.prompt_ids.dtype == t.completion_ids.dtype == torch.long
        n = t.completion_ids.numel()
        assert t.loss_mask.tolist() == [1] * n  # every token is the policy's
        assert t.sampling_logprobs.shape == (n,) and bool((t.sampling_logprobs <= 0).all())
        assert t.text == "<answer>" + tok.decode(t.completion_ids, skip_special_tokens=True)
        assert not t.truncated or n == 6  # truncated only at the token budget
    assert torch.equal(trajectories[0].prompt_ids, trajectories[2].prompt_ids)
    assert not torch.equal(trajectories[0].prompt_ids, trajectories[3].prompt_ids)

    (first, second) = env.validation_rollout(EXAMPLES, engine, SamplingParams(max_new_tokens=4))
    assert (first.group, second.group) == (0, 1)
    assert set(env.metrics(trajectories)) == {"answered"}


def test_closed_book_extract_answer():
    env = ClosedBookEnvironment()
    scored = env.trajectory(EXAMPLES[0], 0, [1], [2], [-0.1], "<answer> Kessa </answer>")
    assert env.extract_answer(scored) == "Kessa"
    assert env.extract_answer(env.trajectory(EXAMPLES[0], 0, [1], [2], [-0.1], "no tag")) == ""


def test_prompts_repeat_each_example_group_size_times_in_a_row():
    prompts = Prompts(texts=["a", "b", "c"], ids=[[1], [2, 3], [4]], group_size=2)
    assert prompts.repeated == [[1], [1], [2, 3], [2, 3], [4], [4]]
    assert prompts.groups == [0, 0, 1, 1, 2, 2]  # row // group_size
    assert Prompts(texts=[], ids=[], group_size=4).repeated == []


def test_prompts_builds_and_encodes_each_example_once(tiny_policy):
    _, tok = tiny_policy
    env = ClosedBookEnvironment(use_chat_template=False)
    prompts = env.prompts(EXAMPLES, tok, group_size=2)
    # plain text: system, a blank line, user, a newline
    assert prompts.texts == [f"{CLOSED_BOOK_PROMPT}\n\nQuestion: {e.question}\n" for e in EXAMPLES]
    assert prompts.ids == [tok(t, add_special_tokens=False)["input_ids"] for t in prompts.texts]
    assert prompts.repeated == [prompts.ids[0]] * 2 + [prompts.ids[1]] * 2


class QuestionOnly(Environment):
    """The base's defaults only: ``system_prompt`` + the question, the base rollout."""

    def extract_answer(self, trajectory: Trajectory) -> str:
        return trajectory.text


def test_default_build_prompt_and_rollout(tiny_policy):
    _, tok = tiny_policy
    env = QuestionOnly()
    env.use_chat_template, env.assistant_prefix = False, "A:"
    assert env.build_prompt(EXAMPLES[0], tok) == "Where was Mira Tolvan born?\nA:"
    env.system_prompt = "Be brief."
    assert env.build_prompt(EXAMPLES[0], tok) == "Be brief.\n\nWhere was Mira Tolvan born?\nA:"

    # the tiny tokenizer: " Kessa" is 5 tokens, " rafts and boats" 11, cut at the budget of 8
    engine = ScriptedPolicy(tok, [[" Kessa", " Ke", " boats", " rafts and boats"]])
    trajectories = env.rollout(EXAMPLES, engine, 2, SamplingParams(max_new_tokens=8))
    (sent,) = engine.prompts
    assert sent == [env.build_prompt(e, tok) for e in EXAMPLES for _ in range(2)]  # 0, 0, 1, 1
    assert [t.group for t in trajectories] == [0, 0, 1, 1]
    assert [t.prompt_text for t in trajectories] == sent
    cut = tok.decode(tok(" rafts and boats", add_special_tokens=False)["input_ids"][:8])
    assert [t.text for t in trajectories] == ["A: Kessa", "A: Ke", "A: boats", "A:" + cut]
    assert [t.truncated for t in trajectories] == [False, False, False, True]
    assert [t.completion_ids.numel() for t in trajectories] == [5, 3, 4, 8]
    assert trajectories[0].sampling_logprobs.tolist() == [-0.25] * 5  # the engine's, as given


def test_trajectory_makes_tensors_and_keeps_given_ones():
    env = QuestionOnly()
    t = env.trajectory(
        EXAMPLES[0],
        1,
        [5, 6],
        [7, 8, 9],
        [-0.5, 0.0, -1.0],
        "x",
        loss_mask=[1, 0, 1],
        prompt_text="p",
        meta={"turns": 2},
    )
    assert (t.prompt_ids.dtype, t.completion_ids.dtype, t.loss_mask.dtype) == (torch.long,) * 3
    assert t.sampling_logprobs.dtype == torch.float32
    assert t.loss_mask.tolist() == [1, 0, 1] and t.num_generated == 2
    assert (t.group, t.prompt_text, t.meta) == (1, "p", {"turns": 2})
    assert (t.steps, t.truncated) == ([], False)

    ids, logprobs = torch.tensor([3, 4]), torch.tensor([-0.1, -0.2], dtype=torch.float64)
    kept = env.trajectory(EXAMPLES[0], 0, torch.tensor([1]), ids, logprobs, "y")
    assert kept.completion_ids is ids and kept.sampling_logprobs is logprobs  # as given
    assert kept.loss_mask.tolist() == [1, 1]  # default: all the policy's

    empty = env.trajectory(EXAMPLES[0], 0, [], [], [], "")
    assert empty.prompt_ids.shape == empty.completion_ids.shape == empty.loss_mask.shape == (0,)


def test_an_environment_without_extract_answer_cannot_be_built():
    class Incomplete(Environment):
        pass

    with pytest.raises(TypeError, match="extract_answer"):
        Incomplete()
