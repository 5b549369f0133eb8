"""Rollout engine base (docs/DESIGN.md step 2): prompts in, sampled token ids and log-probs out."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

import torch

from lit_rag.errors import InputError


@dataclass
class SamplingParams:
    """How to sample one batch.

    Args:
        max_new_tokens: Token budget of the completion.
        temperature: Softmax temperature; 0 means greedy.
        top_p: Nucleus sampling mass (1: off). Engines report each token's log-prob under
            the truncated, renormalized distribution it was drawn from (the trainer's full
            softmax differs by the kept mass; ``rollout/logprob_diff_*`` leaves that out).
        top_k: Top-k cut-off; 0 disables it.
        stop: Strings that end a completion (the stop string is kept in the output).
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        problems = []
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        # 0 is greedy; a negative value used to be taken as greedy silently
        if self.temperature < 0:
            problems.append(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            problems.append(f"top_k must be >= 0 (0: off), got {self.top_k}")
        if problems:
            raise InputError(f"sampling: {'; '.join(problems)}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class Placement:
    """Where this training process sits among the run's processes (ranks).

    The policy module gives it to its engine (:meth:`RolloutEngine.place`) before binding the
    model; an engine that keeps its own copy of the policy uses it to start one copy per rank
    (or per tensor-parallel group of ranks) and to seed each differently.

    Args:
        rank: Global rank of this process.
        world_size: Number of training processes (devices x nodes).
        local_rank: Rank of this process on its node.
        local_world_size: Training processes on this node.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1


@dataclass
class Generation:
    """One completion from the engine.

    Args:
        token_ids: Generated ids, ``[C]``, without padding (the EOS token is kept if produced).
        logprobs: ``[C]`` log-probs of ``token_ids`` under the sampling distribution.
        text: Decoded completion without special tokens.
        finished: True when it ended on EOS or a stop string; False when it hit the budget.
        versions: ``(first, last)`` policy versions its tokens were sampled under, set by a
            rollout worker (the weights may change while a request runs: a partial rollout);
            None for an engine that samples the trainer's live weights.
    """

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    text: str
    finished: bool
    versions: tuple[int, int] | None = None


class RolloutEngine(ABC):
    """Generates completions from the current policy.

    The :class:`~lit_rag.trainer.policy.PolicyModule` binds the engine to its live model and
    tokenizer with :meth:`bind`, and calls :meth:`sync_weights` after each optimizer step
    (a no-op for engines that sample from the live model).

    Capabilities, declared here with their defaults (an engine sets or overrides the ones it
    has; the rollout workers read them, ``model.rollout.workers``):

    - ``serves_pushed_weights``: it can run in a rollout worker process (:meth:`serve`,
      :meth:`weight_dtype`, :meth:`receive_weights`); default False.
    - ``seed``: the seed it samples with; None (the default): the run picks one (torch's
      initial seed; in a worker, that seed plus the worker's offset).
    - ``model_path``: the weights a copy of the policy starts from in a worker; None (the
      default): the policy's own folder.
    - ``lora_sync``: how a LoRA policy's weights reach the engine's copy: ``merge`` (the
      default: merged full weights, what a worker receives) or ``adapter`` (``vllm``: the
      adapter alone, in the training process only).
    - ``batches_continuously``: its :meth:`collect` returns segments as they finish while
      the others go on (``vllm``), so an episode loop keeps generating while tool calls run;
      default False (the default ``collect`` runs what is queued as one ``generate``).
    """

    model: torch.nn.Module | None = None
    tokenizer: object | None = None
    placement: Placement = Placement()
    #: training ranks one engine spans (a tensor-parallel ``vllm`` group); 1 for the others
    tensor_parallel_size: int = 1
    #: it can run in a rollout worker process on weights pushed from the trainer
    #: (:meth:`serve`, :meth:`weight_dtype`, :meth:`receive_weights`; ``model.rollout.workers``)
    serves_pushed_weights: bool = False
    #: the seed it samples with; None: the run picks one
    seed: int | None = None
    #: the weights a worker's copy of the policy starts from; None: the policy's folder
    model_path: str | None = None
    #: how a LoRA policy's weights reach the engine's copy: ``merge`` or ``adapter``
    lora_sync: str = "merge"
    #: :meth:`collect` returns what finished first while the rest goes on (``vllm``)
    batches_continuously: bool = False
    #: called between the engine's steps when set: a rollout worker applies pushed weights there,
    #: so requests in flight go on under the new weights (a partial rollout)
    step_hook: Callable[[], None] | None = None

    def place(self, placement: Placement) -> None:
        """Tell the engine which rank of how many it serves (before :meth:`bind`); one
        process by default. Engines that sample from the live policy need nothing more."""
        self.placement = placement

    def bind(self, model: torch.nn.Module, tokenizer: object) -> None:
        """Attach the policy the engine samples from."""
        self.model = model
        self.tokenizer = tokenizer

    def context_window(self) -> int | None:
        """The most tokens a prompt and its completion may take together; None when the
        engine knows no bound. Default: the bound model's (``max_position_embeddings`` of its
        config, or the other names configs give it), as transformers and vLLM read it."""
        return model_context_window(getattr(self.model, "config", None))

    @abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One completion per prompt (prompts are token-id lists, repeated for groups)."""

    def submit(self, prompt: list[int], params: SamplingParams) -> int:
        """Queue one completion without waiting for it; returns its ticket for :meth:`collect`.

        Multi-turn environments submit each episode's next segment as soon as its last one
        is back, so an episode never waits for the slowest one of its turn on an engine that
        batches continuously (``vllm``).
        """
        queue = self.__dict__.setdefault("_queue", [])
        ticket = self.__dict__.get("_tickets", 0)
        self._tickets = ticket + 1
        queue.append((ticket, [int(t) for t in prompt], params))
        return ticket

    def generate_by_collect(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> list[Generation]:
        """:meth:`generate` through :meth:`submit` / :meth:`collect`, for an engine whose
        ``collect`` batches continuously (it must override ``collect``: the default one calls
        ``generate``)."""
        tickets = [self.submit(prompt, params) for prompt in prompts]
        done: dict[int, Generation] = {}
        while len(done) < len(tickets):
            finished = self.collect()
            if not finished:
                raise RuntimeError("the engine finished without answering every request")
            done.update(finished)
        return [done[t] for t in tickets]

    def _take_queue(self) -> list[tuple[int, list[int], SamplingParams]]:
        """The submissions not yet started, ``(ticket, prompt, params)``; the queue empties."""
        queue, self._queue = self.__dict__.get("_queue", []), []
        return queue

    def collect(self) -> list[tuple[int, Generation]]:
        """Some finished submissions as ``(ticket, generation)``; ``[]`` when none is pending.

        This default runs everything queued at once: one :meth:`generate` call per distinct
        sampling setting (the token budget aside: a call gets the widest, and each row is cut
        back to its own), in submission order. Engines with continuous batching return
        whatever finished first.
        """
        queue = self._take_queue()
        groups: dict[str, list[tuple[int, list[int], SamplingParams]]] = {}
        for item in queue:  # the key: all sampling settings but the budget
            groups.setdefault(repr(replace(item[2], max_new_tokens=1)), []).append(item)
        done: list[tuple[int, Generation]] = []
        for items in groups.values():
            widest = replace(items[0][2], max_new_tokens=max(p.max_new_tokens for _, _, p in items))
            generations = self.generate([prompt for _, prompt, _ in items], widest)
            done.extend(  # a row whose budget is the call's gets what generate gave
                (
                    t,
                    g
                    if p.max_new_tokens == widest.max_new_tokens
                    else self._cut(g, p.max_new_tokens),
                )
                for (t, _, p), g in zip(items, generations, strict=True)
            )
        return done

    def _cut(self, generation: Generation, budget: int) -> Generation:
        """A generation cut to ``budget`` tokens (unfinished if it ran past it)."""
        if len(generation.token_ids) <= budget:
            return generation
        ids = generation.token_ids[:budget]
        return Generation(
            ids,
            generation.logprobs[:budget],
            self.tokenizer.decode(ids, skip_special_tokens=True),
            finished=False,
        )

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """Around one whole rollout, all its turns: an engine that samples from the live policy
        prepares it here (the ``hf`` engine gathers an FSDP-sharded policy's weights once); an
        engine shared by several ranks (a tensor-parallel ``vllm`` group) keeps serving the
        other ranks' requests at the end until every rank's rollout is done. Every rank enters
        it once per rollout, all ranks the same number of times. Nothing by default."""
        yield

    def idle(self) -> None:  # noqa: B027 (optional hook)
        """A rollout is over (the update comes next): release what generation held."""

    def sync_weights(self) -> None:  # noqa: B027 (optional hook)
        """Push the policy's new weights to the engine's copy, if it keeps one."""

    def metrics(self) -> dict[str, float]:
        """Engine figures since the last call, logged with the step (e.g.
        ``time/weight_sync_s``)."""
        return {}

    def state_dict(self) -> dict:
        """State a resumed run needs (plain types); the checkpoint carries it. None by default."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 (optional hook)
        """Restore :meth:`state_dict`'s output."""

    # ---- rollout workers (``serves_pushed_weights``) ---------------------------------------
    def serve(self, tokenizer: object, model_path: str, config: object) -> None:
        """Start in a rollout worker: the model at ``model_path`` (the policy's base weights),
        sampled until :meth:`receive_weights` brings the trainer's; ``config`` is the policy's
        transformers config."""
        raise NotImplementedError(f"{type(self).__name__} cannot run in a rollout worker")

    def weight_dtype(self) -> torch.dtype:
        """The dtype the worker's copy of the weights is in (pushed tensors are cast to it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot run in a rollout worker")

    def receive_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the trainer's weights (checkpoint names, as
        :func:`~lit_rag.rollout.weights.checkpoint_weights` yields them)."""
        raise NotImplementedError(f"{type(self).__name__} cannot run in a rollout worker")


#: the config attributes that give a model's context window, in the order vLLM reads them
_WINDOW_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def model_context_window(config: object) -> int | None:
    """A Hugging Face config's context window (the smallest of the lengths it declares, as
    vLLM derives ``max_model_len``); None when it declares none."""
    found = [getattr(config, key, None) for key in _WINDOW_KEYS]
    lengths = [n for n in found if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    return min(lengths) if lengths else None
