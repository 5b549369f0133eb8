"""The ``hf`` rollout engine in place of ``vllm`` where vLLM cannot be installed.

A recipe that names ``engine: vllm`` runs on macOS (there is no vLLM build for it) and where the
user installed without vLLM (``LIT_RAG_NO_VLLM=1``, as ``scripts/install.sh`` takes it): the
CLI rewrites the engine to ``hf`` before jsonargparse parses and says so in one line. The vllm
engine's options that ``hf`` does not take (``kv_cache_gib``, ``dtype``, ...) are dropped: none
has a counterpart there. Elsewhere a missing vLLM stays an error (one line, see
``lit_rag.cli.commands``): on Linux it is an install step left out, not a platform without vLLM.

Whether vLLM is installed is asked of the import system (``importlib.util.find_spec``), which
imports nothing: vLLM's import takes seconds and the engine does it when it first generates.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from typing import Any

import yaml

from lit_rag import registry


def vllm_installed() -> bool:
    """Whether a ``vllm`` package can be found (not imported)."""
    return importlib.util.find_spec("vllm") is not None


def missing_vllm_reason() -> str | None:
    """Why recipes must roll out with ``hf`` here: vLLM is not installed, on macOS or with
    ``LIT_RAG_NO_VLLM=1``. None where vLLM is installed, or missing where it should not be."""
    if vllm_installed():
        return None
    if sys.platform == "darwin":
        return "no vLLM build for macOS"
    if os.environ.get("LIT_RAG_NO_VLLM", "") == "1":
        return "LIT_RAG_NO_VLLM=1"
    return None


class HFFallback:
    """Rewrites a command line's recipes and overrides from the vllm engine to hf.

    Args:
        reason: Why vLLM is missing, for the line :meth:`announce` prints.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.vllm_path = registry.class_path("engine", "vllm")
        self.hf_path = registry.class_path("engine", "hf")
        hf = registry.load("engine", "hf")
        self.hf_options = set(inspect.signature(hf.__init__).parameters) - {"self"}
        self.replaced = False  # a vllm engine was rewritten
        self.last_is_vllm = False  # the engine named last on the command line was vllm

    def _engine(self, node: Any) -> Any:
        """An ``engine`` value (``{class_path, init_args}`` or a class path), hf for vllm."""
        if isinstance(node, str):
            self.last_is_vllm = node == self.vllm_path
            self.replaced |= self.last_is_vllm
            return self.hf_path if self.last_is_vllm else node
        if not isinstance(node, dict) or "class_path" not in node:
            return node
        self.last_is_vllm = node["class_path"] == self.vllm_path
        if not self.last_is_vllm:
            return node
        self.replaced = True
        init_args = node.get("init_args") or {}
        kept = {k: v for k, v in init_args.items() if k in self.hf_options}
        return {"class_path": self.hf_path, **({"init_args": kept} if kept else {})}

    def config(self, node: Any) -> Any:
        """A resolved recipe (plugin names already class paths) with every vllm engine hf."""
        if isinstance(node, list):
            return [self.config(item) for item in node]
        if not isinstance(node, dict):
            return node
        return {
            key: self._engine(value) if key == "engine" else self.config(value)
            for key, value in node.items()
        }

    def override(self, key: str, value: str) -> str | None:
        """A resolved ``--key=value`` override for the hf engine; None drops it (an option of
        the vllm engine that hf does not take)."""
        parts = key.lstrip("-").split(".")
        if parts[-1] == "engine" or parts[-2:] == ["engine", "class_path"]:
            if value.lstrip().startswith("{"):  # --model.engine={class_path: ..., init_args: ...}
                try:
                    parsed = yaml.safe_load(value)
                except yaml.YAMLError:
                    return value  # jsonargparse reports the malformed value
                return yaml.safe_dump(self._engine(parsed), default_flow_style=True).strip()
            return self._engine(value)
        if "engine" in parts[:-1] and parts[-2] == "init_args" and self.last_is_vllm:
            return value if parts[-1] in self.hf_options else None
        return value

    def announce(self) -> None:
        """One line, once per machine (the local rank 0 of a multi-process run), when the
        engine the command ends up with was rewritten."""
        if not (self.replaced and self.last_is_vllm):
            return
        if os.environ.get("LOCAL_RANK", "0") != "0":
            return
        print(
            f"lit-rag: vLLM is not installed ({self.reason}): rolling out with the hf engine",
            file=sys.stderr,
            flush=True,
        )


def hf_fallback() -> HFFallback | None:
    """The rewriter where recipes must roll out with hf instead of vllm, else None."""
    reason = missing_vllm_reason()
    return HFFallback(reason) if reason is not None else None
