"""A verifiers environment's reward functions as lit-rag's reward.

Each trajectory's conversation (the ``verifiers`` environment's
``meta["verifiers_conversation"]``; else the tool agent's ``meta["messages"]``, read with the
``hermes`` parser; else the task's first messages and what the policy wrote) becomes a
verifiers trace, and the task's rewards (``@vf.reward`` methods, rewards plugged through the
task config, judges) score it as verifiers' ``Task.score`` does: each a score and a weight, the
total their weighted sum, each logged as ``reward/<name>`` (unweighted). Rewards that need the
rollout's runtime (a sandbox) are skipped, said once.

Never raises on model text: a reward function that raises, or returns something that is not a
finite number, scores 0 for that trajectory; the failures are counted
(:attr:`VerifiersRubricReward.failures`) and one line per step goes to stderr.
"""

from __future__ import annotations

import sys
from collections import Counter

import torch

from lit_rag.api import (
    InputError,
    Reward,
    RewardBreakdown,
    Trajectory,
    VerifiersEnv,
    tool_call_parser,
    verifiers_conversation,
)


class VerifiersRubricReward(Reward):
    """A verifiers environment's rubric (module doc).

    Args:
        environment: The verifiers environment's id; None: the one each example came from
            (``data.train: verifiers:<env-id>`` writes it into the example).
        env_args: Its taskset config's fields (None: the example's).
        weights: Reward name -> weight, replacing the environment's own for those named.
    """

    def __init__(
        self,
        environment: str | None = None,
        env_args: dict | None = None,
        weights: dict[str, float] | None = None,
    ) -> None:
        self.environment = environment
        self.env_args = None if env_args is None else dict(env_args)
        self.overrides = dict(weights or {})
        self.weights = dict(self.overrides)
        self.failures: Counter[str] = Counter()
        self.calls = 0
        self._hermes = None

    def set_weights(self, weights: dict[str, float]) -> None:
        """Set some rewards' weights (any name: the rewards are known after a call)."""
        self.overrides.update(weights)
        self.weights.update(weights)

    def _env(self, trajectory: Trajectory) -> VerifiersEnv:
        meta = trajectory.example.meta
        environment = self.environment or meta.get(VerifiersEnv.META_ENV)
        if not environment:
            raise InputError(
                "reward verifiers_rubric: the examples are not a verifiers environment's tasks "
                "(no meta['verifiers_env']); set the reward's environment or train on "
                f"data.train: {VerifiersEnv.SOURCE_PREFIX}<env-id>"
            )
        args = self.env_args
        if args is None:
            same = self.environment is None or self.environment == meta.get(VerifiersEnv.META_ENV)
            args = meta.get(VerifiersEnv.META_ARGS) if same else None
        return VerifiersEnv.load(environment, args)

    def _conversation(self, env: VerifiersEnv, task, trajectory: Trajectory) -> list[dict]:
        meta = trajectory.meta or {}
        if meta.get(VerifiersEnv.META_CONVERSATION) is not None:
            return list(meta[VerifiersEnv.META_CONVERSATION])
        if meta.get("messages"):
            if self._hermes is None:
                self._hermes = tool_call_parser("hermes")
            return verifiers_conversation(meta["messages"], self._hermes)
        return [
            *env.prompt_messages(task),
            {"role": "assistant", "content": trajectory.policy_text},
        ]

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        """Score each trajectory's conversation with its task's rewards."""
        by_env: dict[int, tuple[VerifiersEnv, list[int]]] = {}
        for i, trajectory in enumerate(trajectories):
            env = self._env(trajectory)
            by_env.setdefault(id(env), (env, []))[1].append(i)
        results: list = [None] * len(trajectories)
        for env, indices in by_env.values():
            items = []
            for i in indices:
                task = env.task_for(trajectories[i].example)
                items.append((task, self._conversation(env, task, trajectories[i])))
            for i, scores in zip(indices, env.score_conversations(items), strict=True):
                results[i] = scores
        names = list(dict.fromkeys(name for r in results for name in r.scores))
        for r in results:
            for name, weight in r.weights.items():
                if name not in self.overrides:
                    self.weights[name] = weight
        components = {
            name: torch.tensor([r.scores.get(name, 0.0) for r in results], dtype=torch.float32)
            for name in names
        }
        total = torch.zeros(len(trajectories))
        for name, values in components.items():
            total = total + self.weights.get(name, 1.0) * values
        self._report(results)
        return RewardBreakdown(total=total, components=components)

    def _report(self, results: list) -> None:
        """Count the failures; one stderr line for the step's."""
        self.calls += sum(len(r.scores) for r in results)
        step = Counter(name for r in results for name in r.errors)
        if not step:
            return
        self.failures.update(step)
        first = next(r.errors for r in results if r.errors)
        name = next(iter(first))
        counts = ", ".join(f"{k} x{v}" for k, v in step.items())
        print(
            f"reward verifiers_rubric: {sum(step.values())} reward call(s) failed and scored 0 "
            f"({counts}); e.g. {name}: {first[name]}",
            file=sys.stderr,
        )
