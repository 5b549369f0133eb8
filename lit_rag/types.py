"""The vocabulary every part of lit-rag speaks (docs/DESIGN.md, "Vocabulary").

Readers end in :class:`Example`; environments return :class:`Trajectory`; rewards return
:class:`RewardBreakdown`. Nothing downstream of a reader knows a file format. What an
environment hands a reward or an algorithm beyond that is a :class:`Contract` (docs/STYLE.md 19).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from lit_rag.errors import InputError

if TYPE_CHECKING:  # annotations only: ``lit-rag index search`` and ``--help`` never import torch
    import torch

C = TypeVar("C", bound="Contract")


class Contract:
    """Typed data one plugin hands another on ``Trajectory.contract`` (or ``Example.contract``),
    in place of string keys in ``meta`` (docs/STYLE.md 19).

    A subclass is a dataclass in the module of the environment that writes it, exported through
    :mod:`lit_rag.api`; ``producer`` is that environment's registered name. A reader (a reward,
    an algorithm) fetches it with :meth:`of` when it needs it or :meth:`find` when it can do
    without: a trajectory that carries none, or another type, fails at once with an
    :class:`~lit_rag.errors.InputError` naming both plugins, never a silent zero reward.
    ``meta`` stays free-form, for users' own keys.

    Example::

        @dataclass
        class Turns(Contract):
            producer: ClassVar[str] = "my_agent"
            turns: int

        trajectory.contract = Turns(turns=3)  # the environment, on each trajectory
        Turns.of(trajectory, consumer="reward brevity").turns  # the reward: 3

    A trajectory from another environment fails with ``reward brevity needs Turns from
    environment my_agent on every trajectory; the trajectory of example 'q1' (group 0) has
    SearchEpisode from environment search_agent``.
    """

    #: The registered name of the environment that writes it ("" for a base type).
    producer: ClassVar[str] = ""

    @classmethod
    def of(cls: type[C], item: Trajectory | Example, consumer: str) -> C:
        """The ``cls`` that ``item`` carries; an error naming ``consumer`` (e.g. ``"reward
        r2ag"``) and the producer when it carries none or another type."""
        found = cls.find(item, consumer)
        if found is None:
            raise InputError(cls._mismatch(item, consumer))
        return found

    @classmethod
    def find(cls: type[C], item: Trajectory | Example, consumer: str) -> C | None:
        """The ``cls`` that ``item`` carries, or None when it carries none or another
        environment's contract (a reader that can do without, e.g. DPO without branches); an
        error when what it carries is not a contract at all."""
        value = item.contract
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, Contract):
            return None
        raise InputError(cls._mismatch(item, consumer, needed=False))

    @classmethod
    def _mismatch(cls, item: Trajectory | Example, consumer: str, needed: bool = True) -> str:
        value = item.contract
        if value is None:
            named = isinstance(item, Trajectory) and item.environment
            maker = f"environment {item.environment}" if named else "its environment"
            has = f"none ({maker} hands no {cls.__name__})"
        elif isinstance(value, Contract):
            source = f" from environment {value.producer}" if value.producer else ""
            has = f"{type(value).__name__}{source}"
        else:
            has = f"a {type(value).__name__}, which is not a Contract"
        kind = "trajectory" if isinstance(item, Trajectory) else "example"
        where = (
            f"the trajectory of example {item.example.id!r} (group {item.group})"
            if isinstance(item, Trajectory)
            else f"example {item.id!r}"
        )
        source = f" from environment {cls.producer}" if cls.producer else ""
        wants = f"needs {cls.__name__}{source} on every" if needed else f"reads {cls.__name__} on a"
        return f"{consumer} {wants} {kind}; {where} has {has}"

    def key(self) -> Any:
        """What tells two contexts of one question apart in a pool that keeps one of each (the
        RR-Forest's); default: nothing (one context per question)."""
        return ()

    def to_dict(self) -> dict[str, Any]:
        """Plain types for a checkpoint: the class's import path and its fields
        (:meth:`from_dict` reads it back)."""
        return {
            "type": f"{type(self).__module__}:{type(self).__qualname__}",
            "fields": asdict(self),
        }

    @staticmethod
    def from_dict(row: dict[str, Any]) -> Contract:
        """The contract :meth:`to_dict` wrote. Its type must be one this run's plugins define
        (already imported): a checkpoint is data, and nothing read from it chooses code to
        import."""
        name = str(row.get("type", ""))
        known = {f"{c.__module__}:{c.__qualname__}": c for c in _subclasses(Contract)}
        if name not in known:
            raise InputError(
                f"checkpoint: contract type {name!r} is not one this run's plugins define; "
                f"known: {', '.join(sorted(known)) or 'none'}"
            )
        return known[name](**row.get("fields", {}))


def _subclasses(cls: type) -> list[type]:
    """Every subclass of ``cls`` defined so far, at any depth."""
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


@dataclass(unsafe_hash=True)
class Passage:
    """One reference paragraph (hashable; treat as immutable).

    Not a frozen dataclass: Lightning's precision plugins (FSDP's ``convert_input``) walk the
    batch with ``apply_to_collection``, which refuses frozen dataclasses.

    Args:
        id: Stable identifier, unique within an example (or a corpus).
        title: Title of the source page; may be empty.
        text: The paragraph text.
    """

    id: str
    title: str
    text: str


@dataclass
class Example:
    """One question with its answers and (for single-turn methods) its references.

    Args:
        id: Identifier from the source dataset.
        question: The natural-language question.
        answers: Acceptable answers (aliases); any match counts (ARENA Appendix B).
        references: Reference paragraphs in their original order; empty for retrieval methods.
        gold_ids: Ids of the references (or corpus passages) that support the answer.
        meta: Anything else the source carries (type, level, hops, ...).
        contract: The state an environment resumes from, when an environment made this
            example (R2AG's pruned tree, ``R2AGTree``); None for a dataset's example.
    """

    id: str
    question: str
    answers: list[str]
    references: list[Passage] = field(default_factory=list)
    gold_ids: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    contract: Contract | None = None


@dataclass
class Step:
    """One action an agent took inside an episode.

    Args:
        action: What the policy did, e.g. ``"answer"``, ``"search"``, ``"backtrack"``.
        query: The query it issued, if any.
        passage_ids: Ids of the passages the retriever returned for the query.
        text: The policy's text for this step.
    """

    action: str
    query: str | None = None
    passage_ids: list[str] = field(default_factory=list)
    text: str = ""


@dataclass
class Piece:
    """One stretch of a completion's text and who wrote it: the policy (``inserted`` False) or
    the environment (documents, observations, messages: ``inserted`` True).

    Args:
        text: The text.
        inserted: True when the environment inserted it (its tokens have loss mask 0).
    """

    text: str
    inserted: bool = False


@dataclass
class Trajectory:
    """One sampled episode for one example.

    ``completion_ids`` holds everything after the prompt: tokens the policy generated and, for
    tool-using environments, tokens the environment inserted. ``loss_mask`` has the same length
    and is 1 exactly on the tokens the policy generated; prompt tokens are never in the loss.

    Text comes the same two ways: :attr:`policy_text` is what the policy wrote, the only text a
    reward scores; :attr:`inserted_text` is what the environment put in (retrieved documents,
    observations). ``text`` is both, in order, for display.

    Args:
        example: The example this episode answers.
        group: Index of the prompt group (all samples of one example share it).
        prompt_ids: Prompt token ids, ``[P]``.
        completion_ids: Completion token ids, ``[C]``.
        loss_mask: ``[C]``, 1 on policy-generated tokens, 0 on tool-inserted tokens.
        sampling_logprobs: ``[C]``, log-probs of ``completion_ids`` under the sampling policy
            (0 where ``loss_mask`` is 0).
        text: The decoded completion.
        steps: The actions taken, in order.
        truncated: True when generation stopped at the token budget rather than on its own.
        prompt_text: The prompt as text.
        meta: Free-form: users' own keys (nothing lit-rag reads).
        contract: What the environment hands rewards and algorithms (a :class:`Contract`,
            e.g. R2AG's ``R2AGEpisode``); None when it hands nothing beyond the fields above.
        environment: The registered name of the environment that made it (named in a
            contract's error); "" when unknown.
        pieces: ``text`` split by who wrote each stretch (:class:`Piece`); empty when the
            policy wrote all of it (a single-turn completion).
        token_mismatch: Tokens with loss mask 1 that differ from what the engine sampled
            (0 unless an environment re-encoded the policy's text; counted when the
            environment hands the engine's samples to :meth:`Environment.trajectory`).
        versions: ``(first, last)`` policy version of each generated segment, in order, when
            rollout workers sampled it (``model.rollout.workers``); empty for the colocated
            engines, which sample the current weights.
        staleness: Policy versions between the weights it is trained on and those that
            sampled its oldest segment (set by rollout workers; 0: the current weights).
        failed: Why the environment, not the policy, failed the episode ("" when it did not):
            a tool server that died, a tool that timed out. Such an episode leaves the loss
            and its group's baseline (``model.environment_failures``).
    """

    example: Example
    group: int
    prompt_ids: torch.Tensor
    completion_ids: torch.Tensor
    loss_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    text: str
    steps: list[Step] = field(default_factory=list)
    truncated: bool = False
    prompt_text: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    contract: Contract | None = None
    environment: str = ""
    pieces: list[Piece] = field(default_factory=list)
    token_mismatch: int = 0
    versions: list[tuple[int, int]] = field(default_factory=list)
    staleness: int = 0
    failed: str = ""

    @property
    def policy_text(self) -> str:
        """What the policy wrote: the steps' texts joined when the environment records them
        (each step's text is the policy's own), else the pieces it wrote, else ``text``."""
        if any(step.text for step in self.steps):
            return "\n".join(step.text for step in self.steps)
        if self.pieces:
            return "".join(p.text for p in self.pieces if not p.inserted)
        return self.text

    @property
    def inserted_text(self) -> str:
        """What the environment inserted into the completion (documents, observations), joined;
        "" for a single-turn completion."""
        return "\n".join(p.text for p in self.pieces if p.inserted)

    @property
    def num_generated(self) -> int:
        """Number of tokens the policy generated (``loss_mask`` sum)."""
        return int(self.loss_mask.sum().item())

    def same_completion(self, other: Trajectory) -> bool:
        """Whether two trajectories hold the same completion tokens (siblings that took the same
        action at their shared state: a preference pair of them carries no information)."""
        import torch

        return torch.equal(self.completion_ids, other.completion_ids)


@dataclass
class RewardBreakdown:
    """Rewards for a list of trajectories.

    Args:
        total: ``[N]`` (one per trajectory) or ``[N, T]`` for step-level methods.
        components: Name -> tensor of the same shape as ``total``, each logged on its own
            as ``reward/<name>``.
        failed: ``[N]`` bool, True where the reward could not score a trajectory for a reason
            outside the policy (a judge that gave no verdict); None: none failed. Such a
            trajectory leaves the loss and its group's baseline, as an episode the environment
            failed does (:attr:`Trajectory.failed`).
    """

    total: torch.Tensor
    components: dict[str, torch.Tensor] = field(default_factory=dict)
    failed: torch.Tensor | None = None


@dataclass
class Branch(Contract):
    """One sibling branch: trajectories that share a state and differ in the action taken
    there, which preference pairs compare (DPO, EVO-RAG's reward model). An environment that
    rolls out siblings hands a subclass (EVO-RAG's ``EvoRagBranch``); readers :meth:`find` it
    and, on a trajectory without one, take its prompt group as the state.

    Args:
        state: Names the shared state (siblings have the same).
        step: Index in ``Trajectory.steps`` of the action taken at that state.
    """

    state: str
    step: int = 0
