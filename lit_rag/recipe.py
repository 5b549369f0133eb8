"""lit-rag from Python: ``lit-rag fit`` (validate, test) from a script or a notebook.

:func:`fit`, :func:`validate` and :func:`test` run a recipe as the command does, with overrides
as a mapping (``{"trainer.max_steps": 4}`` for ``--trainer.max_steps=4``); :func:`build` builds
the recipe's objects and runs nothing, so they can be looked at or changed first; :class:`Run`
also takes a Trainer, a module and data built in Python.

A recipe goes through the command's own code (:func:`lit_rag.cli.fit.build_cli`): registered
plugin names, renamed keys, ``precision: auto``, the hf fallback for vLLM, the seed, the callbacks,
logger and run folder, checkpoint files a kill cannot break, the checks of ``--ckpt_path`` and of
the settings that depend on the number of processes. The same recipe and seed log the same
metrics from Python as from the shell (``tests/cli/test_python_api.py``).

Bad input raises :class:`~lit_rag.errors.InputError` with the line the command prints after
``lit-rag: error:``; nothing exits the process or reads ``sys.argv``, and each call builds
everything anew, so calls can repeat in one process. A Ctrl-C (a notebook's interrupt) stops a
call with ``KeyboardInterrupt`` and leaves Ctrl-C working for the next one.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lit_rag.errors import InputError, chain

if TYPE_CHECKING:
    from lightning.pytorch import LightningDataModule, LightningModule, Trainer

__all__ = ["Run", "build", "fit", "test", "validate"]


class Run:
    """A Trainer, the module it trains and its data, set up as ``lit-rag fit`` sets up a run.

    :func:`build` and :func:`fit` make one from a recipe; from objects built in Python::

        run = Run(Trainer(max_steps=2), PolicyModule(...), QADataModule(...))
        run.fit()
        print(run.metrics["reward/total"])

    Setting up adds what every ``lit-rag`` run gets (:func:`lit_rag.cli.fit.prepare_run`):
    checkpoint files a kill cannot break; the callbacks a run has unless it lists its own
    (a checkpoint on SIGTERM, the run header, run health, lit-rag's progress bar); the global
    batch checked against the number of processes; the collective timeout. The Trainer's
    strategy is used as given (a recipe's ``strategy: fsdp`` on CPU becomes lit-rag's CPU
    strategy only through :func:`build`).

    Args:
        trainer: The Lightning Trainer that runs.
        model: The LightningModule (:class:`~lit_rag.trainer.policy.PolicyModule`, or any).
        datamodule: Its data (:class:`~lit_rag.data.datamodule.QADataModule`, or any).
        collective_timeout: Seconds a collective waits for the other processes before the run
            ends with one line (None: 300 on CPU, 900 on GPUs).

    Raises:
        InputError: A setting that does not fit the Trainer's number of processes.
    """

    def __init__(
        self,
        trainer: Trainer,
        model: LightningModule,
        datamodule: LightningDataModule | None = None,
        collective_timeout: float | None = None,
    ) -> None:
        from lit_rag.cli.fit import prepare_run

        self.trainer, self.model, self.datamodule = trainer, model, datamodule
        with _input_errors("fit"):
            self._timeout = prepare_run(trainer, model, datamodule, collective_timeout)

    def fit(self, ckpt_path: str | None = None) -> Run:
        """Train, as ``lit-rag fit`` does; ``ckpt_path`` resumes from a checkpoint (a file,
        ``last`` or ``best``). Returns this run (its :attr:`metrics`, :attr:`log_dir`)."""
        self._call("fit", ckpt_path)
        return self

    def validate(self, ckpt_path: str | None = None) -> list[dict[str, float]]:
        """Validate the module's current weights, or those of the checkpoint ``ckpt_path``, as
        ``lit-rag validate`` does: the metrics of each validation set."""
        return _floats(self._call("validate", ckpt_path))

    def test(self, ckpt_path: str | None = None) -> list[dict[str, float]]:
        """Test the module's current weights, or those of the checkpoint ``ckpt_path``, as
        ``lit-rag test`` does: the metrics of each test set."""
        return _floats(self._call("test", ckpt_path))

    @property
    def metrics(self) -> dict[str, float]:
        """The last value of each metric the run logged (the Trainer's ``callback_metrics``)."""
        return {
            key: float(value)
            for key, value in self.trainer.callback_metrics.items()
            if getattr(value, "numel", lambda: 1)() == 1
        }

    @property
    def log_dir(self) -> str | None:
        """The folder the run's logger writes (``metrics.csv``, ``config.yaml``)."""
        return self.trainer.log_dir

    def _call(self, command: str, ckpt_path: str | None) -> Any:
        from lit_rag.cli.fit import check_ckpt_path, resolve_last, run_errors

        with _input_errors(command), _interrupts():
            if ckpt_path:
                check_ckpt_path(ckpt_path)
            if ckpt_path == "last":  # the newest checkpoint of the recipe's runs, as the command
                ckpt_path = resolve_last(self.trainer, command)
            with run_errors(self.trainer, self._timeout):
                method = getattr(self.trainer, command)
                return method(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path)


def build(recipe: str | Path, overrides: Mapping[str, Any] | None = None) -> Run:
    """The objects ``lit-rag fit --config RECIPE --KEY=VALUE ...`` builds, nothing run yet.

    Args:
        recipe: A recipe file (``recipes/quickstart.yaml``).
        overrides: Recipe keys as the command line spells them, without the dashes, and their
            values: ``{"trainer.max_steps": 4, "model.optimizer.lr": 5e-4, "model.engine":
            "hf"}``. A value is a string as typed on the command line, or a number, bool,
            None, list or dict (written as JSON).

    Raises:
        InputError: The recipe or an override cannot be used; the message is the line the
            command prints.
    """
    return _build(recipe, overrides, "fit", None)


def fit(
    recipe: str | Path,
    overrides: Mapping[str, Any] | None = None,
    ckpt_path: str | None = None,
) -> Run:
    """``lit-rag fit --config RECIPE [--ckpt_path CKPT] --KEY=VALUE ...``: build the recipe's
    objects (:func:`build`) and train. ``ckpt_path`` resumes from a checkpoint. Returns the
    finished :class:`Run` (its Trainer, module, data, :attr:`Run.metrics`)."""
    return _build(recipe, overrides, "fit", ckpt_path).fit(ckpt_path)


def validate(
    recipe: str | Path,
    overrides: Mapping[str, Any] | None = None,
    ckpt_path: str | None = None,
) -> list[dict[str, float]]:
    """``lit-rag validate --config RECIPE [--ckpt_path CKPT] --KEY=VALUE ...``: the metrics of
    each validation set, for the checkpoint ``ckpt_path`` or the untrained policy."""
    return _build(recipe, overrides, "validate", ckpt_path).validate(ckpt_path)


def test(
    recipe: str | Path,
    overrides: Mapping[str, Any] | None = None,
    ckpt_path: str | None = None,
) -> list[dict[str, float]]:
    """``lit-rag test --config RECIPE [--ckpt_path CKPT] --KEY=VALUE ...``: the metrics of each
    test set, for the checkpoint ``ckpt_path`` or the untrained policy."""
    return _build(recipe, overrides, "test", ckpt_path).test(ckpt_path)


def _build(
    recipe: str | Path,
    overrides: Mapping[str, Any] | None,
    command: str,
    ckpt_path: str | None,
) -> Run:
    """The recipe's objects as ``lit-rag COMMAND`` builds them; ``ckpt_path`` checked first,
    as the command checks it before anything is built."""
    from lit_rag.cli import console

    # before torch loads (it reads TORCH_CPP_LOG_LEVEL then); LIT_RAG_VERBOSE=1 shows everything
    if not console.split_verbose([])[1]:
        console.quiet()
    from lit_rag.cli.fit import build_cli, check_ckpt_path

    with _input_errors(command):
        if ckpt_path:
            check_ckpt_path(ckpt_path)
        cli = build_cli(["--config", str(recipe), *override_args(overrides)], run=False)
    return Run(
        cli.trainer,
        cli.model,
        cli.datamodule,
        collective_timeout=cli.config.get("collective_timeout"),
    )


def override_args(overrides: Mapping[str, Any] | None) -> list[str]:
    """``overrides`` as command-line options: ``{"trainer.max_steps": 4}`` ->
    ``["--trainer.max_steps=4"]``; a string as it is, any other value as JSON (which YAML
    reads: ``true``, ``null``, ``[1, 2]``).

    Raises:
        InputError: A key that is not a string, or a value JSON cannot write.
    """
    args = []
    for key, value in (overrides or {}).items():
        if not isinstance(key, str) or not key.strip("-"):
            raise InputError(
                f"overrides: a key is a recipe key such as 'trainer.max_steps', got {key!r}"
            )
        if not isinstance(value, str):
            try:
                value = json.dumps(value)
            except (TypeError, ValueError):
                raise InputError(
                    f"overrides: {key} takes what a command line can spell (a string, number, "
                    f"bool, None, list or dict), got a {type(value).__name__}"
                ) from None
        args.append(f"--{key.lstrip('-')}={value}")
    return args


def _floats(results: list[dict[str, Any]]) -> list[dict[str, float]]:
    return [{key: float(value) for key, value in metrics.items()} for metrics in results]


@contextmanager
def _input_errors(command: str) -> Iterator[None]:
    """Errors the user can fix as :class:`InputError` with the line ``lit-rag COMMAND`` prints
    (:func:`lit_rag.cli.commands.error_line`); an InputError stays as raised, any other error
    (a failed collective included) keeps its type and traceback."""
    from lit_rag.cli.commands import error_line

    try:
        yield
    except InputError:
        raise
    except Exception as exc:
        found = error_line(exc, [command])
        if found is None or found[1] != 2:
            raise
        raise InputError(found[0]) from None


@contextmanager
def _interrupts() -> Iterator[None]:
    """Lightning answers Ctrl-C by ignoring SIGINT from then on and exiting the process; here the
    call ends with ``KeyboardInterrupt`` and the SIGINT handler from before the call is back."""
    handler = signal.getsignal(signal.SIGINT)
    try:
        yield
    except SystemExit as exc:
        if not any(isinstance(e, KeyboardInterrupt) for e in chain(exc)):
            raise
        if handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, handler)
        raise KeyboardInterrupt from None
