"""Reading a recipe for the memory estimate (lit_rag/sizing/recipe.py): overrides as lit-rag fit
takes them, the paper recipes without their weights, and defaults that agree with the classes
that own them."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

from lit_rag.cli.recipe_args import load_recipe
from lit_rag.errors import InputError
from lit_rag.sizing.recipe import DEFAULTS, apply_overrides, cpu_has_native_bf16, plan

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
PAPER = ("arena", "r2ag", "evo_rag", "eval_rar", "search_r1")


def recipe(name: str, *overrides: str) -> dict:
    return apply_overrides(load_recipe(str(RECIPES / f"{name}.yaml")), list(overrides))


def test_tiny_recipe():
    sized = plan(recipe("tiny")).plan
    assert (sized.model.hidden, sized.model.layers, sized.accelerator) == (32, 2, "cpu")
    assert (sized.group_size, sized.prompts, sized.micro_rows) == (2, 2, 4)
    assert sized.reference and sized.lora_rank is None  # GRPO beta 0.04, full training


@pytest.mark.parametrize("name", PAPER)
def test_paper_recipes_are_sized_without_their_weights(name):
    sized = plan(recipe(name), devices=8)
    assert sized.plan.devices == 8 and sized.plan.accelerator == "gpu"
    assert "table of paper models" in sized.plan.model.source


def test_overrides_with_or_without_init_args():
    plain = plan(recipe("tiny", "--model.algorithm.beta=0", "--model.micro_batch_size", "2"))
    spelled = plan(recipe("tiny", "--model.algorithm.init_args.beta=0.0"))
    assert not plain.plan.reference and not spelled.plan.reference
    assert plain.plan.micro_rows == 2
    strategy = plan(recipe("tiny", "--trainer.strategy=fsdp"), devices=4).plan
    assert (strategy.strategy, strategy.devices) == ("fsdp", 4)


def test_fsdp_offload_and_deepspeed_strategies():
    offload = plan(recipe("eval_rar"), devices=4).plan
    assert (offload.strategy, offload.offload) == ("fsdp", True)
    arena = plan(recipe("arena"), devices=8).plan
    assert arena.strategy == "deepspeed_stage_2" and arena.weight_bytes == 2


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["--trainer.strategy=horovod"], "trainer.strategy 'horovod'"),
        (["--model.policy.dtype=int3"], "model.policy.dtype 'int3'"),
        (["--model.policy.gradient_checkpointing=some"], "gradient_checkpointing 'some'"),
        (["--bogus=1"], "unknown option '--bogus=1'"),
        (
            ["--model.policy.tiny=null", "--model.policy.path=/nowhere/NoSuchModel-1B"],
            "model '/nowhere/NoSuchModel-1B': no config.json here and not a model the table knows",
        ),
    ],
)
def test_bad_settings_are_one_line(overrides, fragment):
    with pytest.raises(InputError) as caught:
        plan(recipe("tiny", *overrides))
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/cpuinfo")
def test_cpu_bf16_reads_as_torch_does():
    from lit_rag.models.precision import cpu_has_native_bf16 as torch_says

    assert cpu_has_native_bf16() == torch_says()


def _default(cls, name: str):
    return inspect.signature(cls.__init__).parameters[name].default


def test_defaults_agree_with_the_classes_that_own_them():
    from lit_rag.callbacks.preference_model import AlternatingRewardModel
    from lit_rag.data.datamodule import DEFAULT_BATCH
    from lit_rag.models.loading import LoraSettings, ModelConfig
    from lit_rag.plugins.algorithms.dpo import DPO
    from lit_rag.plugins.algorithms.grpo import GRPO
    from lit_rag.plugins.engines.hf import HFEngine
    from lit_rag.plugins.engines.vllm.engine import VLLMEngine
    from lit_rag.plugins.environments.search_agent import SearchAgentEnvironment
    from lit_rag.plugins.retrievers.dense import DEFAULT_ENCODER
    from lit_rag.rollout.base import SamplingParams
    from lit_rag.trainer.policy import PolicyModule
    from lit_rag.trainer.reward_model import RewardModelModule

    owners = {
        "group_size": _default(PolicyModule, "group_size"),
        "micro_batch_size": _default(PolicyModule, "micro_batch_size"),
        "micro_batch_tokens": _default(PolicyModule, "micro_batch_tokens"),
        "share_prefix": _default(PolicyModule, "share_prefix"),
        "logprob_chunk_tokens": _default(PolicyModule, "logprob_chunk_tokens"),
        "dtype": ModelConfig.dtype,
        "gradient_checkpointing": ModelConfig.gradient_checkpointing,
        "lora_r": LoraSettings.r,
        "max_new_tokens": SamplingParams.max_new_tokens,
        "batch_size": DEFAULT_BATCH,
        "grpo_beta": _default(GRPO, "beta"),
        "dpo_reference_free": _default(DPO, "reference_free"),
        "vllm_dtype": _default(VLLMEngine, "dtype"),
        "vllm_gpu_memory_utilization": _default(VLLMEngine, "gpu_memory_utilization"),
        "hf_max_batch_size": _default(HFEngine, "max_batch_size"),
        "dense_encoder": DEFAULT_ENCODER,
        "search_top_k": _default(SearchAgentEnvironment, "top_k"),
        "search_max_turns": _default(SearchAgentEnvironment, "max_turns"),
        "search_max_response_tokens": _default(SearchAgentEnvironment, "max_response_tokens"),
        "reward_model_max_length": _default(RewardModelModule, "max_length"),
        "reward_model_batch_size": _default(AlternatingRewardModel, "batch_size"),
        "reward_model_score_batch_size": _default(AlternatingRewardModel, "score_batch_size"),
    }
    assert owners == DEFAULTS
