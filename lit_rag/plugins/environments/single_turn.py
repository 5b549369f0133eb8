"""Single-turn environment: question + given references in the prompt, one completion.

ARENA (Section 3.1, Table 1): an instruction fixes the three-section output (<relevance>,
<analysis>, <answer>); after a "User:" line come the question and the references numbered from
1 in their original order (Appendix B). The table does not say which chat roles carry it;
ARENA's released data maker (``src/data_generator.py`` and ``src/datamaker_grpo.py`` of
ren258/ARENA) formats the whole table as ONE user message, which Open-R1 / TRL then send
through the model's chat template. That is our default (``prompt_layout="one_message"``), so
the model sees its chat template's own default system turn, if it has one (Qwen2.5: "You are
Qwen, created by Alibaba Cloud..."), exactly as in the release.
``prompt_layout="system_user"`` puts the instruction in a system message and the question in
the user message (what this environment did before; the CPU quickstart's measured base rates
use it).

The wording is Table 1's; the release's template differs only in layout and case (newlines
inside the tags, "**User**:", "give some references"), which the paper's table does not show.

Departures, both off by default: ``assistant_prefix`` pre-fills the start of the assistant
turn (the R1-style "<think>" trick) and ``example_output`` adds a worked output to the
instruction. Small models (SmolLM2-135M) never produce the format unaided, which gives GRPO no
signal; the CPU quickstart uses them and says so in its recipe. With one fixed worked output a
small policy learns to copy it word for word, which ARENA's format reward pays in full (measured
on HotpotQA, issue 27); ``example_outputs`` gives each question one of several, chosen from its
id, so that no single answer pays everywhere. Measured, it does not stop the copying: the policy
copies whichever output its prompt shows (README "Learning on real data").
"""

from __future__ import annotations

import zlib

from lit_rag.api import (
    Environment,
    Example,
    Passage,
    Trajectory,
    chat_prompt,
    check_context_overflow,
    extract_tag,
)

#: ARENA Table 1, the instruction part (verbatim); the system message with ``system_user``.
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

#: ARENA Table 1, the line between the instruction and the user part (``one_message``).
ARENA_USER_HEADER = "User:"

#: ``prompt_layout`` values: one user message (ARENA's release) or system + user messages.
LAYOUTS = ("one_message", "system_user")

#: How one reference is written; ``{index}`` counts from 1.
ARENA_REFERENCE_TEMPLATE = "{index}. {title}: {text}"


class SingleTurnEnvironment(Environment):
    """One prompt per example, ``group_size`` sampled completions (the base's
    :meth:`~lit_rag.api.Environment.rollout`).

    Args:
        system_prompt: The instruction (ARENA Table 1 by default); empty for none. A system
            message with ``prompt_layout="system_user"``, the start of the user message with
            ``one_message``.
        user_template: User message with ``{question}`` and ``{references}``.
        reference_template: One reference, with ``{index}``, ``{title}``, ``{text}``.
        reference_separator: Between references.
        example_output: Appended to the system prompt after "Example of a response:".
        example_outputs: Several worked outputs instead of one: each example's prompt shows the
            one at ``crc32(example.id) % len(example_outputs)``, the same in every run and for
            every sample of a group.
        assistant_prefix: Text that starts the assistant turn (part of the prompt; the reward
            reads it as the start of the completion).
        use_chat_template: Send messages through the tokenizer's chat template; False writes
            system, user and prefix as plain text (base models).
        chat_template_kwargs: Keyword arguments of the chat template, e.g.
            ``{"enable_thinking": false}`` (Qwen3 thinks by default).
        answer_tag: Tag whose content is the answer (for EM/F1 in validation).
        prompt_layout: ``one_message``: instruction, ``user_header`` and user part in one user
            message (ARENA's released data maker); ``system_user``: the instruction as a system
            message, the user part as the user message.
        user_header: Line between the instruction and the user part with ``one_message``
            (Table 1: "User:"); empty for none.
        context_overflow: A prompt that, with the token budget, does not fit the engine's
            context window: ``drop`` the last (lowest-ranked) references until it fits,
            ``cut`` (drop, then cut the next reference to the room left) or ``error``; a
            question too long alone is always an error naming the example.
    """

    def __init__(
        self,
        system_prompt: str = ARENA_SYSTEM_PROMPT,
        user_template: str = ARENA_USER_TEMPLATE,
        reference_template: str = ARENA_REFERENCE_TEMPLATE,
        reference_separator: str = "\n",
        example_output: str = "",
        example_outputs: list[str] | None = None,
        assistant_prefix: str = "",
        use_chat_template: bool = True,
        answer_tag: str = "answer",
        prompt_layout: str = "one_message",
        user_header: str = ARENA_USER_HEADER,
        chat_template_kwargs: dict | None = None,
        context_overflow: str = "drop",
    ) -> None:
        if prompt_layout not in LAYOUTS:
            raise ValueError(
                f"environment prompt_layout '{prompt_layout}' is not known; "
                f"allowed: {', '.join(LAYOUTS)}"
            )
        for key, template, fields in (
            ("user_template", user_template, ("{question}", "{references}")),
            ("reference_template", reference_template, ("{index}", "{text}")),
        ):
            missing = [f for f in fields if f not in template]
            if missing:
                raise ValueError(
                    f"environment {key} must contain {', '.join(missing)}: {template!r}"
                )
        if example_output and example_outputs:
            raise ValueError(
                "environment example_output and example_outputs are both set; give one "
                "worked output or a list of them"
            )
        if example_outputs is not None and not all(
            isinstance(text, str) and text for text in example_outputs
        ):
            raise ValueError("environment example_outputs must be a list of non-empty strings")
        self.system_prompt = system_prompt
        self.user_template = user_template
        self.reference_template = reference_template
        self.reference_separator = reference_separator
        self.example_output = example_output
        self.example_outputs = list(example_outputs or [])
        self.assistant_prefix = assistant_prefix
        self.use_chat_template = use_chat_template
        self.answer_tag = answer_tag
        self.prompt_layout = prompt_layout
        self.user_header = user_header
        self.chat_template_kwargs = chat_template_kwargs
        self.context_overflow = check_context_overflow(context_overflow)

    def format_references(self, references: list[Passage]) -> str:
        return self.reference_separator.join(
            self.reference_template.format(index=i + 1, title=p.title, text=p.text)
            for i, p in enumerate(references)
        )

    def example_output_for(self, example: Example) -> str:
        """The worked output this example's prompt shows ("" for none)."""
        if not self.example_outputs:
            return self.example_output
        pick = zlib.crc32(example.id.encode("utf-8")) % len(self.example_outputs)
        return self.example_outputs[pick]

    def build_prompt(self, example: Example, tokenizer) -> str:
        """The full prompt text for one example (chat template applied)."""
        system = self.system_prompt
        worked = self.example_output_for(example)
        if worked:
            system = f"{system}\nExample of a response:\n{worked}"
        user = self.user_template.format(
            question=example.question, references=self.format_references(example.references)
        )
        if self.prompt_layout == "one_message":  # Table 1 as one user message (the release)
            user = "\n".join(part for part in (system, self.user_header, user) if part)
            system = ""
        text = chat_prompt(
            tokenizer, system, user, self.use_chat_template, self.chat_template_kwargs
        )
        if text is None:
            if self.prompt_layout == "one_message":
                return f"{user}\nAssistant: {self.assistant_prefix}"
            head = f"{system}\n\n" if system else ""
            return f"{head}User: {user}\nAssistant: {self.assistant_prefix}"
        return text + self.assistant_prefix

    def extract_answer(self, trajectory: Trajectory) -> str:
        return extract_tag(trajectory.text, self.answer_tag) or ""
