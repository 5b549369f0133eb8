"""lit-rag's public plugin API: everything a plugin, built-in or third-party, imports from lit-rag.

The layers (docs/DESIGN.md, "Layers and the public plugin API"): the CLI and callbacks wire things
together; the built-in plugins (algorithms, rewards, environments, retrievers, engines) import only
this module
(and libraries); this module re-exports the contracts that live in lit-rag's core.

- Vocabulary: :class:`Example`, :class:`Passage`, :class:`Piece`, :class:`Step`,
  :class:`Trajectory`,
  :class:`RewardBreakdown`, :class:`StepOutput`.
- Typed contracts, what an environment hands the rewards and algorithms that read its
  trajectories (``Trajectory.contract``; ``meta`` is for users' own keys): the base
  :class:`Contract` (``of`` / ``find`` fail naming both plugins on a mismatch), :class:`Branch`
  (a sibling branch, for preference pairs); R2AG's :class:`R2AGEpisode` (with
  :class:`R2AGInference`) and the pruned tree :class:`R2AGTree` (``Example.contract``, of
  :class:`TreeVertex`); the search agent's :class:`SearchEpisode`; EVO-RAG's
  :class:`EvoRagBranch`; the tool agent's :class:`ToolEpisode` (imported on first use, from
  :mod:`lit_rag.contracts.methods`).
- The five bases: :class:`Algorithm`, :class:`Reward`, :class:`Environment` (and
  :class:`RetrievalEnvironment`; :class:`Prompts` is what ``Environment.prompts`` builds,
  within a :class:`ContextLimit` and as ``context_overflow`` says, one of
  :data:`CONTEXT_OVERFLOW`),
  :class:`Retriever`, :class:`RolloutEngine`; :class:`Placement` tells an algorithm or an
  engine which rank of how many it serves.
- The episode loop of multi-turn environments: :class:`Episode` (one trajectory being rolled
  out, with its state), :class:`EpisodeLoop` (one handler per state; segments through the
  engine's ``submit`` / ``collect``), the requests a handler returns (:class:`Generate`,
  :class:`Search`, :class:`CallTools`; ``Request``), :class:`Turn`, :func:`start_episodes`.
- Tools, the sixth plugin kind (``lit_rag.tools``): :class:`Tool` (a schema and ``run``),
  :class:`FunctionTool` (a typed, documented function), :class:`ToolBox` (checked, limited,
  cached, timed calls on one event loop), :class:`ToolCall`, :class:`ToolResult`,
  :class:`ToolError`, :class:`ServerDied`, :data:`TOOL_ERRORS`, :data:`ENVIRONMENT_ERRORS`,
  :func:`build_tools`; MCP
  servers' tools (:class:`McpServer`, :func:`connect_mcp`); the parsers of models' calls
  (:class:`Parsed`, :func:`tool_call_parser`), :func:`tool_chat_template` and
  :func:`choose_tool_template` (a template that preserves prefixes, or its family's training
  template), :func:`template_prefix_problem`, :func:`template_opening`,
  :func:`template_turn_end` (imported on first use, from :mod:`lit_rag.tools`).
- Typed batches and losses: :class:`TrainBatch`, :class:`Prepared`, :class:`LossOutput`,
  :class:`TokenLoss`, :class:`PolicyLossConfig`, :func:`collate`, the KL estimators.
- Registered functions: :func:`advantage_estimator` / :func:`policy_loss` look up the
  estimators and losses a GRPO-family recipe names; :func:`register_reward`,
  :func:`register_advantage` and :func:`register_policy_loss` register one in this process
  (packages use entry points: ``lit_rag.rewards``, ``lit_rag.advantages``,
  ``lit_rag.policy_losses``).
- Text helpers for rewards and environments: :func:`extract_tag`, :func:`tag_blocks`,
  :func:`normalize_answer`, :func:`exact_match`, :func:`f1_score`, :func:`policy_text`,
  :func:`final_answer`.
- Answer guards for rewards that match answers: :class:`Hedging` (what a reward does with an
  answer that lists candidates, one of :data:`HEDGING_MODES`), :func:`answer_candidates`,
  :func:`hedged`, :func:`hedged_text`.
- Retrieval scores for rewards and environment metrics: :func:`recall_at_k`,
  :func:`full_recall_at_k`, :func:`average_precision` (imported on first use).
- Retrievers: :class:`Retriever` (search), :class:`IndexedRetriever` (the template owning an
  index folder: manifest, passages, verification, loading on the first search; a subclass
  writes ``build_state``, ``rank``, ``save_state``, ``load_state``), :class:`Hit`,
  :func:`check_search_args`; an index folder's
  :class:`Manifest` (``MANIFEST_NAME``, ``PASSAGES_NAME``, :class:`IndexCorruptError`,
  :class:`IndexMismatchError`); corpora: :func:`read_corpus`, :func:`write_corpus`,
  :func:`corpus_fingerprint`, :func:`split_contents`; building: :func:`atomic_index_dir`,
  :func:`build_missing_index`, :func:`open_index`.
- Rollout engines: :class:`RolloutEngine`, :class:`SamplingParams`, :class:`Generation`;
  weights to sync: :func:`checkpoint_weights`, :func:`is_zero3`, :func:`has_adapters`,
  :func:`policy_path`;
  :func:`resolve_dtype`.
- Files and random states a plugin keeps: :func:`atomic_write` (a file a kill cannot break),
  :func:`remove_stale_temps` (the staging files of killed writers), :func:`sha256_file`;
  :func:`rng_states` / :func:`restore_rng_states` (the process's torch, Python and NumPy random
  states, e.g. around a library that reseeds them; imported on first use).
- An LLM judge for a model-based reward: :class:`Judge` (an OpenAI-compatible endpoint; the
  ``judge`` extra) scores :class:`JudgeCase` answers as :class:`Verdict` objects, reading replies
  as one of :data:`JUDGE_SCORES`; :data:`ANSWER_JUDGE_PROMPT`, :func:`judge_signals`.
- A verifiers environment (``verifiers.v1``) as lit-rag data, tools and reward:
  :class:`VerifiersEnv` (its tasks as examples, its toolsets as tools, its rewards on a
  conversation), :func:`verifiers_conversation` (a tool agent's messages, OpenAI-style; imported
  on first use, from :mod:`lit_rag.integrations.verifiers`).
- Models a plugin loads itself (a model-based reward): :class:`ModelConfig`,
  :func:`load_model`, :func:`load_tokenizer`, :func:`resolve_path` (imported on first use).

Example, a reward package in a few lines::

    from lit_rag.api import Example, extract_tag

    def brevity(
        completions: list[str], examples: list[Example], max_words: int = 20
    ) -> list[float]:
        answers = [extract_tag(c, "answer") or "" for c in completions]
        return [1.0 if 0 < len(a.split()) <= max_words else 0.0 for a in answers]

    # pyproject.toml: [project.entry-points."lit_rag.rewards"] brevity = "my_pkg:brevity"
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lit_rag import registry
from lit_rag.errors import InputError
from lit_rag.files import atomic_write, remove_stale_temps, sha256_file
from lit_rag.health.guards import HEDGING_MODES, Hedging, answer_candidates, hedged, hedged_text
from lit_rag.judges import (
    ANSWER_JUDGE_PROMPT,
    JUDGE_SCORES,
    Judge,
    JudgeCase,
    Verdict,
    judge_signals,
)
from lit_rag.models.facts import has_adapters, resolve_path
from lit_rag.retrieval.base import Hit, IndexedRetriever, Retriever, check_search_args, open_index
from lit_rag.retrieval.corpus import corpus_fingerprint, read_corpus, split_contents, write_corpus
from lit_rag.retrieval.manifest import (
    MANIFEST_NAME,
    PASSAGES_NAME,
    IndexCorruptError,
    IndexMismatchError,
    Manifest,
)
from lit_rag.retrieval.storage import atomic_index_dir, build_missing_index
from lit_rag.text import (
    PUNCTUATION_MODES,
    check_punctuation,
    exact_match,
    extract_tag,
    f1_score,
    final_answer,
    normalize_answer,
    policy_text,
    tag_blocks,
)
from lit_rag.types import (
    Branch,
    Contract,
    Example,
    Passage,
    Piece,
    RewardBreakdown,
    Step,
    Trajectory,
)

if TYPE_CHECKING:  # imported on first use (module __getattr__ below)
    from lit_rag.contracts.algorithm import (
        AdvantageFn,
        Algorithm,
        LossOutput,
        PolicyLossConfig,
        PolicyLossFn,
        Prepared,
        TokenLoss,
        TrainBatch,
        collate,
    )
    from lit_rag.contracts.environment import (
        CONTEXT_OVERFLOW,
        ContextLimit,
        Environment,
        Prompts,
        RetrievalEnvironment,
        chat_prompt,
        check_context_overflow,
        encode_prompts,
        fit_passages,
    )
    from lit_rag.contracts.episodes import (
        CallTools,
        Episode,
        EpisodeLoop,
        Generate,
        Request,
        Search,
        Turn,
        start_episodes,
    )
    from lit_rag.contracts.methods import (
        EvoRagBranch,
        R2AGEpisode,
        R2AGInference,
        R2AGTree,
        SearchEpisode,
        ToolEpisode,
        TreeVertex,
    )
    from lit_rag.contracts.reward import (
        FunctionReward,
        Reward,
    )
    from lit_rag.contracts.step import (
        StepOutput,
    )
    from lit_rag.integrations.verifiers import VerifiersEnv
    from lit_rag.integrations.verifiers import conversation as verifiers_conversation
    from lit_rag.metrics.retrieval import (
        average_precision,
        full_recall_at_k,
        recall_at_k,
    )
    from lit_rag.models.loading import (
        ModelConfig,
        load_model,
        load_tokenizer,
    )
    from lit_rag.models.precision import (
        resolve_dtype,
    )
    from lit_rag.rng import restore_rng_states, rng_states
    from lit_rag.rollout.base import (
        Generation,
        Placement,
        RolloutEngine,
        SamplingParams,
    )
    from lit_rag.rollout.weights import (
        checkpoint_weights,
        is_zero3,
        policy_path,
    )
    from lit_rag.tools.base import (
        ENVIRONMENT_ERRORS,
        FunctionTool,
        ServerDied,
        Tool,
        ToolBox,
        ToolCall,
        ToolError,
        ToolResult,
        build_tools,
    )
    from lit_rag.tools.base import ERRORS as TOOL_ERRORS
    from lit_rag.tools.mcp import McpServer
    from lit_rag.tools.mcp import connect as connect_mcp
    from lit_rag.tools.parsers import Parsed
    from lit_rag.tools.parsers import parser as tool_call_parser
    from lit_rag.tools.templates import chat_template as tool_chat_template
    from lit_rag.tools.templates import choose as choose_tool_template
    from lit_rag.tools.templates import generation_text as template_opening
    from lit_rag.tools.templates import prefix_problem as template_prefix_problem
    from lit_rag.tools.templates import turn_end as template_turn_end
    from lit_rag.trainer.kl import ESTIMATORS as KL_ESTIMATORS
    from lit_rag.trainer.kl import get_estimator as kl_estimator

#: imported on first use: torch (the batch, environment, engine and step contracts), and
#: transformers, peft and torchmetrics (models, retrieval scores). A retriever plugin and
#: ``lit-rag index search`` over BM25 never import torch.
_LAZY: dict[str, tuple[str, str]] = {
    "AdvantageFn": ("lit_rag.contracts.algorithm", "AdvantageFn"),
    "Algorithm": ("lit_rag.contracts.algorithm", "Algorithm"),
    "LossOutput": ("lit_rag.contracts.algorithm", "LossOutput"),
    "PolicyLossConfig": ("lit_rag.contracts.algorithm", "PolicyLossConfig"),
    "PolicyLossFn": ("lit_rag.contracts.algorithm", "PolicyLossFn"),
    "Prepared": ("lit_rag.contracts.algorithm", "Prepared"),
    "TokenLoss": ("lit_rag.contracts.algorithm", "TokenLoss"),
    "TrainBatch": ("lit_rag.contracts.algorithm", "TrainBatch"),
    "collate": ("lit_rag.contracts.algorithm", "collate"),
    "CONTEXT_OVERFLOW": ("lit_rag.contracts.environment", "CONTEXT_OVERFLOW"),
    "ContextLimit": ("lit_rag.contracts.environment", "ContextLimit"),
    "Environment": ("lit_rag.contracts.environment", "Environment"),
    "Prompts": ("lit_rag.contracts.environment", "Prompts"),
    "RetrievalEnvironment": ("lit_rag.contracts.environment", "RetrievalEnvironment"),
    "chat_prompt": ("lit_rag.contracts.environment", "chat_prompt"),
    "check_context_overflow": ("lit_rag.contracts.environment", "check_context_overflow"),
    "encode_prompts": ("lit_rag.contracts.environment", "encode_prompts"),
    "fit_passages": ("lit_rag.contracts.environment", "fit_passages"),
    "Episode": ("lit_rag.contracts.episodes", "Episode"),
    "EpisodeLoop": ("lit_rag.contracts.episodes", "EpisodeLoop"),
    "Generate": ("lit_rag.contracts.episodes", "Generate"),
    "Request": ("lit_rag.contracts.episodes", "Request"),
    "Search": ("lit_rag.contracts.episodes", "Search"),
    "Turn": ("lit_rag.contracts.episodes", "Turn"),
    "start_episodes": ("lit_rag.contracts.episodes", "start_episodes"),
    "resolve_dtype": ("lit_rag.models.precision", "resolve_dtype"),
    "FunctionReward": ("lit_rag.contracts.reward", "FunctionReward"),
    "Reward": ("lit_rag.contracts.reward", "Reward"),
    "Generation": ("lit_rag.rollout.base", "Generation"),
    "Placement": ("lit_rag.rollout.base", "Placement"),
    "RolloutEngine": ("lit_rag.rollout.base", "RolloutEngine"),
    "SamplingParams": ("lit_rag.rollout.base", "SamplingParams"),
    "checkpoint_weights": ("lit_rag.rollout.weights", "checkpoint_weights"),
    "is_zero3": ("lit_rag.rollout.weights", "is_zero3"),
    "policy_path": ("lit_rag.rollout.weights", "policy_path"),
    "StepOutput": ("lit_rag.contracts.step", "StepOutput"),
    "average_precision": ("lit_rag.metrics.retrieval", "average_precision"),
    "full_recall_at_k": ("lit_rag.metrics.retrieval", "full_recall_at_k"),
    "recall_at_k": ("lit_rag.metrics.retrieval", "recall_at_k"),
    "ModelConfig": ("lit_rag.models.loading", "ModelConfig"),
    "load_model": ("lit_rag.models.loading", "load_model"),
    "load_tokenizer": ("lit_rag.models.loading", "load_tokenizer"),
    "rng_states": ("lit_rag.rng", "rng_states"),
    "restore_rng_states": ("lit_rag.rng", "restore_rng_states"),
    "KL_ESTIMATORS": ("lit_rag.trainer.kl", "ESTIMATORS"),
    "kl_estimator": ("lit_rag.trainer.kl", "get_estimator"),
    "EvoRagBranch": ("lit_rag.contracts.methods", "EvoRagBranch"),
    "R2AGEpisode": ("lit_rag.contracts.methods", "R2AGEpisode"),
    "R2AGInference": ("lit_rag.contracts.methods", "R2AGInference"),
    "R2AGTree": ("lit_rag.contracts.methods", "R2AGTree"),
    "TreeVertex": ("lit_rag.contracts.methods", "TreeVertex"),
    "SearchEpisode": ("lit_rag.contracts.methods", "SearchEpisode"),
    "ToolEpisode": ("lit_rag.contracts.methods", "ToolEpisode"),
    "CallTools": ("lit_rag.contracts.episodes", "CallTools"),
    "TOOL_ERRORS": ("lit_rag.tools.base", "ERRORS"),
    "ENVIRONMENT_ERRORS": ("lit_rag.tools.base", "ENVIRONMENT_ERRORS"),
    "FunctionTool": ("lit_rag.tools.base", "FunctionTool"),
    "ServerDied": ("lit_rag.tools.base", "ServerDied"),
    "Tool": ("lit_rag.tools.base", "Tool"),
    "ToolBox": ("lit_rag.tools.base", "ToolBox"),
    "ToolCall": ("lit_rag.tools.base", "ToolCall"),
    "ToolError": ("lit_rag.tools.base", "ToolError"),
    "ToolResult": ("lit_rag.tools.base", "ToolResult"),
    "build_tools": ("lit_rag.tools.base", "build_tools"),
    "McpServer": ("lit_rag.tools.mcp", "McpServer"),
    "connect_mcp": ("lit_rag.tools.mcp", "connect"),
    "Parsed": ("lit_rag.tools.parsers", "Parsed"),
    "tool_call_parser": ("lit_rag.tools.parsers", "parser"),
    "tool_chat_template": ("lit_rag.tools.templates", "chat_template"),
    "choose_tool_template": ("lit_rag.tools.templates", "choose"),
    "template_opening": ("lit_rag.tools.templates", "generation_text"),
    "template_prefix_problem": ("lit_rag.tools.templates", "prefix_problem"),
    "template_turn_end": ("lit_rag.tools.templates", "turn_end"),
    "VerifiersEnv": ("lit_rag.integrations.verifiers", "VerifiersEnv"),
    "verifiers_conversation": ("lit_rag.integrations.verifiers", "conversation"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'lit_rag.api' has no attribute '{name}'")


def advantage_estimator(name: str) -> AdvantageFn:
    """The advantage estimator registered as ``name`` (``lit_rag.advantages``)."""
    return registry.load("advantage", name)  # type: ignore[return-value]


def policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name`` (``lit_rag.policy_losses``)."""
    return registry.load("policy_loss", name)  # type: ignore[return-value]


def _registrar(kind: str, name: str | None) -> Callable[[Callable], Callable]:
    def decorate(function: Callable) -> Callable:
        registry.register(kind, name or function.__name__, function)
        return function

    return decorate


def register_reward(name: str | None = None) -> Callable[[Callable], Callable]:
    """Decorator: register a reward function (or class) in this process under ``name``
    (default: its ``__name__``)."""
    return _registrar("reward", name)


def register_advantage(name: str | None = None) -> Callable[[Callable], Callable]:
    """Decorator: register an :data:`AdvantageFn` in this process (verl's ``register_adv_est``)."""
    return _registrar("advantage", name)


def register_policy_loss(name: str | None = None) -> Callable[[Callable], Callable]:
    """Decorator: register a :data:`PolicyLossFn` in this process (verl's
    ``register_policy_loss``)."""
    return _registrar("policy_loss", name)


__all__ = [
    "atomic_write",
    "remove_stale_temps",
    "restore_rng_states",
    "rng_states",
    "sha256_file",
    "ANSWER_JUDGE_PROMPT",
    "CONTEXT_OVERFLOW",
    "HEDGING_MODES",
    "JUDGE_SCORES",
    "KL_ESTIMATORS",
    "MANIFEST_NAME",
    "PASSAGES_NAME",
    "PUNCTUATION_MODES",
    "AdvantageFn",
    "Algorithm",
    "Branch",
    "ContextLimit",
    "Contract",
    "Environment",
    "Episode",
    "EpisodeLoop",
    "EvoRagBranch",
    "Example",
    "FunctionReward",
    "Generate",
    "Generation",
    "Hedging",
    "Hit",
    "IndexCorruptError",
    "IndexMismatchError",
    "IndexedRetriever",
    "InputError",
    "Judge",
    "JudgeCase",
    "LossOutput",
    "Manifest",
    "ModelConfig",
    "Passage",
    "Piece",
    "Placement",
    "PolicyLossConfig",
    "PolicyLossFn",
    "Prepared",
    "Prompts",
    "R2AGEpisode",
    "R2AGInference",
    "R2AGTree",
    "Request",
    "RetrievalEnvironment",
    "Retriever",
    "Reward",
    "RewardBreakdown",
    "RolloutEngine",
    "SamplingParams",
    "Search",
    "SearchEpisode",
    "ToolEpisode",
    "CallTools",
    "TOOL_ERRORS",
    "ENVIRONMENT_ERRORS",
    "FunctionTool",
    "ServerDied",
    "Tool",
    "ToolBox",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "build_tools",
    "McpServer",
    "connect_mcp",
    "Parsed",
    "tool_call_parser",
    "tool_chat_template",
    "choose_tool_template",
    "template_opening",
    "template_prefix_problem",
    "template_turn_end",
    "VerifiersEnv",
    "verifiers_conversation",
    "Step",
    "StepOutput",
    "TokenLoss",
    "TrainBatch",
    "Trajectory",
    "TreeVertex",
    "Verdict",
    "Turn",
    "advantage_estimator",
    "answer_candidates",
    "atomic_index_dir",
    "average_precision",
    "build_missing_index",
    "chat_prompt",
    "check_context_overflow",
    "check_punctuation",
    "check_search_args",
    "checkpoint_weights",
    "collate",
    "corpus_fingerprint",
    "encode_prompts",
    "exact_match",
    "extract_tag",
    "f1_score",
    "final_answer",
    "fit_passages",
    "full_recall_at_k",
    "has_adapters",
    "hedged",
    "hedged_text",
    "is_zero3",
    "judge_signals",
    "policy_path",
    "kl_estimator",
    "load_model",
    "load_tokenizer",
    "normalize_answer",
    "open_index",
    "policy_loss",
    "policy_text",
    "read_corpus",
    "recall_at_k",
    "register_advantage",
    "register_policy_loss",
    "register_reward",
    "resolve_dtype",
    "resolve_path",
    "split_contents",
    "start_episodes",
    "tag_blocks",
    "write_corpus",
]
