"""Reward contract (docs/DESIGN.md step 3): trajectories + their examples ->
:class:`RewardBreakdown`.

A reward is a :class:`Reward` subclass, or a plain function (docs/STYLE.md 14, as TRL's
``reward_funcs``)::

    def brevity(
        completions: list[str], examples: list[Example], max_words: int = 20
    ) -> list[float]:
        return [1.0 if len(c.split()) <= max_words else 0.0 for c in completions]

registered under the entry-point group ``lit_rag.rewards`` like a class, and named in a recipe
the same way; the recipe's ``init_args`` become its keyword arguments. The CLI wraps a function
in :class:`FunctionReward`. A function may also return named components,
``dict[str, list[float]]``; the total is their weighted sum (weights 1 unless the recipe gives
``weights``), each logged as ``reward/<name>``. ``completions`` are what the policy wrote
(``Trajectory.policy_text``, without a multi-turn environment's insertions). A function that
declares a ``trajectories`` parameter also gets the trajectories (multi-turn steps, token
counts).

Optional capabilities are declared on :class:`Reward`: ``weights`` (schedulable by callbacks
through :meth:`~Reward.set_weights`), ``stages`` (curriculum stages, :meth:`~Reward.set_stage`),
``time_weighted`` (per-step weight anchors, :meth:`~Reward.set_anchors`), and ``state_dict`` /
``load_state_dict`` (the checkpoint carries them).
"""

from __future__ import annotations

import inspect
import math
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from lit_rag.errors import InputError
from lit_rag.types import RewardBreakdown, Trajectory


class Reward(ABC):
    """Scores trajectories. Pure: no model, no GPU, never raises on model text.

    Attributes:
        weights: Component -> weight, which schedule callbacks may change between steps
            through :meth:`set_weights` (empty: nothing to schedule).
        stages: Curriculum stages the reward knows (:meth:`set_stage`); empty: none.
        time_weighted: Whether the weights move within an episode between anchors that a
            schedule sets with :meth:`set_anchors` (EVO-RAG).
    """

    weights: dict[str, float] = {}  # noqa: RUF012 (never mutated: subclasses assign their own)
    stages: tuple[str, ...] = ()
    time_weighted: bool = False

    @abstractmethod
    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        """Score each trajectory against ``trajectory.example``."""

    def metrics(self) -> dict[str, float]:
        """What the last call measured beyond its components, logged as ``rollout/<name>``
        (``val/<name>`` in validation): an LLM judge's failures and score distribution. None
        by default."""
        return {}

    def set_weights(self, weights: dict[str, float]) -> None:
        """Replace some component weights; unknown names are an error."""
        unknown = sorted(set(weights) - set(self.weights))
        if unknown:
            known = ", ".join(sorted(self.weights)) or "none"
            raise ValueError(f"unknown reward component(s) {unknown}; this reward has: {known}")
        self.weights.update(weights)

    def set_stage(self, stage: str, table: dict[str, tuple[float, ...]] | None = None) -> None:
        """Switch to a curriculum stage (rewards that declare ``stages``); a time-weighted
        reward takes the stage's anchors from ``table`` (component -> anchor row), ``None``: its
        own table."""
        raise ValueError(f"{type(self).__name__} has no curriculum stages")

    def set_anchors(self, early: dict[str, float], late: dict[str, float]) -> None:
        """Set the weights at the first and last step of an episode (``time_weighted`` rewards)."""
        raise ValueError(f"{type(self).__name__} has no time-dependent weights")

    def weights_at(self, t: int) -> dict[str, float]:
        """The weights at step ``t`` of an episode (default: the same at every step)."""
        return dict(self.weights)

    def state_dict(self) -> dict:
        """State a resumed run needs (plain types and tensors); the checkpoint carries it."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 (optional hook)
        """Restore :meth:`state_dict`'s output."""


class FunctionReward(Reward):
    """A plain reward function as a :class:`Reward`.

    The function's ``completions`` are what the policy wrote (``Trajectory.policy_text``):
    never the documents or messages a multi-turn environment inserted into the completion, so a
    retrieved passage that holds the answer cannot score.

    Example:
        A function ``brevity(completions, examples, max_words=2)`` returning ``[1.0, 0.0]`` for
        completions ``["Paris", "It is Paris"]`` gives ``total = [1.0, 0.0]`` and the component
        ``{"brevity": [1.0, 0.0]}``; one returning ``{"short": [1, 0], "polite": [0, 1]}`` with
        ``weights={"polite": 0.5}`` gives ``total = [1.0, 0.5]``.

    Args:
        function: The function, or its registered name / dotted path (resolved at construction).
        kwargs: Keyword arguments passed on every call (the recipe's ``init_args``).
        weights: Component -> weight for functions that return named components (default 1).
        name: Component name of a function returning a list (default: the function's name).
    """

    def __init__(
        self,
        function: Callable | str,
        kwargs: dict | None = None,
        weights: dict[str, float] | None = None,
        name: str | None = None,
    ) -> None:
        if isinstance(function, str):
            from lit_rag import registry

            label, function = function, registry.resolve("reward", function)
        else:
            label = name or getattr(function, "__name__", type(function).__name__)
        if not callable(function) or isinstance(function, type):
            raise InputError(f"reward '{label}' is not a function")
        self.function, self.label = function, label
        self.name = name or getattr(function, "__name__", label)
        self.kwargs = dict(kwargs or {})
        params = inspect.signature(function).parameters
        self.wants_trajectories = "trajectories" in params
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        named = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL][2:]
        unknown = sorted(set(self.kwargs) - set(named) - {"trajectories"}) if not takes_any else []
        if unknown or "trajectories" in self.kwargs:
            allowed = ", ".join(n for n in named if n != "trajectories") or "none"
            raise InputError(
                f"reward '{label}' got unknown argument(s) {unknown or ['trajectories']}; "
                f"it takes: {allowed}"
            )
        self.weights = dict(weights or {})

    def __call__(self, trajectories: list[Trajectory]) -> RewardBreakdown:
        """Call the function on what the policy wrote and the examples; check what it
        returns."""
        extra = {"trajectories": trajectories} if self.wants_trajectories else {}
        out = self.function(
            [t.policy_text for t in trajectories],
            [t.example for t in trajectories],
            **self.kwargs,
            **extra,
        )
        named = out if isinstance(out, dict) else {self.name: out}
        components = {
            key: self._values(key, values, len(trajectories)) for key, values in named.items()
        }
        unknown = sorted(set(self.weights) - set(components))
        if unknown:
            raise InputError(
                f"reward '{self.label}' weights name unknown component(s) {unknown}; "
                f"it returns: {', '.join(components)}"
            )
        total = torch.zeros(len(trajectories))
        for key, values in components.items():
            total = total + self.weights.get(key, 1.0) * values
        return RewardBreakdown(total=total, components=components)

    def set_weights(self, weights: dict[str, float]) -> None:
        """Function rewards accept any component name (components are known after a call)."""
        self.weights.update(weights)

    def _values(self, key: str, values: object, n: int) -> torch.Tensor:
        """``[n]`` float tensor of one component; a wrong length or a non-number is an error
        naming the reward (a bug in the plugin, not in the model's text)."""
        try:
            numbers = [float(v) for v in values]  # type: ignore[union-attr]
        except (TypeError, ValueError) as exc:
            raise InputError(
                f"reward '{self.label}' must return a list of numbers (or a dict of such "
                f"lists); component '{key}' gave {type(values).__name__}: {exc}"
            ) from exc
        if len(numbers) != n:
            raise InputError(
                f"reward '{self.label}' returned {len(numbers)} value(s) for component '{key}'; "
                f"expected one per completion ({n})"
            )
        if not all(math.isfinite(v) for v in numbers):
            raise InputError(
                f"reward '{self.label}' returned a NaN or infinite value for component '{key}'"
            )
        return torch.tensor(numbers, dtype=torch.float32)  # [n]


def function_reward_class(name: str, function: Callable) -> type[FunctionReward]:
    """A :class:`FunctionReward` subclass whose ``__init__`` takes ``function``'s keyword
    arguments (its parameters after ``completions, examples``) and ``weights``: jsonargparse reads
    that signature, so a recipe's ``init_args`` and ``--model.reward.init_args.<arg>=`` overrides
    are checked against the function's own parameters, and ``--help`` lists them."""
    try:
        hints = typing.get_type_hints(function)
    # an annotation naming something unimportable: keep the strings
    except (NameError, TypeError, AttributeError):
        hints = {}
    keep = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
        for p in list(inspect.signature(function).parameters.values())[2:]
        if p.kind in keep and p.name not in ("trajectories", "weights")
    ]
    weights = inspect.Parameter(
        "weights", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=dict[str, float] | None
    )

    def __init__(self, **kwargs) -> None:  # the generated class's constructor
        component_weights = kwargs.pop("weights", None)
        FunctionReward.__init__(self, function, kwargs, component_weights, name=name)

    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    __init__.__signature__ = inspect.Signature([self_param, *params, weights])  # type: ignore[attr-defined]
    doc = (inspect.getdoc(function) or f"The reward function '{name}'.") + (
        "\n\nArgs:\n    weights: Component -> weight when the function returns named components."
    )
    return type(
        name,
        (FunctionReward,),
        {
            "__init__": __init__,
            "__doc__": doc,
            "__module__": "lit_rag.contracts.function_rewards",
            "__qualname__": name,
        },
    )
