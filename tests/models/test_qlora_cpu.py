"""QLoRA on CPU: ``quantization: 4bit`` loads the policy's linear layers as bitsandbytes NF4
(bitsandbytes 0.50.2's 4-bit layers run forward and backward on CPU) and trains LoRA adapters
on them through a real Lightning fit; the quantized base stays frozen."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from helpers import require_package

from lit_rag.api import Reward
from lit_rag.data.datamodule import QADataModule
from lit_rag.models.loading import (
    LoraSettings,
    ModelConfig,
    TinyConfig,
    load_model,
    load_tokenizer,
)
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.rollout.base import SamplingParams
from lit_rag.trainer.optimizer import OptimizerSettings
from lit_rag.trainer.policy import PolicyModule
from lit_rag.types import RewardBreakdown

require_package("bitsandbytes", "pip install bitsandbytes==0.50.2")


class Distinct(Reward):
    """More distinct tokens score more (random tiny-model samples differ, so groups vary)."""

    def __call__(self, trajectories):
        total = torch.tensor([float(len(set(t.completion_ids.tolist()))) for t in trajectories])
        return RewardBreakdown(total=total, components={"distinct": total})


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A tiny random Llama saved as an ordinary checkpoint folder (quantization applies when a
    model is loaded from a path, as a real one is)."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    config = ModelConfig(tiny=TinyConfig(hidden_size=64, num_layers=2, num_heads=2))
    load_model(config).save_pretrained(folder)
    load_tokenizer(config).save_pretrained(folder)
    return folder


def _qlora(folder, quantization="4bit") -> ModelConfig:
    return ModelConfig(
        path=str(folder), quantization=quantization, lora=LoraSettings(r=4, alpha=8, dropout=0.0)
    )


def test_4bit_loading_quantizes_the_linear_layers_and_trains_only_adapters(tiny_folder):
    import bitsandbytes as bnb

    model = load_model(_qlora(tiny_folder))
    quantized = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(quantized) == 2 * 7  # q, k, v, o, gate, up, down per layer
    assert quantized[0].weight.quant_state.quant_type == "nf4"
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    ids = torch.randint(3, 100, (2, 12))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
    assert all(g is not None for g in grads) and any(float(g.abs().sum()) > 0 for g in grads)


def test_8bit_loading_runs_forward(tiny_folder):
    import bitsandbytes as bnb

    model = load_model(_qlora(tiny_folder, "8bit"))
    assert any(isinstance(m, bnb.nn.Linear8bitLt) for m in model.modules())
    logits = model(input_ids=torch.randint(3, 100, (1, 8))).logits
    assert torch.isfinite(logits).all()


def test_qlora_fit_updates_adapters_and_keeps_the_4bit_base(tiny_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = PolicyModule(
        policy=_qlora(tiny_folder),
        environment=SingleTurnEnvironment(),
        reward=Distinct(),
        algorithm=GRPO(beta=0.04),
        group_size=4,
        sampling=SamplingParams(max_new_tokens=8),
        micro_batch_size=2,
        optimizer=OptimizerSettings(lr=1e-2),
    )
    data = QADataModule(num_train=4, num_val=2, batch_size=2, hops=[2], num_distractors=0)
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    module.configure_model()
    ids = torch.randint(3, 100, (2, 10))

    def base_logits():  # the frozen NF4 base: adapters off
        with torch.no_grad(), module.model.disable_adapter():
            return module.model(input_ids=ids).logits

    base_before = base_logits()
    adapters = {
        n: p.detach().clone() for n, p in module.model.named_parameters() if p.requires_grad
    }
    trainer.fit(module, datamodule=data)
    assert torch.equal(base_logits(), base_before)  # the 4-bit base did not move
    after = dict(module.model.named_parameters())
    assert any(
        not torch.equal(adapters[n], after[n].detach()) for n in adapters
    )  # the adapters did
    assert "train/kl" in trainer.callback_metrics  # the reference is the base with adapters off


def test_adapter_gradients_match_a_full_precision_twin_after_a_rollout(tiny_folder):
    """The gradients reaching the adapters through NF4 layers equal those of a full-precision
    model holding the dequantized weights, also after an eval-mode generate (bitsandbytes
    repacks 4-bit weights for its CPU inference kernel there unless lit-rag stops it)."""
    import bitsandbytes as bnb

    lora = LoraSettings(r=4, alpha=8, dropout=0.0)
    quant = load_model(ModelConfig(path=str(tiny_folder), quantization="4bit", lora=lora))
    torch.manual_seed(0)
    for name, p in quant.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    twin = load_model(ModelConfig(path=str(tiny_folder), lora=lora))
    twin_modules, twin_params = dict(twin.named_modules()), dict(twin.named_parameters())
    for name, module in quant.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            w = bnb.functional.dequantize_4bit(
                module.weight.data, module.weight.quant_state
            ).float()
            twin_modules[name].weight.data.copy_(w)
    for name, p in quant.named_parameters():
        if "lora_" in name:
            twin_params[name].data.copy_(p.data.float())
    ids = torch.randint(3, 100, (2, 12))

    def adapter_grads(model):
        model.train()
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if "lora_A" in n}

    expected = adapter_grads(twin)
    quant.eval()
    with torch.no_grad():
        quant.generate(input_ids=ids[:, :4], max_new_tokens=3, do_sample=False)
    got = adapter_grads(quant)
    for name, g in expected.items():
        assert torch.allclose(got[name], g, rtol=1e-3, atol=1e-5), name
