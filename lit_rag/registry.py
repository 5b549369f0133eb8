"""Plugin discovery: entry-point name -> class. The only module that reads entry points.

lit-rag registers its own built-ins through the same entry-point groups as any third-party
package (see ``[project.entry-points]`` in pyproject.toml), so both take one path. The rules
follow pluggy's ``load_setuptools_entrypoints``: a name registered by two packages is an error
naming both, and a plugin that fails to import fails with its entry-point name.

Example:
    >>> from lit_rag import registry
    >>> registry.resolve("reward", "arena").__name__
    'ArenaReward'
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from importlib import metadata

from lit_rag.errors import InputError

#: kind (as used in recipes and messages) -> entry-point group
GROUPS: dict[str, str] = {
    "algorithm": "lit_rag.algorithms",
    "reward": "lit_rag.rewards",
    "environment": "lit_rag.environments",
    "retriever": "lit_rag.retrievers",
    "engine": "lit_rag.engines",
    "tool": "lit_rag.tools",
    "advantage": "lit_rag.advantages",
    "policy_loss": "lit_rag.policy_losses",
}

#: plugins registered in this process (``register``), by kind then name
_LOCAL: dict[str, dict[str, object]] = {kind: {} for kind in GROUPS}


class PluginError(InputError):
    """A plugin name could not be resolved, was registered twice, or failed to import."""


@dataclass(frozen=True)
class PluginInfo:
    """One registered plugin.

    Args:
        kind: ``algorithm``, ``reward``, ``environment``, ``retriever``, ``engine``, ``tool``,
            ``advantage`` or ``policy_loss``.
        name: The registered (short) name used in recipes.
        target: ``module:attr`` the entry point points at.
        package: Distribution that registered it.
        version: That distribution's version.
    """

    kind: str
    name: str
    target: str
    package: str
    version: str


def _entry_points(group: str) -> list[metadata.EntryPoint]:
    """All entry points of ``group`` (a seam for tests)."""
    return list(metadata.entry_points(group=group))


def _check_kind(kind: str) -> str:
    if kind not in GROUPS:
        raise PluginError(f"unknown plugin kind '{kind}'; known kinds: {', '.join(GROUPS)}")
    return GROUPS[kind]


@cache
def available(kind: str) -> dict[str, PluginInfo]:
    """Registered plugins of one kind, by name.

    Raises:
        PluginError: When two different packages register the same name.
    """
    group = _check_kind(kind)
    found: dict[str, PluginInfo] = {}
    for ep in _entry_points(group):
        dist = getattr(ep, "dist", None)
        info = PluginInfo(
            kind=kind,
            name=ep.name,
            target=ep.value,
            package=dist.metadata["Name"] if dist is not None else "<unknown>",
            version=dist.version if dist is not None else "",
        )
        previous = found.get(ep.name)
        if previous is not None and previous != info:
            raise PluginError(
                f"{kind} plugin '{ep.name}' is registered twice: by package "
                f"'{previous.package}' ({previous.target}) and by package '{info.package}' "
                f"({info.target}); uninstall one of them"
            )
        found[ep.name] = info
    for name, obj in _LOCAL[kind].items():
        target = f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', name)}"
        if name in found:
            raise PluginError(
                f"{kind} plugin '{name}' is registered twice: by package '{found[name].package}' "
                f"({found[name].target}) and in this process ({target}); pick another name"
            )
        found[name] = PluginInfo(
            kind=kind, name=name, target=target, package="<this process>", version=""
        )
    return dict(sorted(found.items()))


def register(kind: str, name: str, obj: object) -> None:
    """Register ``obj`` as ``name`` in this process only (scripts, notebooks, tests); packages
    register through entry points. A name already taken is an error."""
    _check_kind(kind)
    if name in available(kind):
        raise PluginError(
            f"{kind} plugin '{name}' is already registered ({available(kind)[name].target})"
        )
    _LOCAL[kind][name] = obj
    clear_cache()


def unregister(kind: str, name: str) -> None:
    """Forget a plugin :func:`register` added (no-op when absent)."""
    _check_kind(kind)
    _LOCAL[kind].pop(name, None)
    clear_cache()


def clear_cache() -> None:
    """Forget discovered plugins (after installing a package at run time, or in tests)."""
    available.cache_clear()
    load.cache_clear()


@cache
def load(kind: str, name: str) -> type:
    """Import and return the class (or function) registered as ``name``.

    Raises:
        PluginError: Unknown name (the message lists the installed ones) or a failed import.
    """
    plugins = available(kind)
    if name not in plugins:
        installed = ", ".join(plugins) or "none"
        raise PluginError(f"unknown {kind} '{name}'; installed: {installed}")
    if name in _LOCAL[kind]:
        return _LOCAL[kind][name]  # type: ignore[return-value]
    info = plugins[name]
    module_name, _, attr = info.target.partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split(".") if attr else []:
            obj = getattr(obj, part)
    except Exception as exc:  # a broken plugin must name itself, whatever it raised
        raise PluginError(
            f"{kind} plugin '{name}' from package '{info.package}' failed to load "
            f"({info.target}): {type(exc).__name__}: {exc}"
        ) from exc
    return obj  # type: ignore[return-value]


def resolve(kind: str, name: str) -> type:
    """A registered name or a dotted import path -> class."""
    if name in available(kind):
        return load(kind, name)
    if "." in name:
        module_name, _, attr = name.rpartition(".")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except Exception as exc:  # whatever the module raised, name the path the user gave
            raise PluginError(
                f"{kind} '{name}' could not be imported: {type(exc).__name__}: {exc}"
            ) from exc
    return load(kind, name)  # raises with the list of installed names


def class_path(kind: str, name: str) -> str:
    """The dotted path jsonargparse needs for a registered name or a class name.

    ``arena`` -> ``lit_rag.plugins.rewards.arena.ArenaReward``. A dotted path is returned as
    it is. A bare class name of a registered plugin (``ArenaReward``) is also accepted.
    """
    if "." in name:
        return name
    plugins = available(kind)
    if name not in plugins:
        for info in plugins.values():
            if info.target.rpartition(":")[2].rpartition(".")[2] != name:
                continue  # match class names on the entry point's target; import nothing else
            cls = load(kind, info.name)
            return f"{cls.__module__}.{cls.__qualname__}"
    cls = load(kind, name)
    if kind == "reward" and not isinstance(cls, type) and callable(cls):  # a reward function
        return f"lit_rag.contracts.function_rewards.{name}"
    return f"{cls.__module__}.{cls.__qualname__}"


def name_of(kind: str, cls: type) -> str:
    """The name ``cls`` is registered under (imports nothing); "" when it is not registered."""
    target = f"{cls.__module__}:{cls.__qualname__}"
    return next((i.name for i in available(kind).values() if i.target == target), "")


def all_plugins() -> list[PluginInfo]:
    """Every registered plugin of every kind, sorted by kind then name."""
    return [info for kind in GROUPS for info in available(kind).values()]
