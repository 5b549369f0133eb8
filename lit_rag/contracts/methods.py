"""What the built-in environments hand the rewards and algorithms that read their trajectories
(``Trajectory.contract``, ``Example.contract``; docs/STYLE.md 19). They live in the core, below
the plugins, so a third-party reward or algorithm reads them through :mod:`lit_rag.api` without
importing an environment.

R2AG's retrieval tree (``retrieval_tree``):

- :class:`R2AGEpisode`, on every trajectory: what the ``r2ag`` reward scores (Eq. 5: the
  documents retrieved before, the "stop retrieval", the ``<think>`` block and the format
  segments) and what the RR-Forest prunes (Algorithm 1); in inference also the ranked documents
  and the timings of Tables 1 and 4 (:class:`R2AGInference`).
- :class:`R2AGTree`, on each pruned tree the forest feeds back as an example: the context a
  later expansion starts from.


The search agent (``search_agent``): :class:`SearchEpisode`. EVO-RAG's query rewriter
(``query_rewriter``): :class:`EvoRagBranch`, one sibling of its branching. The tool agent
(``tool_agent``): :class:`ToolEpisode`.

A reward reads them with ``R2AGEpisode.of(trajectory, consumer="reward ...")``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from lit_rag.types import Branch, Contract, Passage


@dataclass
class TreeVertex:
    """A vertex the bottom-up pruning kept: a query whose retrieval brought gold.

    Args:
        query: The query.
        kind: ``"base"`` or ``"predicted"``.
        passage_ids: The gold documents it retrieved.
        depth: The expansion that wrote it (1 for the root's).
    """

    query: str
    kind: str
    passage_ids: list[str]
    depth: int


@dataclass
class R2AGTree(Contract):
    """A pruned tree (Algorithm 1's RR-Forest) as the context of a new example
    (``Example.contract``); a plain example is the root (no tree).

    Args:
        depth: Expansions so far (0: the root).
        retrieved: The gold documents found so far, in the order found (the evidence).
        tree: The vertices the pruning kept.
    """

    producer: ClassVar[str] = "retrieval_tree"

    depth: int = 0
    retrieved: list[str] = field(default_factory=list)
    tree: list[TreeVertex] = field(default_factory=list)

    def __post_init__(self) -> None:
        # read back from a checkpoint (Contract.from_dict): the vertices come as dicts
        self.tree = [v if isinstance(v, TreeVertex) else TreeVertex(**v) for v in self.tree]

    def key(self) -> tuple[str, ...]:
        """The forest keeps one tree per question and set of gold documents found."""
        return tuple(sorted(self.retrieved))


@dataclass
class R2AGInference:
    """What an inference tree adds (Tables 1 and 4).

    Args:
        ranked: The documents retrieved, in rank order (the order the queries were written).
        iterations: Expansions of the tree.
        dropped_branches: Queries the top-t/x selection left out.
        retrieval_s: Seconds spent expanding and retrieving, per question.
        generation_s: Seconds the reader spent answering, per question.
    """

    ranked: list[str]
    iterations: int
    dropped_branches: int
    retrieval_s: float
    generation_s: float


@dataclass
class R2AGEpisode(Contract):
    """What one R2AG rollout hands the ``r2ag`` reward and the forest (``Trajectory.contract``):
    one expansion in training, a whole tree in inference.

    Args:
        depth: Depth of the context the expansion started from (0: the root).
        prior: ``r_prior``: the documents retrieved before this expansion (its evidence).
        think: The output has a ``<think>`` block (else the reward is 0).
        stop: The output says "stop retrieval".
        segments: ``<base-Q>`` / ``<predicted-Q>`` blocks after the ``<think>`` block (the
            format reward).
        passages: Id -> passage of what this expansion retrieved (the next context's evidence).
        inference: Inference trees only: ranked documents, iterations, timings.
    """

    producer: ClassVar[str] = "retrieval_tree"

    depth: int
    prior: list[str]
    think: bool
    stop: bool
    segments: int
    passages: dict[str, Passage] = field(default_factory=dict)
    inference: R2AGInference | None = None


@dataclass
class SearchEpisode(Contract):
    """How a search-agent episode went (``Trajectory.contract``).

    Args:
        stop_reason: Why it ended: ``answer``, ``max_turns`` or ``max_response_tokens``.
        turns: Actions taken (searches and invalid actions; Algorithm 1's N counts them).
    """

    producer: ClassVar[str] = "search_agent"

    stop_reason: str
    turns: int


@dataclass
class EvoRagBranch(Branch):
    """One sibling of EVO-RAG's branching (``Trajectory.contract``): what DPO and the reward
    model pair by (``state``, ``step``: the :class:`~lit_rag.api.Branch` fields) and what the
    ``evo_rag`` reward's verifier reads.

    Args:
        state: ``"<group>:<step>"`` of the shared state.
        step: Index in ``steps`` of the action taken there.
        passages: Id -> passage of every document the episode retrieved.
    """

    producer: ClassVar[str] = "query_rewriter"

    passages: dict[str, Passage] = field(default_factory=dict)


@dataclass
class ToolEpisode(Contract):
    """How a tool agent's episode went (``Trajectory.contract``).

    Args:
        stop_reason: Why it ended: ``answer`` (the answer tool), ``message`` (a turn without a
            call), ``max_turns``, ``max_response_tokens``, ``context full``, ``server_died``.
        turns: Assistant turns.
        calls: Tool calls run, by tool name.
        errors: Failed calls by kind (:data:`lit_rag.tools.ERRORS`, and ``budget`` for a call
            over the episode's budget).
        answer: The final answer (the answer tool's argument, else the last message's text);
            None when the episode gave none.
        failed: Why the environment failed the episode ("" when it did not): a tool's
            server died or a call timed out (:data:`lit_rag.tools.ENVIRONMENT_ERRORS`).
        template_mismatch: Tool turns whose text, as trained, differs from a re-rendering of
            the conversation (each turn compared on its own); 0 when every turn lines up.
        retokenized: Tool turns whose text is the re-rendering's but whose sampled ids are
            not the tokenizer's encoding of it.
        written: Tool calls the model wrote, well-formed or not.
    """

    producer: ClassVar[str] = "tool_agent"

    stop_reason: str
    turns: int
    calls: dict[str, int]
    errors: dict[str, int]
    answer: str | None
    failed: str = ""
    template_mismatch: int = 0
    written: int = 0
    retokenized: int = 0
