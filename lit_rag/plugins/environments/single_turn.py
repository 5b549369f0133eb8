"""Single-turn environment: question + given references in the prompt, one completion.

ARENA (Section 3.1, Table 1): the system part of the prompt fixes the three-section output
(<relevance>, <analysis>, <answer>); the user part carries the question and the references
numbered from 1 in their original order (Appendix B). We send it through the model's chat
template (system + user messages), as Open-R1, ARENA's framework, does for instruct models.

Departures, both off by default: ``assistant_prefix`` pre-fills the start of the assistant
turn (the R1-style "<think>" trick) and ``example_output`` adds a worked output to the system
prompt. Small models (SmolLM2-135M) never produce the format unaided, which gives GRPO no
signal; the CPU quickstart uses them and says so in its recipe.
"""

from __future__ import annotations

from lit_rag.plugins.environments.base import Environment, chat_prompt, encode_prompts
from lit_rag.plugins.rewards.qa import extract_tag
from lit_rag.rollout.base import RolloutEngine, SamplingParams
from lit_rag.types import Example, Passage, Trajectory

#: ARENA Table 1, the instruction part (verbatim).
ARENA_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question and gives some "
    "references. The assistant should answer the question based on the references.\n"
    "User's input will always contain:\n"
    "<question>[ the question to answer ]</question>\n"
    "<references>[ references starting with numbers ]</references>\n"
    "Assistant's response must contain EXACTLY three sections:\n"
    "<relevance> [list ONLY reference numbers that provide useful information in square "
    "brackets, e.g. [1,5]]</relevance>\n"
    "<analysis>[ combine information from relevant references to build the answer. Explicitly "
    "mention which references support each claim ]</analysis>\n"
    "<answer>[ answer with ONLY a short phrase or single word. no explanations ]</answer>"
)

#: ARENA Table 1, the user part.
ARENA_USER_TEMPLATE = "<question>{question}</question>\n<references>{references}</references>"

#: How one reference is written; ``{index}`` counts from 1.
ARENA_REFERENCE_TEMPLATE = "{index}. {title}: {text}"


class SingleTurnEnvironment(Environment):
    """One prompt per example, ``group_size`` sampled completions.

    Args:
        system_prompt: System message (ARENA Table 1 by default); empty for none.
        user_template: User message with ``{question}`` and ``{references}``.
        reference_template: One reference, with ``{index}``, ``{title}``, ``{text}``.
        reference_separator: Between references.
        example_output: Appended to the system prompt after "Example of a response:".
        assistant_prefix: Text that starts the assistant turn (part of the prompt; the reward
            reads it as the start of the completion).
        use_chat_template: Send messages through the tokenizer's chat template; False writes
            system, user and prefix as plain text (base models).
        answer_tag: Tag whose content is the answer (for EM/F1 in validation).
    """

    def __init__(
        self,
        system_prompt: str = ARENA_SYSTEM_PROMPT,
        user_template: str = ARENA_USER_TEMPLATE,
        reference_template: str = ARENA_REFERENCE_TEMPLATE,
        reference_separator: str = "\n",
        example_output: str = "",
        assistant_prefix: str = "",
        use_chat_template: bool = True,
        answer_tag: str = "answer",
    ) -> None:
        for key, template, fields in (
            ("user_template", user_template, ("{question}", "{references}")),
            ("reference_template", reference_template, ("{index}", "{text}")),
        ):
            missing = [f for f in fields if f not in template]
            if missing:
                raise ValueError(f"environment {key} must contain {', '.join(missing)}: {template!r}")
        self.system_prompt = system_prompt
        self.user_template = user_template
        self.reference_template = reference_template
        self.reference_separator = reference_separator
        self.example_output = example_output
        self.assistant_prefix = assistant_prefix
        self.use_chat_template = use_chat_template
        self.answer_tag = answer_tag

    def format_references(self, references: list[Passage]) -> str:
        return self.reference_separator.join(
            self.reference_template.format(index=i + 1, title=p.title, text=p.text)
            for i, p in enumerate(references)
        )

    def build_prompt(self, example: Example, tokenizer) -> str:
        """The full prompt text for one example (chat template applied)."""
        system = self.system_prompt
        if self.example_output:
            system = f"{system}\nExample of a response:\n{self.example_output}"
        user = self.user_template.format(
            question=example.question, references=self.format_references(example.references)
        )
        text = chat_prompt(tokenizer, system, user, self.use_chat_template)
        if text is None:
            head = f"{system}\n\n" if system else ""
            return f"{head}User: {user}\nAssistant: {self.assistant_prefix}"
        return text + self.assistant_prefix

    def rollout(
        self,
        examples: list[Example],
        engine: RolloutEngine,
        group_size: int,
        params: SamplingParams,
    ) -> list[Trajectory]:
        tokenizer = engine.tokenizer
        prompt_texts = [self.build_prompt(ex, tokenizer) for ex in examples]
        prompt_ids = encode_prompts(tokenizer, prompt_texts)
        repeated = [ids for ids in prompt_ids for _ in range(group_size)]
        generations = engine.generate(repeated, params)
        trajectories = []
        for i, gen in enumerate(generations):
            group = i // group_size
            trajectories.append(
                Trajectory(
                    example=examples[group],
                    group=group,
                    prompt_ids=_tensor(prompt_ids[group]),
                    completion_ids=gen.token_ids,
                    loss_mask=gen.token_ids.new_ones(gen.token_ids.shape),
                    sampling_logprobs=gen.logprobs,
                    text=self.assistant_prefix + gen.text,
                    truncated=not gen.finished,
                    prompt_text=prompt_texts[group],
                )
            )
        return trajectories

    def extract_answer(self, trajectory: Trajectory) -> str:
        return extract_tag(trajectory.text, self.answer_tag) or ""


def _tensor(ids: list[int]):
    import torch

    return torch.tensor(ids, dtype=torch.long)
