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


@pytest.mark.parametrize(
    "lora", [None, LoraSettings(r=4, alpha=8, dropout=0.0)], ids=["full", "lora"]
)
def test_an_empty_model_reads_no_weights_and_has_the_loaded_ones_parameters(lora, tmp_path):
    """What the ranks of an FSDP run but the first build (``empty``): a saved folder's
    architecture on the meta device, the same parameters by name, shape and dtype, LoRA's
    adapters included, and no fingerprint until the first rank's arrives."""
    from helpers import tiny_folder

    from lit_rag.checkpoints.provenance import BASE_ATTRIBUTE

    config = ModelConfig(path=tiny_folder(tmp_path / "m"), dtype="bfloat16", lora=lora)
    loaded, empty = load_model(config), load_model(config, empty=True)
    shapes = [(n, tuple(p.shape), p.dtype) for n, p in loaded.named_parameters()]
    assert [(n, tuple(p.shape), p.dtype) for n, p in empty.named_parameters()] == shapes
    assert all(p.is_meta for p in empty.parameters())
    assert getattr(empty, BASE_ATTRIBUTE) is None and getattr(loaded, BASE_ATTRIBUTE)


def test_materializing_an_empty_model_keeps_its_tied_weights_tied():
    """FSDP's ``param_init_fn`` (lit_rag.models.strategies._Materialize) gives a tied embedding
    and output head one tensor: ``Module.to_empty`` gives each its own, and the ranks then
    flatten different parameter sets (a collective mismatch at the first forward)."""
    from lit_rag.models.strategies import _Materialize

    model = load_model(ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=1)), empty=True)
    materialize = _Materialize(torch.device("cpu"))
    for module in model.modules():
        materialize(module)
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
