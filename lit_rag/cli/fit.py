"""``lit-rag fit`` (validate, test): Lightning's CLI with lit-rag's input rules.

:class:`LitRagCLI` reports bad input in one line (:class:`~lit_rag.errors.InputError`), checks
``--ckpt_path`` before anything is built and never takes settings from a checkpoint, checks the
settings that depend on the number of processes before any starts, and gives every run the
callbacks and timeouts it needs. :func:`build_cli` builds it over :class:`PolicyModule` and
:class:`QADataModule`, with the recipe and the command line rewritten first
(:mod:`lit_rag.cli.recipe_args`).

Lightning is imported here at the top: only the trainer commands (and compare, evaluate,
export, which build the same CLI) import this module, so ``lit-rag --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

from lit_rag.cli.help import DESCRIPTION, TRAINER_COMMANDS, TRAINER_HELP
from lit_rag.cli.recipe_args import (
    RecipeError,
    argument_message,
    names_module_class,
    one_line,
    resolve_args,
)
from lit_rag.cli.wording import TrainerParser, reword
from lit_rag.errors import InputError
from lit_rag.models.distributed import CollectiveError, collective_failure, failure_line


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
        """Lightning's Trainer commands that lit-rag runs (:data:`TRAINER_COMMANDS`), each
        without the Trainer method's ``verbose``: ``--verbose`` is lit-rag's own option (the
        warnings of third-party libraries; validate and test always print their results)."""
        commands = LightningCLI.subcommands()
        return {name: commands[name] | {"verbose"} for name in TRAINER_COMMANDS}

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs):
        """Lightning's parser of ``subcommand``, with lit-rag's group titles and texts."""
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        reword(parser, subcommand, policy=not self.subclass_mode_model)
        return parser

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict:
        """The Trainer method's arguments, with ``--ckpt_path last`` found on disk."""
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        if kwargs.get("ckpt_path") == "last":
            kwargs["ckpt_path"] = resolve_last(self.trainer, subcommand)
        return kwargs

    def _parse_ckpt_path(self) -> None:
        """Check ``--ckpt_path`` before anything is built; never take settings from it.

        Lightning's version loads the checkpoint here and parses its ``hyper_parameters``
        into the config, so a ``class_path`` written in a downloaded checkpoint would choose
        what gets imported. A checkpoint is data: the recipe is the only config, and the
        weights load later through the trainer (``weights_only``, see lit_rag.checkpoints.storage).
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
            "operation (default: 300 on CPU, 900 on GPUs; lit_rag/models/distributed.py)",
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
            raise RecipeError(argument_message(exc)) from None

    def _run_subcommand(self, subcommand: str) -> None:
        with run_errors(self.trainer, self._collective_timeout):
            super()._run_subcommand(subcommand)

    def after_instantiate_classes(self) -> None:
        self._collective_timeout = prepare_run(
            self.trainer,
            self.model,
            self.datamodule,
            self._command_config().get("collective_timeout"),
        )


def prepare_run(trainer, module, datamodule, timeout_s: float | None) -> float | None:
    """What ``lit-rag fit`` (validate, test) does to the objects it built, before it runs them:
    checkpoint files a kill cannot break, the settings that depend on the number of processes
    checked (:func:`check_scale`), the callbacks of every run (:func:`add_run_callbacks`) and
    the collective timeout (``timeout_s``, None: the accelerator's default); returns the
    timeout set (None for a single process). Doing it twice changes nothing (the Python entry
    points, lit_rag/recipe.py, call it on objects built in Python too)."""
    from lit_rag.checkpoints.storage import use_atomic_checkpoints

    use_atomic_checkpoints(trainer)
    check_scale(trainer, module, datamodule)
    add_run_callbacks(trainer)
    return collective_timeout(trainer, timeout_s)


@contextmanager
def run_errors(trainer, timeout_s: float | None) -> Iterator[None]:
    """Around a Trainer's fit, validate or test: the errors a user can act on as one line.

    Lightning checks ``val_check_interval`` against the epoch's batches once the data is read,
    with a ValueError: a recipe error (:class:`RecipeError`). A collective that timed out or lost
    a rank: :class:`~lit_rag.models.distributed.CollectiveError`. Anything else as it was.
    """
    try:
        yield
    except ValueError as exc:
        if "`val_check_interval`" not in str(exc):
            raise
        raise RecipeError(f"trainer.val_check_interval: {one_line(exc)}") from None
    except Exception as exc:
        raise_collective_failure(exc, trainer, timeout_s)
        raise


def add_run_callbacks(trainer) -> None:
    """What every run gets unless its recipe lists its own: :class:`PreemptionCheckpoint` (a
    SIGTERM saves a checkpoint, then exits), :class:`RunHeader` (what runs, where it writes),
    :class:`HealthMonitor` (the run-health detectors, with their default thresholds), and
    :class:`RunProgressBar` in place of Lightning's default rich bar (which reads "Epoch 0/-2"
    when ``max_steps`` ends the run; any other bar stays)."""
    from lightning.pytorch.callbacks import RichProgressBar

    from lit_rag.callbacks import HealthMonitor, PreemptionCheckpoint, RunHeader, RunProgressBar

    for kind in (PreemptionCheckpoint, RunHeader, HealthMonitor):
        if not any(isinstance(c, kind) for c in trainer.callbacks):
            trainer.callbacks.append(kind())
    for index, callback in enumerate(trainer.callbacks):
        if type(callback) is RichProgressBar:
            trainer.callbacks[index] = RunProgressBar()


def use_cpu_strategy(trainer: dict) -> None:
    """``trainer.strategy: fsdp`` (or ``deepspeed_stage_2``, ...) on CPU processes: lit-rag's CPU
    subclass of the strategy (lit_rag/models/cpu_strategies.py); Lightning takes it on CUDA
    only. ``trainer`` is the parsed recipe's trainer section, rewritten in place."""
    from jsonargparse import Namespace

    from lit_rag.models.distributed import cpu_strategy

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
    its accelerator (lit_rag/models/distributed.py); the value set, None for a single process."""
    from lightning.pytorch.accelerators import CPUAccelerator

    from lit_rag.models.distributed import default_timeout, set_timeout

    if seconds is None:
        seconds = default_timeout(
            "cpu" if isinstance(trainer.accelerator, CPUAccelerator) else "gpu"
        )
    return seconds if set_timeout(trainer.strategy, seconds) else None


def raise_collective_failure(exc: BaseException, trainer, timeout_s: float | None) -> None:
    """Raise :class:`~lit_rag.models.distributed.CollectiveError` (one line) when ``exc`` is a
    failed collective; return otherwise."""
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

    from lit_rag.plugins.engines.vllm.ranks import check_tensor_parallel
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

    ``last`` (found when the run starts, :func:`resolve_last`), Lightning's ``hpc`` (SLURM's
    requeue) and URLs pass through; ``best`` and ``registry`` are refused: each lit-rag command
    is a new process, with no earlier fit that ranked its checkpoints, and checkpoints are files.
    """
    import zipfile

    from lit_rag.checkpoints.storage import check_checkpoint_file

    if path in ("last", "hpc") or "://" in path:
        return
    if path == "best" or path.startswith("registry"):
        raise InputError(
            f"--ckpt_path {path} is not offered: give a checkpoint file "
            "(runs/NAME/version_N/checkpoints/last.ckpt) or last, the newest checkpoint of "
            "the recipe's runs; lit-rag compare scores several checkpoints side by side"
        )
    check_checkpoint_file(path)  # missing, a folder, empty
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive, its directory at the end
        raise InputError(
            f"checkpoint {path} is truncated or not a torch checkpoint "
            f"({Path(path).stat().st_size} bytes, no zip directory at its end)"
        )


def resolve_last(trainer, command: str) -> str | None:
    """``--ckpt_path last``: the newest whole ``.ckpt`` file in the recipe's checkpoint folders
    (a checkpoint callback's ``dirpath``; else the first logger's ``SAVE_DIR/NAME/*/checkpoints``;
    else ``DEFAULT_ROOT_DIR/checkpoints``): ``last.ckpt`` where the recipe saves one, else the
    latest step's (Lightning's own ``last`` finds ``last.ckpt`` files of the run in this process
    only). None for ``fit`` when there is none yet (training starts from the beginning, said in
    one line).

    Raises:
        InputError: ``validate`` or ``test`` and no checkpoint found.
    """
    import zipfile

    from lightning.pytorch.callbacks import ModelCheckpoint

    folders = [
        Path(c.dirpath)
        for c in trainer.checkpoint_callbacks
        if isinstance(c, ModelCheckpoint) and c.dirpath is not None
    ]
    where = ", ".join(str(f) for f in folders)
    if not folders and trainer.loggers:  # save_dir and name: no collective (log_dir is one)
        logger = trainer.loggers[0]
        root = Path(logger.save_dir or trainer.default_root_dir) / str(logger.name or "")
        folders, where = sorted(root.glob("*/checkpoints")), f"{root}/*/checkpoints"
    elif not folders:
        folders = [Path(trainer.default_root_dir) / "checkpoints"]
        where = str(folders[0])
    dated = [
        (path.stat().st_mtime, str(path))
        for folder in folders
        for path in folder.glob("*.ckpt")
        if zipfile.is_zipfile(path)  # a whole file: not a sharded folder, not a cut-off one
    ]
    if dated:
        return max(dated)[1]
    if command != "fit":
        raise InputError(
            f"--ckpt_path last: no checkpoint in {where}; train first (lit-rag fit) "
            "or give a checkpoint file"
        )
    if trainer.global_rank == 0:
        print(
            f"lit-rag: --ckpt_path last: no checkpoint in {where} yet; training starts "
            "from the beginning",
            file=sys.stderr,
        )
    return None


#: parser settings for the main parser and each subcommand's: errors raise (printed as one line
#: by ``lit_rag.cli.commands.main``) and options must be spelled out (``--trainer.max_step`` is not
#: ``max_steps``)
_PARSER_KWARGS = {"default_env": False, "exit_on_error": False, "allow_abbrev": False}


def build_cli(args: list[str], run: bool = True):
    """The LightningCLI over :class:`PolicyModule` and :class:`QADataModule`.

    A recipe whose ``model`` (and ``data``) name a ``class_path`` runs any LightningModule and
    LightningDataModule instead (the EVO-RAG reward model recipe does).
    """
    from lit_rag.data.datamodule import QADataModule
    from lit_rag.trainer.policy import PolicyModule

    parser_kwargs = {
        **_PARSER_KWARGS,
        "prog": "lit-rag",
        "description": DESCRIPTION,
    }
    for name in TRAINER_COMMANDS:
        parser_kwargs[name] = {
            **_PARSER_KWARGS,
            "usage": f"lit-rag {name} --config RECIPE [--KEY=VALUE ...]",
            "description": TRAINER_HELP[name],
        }
    if names_module_class(args):
        return LitRagCLI(
            LightningModule,
            LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=resolve_args(args),
            run=run,
            save_config_kwargs={"overwrite": True},
            parser_kwargs=parser_kwargs,
            parser_class=TrainerParser,
        )
    return LitRagCLI(
        PolicyModule,
        QADataModule,
        args=resolve_args(args),
        run=run,
        auto_configure_optimizers=False,
        save_config_kwargs={"overwrite": True},
        parser_kwargs=parser_kwargs,
        parser_class=TrainerParser,
    )
