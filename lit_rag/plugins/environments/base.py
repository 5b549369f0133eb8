"""Environment base (DESIGN.md step 2): examples -> trajectories. Never computes rewards."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from lit_rag.rollout.base import RolloutEngine, SamplingParams
from lit_rag.types import Example, Trajectory


def chat_prompt(tokenizer, system: str, user: str, use_chat_template: bool = True) -> str | None:
    """System + user messages through the tokenizer's chat template, ready for the assistant;
    ``None`` when the template is off or the tokenizer has none (the caller writes raw text)."""
    if not use_chat_template or getattr(tokenizer, "chat_template", None) is None:
        return None
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def encode_prompts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of prompt texts (their special tokens are already in the text)."""
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


class Environment(ABC):
    """Builds prompts, drives the engine (and retriever for tool turns), returns trajectories."""

    def setup(self) -> None:
        """Open what the environment needs (an index, say) before training starts, so a missing
        one fails at once rather than at the first rollout. Called once by the policy module."""

    @abstractmethod
    def rollout(
        self,
        examples: list[Example],
        engine: RolloutEngine,
        group_size: int,
        params: SamplingParams,
    ) -> list[Trajectory]:
        """``group_size`` trajectories per example, grouped contiguously (``group`` = index)."""

    def validation_rollout(self, examples: list[Example], engine: RolloutEngine, params: SamplingParams) -> list[Trajectory]:
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


class RetrievalEnvironment(Environment):
    """An environment that searches ``self.retriever`` during rollouts."""

    retriever: object

    def setup(self) -> None:
        """Open the retriever's index now (a missing index is an error before any rollout)."""
        self.retriever.search(["lit-rag index check"], 1)
