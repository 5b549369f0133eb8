"""``lit-rag export``: the trained policy of a checkpoint as a Hugging Face model folder.

    lit-rag export runs/quickstart/version_0/checkpoints/last.ckpt \\
        --config recipes/quickstart.yaml --out exported/quickstart
    lit-rag export CKPT --config RECIPE --out DIR --adapter      # the LoRA adapter alone (peft)

The recipe names the base model (``model.policy``: a local folder, a GGUF file it converts, the
LoRA settings; ``--model.policy.path=...`` and any other override work as for ``fit``); the
checkpoint holds what training changed: the LoRA adapters under LoRA, every weight under full
fine-tuning (single process, DDP, or FSDP with its default full state dict). LoRA is merged into
the base weights (peft's ``merge_and_unload``; a QLoRA adapter merges into the unquantized base)
unless ``--adapter``, which writes the adapter in peft's format beside the tokenizer.

The folder holds ``model.safetensors`` (or an adapter), ``config.json``,
``generation_config.json``, the tokenizer and its chat template: what
``transformers.AutoModelForCausalLM.from_pretrained`` and ``vllm serve`` load.

Files are data: the checkpoint is read with ``torch.load(weights_only=True)``; its keys choose
only which tensor goes where, and a key the recipe's model has not is an error, not ignored.
A checkpoint trained on another base model, architecture or LoRA settings than the recipe
builds is refused in one line naming both (:mod:`lit_rag.checkpoints.provenance`).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from lit_rag.errors import CommandParser, InputError

if TYPE_CHECKING:
    import torch

USAGE = (
    "lit-rag export CHECKPOINT --config RECIPE --out DIR [--adapter] [--model.policy.KEY=VALUE ...]"
)
#: ``lit-rag export --help``: the line ``lit-rag --help`` gives the command, then examples
DESCRIPTION = """\
Save a checkpoint's policy as a Hugging Face model folder.

  lit-rag export runs/quickstart/version_0/checkpoints/last.ckpt \\
      --config recipes/quickstart.yaml --out exported/quickstart
  lit-rag export CHECKPOINT --config RECIPE --out DIR --adapter   the LoRA adapter alone

The recipe names the base model; the checkpoint holds what training changed. LoRA adapters
are merged into the base weights unless --adapter. The folder loads with transformers'
AutoModelForCausalLM.from_pretrained or vllm serve. Recipe overrides work as for lit-rag fit
(--model.policy.path=DIR)."""


def build_parser() -> CommandParser:
    """The parser of ``lit-rag export`` (recipe overrides are what it leaves)."""
    parser = CommandParser(
        "export",
        USAGE,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkpoint", help="a .ckpt file of a lit-rag run")
    parser.add_argument(
        "--config", required=True, metavar="RECIPE", help="the recipe the run was trained with"
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="a new (or empty) folder")
    parser.add_argument(
        "--adapter", action="store_true", help="write the LoRA adapter alone, not merged"
    )
    return parser


def main(args: list[str]) -> None:
    """``lit-rag export``: see the module docstring."""
    parser = build_parser()
    options, overrides = parser.parse_known_args(args)
    out = export(
        options.checkpoint,
        options.config,
        options.out,
        adapter=options.adapter,
        overrides=overrides,
    )
    kind = "LoRA adapter" if options.adapter else "model"
    print(
        f"lit-rag export: wrote the {kind} to {out} (load it with "
        f"AutoModelForCausalLM.from_pretrained or `vllm serve {out}`)"
    )


def export(
    checkpoint: str | Path,
    recipe: str,
    out: str | Path,
    adapter: bool = False,
    overrides: list[str] | None = None,
) -> Path:
    """Write the policy of ``checkpoint`` (trained with ``recipe``) to the folder ``out``.

    Raises:
        InputError: a bad checkpoint, a non-empty ``out``, ``adapter`` without LoRA, or a
            checkpoint whose weights do not fit the recipe's model.
    """
    import torch

    from lit_rag.checkpoints.storage import check_checkpoint_file, load_error
    from lit_rag.models.facts import has_adapters
    from lit_rag.models.loading import load_model, load_tokenizer

    checkpoint, out = Path(checkpoint), Path(out)
    check_checkpoint_file(checkpoint)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"export: --out {out} exists and is not an empty folder; give a new one")
    config = policy_config(recipe, overrides or [])
    if adapter and config.lora is None:
        raise InputError(
            f"export: --adapter needs a LoRA run, and {recipe}'s model.policy has no lora"
        )
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one line
        raise load_error(checkpoint, exc) from None
    # a QLoRA adapter merges into the unquantized base (merging into 4-bit weights would round)
    config = dataclasses.replace(config, quantization=None, gradient_checkpointing="none")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # an error after loading stays the only line on stderr
    model = load_model(config).eval()
    check_trained_model(model, config, state, checkpoint)
    load_trained_weights(model, state, checkpoint, lora=config.lora is not None)
    tokenizer = load_tokenizer(config)
    out.mkdir(parents=True, exist_ok=True)
    if not adapter and has_adapters(model):
        model = model.merge_and_unload()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def policy_config(recipe: str, overrides: list[str]):
    """The recipe's ``model.policy`` (a :class:`~lit_rag.models.loading.ModelConfig`), parsed as
    ``lit-rag fit`` parses it, overrides included; nothing is loaded or started."""
    from lit_rag.cli.fit import build_cli

    cli = build_cli(["--config", recipe, *overrides], run=False)
    config = getattr(cli.model, "policy_config", None)
    if config is None:
        raise InputError(
            f"export: {recipe} does not train a policy (its model is {type(cli.model).__name__})"
        )
    return config


def check_trained_model(model: torch.nn.Module, config, state: dict, checkpoint: Path) -> None:
    """Refuse a checkpoint trained on another base model, architecture or LoRA settings than the
    recipe builds (:mod:`lit_rag.checkpoints.provenance`); one line on stderr for one that records
    nothing to check.

    Raises:
        InputError: naming what the checkpoint was trained on and what the recipe builds.
    """
    import sys

    from lit_rag.checkpoints.provenance import check_trained_on, trained_on, unchecked_line

    stored = (state.get("lit_rag") or {}) if isinstance(state, dict) else {}
    current = trained_on(model, config)
    if not check_trained_on(stored.get("trained_on"), current, str(checkpoint)):
        print(f"lit-rag export: {unchecked_line(str(checkpoint))}", file=sys.stderr)


def load_trained_weights(model: torch.nn.Module, state: dict, checkpoint: Path, lora: bool) -> None:
    """Copy the checkpoint's ``model.*`` tensors into ``model`` (the recipe's policy, freshly
    loaded): under LoRA every trainable (adapter) weight must be in the checkpoint; under full
    fine-tuning every weight; a key the model has not is an error.

    Raises:
        InputError: naming the checkpoint and the first keys that do not fit.
    """
    import torch

    from lit_rag.rollout.weights import strip_wrappers

    weights = state.get("state_dict") if isinstance(state, dict) else None
    if not isinstance(weights, dict):
        raise InputError(
            f"checkpoint {checkpoint} has no state_dict: not a lit-rag training checkpoint"
        )
    tensors = {
        strip_wrappers(key[len("model.") :]): value
        for key, value in weights.items()
        if key.startswith("model.") and isinstance(value, torch.Tensor)
    }
    if not tensors:
        raise InputError(f"checkpoint {checkpoint} holds no policy weights (no model.* tensors)")
    own = model.state_dict(keep_vars=True)  # tied weights (lm_head = embed_tokens) under both names
    unexpected = sorted(set(tensors) - set(own))
    if unexpected:
        raise InputError(
            f"checkpoint {checkpoint} holds {len(unexpected)} weights the recipe's model has not "
            f"(first: {unexpected[0]}): was it trained with another recipe or model?"
        )
    needed = (
        {name for name, p in model.named_parameters() if p.requires_grad}
        if lora
        else set(dict(model.named_parameters()))
    )
    absent = sorted(needed - set(tensors))
    if absent:
        what = (
            "adapter weights" if lora else "weights (a full fine-tuning checkpoint holds them all)"
        )
        raise InputError(
            f"checkpoint {checkpoint} lacks {len(absent)} {what} of the recipe's model "
            f"(first: {absent[0]}): was it trained with another recipe (LoRA settings)?"
        )
    for name, value in tensors.items():
        target = own[name]
        if target.shape != value.shape:
            raise InputError(
                f"checkpoint {checkpoint}: {name} has shape {tuple(value.shape)}, the recipe's "
                f"model {tuple(target.shape)}"
            )
        with torch.no_grad():
            target.copy_(value.to(target.dtype))
