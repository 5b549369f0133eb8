"""Master weights in fp32 whatever dtype a recipe loads (lit_rag.models.precision): the paper
recipes load ``dtype: bfloat16`` under ``precision: bf16-mixed``, and an AdamW step at their
learning rates (1e-6 to 5e-6) is below half bf16's spacing at typical weights, so bf16 masters
lose almost every update.

The arithmetic: bf16 has 8 significant bits, so at |w| = 0.02 (in [2^-6, 2^-5)) its spacing is
2^-6 x 2^-7 = 1.2e-4 and an update must exceed 6.1e-5 to move the weight. AdamW's first step
moves each weight with a gradient by lr x m / (sqrt(v) + eps) = lr x g / |g| = 1e-6: in fp32
(spacing 2^-6 x 2^-23 = 1.9e-9 at 0.02) every such weight moves; in bf16 only weights with
|w| < about 2e-6 x 2^7 = 2.6e-4 would, a few percent of a N(0, 0.02) initialisation.

``lit-rag fit`` of one step on the tiny recipe, ``dtype: bfloat16``, ``bf16-mixed``, lr 1e-6, on
one process and on two FSDP ranks: the checkpoint's weights and Adam states are fp32, and the
step moved almost every weight AdamW had a gradient for. Before, both runs wrote 21 bf16 weights
and 40 bf16 Adam states, and the step moved a few percent of the weights.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import require_package

from lit_rag.models.loading import TinyConfig
from lit_rag.models.precision import (
    PURE_LOW_PRECISION_LINE,
    hold_masters,
    master_dtype,
    sharded_mixed_precision,
)
from lit_rag.models.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
LIT_RAG = str(Path(sys.executable).with_name("lit-rag"))
TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 2}  # recipes/tiny.yaml's


# ---- the decisions, as pure functions ------------------------------------------------------
@pytest.mark.parametrize(
    "precision,dtype",
    [
        ("bf16-mixed", torch.float32),
        ("16-mixed", torch.float32),
        ("32-true", torch.float32),
        (None, torch.float32),  # a module built without a trainer
        ("bf16-true", torch.bfloat16),  # pure bf16: only when the recipe says so
        ("16-true", torch.float16),
    ],
)
def test_master_dtype_is_fp32_unless_the_precision_is_pure_low(precision, dtype):
    assert master_dtype(precision) is dtype


def test_fsdp_computes_in_bf16_and_reduces_in_fp32():
    mixed = sharded_mixed_precision("bf16-mixed")
    assert (mixed.param_dtype, mixed.reduce_dtype, mixed.buffer_dtype) == (
        torch.bfloat16,
        torch.float32,
        torch.float32,
    )
    assert mixed.cast_forward_inputs
    assert sharded_mixed_precision("16-mixed").reduce_dtype is torch.float32
    assert sharded_mixed_precision("32-true") is None  # Lightning's fp32 config stands
    assert sharded_mixed_precision("bf16-true") is None


def test_hold_masters_casts_trained_weights_and_leaves_frozen_and_integer_ones():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)).to(torch.bfloat16)
    model[0].requires_grad_(False)  # frozen (a LoRA base weight)
    model.register_parameter("codes", torch.nn.Parameter(torch.zeros(3, dtype=torch.uint8), False))
    assert hold_masters(model, torch.float32) == 2  # the second layer's weight and bias
    assert model[1].weight.dtype is torch.float32 and model[0].weight.dtype is torch.bfloat16
    assert hold_masters(model, torch.float32, every_weight=True) == 2  # FSDP: one dtype a unit
    assert model[0].weight.dtype is torch.float32 and model.codes.dtype is torch.uint8


def test_hold_masters_keeps_tied_weights_tied():
    model = build_tiny_model(TinyConfig(**TINY), dtype=torch.bfloat16)
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head.weight is embeddings.weight
    hold_masters(model, torch.float32)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert (head.weight is embeddings.weight) == tied


# ---- the command a user runs ---------------------------------------------------------------
def _fit(out: Path, *args: str) -> subprocess.CompletedProcess:
    # completions that differ within a group (tests/scripts/global_batch.py): a gradient
    scripts = str(ROOT / "tests" / "scripts")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": scripts}
    command = [
        LIT_RAG, "fit", "--config", str(ROOT / "recipes" / "tiny.yaml"),
        "--model.engine=global_batch.PromptScripted", "--model.sampling.max_new_tokens=64",
        "--model.policy.dtype=bfloat16", "--model.optimizer.lr=1.0e-6",
        "--trainer.max_steps=1", "--trainer.limit_val_batches=0",
        "--trainer.enable_checkpointing=true", f"--trainer.logger.init_args.save_dir={out}",
        *args,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _checkpoint(out: Path) -> dict:
    (path,) = (out / "tiny" / "version_0" / "checkpoints").glob("*.ckpt")
    return torch.load(path, map_location="cpu", weights_only=False)


def _adam_states(checkpoint: dict) -> list[dict]:
    return list(checkpoint["optimizer_states"][0]["state"].values())


def _moved_share(checkpoint: dict) -> float:
    """Of the weight elements AdamW had a gradient for (exp_avg != 0), the share the step moved
    away from the initial weights (the tiny model, seed 0, as loaded in bf16)."""
    model = build_tiny_model(TinyConfig(**TINY), dtype=torch.bfloat16)
    names = [name for name, _ in model.named_parameters()]  # the optimizer's order
    initial, trained = model.state_dict(), checkpoint["state_dict"]
    moved = total = 0
    for index, state in checkpoint["optimizer_states"][0]["state"].items():
        name = index if isinstance(index, str) else names[index]
        start = initial[name].float()
        had_gradient = state["exp_avg"] != 0
        moved += int(((trained[f"model.{name}"].float() != start) & had_gradient).sum())
        total += int(had_gradient.sum())
    assert total > 0
    return moved / total


@pytest.mark.multiprocess
@pytest.mark.subprocess
@pytest.mark.parametrize(
    "devices,strategy",
    [(1, "auto"), pytest.param(2, "fsdp", id="2-fsdp")],
    ids=["1-process", "2-fsdp"],
)
def test_a_bf16_loaded_recipe_trains_fp32_masters_that_move_at_lr_1e6(devices, strategy, tmp_path):
    _fit(
        tmp_path,
        f"--trainer.devices={devices}",
        f"--trainer.strategy={strategy}",
        "--trainer.precision=bf16-mixed",
    )
    checkpoint = _checkpoint(tmp_path)
    weights = checkpoint["state_dict"]
    assert len(weights) == 21
    assert {v.dtype for v in weights.values()} == {torch.float32}
    states = [t for s in _adam_states(checkpoint) for t in (s["exp_avg"], s["exp_avg_sq"])]
    assert len(states) == 40 and {t.dtype for t in states} == {torch.float32}
    # measured: 1.0 on one process and on two FSDP ranks (bf16 masters: a few percent)
    assert _moved_share(checkpoint) > 0.95


@pytest.mark.subprocess
def test_pure_bf16_is_an_explicit_precision_that_says_what_it_loses(tmp_path):
    done = _fit(tmp_path, "--trainer.precision=bf16-true")
    line = PURE_LOW_PRECISION_LINE.format(precision="bf16-true", dtype="bfloat16")
    assert done.stderr.count(line) == 1, done.stderr[-3000:]
    checkpoint = _checkpoint(tmp_path)
    assert {v.dtype for v in checkpoint["state_dict"].values()} == {torch.bfloat16}
    assert _moved_share(checkpoint) < 0.5  # what the line warns of


@pytest.mark.slow  # about 70 s: DeepSpeed's start on two CPU processes
@pytest.mark.multiprocess
@pytest.mark.subprocess
def test_deepspeed_keeps_fp32_master_partitions_of_a_bf16_loaded_recipe(tmp_path):
    """ZeRO-2 under bf16-mixed computes with bf16 module weights and holds each rank's partition
    of the weights and AdamW's states in fp32 (its ``bf16_zero_*_optim_states.pt``)."""
    require_package("deepspeed", "bash scripts/install.sh dev")
    _fit(
        tmp_path,
        "--trainer.devices=2",
        "--trainer.strategy=deepspeed_stage_2",
        "--trainer.precision=bf16-mixed",
    )
    (folder,) = (tmp_path / "tiny" / "version_0" / "checkpoints").glob("*.ckpt")
    for rank in (0, 1):
        path = folder / "checkpoint" / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        state = torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]
        assert {t.dtype for t in state["single_partition_of_fp32_groups"]} == {torch.float32}
        adam = state["base_optimizer_state"]["state"].values()
        assert {t.dtype for s in adam for t in (s["exp_avg"], s["exp_avg_sq"])} == {torch.float32}
