"""What a run's console shows: the run and its errors, not the messages third-party libraries
print on every run by design.

``lit-rag`` calls :func:`quiet` before anything heavy is imported, unless ``--verbose`` is on
the command line or ``LIT_RAG_VERBOSE=1`` is set: then everything shows. Silenced, each seen on
every quickstart run and none the user's to act on:

- vLLM's start-up warnings (Triton absent on CPU, eager mode, Intel OpenMP not preloaded, the V1
  runner, the raw-prompt deprecation): ``VLLM_LOGGING_LEVEL=ERROR``;
- torch's C++ "NUMA binding" warning from vLLM's CPU worker: ``TORCH_CPP_LOG_LEVEL=ERROR`` (read
  when torch loads: ``lit-rag`` sets it before it re-executes itself under tcmalloc);
- Python warnings matching :data:`NOISE` (Lightning's advice for multi-process logging and
  manual-optimization checkpoints, deprecations inside vLLM and Lightning);
- Lightning's tip to install litlogger, which preceded every one-line error too, and its
  "Detected KeyboardInterrupt" line (Ctrl-C ends any command with ``lit-rag: interrupted``);
- bitsandbytes' and DeepSpeed's notices below ERROR ("Setting accelerator to CPU", on every CPU
  run where DeepSpeed is installed).

A variable the user set wins (``setdefault``); errors always show, and so do lit-rag's own
warnings.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

#: Start of the Python warnings every run triggers by design (``warnings.filterwarnings``
#: matches a message's start).
NOISE = (
    r"`torch\.distributed\.reduce_op` is deprecated",  # vLLM's triton_utils
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning's _pytree
    r"It is recommended to use `self\.log\(",  # Lightning: sync_dist advice (one process here)
    # the checkpoint holds the post-step state, as meant
    r"Using ModelCheckpoint with manual optimization",
    r"Precision .* is not supported by the model summary",  # Lightning's summary estimate
    r"The number of training batches .* is smaller than the logging interval",
)
VERBOSE_FLAG = "--verbose"


#: the values ``--verbose`` may take (``--verbose false``, ``--verbose=true``), as booleans
VERBOSE_VALUES = {"true": True, "false": False}


def split_verbose(args: list[str]) -> tuple[list[str], bool]:
    """``args`` without ``--verbose`` (alone, or with ``true`` / ``false``, also after ``=``),
    and whether everything should show (the flag, or ``LIT_RAG_VERBOSE=1`` unless the flag
    says false)."""
    loud = os.environ.get("LIT_RAG_VERBOSE", "") not in ("", "0")
    rest: list[str] = []
    i = 0
    while i < len(args):
        key, eq, value = args[i].partition("=")
        if key != VERBOSE_FLAG or (eq and value.lower() not in VERBOSE_VALUES):
            rest.append(args[i])  # --verbose=maybe: the command's parser says what is wrong
        elif eq:
            loud = VERBOSE_VALUES[value.lower()]
        elif i + 1 < len(args) and args[i + 1].lower() in VERBOSE_VALUES:
            loud = VERBOSE_VALUES[args[i + 1].lower()]
            i += 1
        else:
            loud = True
        i += 1
    return rest, loud


class _ErrorsOnly(logging.Filter):
    """Keeps ERROR and above: a filter on the logger object outlives the ``setLevel`` a library
    makes when it configures its own logger at import (DeepSpeed sets WARNING, and its
    accelerator detection warns on every CPU run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


class _NoTip(logging.Filter):
    """Drops Lightning's "Tip:" records (an advertisement, on every run) and its "Detected
    KeyboardInterrupt" line (``lit-rag`` says ``lit-rag: interrupted`` itself)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "Tip:" not in message and "Detected KeyboardInterrupt" not in message


def quiet() -> None:
    """Silence what every run prints by design (see the module docstring)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    # transformers' "Loading weights" bar at every model load (read when transformers is
    # imported; one already imported is told directly)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("LIT_RAG_LOAD_PROGRESS", "0")  # and vLLM's (the vllm engine reads it)
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()
    for pattern in NOISE:
        warnings.filterwarnings("ignore", message=pattern)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoTip) for f in logger.filters):
            logger.addFilter(_NoTip())
    # a filter sees only what its own logger logs, not its children's: these log from child
    # loggers (bitsandbytes.backends.cpu.ops), or before vLLM configures its own (Triton's line)
    for name in ("bitsandbytes", "vllm.triton_utils.importing"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for name in ("bitsandbytes", "deepspeed", "DeepSpeed"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _ErrorsOnly) for f in logger.filters):
            logger.addFilter(_ErrorsOnly())
