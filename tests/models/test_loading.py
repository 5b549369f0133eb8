"""Model loading: tiny config, LoRA, path errors (one clear line), GGUF discovery."""

from __future__ import annotations

import pytest
import torch

from lit_rag.models.loading import (
    LoraSettings,
    ModelConfig,
    TinyConfig,
    has_adapters,
    load_model,
    load_tokenizer,
    resolve_path,
)


def test_tiny_model_and_tokenizer_are_deterministic():
    config = ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2, seed=3))
    a, b = load_model(config), load_model(config)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    tok = load_tokenizer(config)
    assert tok.padding_side == "left" and tok.pad_token is not None
    text = "Ünïcode <answer>Kessa</answer> 123"
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: any text round-trips


def test_lora_adds_adapters_and_freezes_base():
    model = load_model(
        ModelConfig(
            tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2),
            lora=LoraSettings(r=2, alpha=4),
        )
    )
    assert has_adapters(model)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_missing_path_is_one_clear_line(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        resolve_path(str(tmp_path / "nope"))
    message = str(info.value)
    assert "\n" not in message and "does not exist" in message and "config.json" in message


def test_missing_package_path():
    with pytest.raises(
        FileNotFoundError, match="python package 'no_such_pkg_xyz' is not installed"
    ):
        resolve_path("pkg://no_such_pkg_xyz/model.gguf")


def test_folder_without_weights(tmp_path):
    with pytest.raises(FileNotFoundError, match="folder without config.json or .gguf"):
        load_tokenizer(ModelConfig(path=str(tmp_path)))


def test_folder_with_two_gguf_files_needs_a_name(tmp_path):
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="holds several .gguf files; set gguf_file"):
        load_model(ModelConfig(path=str(tmp_path)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"tiny": TinyConfig(), "dtype": "fp8"},
            "dtype 'fp8' is not supported; allowed: float32, bfloat16, float16",
        ),
        ({"tiny": TinyConfig(), "quantization": "2bit"}, "quantization '2bit' is not supported"),
        ({"tiny": TinyConfig(), "quantization": "4bit"}, "quantization needs model lora"),
        ({}, "needs either 'path'"),
    ],
)
def test_bad_config_names_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


def test_hub_id_is_passed_through():
    assert resolve_path("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
