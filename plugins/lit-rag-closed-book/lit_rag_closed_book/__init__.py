"""``closed_book``: the same questions with no references, answered from the model's weights.

Closed-book question answering (Roberts et al., 2020, "How Much Knowledge Can You Pack Into the
Parameters of a Language Model?"): the model sees the question alone. Train or validate a RAG
recipe's data and reward with this environment instead of ``single_turn`` and the difference
between the two runs is what the references buy.

The references an example carries are left out of the prompt and out of the trajectory's
example (``example.meta["references_hidden"]`` counts them), so a reward that reads references
(ARENA's relevance score) sees none and cannot pay for citing them.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from lit_rag.api import (
    Environment,
    Example,
    RolloutEngine,
    SamplingParams,
    Trajectory,
    extract_tag,
)

__all__ = ["DEFAULT_INSTRUCTION", "ClosedBookEnvironment", "without_references"]

#: The default system message.
DEFAULT_INSTRUCTION = (
    "Answer the question from what you know. Write only the answer, a short phrase or a "
    "single word, between <answer> and </answer>."
)


def without_references(example: Example) -> Example:
    """``example`` with no references; ``meta["references_hidden"]`` says how many it had.

    Example:
        An example with references ``[p1, p2]`` becomes one with ``references == []`` and
        ``meta == {..., "references_hidden": 2}``; its id, question, answers and gold ids stay.
    """
    meta = {**example.meta, "references_hidden": len(example.references)}
    return replace(example, references=[], meta=meta)


class ClosedBookEnvironment(Environment):
    """One prompt per question, no references; ``group_size`` sampled completions (the base's
    single-turn :meth:`~lit_rag.api.Environment.rollout`).

    Example:
        Without a chat template, the question "Who founded Orbel Mills?" is prompted as::

            Answer the question from what you know. Write only the answer, ...

            Question: Who founded Orbel Mills?

        and the completion ``"<answer>Mira Tolvan</answer>"`` answers ``"Mira Tolvan"``.

    Args:
        system_prompt: The instruction, sent as the system message; empty for none.
        question_template: The user message; ``{question}`` is replaced by the question.
        answer_tag: Tag whose last content is the answer.
        assistant_prefix: Text that starts the assistant turn (the end of the prompt, and the
            start of the trajectory's text).
        use_chat_template: Send the messages through the tokenizer's chat template; False
            writes them as plain text (base models).
        chat_template_kwargs: Keyword arguments of the chat template, e.g.
            ``{"enable_thinking": false}`` for Qwen3.
    """

    def __init__(
        self,
        system_prompt: str = DEFAULT_INSTRUCTION,
        question_template: str = "Question: {question}",
        answer_tag: str = "answer",
        assistant_prefix: str = "",
        use_chat_template: bool = True,
        chat_template_kwargs: dict | None = None,
    ) -> None:
        if "{question}" not in question_template:
            raise ValueError(
                f"environment question_template: got {question_template!r}; "
                "it must contain {question}"
            )
        if not answer_tag:
            raise ValueError("environment answer_tag: got an empty tag; give one, e.g. answer")
        self.system_prompt = system_prompt
        self.question_template = question_template
        self.answer_tag = answer_tag
        self.assistant_prefix = assistant_prefix
        self.use_chat_template = use_chat_template
        self.chat_template_kwargs = chat_template_kwargs

    def build_prompt(self, example: Example, tokenizer) -> str:
        """The instruction and the question (never the references), ready for the answer."""
        user = self.question_template.replace("{question}", example.question)
        return self.chat(tokenizer, self.system_prompt, user) + self.assistant_prefix

    def rollout(
        self,
        examples: list[Example],
        engine: RolloutEngine,
        group_size: int,
        params: SamplingParams,
    ) -> list[Trajectory]:
        """The base's single-turn rollout over the examples without their references
        (validation too: the base's ``validation_rollout`` calls this)."""
        closed = [without_references(e) for e in examples]
        return super().rollout(closed, engine, group_size, params)

    def extract_answer(self, trajectory: Trajectory) -> str:
        return extract_tag(trajectory.text, self.answer_tag) or ""

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, torch.Tensor]:
        """``answer_rate``: the fraction of completions with a complete answer tag;
        ``answer_words``: the mean word count of those answers."""
        if not trajectories:
            return {}
        answers = [extract_tag(t.text, self.answer_tag) for t in trajectories]
        given = [a for a in answers if a is not None]
        words = sum(len(a.split()) for a in given) / len(given) if given else 0.0
        return {
            "answer_rate": torch.tensor(len(given) / len(answers)),
            "answer_words": torch.tensor(float(words)),
        }
