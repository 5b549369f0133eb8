"""The ``lit-rag`` command: LightningCLI (fit / validate / test) and lit-rag's own commands
(compare, evaluate, report, export, data, index, plugins), listed in :data:`COMMANDS`.

A recipe names plugins by their registered names (``class_path: grpo``). jsonargparse only
resolves dotted paths (or class names it has already seen), so before it parses, the
recipe and the command line are rewritten: a ``class_path`` under a key that holds a plugin
(``algorithm``, ``reward``, ``environment``, ``retriever``, ``engine`` and their plurals)
becomes the registered class's dotted path. An unknown name fails with the list of
installed names, in one line.

Lightning, torch and the modules are imported only by the commands that build the LightningCLI
(fit, validate, test): ``--help``, ``plugins`` and ``index`` start in well under two seconds.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from lit_rag import registry
from lit_rag.distributed import CollectiveError, collective_failure, failure_line
from lit_rag.engine_fallback import hf_fallback
from lit_rag.errors import CommandParser, DiskFullError, InputError, chain

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


class RecipeError(InputError):
    """A recipe that cannot be used as written."""


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
        raise RecipeError(
            f"recipe '{path}'{line} is not valid YAML: {getattr(exc, 'problem', exc)}"
        ) from exc
    if not isinstance(data, dict):
        raise RecipeError(
            f"recipe '{path}' must be a mapping of sections (model, data, trainer, ...)"
        )
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


def _precision(value: Any, accelerator: str | None) -> Any:
    """``auto`` resolved for this machine (torch imported only then)."""
    if value != "auto":
        return value
    from lit_rag.precision import resolve_precision

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
                recipes[path] = _load_recipe(path)
            trainer = recipes[path].get("trainer")
            if isinstance(trainer, dict) and trainer.get("accelerator") is not None:
                found = str(trainer["accelerator"])
        elif key == "--trainer.accelerator" and (eq or i + 1 < len(args)):
            found = value if eq else args[i + 1]
    return found


def resolve_args(args: list[str]) -> list[str]:
    """Rewrite ``--config`` files and ``--x.reward=name`` overrides (plugin names -> paths;
    ``trainer.precision: auto`` -> the precision this machine runs fast, see lit_rag.precision;
    the vllm engine -> hf where vLLM cannot be installed, see lit_rag.engine_fallback)."""
    recipes: dict[str, dict] = {}
    accelerator = _accelerator(args, recipes)
    fallback = hf_fallback()  # the hf engine for vllm where vLLM cannot be installed
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        key, eq, value = arg.partition("=")
        has_next = not eq and i + 1 < len(args) and not args[i + 1].startswith("--")
        if key in ("--config", "-c") and (eq or has_next):
            path = value if eq else args[i + 1]
            original = recipes[path] if path in recipes else _load_recipe(path)
            resolved = resolve_config(original)
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
            raw = value if eq else args[i + 1]
            new = (
                _precision(raw, accelerator)
                if key == "--trainer.precision"
                else _resolve_override(key, raw)
            )
            if fallback is not None:
                new = fallback.override(key, new)
            if new is not None:  # None: a vllm engine option the hf fallback does not take
                out += [f"{key}={new}"] if eq else [key, new]
            i += 1 if eq else 2
            continue
        out.append(arg)
        i += 1
    if fallback is not None:
        fallback.announce()
    return out


def print_plugins() -> None:
    """``lit-rag plugins``: every installed plugin with the package it comes from."""
    rows = [
        (p.kind, p.name, f"{p.package} {p.version}".strip(), p.target)
        for p in registry.all_plugins()
    ]
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


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _cli_class():
    """:class:`LightningCLI` with lit-rag's input rules (built on first use: Lightning is heavy)."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.cli import LightningCLI

    class LitRagCLI(LightningCLI):
        """LightningCLI that reports bad input as :class:`InputError` (one line, exit 2)."""

        def parse_arguments(self, parser, args) -> None:
            # ``args`` is the command line with plugin names rewritten; with sys.argv also set,
            # Lightning warns "args parameter is intended ..." and prints the whole recipe
            saved, sys.argv = sys.argv, sys.argv[:1]
            try:
                super().parse_arguments(parser, args)
            finally:
                sys.argv = saved  # restored: DDP's launcher re-runs sys.argv on the other ranks

        @staticmethod
        def subcommands() -> dict[str, set[str]]:
            """Lightning's Trainer commands that lit-rag runs: :data:`TRAINER_COMMANDS`."""
            commands = LightningCLI.subcommands()
            return {name: commands[name] for name in TRAINER_COMMANDS}

        def _parse_ckpt_path(self) -> None:
            """Check ``--ckpt_path`` before anything is built; never take settings from it.

            Lightning's version loads the checkpoint here and parses its ``hyper_parameters``
            into the config, so a ``class_path`` written in a downloaded checkpoint would choose
            what gets imported. A checkpoint is data: the recipe is the only config, and the
            weights load later through the trainer (``weights_only``, see lit_rag.checkpointing).
            """
            subcommand = self.config.get("subcommand")
            path = self.config[subcommand].get("ckpt_path") if subcommand else None
            if path:
                check_ckpt_path(path)

        def add_arguments_to_parser(self, parser) -> None:
            parser.add_argument(
                "--collective_timeout",
                type=float | None,
                default=None,
                help="Seconds a collective (broadcast, barrier, all-reduce) waits for the other "
                "processes before the run ends with one line naming the rank, step and "
                "operation (default: 300 on CPU, 900 on GPUs; lit_rag/distributed.py)",
            )

        def _command_config(self):
            """The parsed config of the subcommand run (``fit``, ...), or the whole config."""
            return self.config.get(self.config.get("subcommand") or "", self.config)

        def before_instantiate_classes(self) -> None:
            config = self._command_config()
            trainer = config.get("trainer", {})
            interval = trainer.get("val_check_interval")
            if interval is not None and interval <= 0:  # Lightning divides by it mid-run
                raise InputError(
                    f"trainer.val_check_interval must be > 0 (an int: every N steps, "
                    f"a float: a fraction of the epoch), got {interval}"
                )
            timeout = config.get("collective_timeout")
            if timeout is not None and not timeout > 0:
                raise InputError(f"collective_timeout must be > 0 seconds, got {timeout}")
            self._collective_timeout = None  # the value set on the strategy, once it is built
            use_cpu_strategy(trainer)

        def instantiate_classes(self) -> None:
            # plugins, modules and the Trainer check their arguments in __init__ with ValueError
            # (group_size: -2, lr: -1, devices: 0): a recipe error, not a crash
            try:
                super().instantiate_classes()
            except InputError:
                raise
            except (ValueError, MisconfigurationException) as exc:
                raise RecipeError(_argument_message(exc)) from None

        def _run_subcommand(self, subcommand: str) -> None:
            # Lightning checks val_check_interval against the epoch's batches once the data
            # is read, with a ValueError: a recipe error, one line like the others
            try:
                super()._run_subcommand(subcommand)
            except ValueError as exc:
                if "`val_check_interval`" not in str(exc):
                    raise
                raise RecipeError(f"trainer.val_check_interval: {_one_line(exc)}") from None
            except Exception as exc:  # a collective that timed out or lost a rank: one line
                raise_collective_failure(exc, self.trainer, self._collective_timeout)
                raise

        def after_instantiate_classes(self) -> None:
            from lit_rag.checkpointing import use_atomic_checkpoints

            use_atomic_checkpoints(self.trainer)
            check_scale(self.trainer, self.model, self.datamodule)
            add_run_callbacks(self.trainer)
            self._collective_timeout = collective_timeout(
                self.trainer, self._command_config().get("collective_timeout")
            )

    return LitRagCLI


def add_run_callbacks(trainer) -> None:
    """What every run gets unless its recipe lists its own: :class:`PreemptionCheckpoint` (a
    SIGTERM saves a checkpoint, then exits), :class:`RunHeader` (what runs, where it writes), and
    :class:`RunProgressBar` in place of Lightning's default rich bar (which reads "Epoch 0/-2"
    when ``max_steps`` ends the run; any other bar stays)."""
    from lightning.pytorch.callbacks import RichProgressBar

    from lit_rag.callbacks import PreemptionCheckpoint, RunHeader, RunProgressBar

    for kind in (PreemptionCheckpoint, RunHeader):
        if not any(isinstance(c, kind) for c in trainer.callbacks):
            trainer.callbacks.append(kind())
    for index, callback in enumerate(trainer.callbacks):
        if type(callback) is RichProgressBar:
            trainer.callbacks[index] = RunProgressBar()


def use_cpu_strategy(trainer: dict) -> None:
    """``trainer.strategy: fsdp`` (or ``deepspeed_stage_2``, ...) on CPU processes: lit-rag's CPU
    subclass of the strategy (lit_rag/modules/cpu_strategies.py); Lightning takes it on CUDA
    only. ``trainer`` is the parsed recipe's trainer section, rewritten in place."""
    from jsonargparse import Namespace

    from lit_rag.distributed import cpu_strategy

    accelerator = trainer.get("accelerator")
    if accelerator not in ("cpu", "auto", None):
        return
    if accelerator != "cpu":
        import torch

        if torch.cuda.is_available():
            return
    replacement = cpu_strategy(trainer.get("strategy"))
    if replacement is not None:
        trainer["strategy"] = Namespace(
            class_path=replacement["class_path"], init_args=Namespace(**replacement["init_args"])
        )


def collective_timeout(trainer, seconds: float | None) -> float | None:
    """Set the process-group timeout of a distributed strategy: ``seconds``, else the default of
    its accelerator (lit_rag/distributed.py); the value set, None for a single process."""
    from lightning.pytorch.accelerators import CPUAccelerator

    from lit_rag.distributed import default_timeout, set_timeout

    if seconds is None:
        seconds = default_timeout(
            "cpu" if isinstance(trainer.accelerator, CPUAccelerator) else "gpu"
        )
    return seconds if set_timeout(trainer.strategy, seconds) else None


def raise_collective_failure(exc: BaseException, trainer, timeout_s: float | None) -> None:
    """Raise :class:`~lit_rag.distributed.CollectiveError` (one line) when ``exc`` is a failed
    collective; return otherwise."""
    failure = collective_failure(exc)
    if failure is None or trainer is None:
        return
    launcher = trainer.strategy.launcher
    if launcher is not None and hasattr(launcher, "procs"):
        # the ranks this process started (Lightning's launcher): a hung one never exits on its
        # own and would outlive the command, so they end with it, as Lightning does on Ctrl-C
        from lightning.pytorch.trainer.call import _get_sigkill_signal

        launcher.kill(_get_sigkill_signal())
    line = failure_line(
        failure, trainer.global_rank, trainer.world_size, trainer.global_step, timeout_s
    )
    raise CollectiveError(line) from exc


def check_scale(trainer, module, datamodule) -> None:
    """Settings that depend on the number of processes, checked once before any starts (a rank
    would fail later, each with the same line): the global batch must split over the ranks,
    and a tensor-parallel engine's group size must divide the ranks of a node and the model's
    attention heads (read from the policy folder's ``config.json`` when it has one)."""
    import json

    from lit_rag.plugins.engines.vllm_ranks import check_tensor_parallel
    from lit_rag.rollout.base import Placement, RolloutEngine

    if datamodule is not None and hasattr(datamodule, "process_batch_size"):
        datamodule.process_batch_size(trainer.world_size)
    engine = getattr(module, "engine", None)  # a module without an engine: the reward model's
    size = engine.tensor_parallel_size if isinstance(engine, RolloutEngine) else 1
    if size == 1:
        return
    config = None
    path = getattr(getattr(module, "policy_config", None), "path", None)
    file = Path(path) / "config.json" if path else None
    if file is not None and getattr(module.policy_config, "tiny", None) is None and file.is_file():
        raw = json.loads(file.read_text(encoding="utf-8"))
        config = argparse.Namespace(
            num_attention_heads=raw.get("num_attention_heads"),
            num_key_value_heads=raw.get("num_key_value_heads"),
        )
    placement = Placement(world_size=trainer.world_size, local_world_size=trainer.num_devices)
    check_tensor_parallel(size, placement, config)


def check_ckpt_path(path: str) -> None:
    """Fail in one line when ``--ckpt_path`` cannot be a checkpoint (cheap: nothing is loaded).

    Lightning's own names (``last``, ``best``, ``hpc``, ``registry:...``) and URLs pass through.
    """
    import zipfile

    from lit_rag.checkpointing import check_checkpoint_file

    if path in ("last", "best", "hpc") or path.startswith("registry") or "://" in path:
        return
    check_checkpoint_file(path)  # missing, a folder, empty
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive, its directory at the end
        raise InputError(
            f"checkpoint {path} is truncated or not a torch checkpoint "
            f"({Path(path).stat().st_size} bytes, no zip directory at its end)"
        )


def _argument_message(exc: BaseException) -> str:
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
        return _one_line(exc)
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
    except (
        KeyError,
        AttributeError,
        TypeError,
        ValueError,
    ):  # not imported or no signature: no list
        return f"{key}.init_args: '{option}' is not an argument of {name}"
    return (
        f"{key}.init_args: '{option}' is not an argument of {name}; "
        f"it takes: {', '.join(takes) or 'none'}"
    )


#: parser settings for the main parser and each subcommand's: errors raise (printed as one line
#: by ``main``) and options must be spelled out (``--trainer.max_step`` is not ``max_steps``)
_PARSER_KWARGS = {"default_env": False, "exit_on_error": False, "allow_abbrev": False}


def _help_formatter() -> type:
    """jsonargparse's help formatter, keeping the line breaks of :data:`TRAINER_HELP`."""
    from jsonargparse import DefaultHelpFormatter

    class TrainerHelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
        pass

    return TrainerHelpFormatter


def build_cli(args: list[str], run: bool = True):
    """The LightningCLI over :class:`PolicyModule` and :class:`QADataModule`.

    A recipe whose ``model`` (and ``data``) name a ``class_path`` runs any LightningModule and
    LightningDataModule instead (the EVO-RAG reward model recipe does).
    """
    from lightning.pytorch import LightningDataModule, LightningModule

    from lit_rag.data.datamodule import QADataModule
    from lit_rag.modules.policy import PolicyModule

    cli_class = _cli_class()
    parser_kwargs = {
        **_PARSER_KWARGS,
        "prog": "lit-rag",
        "description": DESCRIPTION,
        "formatter_class": _help_formatter(),  # the commands' parsers get it from this one
    }
    for name in TRAINER_COMMANDS:
        parser_kwargs[name] = {
            **_PARSER_KWARGS,
            "usage": f"lit-rag {name} --config RECIPE [--KEY=VALUE ...]",
            "description": TRAINER_HELP[name],
        }
    if _names_module_class(args):
        return cli_class(
            LightningModule,
            LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=resolve_args(args),
            run=run,
            save_config_kwargs={"overwrite": True},
            parser_kwargs=parser_kwargs,
        )
    return cli_class(
        PolicyModule,
        QADataModule,
        args=resolve_args(args),
        run=run,
        auto_configure_optimizers=False,
        save_config_kwargs={"overwrite": True},
        parser_kwargs=parser_kwargs,
    )


#: lit-rag's commands in the order ``lit-rag --help`` lists them, each with its line there; a
#: command's own ``--help`` opens with the same line
COMMANDS = {
    "fit": "Train a policy with RL from a YAML recipe.",
    "validate": "Score a policy on the recipe's validation data.",
    "test": "Score a policy on the recipe's test data.",
    "compare": "Validate the untrained policy and each checkpoint, side by side.",
    "evaluate": "Score models on a paper's benchmark suite, beside the paper's results.",
    "report": "Plot a run's curves and sampled rollouts as PNG files and an HTML page.",
    "export": "Save a checkpoint's policy as a Hugging Face model folder.",
    "data": "Prepare a paper recipe's data sets from local or FlashRAG files.",
    "index": "Build, search, score, serve and import retrieval indexes.",
    "plugins": "List the installed algorithms, rewards, retrievers and other plugins.",
}

#: the commands LightningCLI runs (Trainer methods). Not ``predict``: no lit-rag module has a
#: ``predict_step`` nor any data module a ``predict_dataloader``, so ``Trainer.predict`` fails.
TRAINER_COMMANDS = ("fit", "validate", "test")

USAGE = "usage: lit-rag COMMAND [options]"

DESCRIPTION = (
    "Train and evaluate retrieval-augmented generation (RAG) policies with reinforcement learning."
)

_EXAMPLES = """\
examples:
  lit-rag fit --config recipes/quickstart.yaml                  ARENA on CPU with a small model
  lit-rag fit --config recipes/quickstart.yaml --model.lr=5e-4  override a recipe's value
  lit-rag COMMAND --help                                        a command's options

The recipes are in recipes/; recipes/README.md lists them. --verbose (or LIT_RAG_VERBOSE=1)
also shows the warnings third-party libraries print on every run."""

#: what ``lit-rag fit --help`` (and validate, test) prints above LightningCLI's options
TRAINER_HELP = {
    "fit": """\
Train a policy with RL from a YAML recipe.

  lit-rag fit --config recipes/quickstart.yaml
  lit-rag fit --config recipes/quickstart.yaml --model.lr=5e-4 --trainer.max_steps=48
  lit-rag fit --config recipes/quickstart.yaml --ckpt_path CHECKPOINT

A recipe sets the trainer, the model (policy, environment, reward, algorithm) and the data;
recipes/README.md lists the recipes in recipes/. Every option below overrides the
recipe's value (--model.lr=5e-4). Plugins go by their registered names (--model.reward=f1;
lit-rag plugins lists them). --ckpt_path resumes a run from one of its checkpoints
(runs/NAME/version_N/checkpoints/last.ckpt).""",
    "validate": """\
Score a policy on the recipe's validation data.

  lit-rag validate --config recipes/quickstart.yaml
  lit-rag validate --config recipes/quickstart.yaml --ckpt_path CHECKPOINT
  lit-rag validate --config recipes/quickstart.yaml --data.val=FILE

Greedy rollouts, their rewards, EM and F1. Without --ckpt_path the recipe's untrained policy
is scored. The options are fit's; lit-rag compare scores several checkpoints in one table.""",
    "test": """\
Score a policy on the recipe's test data.

  lit-rag test --config recipes/quickstart.yaml --data.test=synthetic
  lit-rag test --config RECIPE --data.test=FILE --ckpt_path CHECKPOINT

What validate scores, on data.test. Recipes set no test data: give it with --data.test (a
file or synthetic). Without --ckpt_path the recipe's untrained policy is scored. The options
are fit's; lit-rag evaluate scores a paper's benchmark suite.""",
}


def help_text() -> str:
    """What ``lit-rag --help`` prints: the usage, one line per command, examples."""
    width = max(len(name) for name in COMMANDS) + 3
    commands = "\n".join(f"  {name.ljust(width)}{line}" for name, line in COMMANDS.items())
    return f"{USAGE}\n\n{DESCRIPTION}\n\ncommands:\n{commands}\n\n{_EXAMPLES}"


def print_help() -> None:
    """``lit-rag --help``, printed without importing Lightning or torch (see the module
    docstring); ``lit-rag fit --help`` and the others are each command's own."""
    print(help_text())


def _asks_top_level_help(args: list[str]) -> bool:
    """``-h`` / ``--help`` with no command: ``lit-rag --help``, ``lit-rag -c RECIPE --help``."""
    return any(a in ("-h", "--help") for a in args) and not any(a in COMMANDS for a in args)


def plugins_parser() -> CommandParser:
    """The parser of ``lit-rag plugins`` (no arguments; ``--help``)."""
    return CommandParser(
        "plugins",
        "lit-rag plugins",
        description=(
            f"{COMMANDS['plugins']} A row per plugin: its kind, the name a recipe gives it "
            "(class_path: grpo), the package it comes from and what it loads. A package adds "
            "plugins through Python entry points (lit_rag.rewards, lit_rag.retrievers, ...)."
        ),
    )


def main(argv: list[str] | None = None) -> None:
    from lit_rag import console

    args, loud = console.split_verbose(list(sys.argv[1:] if argv is None else argv))
    if not loud:
        console.quiet()
    if not args:
        print_help()
        raise SystemExit(2)
    if _asks_top_level_help(args):
        print_help()
        raise SystemExit(0)  # as argparse's --help does
    try:
        if not args[0].startswith("-") and args[0] not in COMMANDS:
            raise InputError(
                f"unknown command '{args[0]}'; commands: {', '.join(COMMANDS)} (lit-rag --help)"
            )
        if args[:1] == ["plugins"]:
            plugins_parser().parse_args(args[1:])  # --help, or an error for any argument
            print_plugins()
            return
        if args[:1] == ["index"]:
            from lit_rag.index_cli import main as index_main

            try:
                index_main(args[1:])
            except ValueError as exc:  # index mismatch, data without gold passages, bad option
                raise RecipeError(str(exc)) from exc
            return
        if args[:1] == ["report"]:
            from lit_rag.report import main as report_main

            report_main(args[1:])
            return
        if args[:1] == ["export"]:
            from lit_rag.export import main as export_main

            export_main(args[1:])
            return
        if args[:1] == ["evaluate"]:
            from lit_rag.evaluate import main as evaluate_main

            evaluate_main(args[1:])
            return
        if args[:1] == ["compare"]:
            from lit_rag.compare import main as compare_main

            compare_main(args[1:])
            return
        if args[:1] == ["data"]:
            from lit_rag.prepare import main as data_main

            data_main(args[1:])
            return
        build_cli(args)
    except argparse.ArgumentError as exc:  # jsonargparse: unknown key, wrong type
        command = args[0] if args and args[0] in ("fit", "validate", "test") else ""
        print(
            f"lit-rag: error: {_argument_message(exc)} (options: lit-rag {command} --help)".replace(
                "  ", " "
            ),
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    except (InputError, FileNotFoundError) as exc:
        print(f"lit-rag: error: {_one_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    except CollectiveError as exc:  # a hang or a lost rank: not the user's input, exit 1
        print(f"lit-rag: error: {_one_line(exc)}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except Exception as exc:  # e.g. a logger's own write failing as the run stops on a full disk
        missing = _missing_vllm(exc)
        if missing is not None:
            print(f"lit-rag: error: {missing}", file=sys.stderr)
            raise SystemExit(2) from None
        full = next((e for e in chain(exc) if isinstance(e, DiskFullError)), None)
        if full is None:
            raise
        print(f"lit-rag: error: {_one_line(full)}", file=sys.stderr)
        raise SystemExit(2) from None
    except SystemExit as exc:
        if _stopped_by_sigterm(exc):  # Lightning exits 0 there; a scheduler must see the signal
            raise SystemExit(128 + 15) from None
        raise


def _missing_vllm(exc: BaseException) -> str | None:
    """The vllm engine's install hint with the import error under it (``No module named
    'vllm'``, or what a broken vLLM install raised), when ``exc`` comes from vLLM not importing."""
    if "lit_rag.plugins.engines.vllm_support" not in sys.modules:
        return None
    from lit_rag.plugins.engines.vllm_support import INSTALL_HINT

    for error in chain(exc):
        if isinstance(error, ImportError) and str(error) == INSTALL_HINT:
            cause = error.__cause__
            return f"{INSTALL_HINT} ({_one_line(cause)})" if cause is not None else INSTALL_HINT
    return None


def _stopped_by_sigterm(exc: SystemExit) -> bool:
    """Whether Lightning stopped the run on a SIGTERM (``SIGTERMException``, a ``SystemExit``
    with no code); :class:`~lit_rag.callbacks.PreemptionCheckpoint` saved a checkpoint first."""
    if "lightning" not in sys.modules:
        return False
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    return isinstance(exc, SIGTERMException)


def entry() -> None:
    """The ``lit-rag`` console command: :func:`main`, trainer commands under tcmalloc
    (:mod:`lit_rag.preload`)."""
    from lit_rag import console
    from lit_rag.preload import reexec_with_tcmalloc

    if not console.split_verbose(sys.argv[1:])[1]:
        os.environ.setdefault(
            "TORCH_CPP_LOG_LEVEL", "ERROR"
        )  # read when torch loads: before the re-exec
    reexec_with_tcmalloc()
    main()


if __name__ == "__main__":
    main()
