"""The ``lit-rag`` command: LightningCLI (fit / validate / test) plus ``plugins``.

A recipe names plugins by their registered names (``class_path: grpo``). jsonargparse only
resolves dotted paths (or class names it has already seen), so before it parses, the
recipe and the command line are rewritten: a ``class_path`` under a key that holds a plugin
(``algorithm``, ``reward``, ``environment``, ``retriever``, ``engine`` and their plurals)
becomes the registered class's dotted path. An unknown name fails with the list of
installed names, in one line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from lit_rag import registry
from lit_rag.data.readers import DatasetFormatError
from lit_rag.retrieval.manifest import IndexMismatchError

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


class RecipeError(ValueError):
    """A recipe that cannot be used as written."""


def _resolve_node(node: Any, kind: str | None) -> Any:
    if isinstance(node, str) and kind is not None and node and "." not in node and node.isidentifier():
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


def _load_recipe(path: str) -> dict:
    file = Path(path)
    if not file.is_file():
        raise RecipeError(f"recipe '{path}' does not exist")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise RecipeError(f"recipe '{path}' is not UTF-8 text (byte {exc.start})") from exc
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        raise RecipeError(f"recipe '{path}'{line} is not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    if not isinstance(data, dict):
        raise RecipeError(f"recipe '{path}' must be a mapping of sections (model, data, trainer, ...)")
    return data


def _resolve_override(key: str, value: str) -> str:
    parts = key.lstrip("-").split(".")
    if parts[-1] == "class_path" and len(parts) > 1 and parts[-2] in PLUGIN_KEYS:
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


def resolve_args(args: list[str]) -> list[str]:
    """Rewrite ``--config`` files and ``--x.reward=name`` overrides (plugin names -> paths)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        key, eq, value = arg.partition("=")
        has_next = not eq and i + 1 < len(args) and not args[i + 1].startswith("--")
        if key in ("--config", "-c") and (eq or has_next):
            path = value if eq else args[i + 1]
            original = _load_recipe(path)
            resolved = resolve_config(original)
            out += ["--config", path if resolved == original else yaml.safe_dump(resolved, sort_keys=False)]
            i += 1 if eq else 2
            continue
        if key.startswith("--") and (eq or has_next):
            raw = value if eq else args[i + 1]
            new = _resolve_override(key, raw)
            out += [f"{key}={new}"] if eq else [key, new]
            i += 1 if eq else 2
            continue
        out.append(arg)
        i += 1
    return out


def print_plugins() -> None:
    """``lit-rag plugins``: every installed plugin with the package it comes from."""
    rows = [(p.kind, p.name, f"{p.package} {p.version}".strip(), p.target) for p in registry.all_plugins()]
    header = ("kind", "name", "package", "target")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    for row in [header] + rows:
        print("  ".join(col.ljust(w) for col, w in zip(row, widths)).rstrip())


def _names_module_class(args: list[str]) -> bool:
    """True when a ``--config`` recipe gives ``model: {class_path: ...}`` (another LightningModule
    than the policy, e.g. EVO-RAG's reward model)."""
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if key in ("--config", "-c"):
            path = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if Path(path).is_file():
                model = _load_recipe(path).get("model")
                if isinstance(model, dict) and "class_path" in model:
                    return True
    return False


def build_cli(args: list[str], run: bool = True):
    """The LightningCLI over :class:`PolicyModule` and :class:`QADataModule`.

    A recipe whose ``model`` (and ``data``) name a ``class_path`` runs any LightningModule and
    LightningDataModule instead (the EVO-RAG reward model recipe does).
    """
    from lightning.pytorch import LightningDataModule, LightningModule
    from lightning.pytorch.cli import LightningCLI

    from lit_rag.data.datamodule import QADataModule
    from lit_rag.modules.policy import PolicyModule

    if _names_module_class(args):
        return LightningCLI(
            LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
            args=resolve_args(args), run=run, save_config_kwargs={"overwrite": True},
            parser_kwargs={"default_env": False},
        )
    return LightningCLI(
        PolicyModule,
        QADataModule,
        args=resolve_args(args),
        run=run,
        auto_configure_optimizers=False,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"default_env": False},
    )


USAGE = """usage: lit-rag {fit,validate,test} --config RECIPE [--key=value ...]
       lit-rag index {build,search,eval} ...
       lit-rag plugins
Train or evaluate RAG policies with RL. See README.md and recipes/."""


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") and len(args) == 1:
        print(USAGE)
        if not args:
            raise SystemExit(2)
    try:
        if args[:1] == ["plugins"]:
            print_plugins()
            return
        if args[:1] == ["index"]:
            from lit_rag.retrieval.commands import main as index_main

            try:
                index_main(args[1:])
            except ValueError as exc:  # index mismatch, data without gold passages, bad option
                raise RecipeError(str(exc)) from exc
            return
        build_cli(args)
    except (registry.PluginError, RecipeError, FileNotFoundError, DatasetFormatError, IndexMismatchError) as exc:
        print(f"lit-rag: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
