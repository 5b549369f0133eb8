"""Several training processes: the collective timeout, CPU strategies, and the one line a run
ends with when a collective fails (docs/DESIGN.md, "Scale").

A collective (a broadcast, a barrier, an all-reduce) returns only when every rank has joined
it. A rank that never joins (it crashed, it hangs, or it took a branch the others did not) would
leave the others waiting forever; torch's process group gives up after its timeout, which
lit-rag sets from the recipe's ``collective_timeout`` (seconds), by default:

- CPU, 300 s. The wait at a collective is the time the ranks are out of step: one rank's
  rollout or validation running longer than another's, or rank zero writing a checkpoint while
  the others wait at the barrier. On the shipped CPU recipes a whole training step takes under
  a minute (SmolLM2-135M, 2 cores), so 300 s is five such steps of slack.
- GPU, 900 s. Paper recipes roll out long multi-turn episodes on 7B models (the ranks' episodes
  end minutes apart), each rank starts its own vLLM (CUDA graph capture), and a full checkpoint
  gathered and written by rank zero can be ~100 GB (weights and Adam state), two to three
  minutes at 0.5-1 GB/s. 900 s covers these with margin and is half torch's default of 1800 s.

torch uses the same timeout for the ranks' rendezvous when the run starts, so it also bounds how
much later than the first process the last one may start.

When a collective times out or loses its peer, :func:`collective_failure` reads the exception's
traceback for the operation and the code that called it, and :class:`CollectiveError` carries the
one line the ``lit-rag`` command prints (exit 1).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from lit_rag.errors import chain

#: seconds a collective may wait for the other ranks (see the module docstring)
DEFAULT_TIMEOUT_S = {"cpu": 300.0, "gpu": 900.0}

#: strategies Lightning takes on CUDA only, and lit-rag's CPU subclasses of them
_CPU_CLASSES = {
    "fsdp": "lit_rag.models.cpu_strategies.CPUFSDP",
    "deepspeed": "lit_rag.models.cpu_strategies.CPUDeepSpeed",
}

#: texts of the errors torch's gloo and NCCL backends raise for a failed collective
_MARKERS = (
    "Timed out waiting",
    "Connection reset by peer",
    "Connection closed by peer",
    "gloo/transport",
    "Watchdog caught collective operation timeout",
    "NCCL communicator was aborted",
)


class CollectiveError(RuntimeError):
    """A collective timed out or lost a rank; the message is the one line the user sees."""


def default_timeout(accelerator: str) -> float:
    """:data:`DEFAULT_TIMEOUT_S` for a resolved accelerator name (``cpu``, ``cuda``, ``gpu``)."""
    return DEFAULT_TIMEOUT_S["cpu" if accelerator == "cpu" else "gpu"]


def cpu_strategy(strategy: Any) -> dict | None:
    """The ``class_path`` config of lit-rag's CPU subclass for a strategy name Lightning accepts
    on CUDA only (``fsdp``, ``deepspeed_stage_2``, ...), with the init arguments Lightning's
    registry gives that name; None for any other strategy (``ddp``, an instance, a class)."""
    if not isinstance(strategy, str):
        return None
    from lightning.pytorch.strategies import StrategyRegistry

    entry = dict.get(StrategyRegistry, strategy)  # its record; StrategyRegistry.get builds one
    if entry is None:
        return None
    base = getattr(entry["strategy"], "strategy_name", None)
    if base not in _CPU_CLASSES:
        return None
    init_args = {"process_group_backend": "gloo", **entry["init_params"]}
    return {"class_path": _CPU_CLASSES[base], "init_args": init_args}


def set_timeout(strategy: Any, seconds: float) -> bool:
    """Give a distributed strategy's process group ``seconds`` of timeout (before it starts);
    False for a strategy without one (a single device).

    Lightning's DDP, FSDP and DeepSpeed strategies take ``timeout`` in their constructor and
    keep it as ``_timeout`` until ``setup_distributed`` hands it to ``init_process_group``; a
    recipe names the strategy as a string, so the built strategy's value is set here."""
    if not hasattr(strategy, "_timeout"):
        return False
    strategy._timeout = timedelta(seconds=seconds)
    return True


@dataclass(frozen=True)
class Failure:
    """What a failed collective's exception says: ``timed_out`` (else a rank went away),
    ``operation`` (``broadcast_object_list``) and ``caller`` (``trainer.log_dir``)."""

    timed_out: bool
    operation: str
    caller: str
    detail: str


def collective_failure(exc: BaseException) -> Failure | None:
    """The failed collective behind ``exc`` (or an exception it was raised from), else None."""
    import torch.distributed as dist

    dist_error = getattr(dist, "DistError", ())
    for error in chain(exc):
        text = " ".join(str(error).split())
        if not (isinstance(error, dist_error) or any(m in text for m in _MARKERS)):
            continue
        timed_out = "timed out" in text.lower() or "timeout" in text.lower()
        operation, caller = _operation(error)
        detail = text.split("] ", 1)[-1][:160]  # gloo's messages open with a source path
        return Failure(timed_out, operation, caller, detail)
    return None


def _operation(error: BaseException) -> tuple[str, str]:
    """The outermost ``torch.distributed`` function in the traceback and the code that called it
    (past Lightning's strategy wrappers); a collective torch runs from C++ (DDP's gradient
    all-reduce in ``backward``) has none: then the deepest Python frame."""
    frames = traceback.extract_tb(error.__traceback__)
    for i, frame in enumerate(frames):
        if "torch/distributed/" not in frame.filename.replace("\\", "/"):
            continue
        operation = next(
            (f.name for f in frames[i:] if f.filename.endswith("distributed_c10d.py")), frame.name
        )
        callers = [f for f in frames[:i] if not _wrapper(f.filename)]
        return operation, (_where(callers[-1]) if callers else "")
    if frames:
        return f"a collective inside {frames[-1].name}", _where(frames[-1])
    return "a collective", ""


def _wrapper(filename: str) -> bool:
    path = filename.replace("\\", "/")
    return any(
        part in path
        for part in ("/lightning/fabric/", "/lightning/pytorch/strategies/", "/deepspeed/comm/")
    )


def _where(frame: traceback.FrameSummary) -> str:
    module = frame.filename.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
    return f"{module}.{frame.name}"


def failure_line(
    failure: Failure, rank: int, world_size: int, step: int, timeout_s: float | None
) -> str:
    """The one line: which rank, at which step, in which operation, and what to do."""
    where = f"rank {rank} of {world_size} at step {step}"
    operation = failure.operation + (f" (from {failure.caller})" if failure.caller else "")
    if failure.timed_out:
        limit = f"collective_timeout {timeout_s:g} s" if timeout_s else "the process-group timeout"
        return (
            f"{where}: {operation} timed out waiting for the other ranks ({limit}): a rank "
            f"hangs, crashed or took another branch; if the run is only slow, raise it with "
            f"--collective_timeout=SECONDS"
        )
    return (
        f"{where}: {operation} failed: another rank stopped or closed its connection "
        f"({failure.detail}); its output says why"
    )
