"""What a policy checkpoint was trained on, and the check that a recipe builds that model.

A checkpoint holds what training changed: the LoRA adapters under LoRA (the base reloads from
the recipe's ``model.policy``), every weight under full fine-tuning. Loaded with a recipe that
builds another model, the first let every key through (the load is not strict under LoRA) and
the second failed in ``load_state_dict`` when a shape differed. So a checkpoint records
``lit_rag.trained_on`` (:func:`trained_on`):

- ``source``: the recipe's base model as written (``model.policy.path``, or the tiny config);
- ``base``: a fingerprint of the base weights (:func:`base_fingerprint`), taken when they load,
  before training changes any;
- ``architecture``: the model config's sizes (``hidden_size``, layers, heads, vocabulary);
- ``lora``: the LoRA settings that shape and scale the adapters (``r``, ``alpha``,
  ``target_modules``), or None under full fine-tuning.

Loading a checkpoint (``fit --ckpt_path``, ``validate``, ``compare``, ``evaluate``, ``export``)
compares the record with what the recipe builds (:func:`check_trained_on`) and refuses a
mismatch in one line naming both. A checkpoint written before the record existed loads as
before, with one warning line saying it cannot be checked; a tensor whose shape differs from
the recipe's model is one line either way (:func:`check_shapes`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from lit_rag.errors import InputError

#: the attribute :func:`lit_rag.models.loading.load_model` sets on the model it loads: the base
#: weights' fingerprint and the architecture, read through peft's and FSDP's wrappers
BASE_ATTRIBUTE = "lit_rag_base"
#: the model config's fields a checkpoint must match, as they read in an error
ARCHITECTURE = {
    "model_type": "model type",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "layers",
    "num_attention_heads": "heads",
    "num_key_value_heads": "key-value heads",
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocabulary",
}
#: values read from each fingerprinted tensor, evenly spaced
SAMPLES = 4096
#: what to do about a mismatch
ADVICE = "load it with the recipe (and model.policy overrides) it was trained with"


def base_fingerprint(model: torch.nn.Module) -> str:
    """A cheap, deterministic hash of a model's base weights: each embedding's and each
    normalization layer's weight (its name, shape, and :data:`SAMPLES` evenly spaced values
    rounded to bfloat16). Quantization (bitsandbytes replaces linear layers only) and the
    dtype a recipe loads in leave it unchanged; another model, another seed of the tiny model
    or a fine-tune of the base changes it. Take it before LoRA or activation checkpointing wrap
    the model (they rename its modules).
    """
    digest = hashlib.sha256()
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        kind = type(module).__name__
        if not isinstance(weight, torch.Tensor) or not (
            isinstance(module, torch.nn.Embedding) or kind.endswith("Norm")
        ):
            continue
        values = weight.detach().reshape(-1)
        if values.numel() > SAMPLES:
            # integers: float positions round past the end of a large tensor
            index = torch.arange(SAMPLES, dtype=torch.int64) * (values.numel() - 1) // (SAMPLES - 1)
            values = values[index.to(values.device)]
        rounded = values.to("cpu", torch.float32).to(torch.bfloat16).view(torch.int16)
        digest.update(f"{name}:{tuple(weight.shape)}:".encode())
        digest.update(rounded.numpy().tobytes())
    return digest.hexdigest()[:16]


def architecture(model: torch.nn.Module) -> dict[str, Any]:
    """The :data:`ARCHITECTURE` fields of ``model.config`` that it sets."""
    config = getattr(model, "config", None)
    values = config.to_dict() if config is not None else {}
    return {key: values[key] for key in ARCHITECTURE if values.get(key) is not None}


def describe_base(model: torch.nn.Module) -> dict[str, Any]:
    """What :data:`BASE_ATTRIBUTE` holds: the base weights' fingerprint and the architecture."""
    return {"base": base_fingerprint(model), "architecture": architecture(model)}


def trained_on(model: torch.nn.Module, config) -> dict[str, Any] | None:
    """The record a checkpoint of ``model`` (loaded from ``config``, a
    :class:`~lit_rag.models.loading.ModelConfig`) carries; None for a model that
    :func:`~lit_rag.models.loading.load_model` did not load (no fingerprint)."""
    base = getattr(model, BASE_ATTRIBUTE, None)
    if not isinstance(base, dict):
        return None
    if config.tiny is not None:  # its sizes are the architecture's
        source = f"a tiny random model, seed {config.tiny.seed}"
    else:
        source = str(config.path) + (f" ({config.gguf_file})" if config.gguf_file else "")
    lora = None
    if config.lora is not None:
        targets = config.lora.target_modules
        lora = {
            "r": config.lora.r,
            "alpha": config.lora.alpha,
            "target_modules": targets if isinstance(targets, str) else sorted(targets),
        }
    return {"source": source, **base, "lora": lora}


def check_trained_on(stored: Any, current: dict[str, Any] | None, checkpoint: str) -> bool:
    """Refuse a checkpoint trained on another model than the recipe builds.

    Args:
        stored: The checkpoint's ``lit_rag.trained_on`` (None when it was written before the
            record existed).
        current: :func:`trained_on` of the recipe's freshly loaded model.
        checkpoint: The checkpoint's path, as the error names it.

    Returns:
        Whether the checkpoint could be checked (False: it records nothing; the caller says so).

    Raises:
        InputError: ``checkpoint CKPT was trained on A; the recipe builds B; ...`` naming on each
            side the source and what differs (architecture, base weights, LoRA settings).
    """
    if not isinstance(stored, dict) or current is None:
        return False
    theirs, ours = [], []
    arch_a, arch_b = stored.get("architecture") or {}, current["architecture"]
    differing = [k for k in ARCHITECTURE if k in arch_a and arch_a.get(k) != arch_b.get(k)]
    for key in differing:
        theirs.append(f"{ARCHITECTURE[key]} {arch_a.get(key)}")
        ours.append(f"{ARCHITECTURE[key]} {arch_b.get(key)}")
    if not differing and stored.get("base") != current["base"]:
        theirs.append(f"base weights {stored.get('base')}")
        ours.append(f"base weights {current['base']}")
    if stored.get("lora") != current["lora"]:
        theirs.append(_lora(stored.get("lora")))
        ours.append(_lora(current["lora"]))
    if theirs:
        raise InputError(
            f"checkpoint {checkpoint} was trained on {stored.get('source')} "
            f"({', '.join(theirs)}); the recipe builds {current['source']} ({', '.join(ours)}): "
            f"{ADVICE}"
        )
    return True


def unchecked_line(checkpoint: str) -> str:
    """The warning for a checkpoint that records nothing to check against."""
    return (
        f"checkpoint {checkpoint} records no base model (written by an earlier lit-rag): it "
        "cannot be checked against the recipe's model; loading it as it is"
    )


def check_shapes(expected: dict[str, torch.Size], weights: dict[str, Any], checkpoint: str) -> None:
    """Refuse a checkpoint tensor whose shape is not the recipe model's (``load_state_dict``
    would end in a ``RuntimeError`` listing every one).

    Args:
        expected: The recipe model's state-dict shapes, by key.
        weights: The checkpoint's ``state_dict``.
        checkpoint: The checkpoint's path, as the error names it.

    Raises:
        InputError: naming the first key, both shapes and how many differ.
    """
    wrong = [
        key
        for key, value in weights.items()
        if isinstance(value, torch.Tensor) and key in expected and value.shape != expected[key]
    ]
    if wrong:
        key = wrong[0]
        raise InputError(
            f"checkpoint {checkpoint}: {key} has shape {tuple(weights[key].shape)}, the recipe's "
            f"model {tuple(expected[key])} ({len(wrong)} tensors differ): it was trained on "
            f"another model; {ADVICE}"
        )


def _lora(settings: dict | None) -> str:
    if settings is None:
        return "full fine-tuning, no LoRA"
    targets = settings.get("target_modules")
    targets = targets if isinstance(targets, str) else ",".join(targets or [])
    return f"LoRA r={settings.get('r')} alpha={settings.get('alpha')} on {targets}"
