"""Environment contract (docs/DESIGN.md step 2): examples -> trajectories. Never computes rewards.

The base holds what every environment repeats: :meth:`~Environment.build_prompt` (one
example's prompt text), :meth:`~Environment.prompts` (prompt -> token ids -> each repeated
``group_size`` times, as :class:`Prompts`) and :meth:`~Environment.trajectory` (token lists or
tensors -> a :class:`Trajectory`). Its default :meth:`~Environment.rollout` is the single-turn
episode (prompt -> one generation -> trajectory), so a single-turn environment writes
``extract_answer`` and, when its prompt holds more than an instruction and the question,
``build_prompt``; a multi-turn one overrides ``rollout`` and uses the same helpers. Example, a
closed-book environment::

    from lit_rag.api import Environment, Trajectory, extract_tag

    class ClosedBook(Environment):
        system_prompt = "Answer inside <answer> and </answer>."

        def extract_answer(self, trajectory: Trajectory) -> str:
            return extract_tag(trajectory.text, "answer") or ""

Optional capabilities are declared on :class:`Environment`: ``grows_forest`` with
:meth:`~Environment.next_contexts` (R2AG's RR-Forest: unfinished states re-enter the data pool)
and ``state_dict`` / ``load_state_dict`` (the checkpoint carries them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from lit_rag import registry
from lit_rag.errors import InputError
from lit_rag.rollout.base import RolloutEngine, SamplingParams
from lit_rag.types import Example, Passage, Piece, Step, Trajectory

#: What an environment does with a prompt that, with the token budget, does not fit the
#: engine's context window: ``drop`` the lowest-ranked references (the last ones) until it
#: fits; ``cut`` the same, and then cut the text of the first reference that did not fit to
#: the room left; ``error``: stop with one line naming the example.
CONTEXT_OVERFLOW = ("drop", "cut", "error")


def check_context_overflow(value: str) -> str:
    """``value`` when it is one of :data:`CONTEXT_OVERFLOW` (else a ValueError naming them)."""
    if value not in CONTEXT_OVERFLOW:
        raise ValueError(
            f"environment context_overflow: got {value!r}; allowed: {', '.join(CONTEXT_OVERFLOW)}"
        )
    return value


def fit_passages(
    passages: Sequence[Passage],
    encode: Callable[[list[Passage]], list[int]],
    room: int,
    overflow: str = "drop",
) -> list[Passage] | None:
    """The first passages (the highest-ranked) whose prompt ``encode(kept)`` takes at most
    ``room`` tokens; with ``overflow="cut"`` the next passage follows, its text cut at a word
    to the room left and ended with " ..." (when a word of it fits). None when the prompt
    does not fit even with no passage. Bisection: ~log2(n) encodings, not n."""
    if len(encode(list(passages))) <= room:
        return list(passages)
    if len(encode([])) > room:
        return None
    low, high = 0, len(passages) - 1  # the most whole passages that fit
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (
            (middle, high) if len(encode(list(passages[:middle]))) <= room else (low, middle - 1)
        )
    kept = list(passages[:low])
    if overflow != "cut":
        return kept
    words = passages[low].text.split()

    def part(n: int) -> Passage:
        return replace(passages[low], text=" ".join(words[:n]) + " ...")

    few, many = 0, len(words) - 1  # the most words of the next passage that fit
    while few < many:
        middle = (few + many + 1) // 2
        few, many = (
            (middle, many) if len(encode([*kept, part(middle)])) <= room else (few, middle - 1)
        )
    return [*kept, part(few)] if few else kept


@dataclass(frozen=True)
class ContextLimit:
    """The room a first prompt has: the engine's context window less the token budget.

    Args:
        window: The engine's context window (prompt + completion), in tokens.
        budget: The completion's token budget (``max_new_tokens``).
    """

    window: int
    budget: int

    @property
    def prompt_tokens(self) -> int:
        """The most tokens a prompt may take."""
        return self.window - self.budget

    def too_long(self, example_id: str, tokens: int, what: str = "", hint: str = "") -> InputError:
        """The one line for a prompt of ``tokens`` that does not fit with the budget."""
        return InputError(
            f"example {example_id!r}: its {what}prompt is {tokens} tokens{hint}; with the "
            f"{self.budget}-token budget (max_new_tokens) that is {tokens + self.budget}, over "
            f"the engine's context window of {self.window} tokens; shorten the question, lower "
            "max_new_tokens, or use a model with a longer context"
        )

    @classmethod
    def of(cls, engine: RolloutEngine, params: SamplingParams) -> ContextLimit | None:
        """The limit of ``engine`` for ``params``; None when the engine knows no window."""
        window = engine.context_window()
        return None if window is None else cls(window, params.max_new_tokens)


def chat_prompt(
    tokenizer,
    system: str,
    user: str,
    use_chat_template: bool = True,
    template_kwargs: dict | None = None,
) -> str | None:
    """System + user messages through the tokenizer's chat template, ready for the assistant;
    ``None`` when the template is off or the tokenizer has none (the caller writes raw text).
    ``template_kwargs`` go to the template (``{"enable_thinking": False}`` turns Qwen3's
    default thinking off; a template that does not read a key ignores it)."""
    if not use_chat_template or getattr(tokenizer, "chat_template", None) is None:
        return None
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}
    ]
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **(template_kwargs or {})
    )


def encode_prompts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of prompt texts (their special tokens are already in the text)."""
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


@dataclass
class Prompts:
    """A batch's prompts, each sampled ``group_size`` times.

    Row ``r`` of :attr:`repeated` is example ``r // group_size``: example 0 ``group_size`` times,
    then example 1, ... (the contiguous groups every algorithm expects).

    Example:
        >>> p = Prompts(texts=["a", "b"], ids=[[1], [2, 3]], group_size=2)
        >>> p.repeated, p.groups
        ([[1], [1], [2, 3], [2, 3]], [0, 0, 1, 1])

    Args:
        texts: Prompt text per example, ``[B]``.
        ids: Token ids per example, ``[B]`` lists of ``P_b`` ids.
        group_size: Samples per example (G).
    """

    texts: list[str]
    ids: list[list[int]]
    group_size: int
    #: the examples as prompted (references dropped or cut to fit the context); None: as given
    examples: list[Example] | None = None

    def example(self, group: int, given: Sequence[Example]) -> Example:
        """Example ``group`` as its prompt shows it."""
        return given[group] if self.examples is None else self.examples[group]

    @property
    def repeated(self) -> list[list[int]]:
        """The engine's input: each example's ids ``group_size`` times in a row, ``[B*G]``."""
        return [ids for ids in self.ids for _ in range(self.group_size)]

    @property
    def groups(self) -> list[int]:
        """The example (group) index of each row of :attr:`repeated`, ``[B*G]``."""
        return [group for group in range(len(self.ids)) for _ in range(self.group_size)]


class Environment(ABC):
    """Builds prompts, drives the engine (and retriever for tool turns), returns trajectories.

    A subclass writes :meth:`extract_answer` and either :meth:`build_prompt` (single-turn: the
    default :meth:`rollout` does the rest) or its own :meth:`rollout` (multi-turn), built from
    :meth:`prompts` and :meth:`trajectory`.
    """

    #: The instruction the default :meth:`build_prompt` sends as the system message.
    system_prompt: str = ""
    #: Send prompts through the tokenizer's chat template (:meth:`chat`); False: plain text.
    use_chat_template: bool = True
    #: Keyword arguments of the chat template (e.g. ``{"enable_thinking": False}`` for Qwen3).
    chat_template_kwargs: dict | None = None
    #: Text that starts the assistant turn: the end of the prompt, and the start of
    #: ``Trajectory.text`` in the default :meth:`rollout` (the reward reads it with the output).
    assistant_prefix: str = ""
    #: A prompt too long for the context window with the budget: ``drop`` / ``cut`` the
    #: lowest-ranked references, or ``error`` (:data:`CONTEXT_OVERFLOW`).
    context_overflow: str = "drop"

    def setup(self) -> None:  # noqa: B027 (optional hook)
        """Open what the environment needs (an index, say) before training starts, so a missing
        one fails at once rather than at the first rollout. Called once by the policy module."""

    # ---- the prompt -> encode -> repeat -> Trajectory preamble -----------------------------
    def build_prompt(self, example: Example, tokenizer) -> str:
        """One example's whole prompt text, ready for the assistant's first token.

        Default: :attr:`system_prompt` and the question as messages (:meth:`chat`), then
        :attr:`assistant_prefix`. Override it to put more in the prompt (references, say).
        """
        return self.chat(tokenizer, self.system_prompt, example.question) + self.assistant_prefix

    def chat(self, tokenizer, system: str, user: str) -> str:
        r"""System + user messages as prompt text: through the chat template when
        :attr:`use_chat_template` is on and the tokenizer has one, else ``"{system}\n\n{user}\n"``
        (``"{user}\n"`` without a system message)."""
        text = chat_prompt(
            tokenizer, system, user, self.use_chat_template, self.chat_template_kwargs
        )
        if text is None:
            return f"{system}\n\n{user}\n" if system else f"{user}\n"
        return text

    def prompts(
        self,
        examples: list[Example],
        tokenizer,
        group_size: int = 1,
        limit: ContextLimit | None = None,
    ) -> Prompts:
        """:meth:`build_prompt` per example, encoded; :attr:`Prompts.repeated` is the engine's
        input for ``group_size`` samples per example. With ``limit``, each prompt is fitted to
        it (:meth:`fit_prompt`) and :attr:`Prompts.examples` holds the examples as prompted."""
        if limit is None:
            texts = [self.build_prompt(example, tokenizer) for example in examples]
            return Prompts(texts, encode_prompts(tokenizer, texts), group_size)
        fitted = [self.fit_prompt(example, tokenizer, limit) for example in examples]
        return Prompts(
            [f[1] for f in fitted],
            [f[2] for f in fitted],
            group_size,
            examples=[f[0] for f in fitted],
        )

    def fit_prompt(
        self, example: Example, tokenizer, limit: ContextLimit
    ) -> tuple[Example, str, list[int]]:
        """The example's prompt within ``limit``: ``(example as prompted, text, ids)``.

        References are taken as ranked (a retriever's order, a data set's own order): with
        ``context_overflow`` ``drop`` the last ones go until the prompt fits; with ``cut`` the
        first reference that did not fit is then cut, at a word, to the room left (a cut
        reference ends with "..."). The example's ``meta`` records what was left out: the
        number of references not shown whole (``references_dropped``) and the id of the one
        cut (``reference_cut``).

        Raises:
            InputError: The prompt does not fit and ``context_overflow`` is ``error``, or it
                does not fit with every reference left out (the question alone is too long):
                one line naming the example and the lengths.
        """
        text, ids = self._encoded(example, tokenizer)
        if len(ids) <= limit.prompt_tokens:
            return example, text, ids
        references = example.references
        if self.context_overflow == "error" or not references:
            raise self._too_long(example, len(ids), limit, without_references=not references)

        def encode(kept: list[Passage]) -> list[int]:
            return self._encoded(replace(example, references=kept), tokenizer)[1]

        kept = fit_passages(references, encode, limit.prompt_tokens, self.context_overflow)
        if kept is None:
            raise self._too_long(example, len(encode([])), limit, without_references=True)
        # kept is a prefix of references (the last one perhaps cut)
        whole = sum(1 for a, b in zip(kept, references, strict=False) if a is b)
        meta = {**example.meta, "references_dropped": len(references) - whole}
        if len(kept) > whole:
            meta["reference_cut"] = kept[-1].id
        prompted = replace(example, references=kept, meta=meta)
        text, ids = self._encoded(prompted, tokenizer)
        return prompted, text, ids

    def _encoded(self, example: Example, tokenizer) -> tuple[str, list[int]]:
        text = self.build_prompt(example, tokenizer)
        return text, encode_prompts(tokenizer, [text])[0]

    def _too_long(
        self, example: Example, tokens: int, limit: ContextLimit, without_references: bool
    ) -> InputError:
        what = " without any reference" if without_references else " with its references"
        error = limit.too_long(example.id, tokens, hint=what)
        if without_references or self.context_overflow != "error":
            return error
        return InputError(f"{error} (context_overflow: drop would leave out references)")

    def trajectory(
        self,
        example: Example,
        group: int,
        prompt_ids: Sequence[int] | torch.Tensor,
        completion_ids: Sequence[int] | torch.Tensor,
        sampling_logprobs: Sequence[float] | torch.Tensor,
        text: str,
        *,
        loss_mask: Sequence[int] | torch.Tensor | None = None,
        prompt_text: str = "",
        steps: list[Step] | None = None,
        truncated: bool = False,
        meta: dict[str, Any] | None = None,
        pieces: list[Piece] | None = None,
        sampled: Sequence[Sequence[int]] | None = None,
        versions: Sequence[tuple[int, int] | None] | None = None,
    ) -> Trajectory:
        """One :class:`Trajectory`; token lists become tensors (ids and mask ``long``, log-probs
        ``float32``), tensors are kept as they are.

        Args:
            example: The example the episode answers.
            group: Its group (the example's index in the batch).
            prompt_ids: ``[P]``.
            completion_ids: ``[C]``: generated tokens and, multi-turn, inserted ones.
            sampling_logprobs: ``[C]``, 0 at inserted tokens.
            text: The completion's text.
            loss_mask: ``[C]``, 1 at generated tokens, 0 at inserted ones; None: all ones.
            prompt_text: The prompt as text.
            steps: The episode's actions.
            truncated: Generation stopped at the token budget.
            meta: Anything else the environment records.
            pieces: ``text`` by who wrote it (:class:`Piece`); None: the policy wrote it all.
            sampled: The engine's sampled ids, one list per generation: trained tokens (loss
                mask 1) that differ are counted (``token_mismatch``, logged; it must stay 0).
            versions: Each generation's policy versions (:attr:`Generation.versions`), in order.
        """
        completion_ids = _tensor(completion_ids, torch.long)  # [C]
        loss_mask = _tensor(
            torch.ones_like(completion_ids) if loss_mask is None else loss_mask, torch.long
        )
        mismatch = 0 if sampled is None else token_mismatch(completion_ids, loss_mask, sampled)
        return Trajectory(
            example=example,
            group=group,
            prompt_ids=_tensor(prompt_ids, torch.long),
            completion_ids=completion_ids,
            loss_mask=loss_mask,
            sampling_logprobs=_tensor(sampling_logprobs, torch.float32),
            text=text,
            steps=[] if steps is None else steps,
            truncated=truncated,
            prompt_text=prompt_text,
            meta={} if meta is None else meta,
            environment=registry.name_of("environment", type(self)),
            pieces=[] if pieces is None else pieces,
            token_mismatch=mismatch,
            versions=[tuple(v) for v in versions or [] if v is not None],
        )

    def rollout(
        self,
        examples: list[Example],
        engine: RolloutEngine,
        group_size: int,
        params: SamplingParams,
    ) -> list[Trajectory]:
        """``group_size`` trajectories per example, grouped contiguously (``group`` = index).

        Default, single-turn: :meth:`prompts`, one generation per row, each a trajectory whose
        text starts with :attr:`assistant_prefix`; multi-turn environments override it.
        """
        prompts = self.prompts(
            examples, engine.tokenizer, group_size, ContextLimit.of(engine, params)
        )
        generations = engine.generate(prompts.repeated, params)
        return [
            self.trajectory(
                prompts.example(group, examples),
                group,
                prompts.ids[group],
                generation.token_ids,
                generation.logprobs,
                self.assistant_prefix + generation.text,
                truncated=not generation.finished,
                prompt_text=prompts.texts[group],
                versions=[generation.versions],
            )
            for group, generation in zip(prompts.groups, generations, strict=True)
        ]

    def validation_rollout(
        self, examples: list[Example], engine: RolloutEngine, params: SamplingParams
    ) -> list[Trajectory]:
        """One trajectory per example for validation / test (default: :meth:`rollout`, G = 1).

        Environments whose inference differs from a training step (R2AG expands whole trees and
        then reads) override it.
        """
        return self.rollout(examples, engine, 1, params)

    @abstractmethod
    def extract_answer(self, trajectory: Trajectory) -> str:
        """The final answer the trajectory gave ("" when it gave none)."""

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, torch.Tensor]:
        """Episode statistics to log (name -> scalar), e.g. turns or searches per trajectory.

        Logged as ``rollout/<name>`` in training and ``val/<name>`` in validation.
        """
        return {}

    #: Whether :meth:`next_contexts` gives the pruned states of a step back to the data pool.
    grows_forest: bool = False

    def next_contexts(self, trajectories: list[Trajectory]) -> list[Example]:
        """The next iteration's examples grown from this step's trajectories (``grows_forest``)."""
        raise ValueError(f"{type(self).__name__} does not grow a forest (next_contexts)")

    def state_dict(self) -> dict:
        """State a resumed run needs (plain types and tensors); the checkpoint carries it."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 (optional hook)
        """Restore :meth:`state_dict`'s output."""


class RetrievalEnvironment(Environment):
    """An environment that searches ``self.retriever`` during rollouts."""

    retriever: object

    def setup(self) -> None:
        """Open the retriever's index now (a missing index is an error before any rollout)."""
        self.retriever.search(["lit-rag index check"], 1)


def token_mismatch(
    completion_ids: torch.Tensor, loss_mask: torch.Tensor, sampled: Sequence[Sequence[int]]
) -> int:
    """How many trained tokens (``loss_mask`` 1) differ from the engine's samples, position by
    position, plus the difference in their counts: 0 when training takes exactly the tokens the
    engine sampled (token in, token out; no decode and re-encode of the policy's text)."""
    trained = completion_ids[loss_mask.bool()].tolist()
    engine = [int(i) for ids in sampled for i in ids]
    differ = sum(a != b for a, b in zip(trained, engine, strict=False))
    return differ + abs(len(trained) - len(engine))


def _tensor(values: Sequence[float] | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` as a tensor of ``dtype``; a tensor is returned as it is (device and dtype)."""
    return values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
