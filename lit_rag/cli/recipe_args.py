"""A recipe and the command line of ``lit-rag fit`` (validate, test) as jsonargparse gets them,
and jsonargparse's complaints about them as one line.

A recipe names plugins by their registered names (``class_path: grpo``). jsonargparse only
resolves dotted paths (or class names it has already seen), so before it parses, the recipe and
the command line are rewritten: a ``class_path`` under a key that holds a plugin (``algorithm``,
``reward``, ``environment``, ``retriever``, ``engine`` and their plurals) becomes the registered
class's dotted path. An unknown name fails with the list of installed names, in one line.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from lit_rag import registry
from lit_rag.cli.engine_fallback import hf_fallback
from lit_rag.errors import InputError, not_utf8_line

#: recipe key -> plugin kind
PLUGIN_KEYS = {
    "algorithm": "algorithm",
    "reward": "reward",
    "rewards": "reward",
    "environment": "environment",
    "retriever": "retriever",
    "retrievers": "retriever",
    "engine": "engine",
}


#: recipe keys that moved, old -> new: the policy's optimizer settings are one group
RENAMED_KEYS = {
    f"model.{name}": f"model.optimizer.{name}"
    for name in (
        "lr",
        "weight_decay",
        "betas",
        "warmup_steps",
        "warmup_ratio",
        "lr_schedule",
        "max_grad_norm",
    )
}


class RecipeError(InputError):
    """A recipe that cannot be used as written."""


def one_line(exc: BaseException) -> str:
    """``exc``'s message with its whitespace (newlines included) collapsed; its type's name
    when it has none."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _resolve_node(node: Any, kind: str | None) -> Any:
    if (
        isinstance(node, str)
        and kind is not None
        and node
        and "." not in node
        and node.isidentifier()
    ):
        return {"class_path": registry.class_path(kind, node)}
    if isinstance(node, list):
        return [_resolve_node(item, kind) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "class_path" and kind is not None and isinstance(value, str):
            out[key] = registry.class_path(kind, value)
        elif key in PLUGIN_KEYS:
            out[key] = _resolve_node(value, PLUGIN_KEYS[key])
        else:
            out[key] = _resolve_node(value, None)
    return out


def resolve_config(config: dict) -> dict:
    """Replace registered plugin names in a parsed recipe with dotted class paths."""
    return _resolve_node(config, None)


def load_recipe(path: str) -> dict:
    """The recipe at ``path``, parsed; a missing file, text that is not UTF-8 or not YAML, or
    YAML that is not a mapping is a :class:`RecipeError` naming the file."""
    file = Path(path)
    if file.is_dir():
        raise RecipeError(f"recipe '{path}' is a folder; give a recipe's YAML file")
    if not file.is_file():
        raise RecipeError(f"recipe '{path}' does not exist")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as exc:  # no permission to read it
        raise RecipeError(f"recipe '{path}' cannot be read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        line, what = not_utf8_line(file, exc)
        at = f" line {line}" if line is not None else ""
        raise RecipeError(f"recipe '{path}'{at} is not UTF-8 text ({what})") from exc
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        raise RecipeError(
            f"recipe '{path}'{line} is not valid YAML: {getattr(exc, 'problem', exc)}"
        ) from exc
    if not isinstance(data, dict):
        raise RecipeError(
            f"recipe '{path}' must be a mapping of sections (model, data, trainer, ...)"
        )
    return data


def check_recipes(args: list[str]) -> None:
    """Read every ``--config`` recipe of ``args`` (:func:`load_recipe`): a missing, unreadable
    or broken one fails in one line before Lightning and torch are imported (seconds)."""
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if key in ("--config", "-c") and (eq or i + 1 < len(args)):
            load_recipe(value if eq else args[i + 1])


def _renamed(old: str, told: set[str]) -> str:
    """The new name of the recipe key ``old``, said once on stderr per run of the CLI."""
    new = RENAMED_KEYS[old]
    if old not in told:
        told.add(old)
        print(f"lit-rag: {old} is now {new}; the old name still works", file=sys.stderr)
    return new


def rename_keys(config: dict, path: str, told: set[str]) -> dict:
    """``config`` with the policy's renamed keys (:data:`RENAMED_KEYS`) moved to their new
    place; a ``model`` that names its own class (``class_path``) keeps its keys.

    Raises:
        RecipeError: The recipe gives a key under its old and its new name.
    """
    model = config.get("model")
    if not isinstance(model, dict) or "class_path" in model:
        return config
    for old in RENAMED_KEYS:
        name = old.removeprefix("model.")
        if name not in model:
            continue
        new = _renamed(old, told)
        group = model.setdefault("optimizer", {})
        if not isinstance(group, dict):
            group = model["optimizer"] = {}
        if name in group:
            raise RecipeError(f"recipe '{path}' gives both {old} and {new}; keep {new}")
        group[name] = model.pop(name)
    return config


def _resolve_override(key: str, value: str) -> str:
    parts = key.lstrip("-").split(".")
    # --model.reward.help arena: the options of a registered plugin (jsonargparse takes paths)
    if parts[-1] in ("class_path", "help") and len(parts) > 1 and parts[-2] in PLUGIN_KEYS:
        return registry.class_path(PLUGIN_KEYS[parts[-2]], value)
    if parts[-1] not in PLUGIN_KEYS:
        return value
    kind = PLUGIN_KEYS[parts[-1]]
    if value.isidentifier():
        return registry.class_path(kind, value)
    if value.lstrip().startswith(("[", "{")):  # --model.reward.init_args.rewards=[arena, f1]
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            return value  # let jsonargparse report the malformed value
        return yaml.safe_dump(_resolve_node(parsed, kind), default_flow_style=True).strip()
    return value


def _precision(value: Any, accelerator: str | None) -> Any:
    """``auto`` resolved for this machine (torch imported only then)."""
    if value != "auto":
        return value
    from lit_rag.models.precision import resolve_precision

    return resolve_precision(value, accelerator)


def _accelerator(args: list[str], recipes: dict[str, dict]) -> str | None:
    """The ``trainer.accelerator`` these arguments ask for (the last one given wins);
    ``recipes`` keeps every recipe read, by path, so that each file is parsed once."""
    found = None
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if key in ("--config", "-c") and (eq or i + 1 < len(args)):
            path = value if eq else args[i + 1]
            if path not in recipes:
                recipes[path] = load_recipe(path)
            trainer = recipes[path].get("trainer")
            if isinstance(trainer, dict) and trainer.get("accelerator") is not None:
                found = str(trainer["accelerator"])
        elif key == "--trainer.accelerator" and (eq or i + 1 < len(args)):
            found = value if eq else args[i + 1]
    return found


def resolve_args(args: list[str]) -> list[str]:
    """Rewrite ``--config`` files and ``--x.reward=name`` overrides (plugin names -> paths;
    renamed keys -> their new names, :data:`RENAMED_KEYS`, with one line on stderr each;
    ``trainer.precision: auto`` -> the precision this machine runs fast, see
    lit_rag.models.precision; the vllm engine -> hf where vLLM cannot be installed, see
    lit_rag.cli.engine_fallback)."""
    recipes: dict[str, dict] = {}
    accelerator = _accelerator(args, recipes)
    fallback = hf_fallback()  # the hf engine for vllm where vLLM cannot be installed
    policy = not names_module_class(args)  # the renamed keys are the policy module's
    told: set[str] = set()
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        key, eq, value = arg.partition("=")
        has_next = not eq and i + 1 < len(args) and not args[i + 1].startswith("--")
        if key in ("--config", "-c") and (eq or has_next):
            path = value if eq else args[i + 1]
            original = recipes[path] if path in recipes else load_recipe(path)
            resolved = resolve_config(original)
            if policy:
                resolved = rename_keys(resolved, path, told)
            if fallback is not None:
                resolved = fallback.config(resolved)
            trainer = resolved.get("trainer")
            if isinstance(trainer, dict) and "precision" in trainer:
                trainer["precision"] = _precision(trainer["precision"], accelerator)
            out += [
                "--config",
                path if resolved == original else yaml.safe_dump(resolved, sort_keys=False),
            ]
            i += 1 if eq else 2
            continue
        if key.startswith("--") and (eq or has_next):
            if policy and key[2:] in RENAMED_KEYS:
                key = "--" + _renamed(key[2:], told)
            new = _override(key, value if eq else args[i + 1], accelerator, fallback)
            if new is not None:  # None: a vllm engine option the hf fallback does not take
                out += [f"{key}={new}"] if eq else [key, new]
            i += 1 if eq else 2
            continue
        out.append(arg)
        i += 1
    if fallback is not None:
        fallback.announce()
    return out


def _override(key: str, raw: str, accelerator: str | None, fallback) -> str | None:
    """A command-line value as jsonargparse gets it (``None``: leave the option out)."""
    if key == "--trainer.precision":
        new = _precision(raw, accelerator)
    else:
        new = _resolve_override(key, raw)
    return fallback.override(key, new) if fallback is not None else new


def names_module_class(args: list[str]) -> bool:
    """True when a ``--config`` recipe gives ``model: {class_path: ...}`` (another LightningModule
    than the policy, e.g. EVO-RAG's reward model)."""
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if key in ("--config", "-c"):
            path = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if Path(path).is_file():
                model = load_recipe(path).get("model")
                if isinstance(model, dict) and "class_path" in model:
                    return True
    return False


def argument_message(exc: BaseException) -> str:
    """jsonargparse's message in one line.

    A value that matches none of a union's types arrives as a report ("Parser key "k": Does not
    validate against any of the Union subtypes ... Errors: - ... Given value: v"). When one of
    the errors is a check of ours (e.g. ``SamplingParams`` refusing ``temperature: -1``) that is
    the message; otherwise the key, the value and the types it could have been.
    """
    text = str(exc)
    unknown = re.search(
        r"Problem with given class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", text
    )
    if unknown:
        return _unknown_option(text, *unknown.groups())
    if "Union subtypes" not in text or "Errors:" not in text:
        return one_line(exc)
    key = text.split('Parser key "', 1)[1].split('"', 1)[0] if 'Parser key "' in text else ""
    body, _, given = text.split("Errors:", 1)[1].partition("Given value type:")
    reasons = [" ".join(r.split()) for r in re.split(r"\n\s*- ", body) if r.strip()]
    ours = [r for r in reasons if not r.startswith("Expected a")]
    if ours:
        return ours[0]
    value = given.split("Given value:", 1)[1].strip() if "Given value:" in given else "?"
    allowed = [
        re.sub(r"<class '([\w.]+)'>", r"\1", r.removeprefix("Expected a ")).replace(
            "typing.Literal", ""
        )
        for r in reasons
    ]
    return f"{key or 'a value'}: got {value!r}; expected {' or '.join(allowed)}"


def _unknown_option(text: str, path: str, option: str) -> str:
    """``init_args`` naming an argument the class does not take: the key, the option and the
    arguments it does take (read from the class jsonargparse has already imported)."""
    key = (
        text.split('Parser key "', 1)[1].split('"', 1)[0] if 'Parser key "' in text else "init_args"
    )
    module_name, _, name = path.rpartition(".")
    try:
        params = inspect.signature(getattr(sys.modules[module_name], name)).parameters
        takes = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (KeyError, AttributeError, TypeError, ValueError):
        # not imported or no signature: no list
        return f"{key}.init_args: '{option}' is not an argument of {name}"
    return (
        f"{key}.init_args: '{option}' is not an argument of {name}; "
        f"it takes: {', '.join(takes) or 'none'}"
    )
