"""The vocabulary every part of lit-rag speaks (docs/DESIGN.md, "Vocabulary").

Readers end in :class:`Example`; environments return :class:`Trajectory`; rewards return
:class:`RewardBreakdown`. Nothing downstream of a reader knows a file format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: ``lit-rag index search`` and ``--help`` never import torch
    import torch


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
    """

    id: str
    question: str
    answers: list[str]
    references: list[Passage] = field(default_factory=list)
    gold_ids: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


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
class Trajectory:
    """One sampled episode for one example.

    ``completion_ids`` holds everything after the prompt: tokens the policy generated and, for
    tool-using environments, tokens the environment inserted. ``loss_mask`` has the same length
    and is 1 exactly on the tokens the policy generated; prompt tokens are never in the loss.

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
        meta: Anything else the environment records (e.g. ``stop_reason``).
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
    """

    total: torch.Tensor
    components: dict[str, torch.Tensor] = field(default_factory=dict)
