"""A weighted sum of rewards, built from YAML like any other reward.

No paper defines this; it is the glue for recipes that mix rewards (e.g. EVO-RAG's
answer correctness = (EM + F1) / 2 is ``CompositeReward([ExactMatchReward(), F1Reward()],
[0.5, 0.5])``).

Each child gets a short name from its class: ``ExactMatchReward`` -> ``exact_match``,
``F1Reward`` -> ``f1``, ``ArenaReward`` -> ``arena``; a repeated name gets its position
appended (``exact_match``, ``exact_match_1``). ``weights`` maps these names to the child
weights, so a schedule callback can call ``set_weights({"f1": 0.2})``; a key
``"<child>.<component>"`` is forwarded to the child (``{"arena.bonus": 5.0}``).

Components are the union of the children's components under their own names; a name two
children share is prefixed with the child name (``exact_match.exact_match``,
``exact_match_1.exact_match``) so neither hides the other. Components are the children's
unweighted values; only ``total`` carries the composite weights.
"""

from __future__ import annotations

import re

import torch

from lit_rag.api import Reward, RewardBreakdown, Trajectory


def short_name(reward: Reward) -> str:
    """Snake-case class name minus a ``Reward`` suffix: ``ExactMatchReward`` -> ``exact_match``."""
    name = type(reward).__name__
    if name.endswith("Reward") and name != "Reward":
        name = name[: -len("Reward")]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


class CompositeReward(Reward):
    """``total = sum_i weights[i] * rewards[i](trajectories).total``.

    Example:
        ``CompositeReward([ExactMatchReward(), F1Reward()], [0.5, 0.5])`` on
        ``"<answer>the city of Paris</answer>"`` with answers ``["Paris France"]``: EM 0, F1 0.4
        (precision 1/3, recall 1/2), total = 0.5 * 0 + 0.5 * 0.4 = 0.2; components
        ``{"exact_match": 0.0, "f1": 0.4}``.

    Args:
        rewards: The child rewards (in YAML, a list of ``class_path`` / ``init_args`` entries).
        weights: One weight per child; ``None`` means 1.0 each.
    """

    def __init__(self, rewards: list[Reward], weights: list[float] | None = None) -> None:
        if not rewards:
            raise ValueError("rewards: got an empty list; give at least one reward")
        if weights is not None and len(weights) != len(rewards):
            raise ValueError(
                f"weights: got {len(weights)} value(s) for {len(rewards)} reward(s); "
                "give one weight per reward or leave it unset"
            )
        self.rewards = list(rewards)
        self.names: list[str] = []
        for i, reward in enumerate(self.rewards):
            name = short_name(reward)
            self.names.append(name if name not in self.names else f"{name}_{i}")
        values = [1.0] * len(self.rewards) if weights is None else [float(w) for w in weights]
        self.weights = dict(zip(self.names, values, strict=True))

    def metrics(self) -> dict:
        """The children's own signals (an LLM judge's), as each reports them."""
        merged: dict = {}
        for reward in self.rewards:
            merged.update(reward.metrics() if hasattr(reward, "metrics") else {})
        return merged

    def set_weights(self, weights: dict[str, float]) -> None:
        """Set child weights by name; ``"<child>.<component>"`` keys go to that child.

        Every key is checked before any weight changes, so a bad key changes nothing.
        """
        own = {k: v for k, v in weights.items() if "." not in k}
        nested: dict[str, dict[str, float]] = {}
        for key, value in weights.items():
            if "." in key:
                child, component = key.split(".", 1)
                nested.setdefault(child, {})[component] = value
        unknown = sorted(set(own) - set(self.weights))
        unknown += sorted(
            f"{child}.{c}"
            for child, comps in nested.items()
            for c in comps
            if child not in self.weights
            or c not in getattr(self.rewards[self.names.index(child)], "weights", {})
        )
        if unknown:
            known = [*self.names]
            for name, reward in zip(self.names, self.rewards, strict=True):
                known += [f"{name}.{c}" for c in getattr(reward, "weights", {})]
            raise ValueError(
                f"unknown reward weight(s) {unknown}; this composite has: {', '.join(known)}"
            )
        self.weights.update(own)
        for child, child_weights in nested.items():
            self.rewards[self.names.index(child)].set_weights(child_weights)

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        """Score with every child and combine."""
        outputs = [reward(trajectories) for reward in self.rewards]
        shapes = {
            name: tuple(out.total.shape) for name, out in zip(self.names, outputs, strict=True)
        }
        if len(set(shapes.values())) > 1:
            raise ValueError(f"rewards: children return totals of different shapes: {shapes}")
        total = sum(
            (self.weights[name] * out.total for name, out in zip(self.names, outputs, strict=True)),
            start=torch.zeros_like(outputs[0].total, dtype=torch.float32),
        )
        seen: dict[str, int] = {}
        for out in outputs:
            for component in out.components:
                seen[component] = seen.get(component, 0) + 1
        components: dict[str, torch.Tensor] = {}
        for name, out in zip(self.names, outputs, strict=True):
            for component, value in out.components.items():
                key = component if seen[component] == 1 else f"{name}.{component}"
                components[key] = value
        failed = [out.failed for out in outputs if out.failed is not None]
        return RewardBreakdown(
            total=total,
            components=components,
            failed=torch.stack(failed).any(0) if failed else None,  # any child's failure
        )
