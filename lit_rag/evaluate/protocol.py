"""The protocol of an evaluation: everything besides the model that decides a score (data
files, retriever, prompts, decoding, engine, versions), the model's own fingerprint, and how
records' protocols differ."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from lit_rag.files import sha256_file

#: weight files hashed for a model folder's fingerprint
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


def weights_fingerprint(path: Path) -> str:
    """SHA-256 of a weights file, or over a folder's weight files (names and contents)."""
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES):
        digest.update(f"{file.name}:{sha256_file(file)}\n".encode())
    return digest.hexdigest()


def model_entry(kind: str, path: str, name: str, module) -> dict:
    """A record's ``model``: its label and kind, the checkpoint's hash, the base model (its path
    and weights hash, or the tiny config), dtype, LoRA and quantization."""
    from lit_rag.models.facts import resolve_path

    config = module.policy_config
    entry: dict[str, Any] = {"label": name, "kind": kind}
    if kind == "checkpoint":
        entry["checkpoint"] = path
        entry["checkpoint_sha256"] = sha256_file(Path(path))
    if config.tiny is not None:
        entry["base"] = {"tiny": dataclasses.asdict(config.tiny)}
    else:
        resolved = resolve_path(config.path)
        base: dict[str, Any] = {"path": config.path}
        if isinstance(resolved, Path) and resolved.exists():
            base["weights_sha256"] = weights_fingerprint(resolved)
        entry["base"] = base
    entry["base"].update(
        dtype=config.dtype,
        lora=dataclasses.asdict(config.lora) if config.lora is not None else None,
        quantization=config.quantization,
    )
    return entry


def protocol(
    recipe: str, overrides: list[str], files: dict[str, Path], limit: int | None, cli
) -> dict:
    """Everything besides the model that decides a score (compared between records)."""
    import torch
    import transformers

    from lit_rag.version import build_version

    module, data = cli.model, cli.datamodule
    environment = module.environment
    engine = module.engine
    engine_info = {"class": _class_path(engine), "transformers": transformers.__version__}
    if "vllm" in sys.modules:
        engine_info["vllm"] = getattr(sys.modules["vllm"], "__version__", "?")
    return {
        "lit_rag": build_version(),
        "recipe": {"path": recipe, "sha256": sha256_file(Path(recipe))},
        "overrides": list(overrides),
        "datasets": {
            name: {"file": str(path), "sha256": sha256_file(path), "limit": limit}
            for name, path in files.items()
        },
        "environment": _class_path(environment),
        "retriever": _retriever(getattr(environment, "retriever", None)),
        "top_k": {
            key: getattr(environment, key)
            for key in ("top_k", "val_top_k", "val_top_t", "max_turns", "t_max", "max_iterations")
            if isinstance(getattr(environment, key, None), int)
        },
        "prompts": _prompts(environment),
        "max_references": data.max_references,
        "decoding": dataclasses.asdict(module.val_sampling),
        "answer_punctuation": module.val_em.punctuation,
        "engine": engine_info,
        "torch": torch.__version__,
    }


def _class_path(obj: Any) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def _retriever(retriever: Any) -> dict | None:
    if retriever is None:
        return None
    entry: dict[str, Any] = {"class": _class_path(retriever)}
    for key in ("index", "corpus", "encoder_path"):
        value = getattr(retriever, key, None)
        if isinstance(value, (str, Path)):
            entry[key] = str(value)
    manifest = getattr(retriever, "manifest", None)
    if manifest is not None and dataclasses.is_dataclass(manifest):
        entry["manifest"] = json.loads(json.dumps(dataclasses.asdict(manifest), default=str))
        entry["corpus_fingerprint"] = getattr(manifest, "corpus_fingerprint", None)
    parts = retriever.parts() if hasattr(retriever, "parts") else []
    if parts and parts != [retriever]:
        entry["parts"] = [_retriever(p) for p in parts]
    return entry


def _prompts(environment: Any) -> dict:
    """The environment's prompt texts (attributes named ``*prompt*`` / ``*template*``)."""
    out = {}
    for key, value in sorted(vars(environment).items()):
        if isinstance(value, str) and ("prompt" in key or "template" in key):
            out[key] = {"sha256": hashlib.sha256(value.encode()).hexdigest(), "text": value}
    return out


def protocol_differences(records: list[dict]) -> list[str]:
    """One line per protocol field whose value is not the same in every record."""
    flat = [_flatten(r.get("protocol", {})) for r in records]
    keys = sorted(set().union(*flat))
    lines = []
    for key in keys:
        values = [f.get(key, "(absent)") for f in flat]
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) > 1:
            shown = " vs ".join(_clip(v) for v in values)
            lines.append(f"protocol differs in {key}: {shown}")
    for dataset in sorted({d for r in records for d in r.get("questions", {})}):
        counts = [r.get("questions", {}).get(dataset) for r in records]
        if len(set(counts)) > 1:
            lines.append(f"questions differ on {dataset}: {' vs '.join(map(str, counts))}")
    return lines


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == "text":  # a prompt's text: its hash beside it says the same
                continue
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _clip(value: Any, width: int = 40) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= width else text[: width - 3] + "..."


def protocol_summary(record: dict) -> str:
    """Model-independent protocol in a line: retriever, corpus, top-k, engine, recipe."""
    p = record.get("protocol", {})
    retriever = p.get("retriever") or {}
    parts = [f"recipe {p.get('recipe', {}).get('path', '?')}"]
    if retriever:
        name = (retriever.get("class") or "?").rsplit(".", 1)[-1]
        corpus = retriever.get("corpus") or retriever.get("index") or "?"
        fingerprint = retriever.get("corpus_fingerprint")
        parts.append(
            f"retriever {name} over {corpus}"
            + (f" (corpus {fingerprint[:12]})" if fingerprint else "")
        )
    else:
        parts.append("no retriever (the references in the prompt)")
    for key, value in (p.get("top_k") or {}).items():
        parts.append(f"{key} {value}")
    engine = p.get("engine") or {}
    if engine:
        name = (engine.get("class") or "?").rsplit(".", 1)[-1]
        version = engine.get("vllm") or engine.get("transformers")
        parts.append(f"engine {name} {version}")
    decoding = p.get("decoding") or {}
    if decoding:
        temperature, budget = decoding.get("temperature"), decoding.get("max_new_tokens")
        parts.append(f"temperature {temperature}, {budget} new tokens")
    return "; ".join(parts)
