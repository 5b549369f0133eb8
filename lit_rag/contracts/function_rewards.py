"""Registered reward functions as importable classes, for jsonargparse.

``lit_rag.contracts.function_rewards.<name>`` is the
:class:`~lit_rag.contracts.reward.FunctionReward` subclass of the reward function registered as
``<name>`` (``lit_rag.rewards`` entry points, or
``lit_rag.api.register_reward``), built on first access. :func:`lit_rag.registry.class_path`
maps a recipe's ``class_path: <name>`` here when the registered object is a function, so a
function is named in a recipe exactly like a class. Only registered names resolve: nothing in a
recipe chooses another import.
"""

from __future__ import annotations

from lit_rag import registry as _registry
from lit_rag.contracts.reward import function_reward_class as _function_reward_class

#: name -> (the registered function, the class built for it); a new registration under an old
#: name (a notebook re-running a cell) gets a new class
_BUILT: dict[str, tuple[object, type]] = {}


def __getattr__(name: str) -> type:
    if name.startswith("__"):
        raise AttributeError(name)
    if name not in _registry.available("reward"):
        raise AttributeError(f"no reward function registered as '{name}'")
    function = _registry.load("reward", name)
    if isinstance(function, type) or not callable(function):
        raise AttributeError(f"reward '{name}' is a class, not a function")  # noqa: TRY004 (__getattr__'s protocol)
    built = _BUILT.get(name)
    if built is None or built[0] is not function:
        built = _BUILT[name] = (function, _function_reward_class(name, function))
    return built[1]
