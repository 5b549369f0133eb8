"""The memory estimate's arithmetic (lit_rag/sizing/estimate.py) on small, hand-checkable plans."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lit_rag.sizing.estimate import (
    Engine,
    GiB,
    Plan,
    estimate,
    largest_micro_batch,
    layer_bytes,
    micro_batch,
    trained_parameters,
)
from lit_rag.sizing.shapes import KNOWN, tiny_shape

SMOLLM2 = KNOWN["smollm2-135m-instruct"]


def part(result, name: str) -> int:
    return next(p.bytes for p in result.parts if p.name == name)


def tiny_plan(**changes) -> Plan:
    """A 2-layer model of width 32 (vocabulary 512), 2 prompts x 2 samples, CPU, hf engine."""
    base = Plan(
        model=tiny_shape(hidden_size=32, num_layers=2, num_heads=2),
        accelerator="cpu",
        devices=2,
        strategy="fsdp",
        weight_bytes=4,
        compute_bytes=2,
        reference=True,
        prompt_tokens=16,
        completion_tokens=8,
        new_tokens=8,
        group_size=2,
        prompts=2,
        micro_tokens=None,
        engine=Engine("hf"),
        runtime_bytes=0,
    )
    return replace(base, **changes)


def test_known_models_have_their_published_parameter_counts():
    # the model cards' totals: 7.62B, 3.09B, 8.19B, 8.03B, and SmolLM2's 134,515,008 (its file)
    counts = {name: shape.parameters() for name, shape in KNOWN.items()}
    assert counts["qwen2.5-7b-instruct"] == 7_615_616_512
    assert counts["qwen2.5-3b-instruct"] == 3_085_938_688
    assert counts["qwen3-8b"] == 8_190_735_360
    assert counts["llama-3.1-8b-instruct"] == 8_030_261_248
    assert counts["smollm2-135m-instruct"] == 134_515_008


def test_tiny_shape_counts_the_tiny_models_weights():
    from lit_rag.models.loading import TinyConfig
    from lit_rag.models.tiny import build_tiny_model

    model = build_tiny_model(TinyConfig(hidden_size=32, num_layers=2, num_heads=2))
    shape = tiny_shape(
        hidden_size=32, num_layers=2, num_heads=2, vocab_size=model.config.vocab_size
    )
    assert shape.parameters() == sum(p.numel() for p in model.parameters())


def test_doubling_devices_under_fsdp_halves_the_sharded_parts():
    two, four = estimate(tiny_plan(devices=2)), estimate(tiny_plan(devices=4))
    for name in ("policy weights", "reference model", "gradients", "optimizer state"):
        assert part(four, name) * 2 == pytest.approx(part(two, name), abs=2), name
    for name in ("activations", "logits", "gathered layers"):  # per micro-batch, per layer
        assert part(four, name) == part(two, name), name


def test_ddp_keeps_every_part_whole():
    two, four = estimate(tiny_plan(strategy="ddp")), estimate(tiny_plan(strategy="ddp", devices=4))
    assert [p.bytes for p in two.parts] == [p.bytes for p in four.parts]


def test_lora_has_no_full_gradients_and_no_reference_copy():
    full = estimate(tiny_plan(devices=1, strategy="single"))
    lora = estimate(tiny_plan(devices=1, strategy="single", lora_rank=4))
    plan = tiny_plan(lora_rank=4)
    # 2 layers x r 4 x (in + out) of q, k, v, o (32 + 32 each), gate, up (32 + 64), down (64 + 32)
    assert trained_parameters(plan) == 2 * 4 * (4 * 64 + 3 * 96) == 4352
    assert part(lora, "gradients") == 4352 * 4  # fp32 adapters
    assert part(lora, "optimizer state") == 2 * 4352 * 4
    assert part(full, "gradients") == plan.model.parameters() * 4
    assert part(lora, "reference model") == 0 < part(full, "reference model")


def test_deepspeed_keeps_fp32_master_weights_and_states():
    plan = tiny_plan(strategy="deepspeed_stage_2", devices=4, weight_bytes=2)
    # 12 bytes per trained weight (fp32 master, two fp32 Adam states), partitioned over 4
    assert part(estimate(plan), "optimizer state") == 12 * plan.model.parameters() // 4


def test_a_bf16_loaded_policy_is_trained_on_fp32_masters_unless_the_precision_is_pure():
    """Loaded in bf16 (2 bytes): held, its gradients and AdamW's two states all at 4 bytes per
    weight under bf16-mixed; at 2 under bf16-true (master_bytes 2). The frozen reference keeps
    the loaded 2 bytes, and so does a LoRA base outside FSDP."""
    n = tiny_plan().model.parameters()
    mixed = estimate(tiny_plan(devices=1, strategy="single", weight_bytes=2))
    assert part(mixed, "policy weights") == 4 * n
    assert part(mixed, "gradients") == 4 * n
    assert part(mixed, "optimizer state") == 2 * 4 * n
    assert part(mixed, "reference model") == 2 * n
    pure = estimate(tiny_plan(devices=1, strategy="single", weight_bytes=2, master_bytes=2))
    assert part(pure, "policy weights") == part(pure, "gradients") == 2 * n
    assert part(pure, "optimizer state") == 2 * 2 * n
    lora = estimate(tiny_plan(devices=1, strategy="single", weight_bytes=2, lora_rank=4))
    assert part(lora, "policy weights") == 2 * n
    sharded = estimate(tiny_plan(devices=2, weight_bytes=2, lora_rank=4))  # FSDP: one dtype
    assert part(sharded, "policy weights") == 4 * n // 2


def test_layer_bytes_of_smollm2_as_its_docstring_works_them():
    plan = Plan(model=SMOLLM2, weight_bytes=4, compute_bytes=2)
    assert layer_bytes(plan, "full") == 4 * 576 == 2304
    assert layer_bytes(plan, "selective") == 2304 + 2 * 5760 == 13824
    assert layer_bytes(plan, "none") == 34560


def test_micro_batch_packs_a_groups_prompt_once_and_keeps_to_the_token_budget():
    plan = tiny_plan(prompts=4, group_size=2, micro_rows=4)
    # 4 rows = 2 groups: 2 x 16 prompt + 4 x 8 completion positions
    assert micro_batch(plan) == micro_batch(plan, 4)
    assert (micro_batch(plan).tokens, micro_batch(plan).completion_tokens) == (64, 32)
    assert micro_batch(replace(plan, micro_tokens=40)).rows == 2  # 16 + 2 x 8 = 32 <= 40
    assert micro_batch(replace(plan, micro_tokens=8)).rows == 1  # one row over it goes alone


def test_the_micro_batch_search_is_monotone_in_memory():
    plan = tiny_plan(prompts=64, group_size=8)  # 512 rows a step
    sizes = [mib * 2**20 for mib in (16, 24, 32, 48, 64, 96, 128, 256)]
    found = [largest_micro_batch(plan, memory) for memory in sizes]
    rows = [0 if batch is None else batch.rows for batch in found]
    assert rows == sorted(rows) and rows[0] == 0 and rows[-1] == 512, rows
    for memory, count in zip(sizes, rows, strict=True):
        if count:  # the answer fits, one more row does not (or none is left)
            assert estimate(plan, memory, count).total <= memory
            if count < 512:
                assert estimate(plan, memory, count + 1).total > memory


def test_memory_grows_with_the_micro_batch():
    plan = tiny_plan(prompts=8, group_size=4, new_tokens=1)
    totals = [estimate(plan, rows=n).total for n in (1, 2, 4, 8, 16, 32)]
    assert totals == sorted(totals) and totals[0] < totals[-1]


def test_vllms_share_is_of_the_smallest_device_that_holds_the_rest():
    plan = tiny_plan(accelerator="gpu", engine=Engine("vllm", utilization=0.5, sleeps=False))
    result = estimate(plan)
    rest = sum(p.bytes for p in result.parts if p.name != "vLLM" and p.phase == "always")
    rest += max(
        sum(p.bytes for p in result.parts if p.phase == phase) for phase in ("rollout", "update")
    )
    # rest + 0.5 x M = M  ->  M = 2 x rest
    assert result.total == pytest.approx(2 * rest, abs=2)
    assert part(result, "vLLM") == pytest.approx(result.total / 2, abs=2)
    given = estimate(plan, memory=80 * GiB)
    assert part(given, "vLLM") == 40 * GiB


def test_a_sleeping_vllm_and_the_update_take_turns():
    plan = tiny_plan(accelerator="gpu", engine=Engine("vllm", utilization=0.5, sleeps=True))
    asleep = estimate(plan, 80 * GiB)
    always = sum(p.bytes for p in asleep.parts if p.phase == "always" and not p.host)
    update = sum(p.bytes for p in asleep.parts if p.phase == "update")
    assert asleep.total == always + max(40 * GiB, update)


def test_fsdp_with_cpu_offload_accumulates_the_whole_gradient_on_the_device():
    """FSDP1 overwrites offloaded gradient shards at every backward, so lit-rag adds an
    optimizer step's micro-batches up inside ``no_sync``: the whole fp32 gradient (4 bytes a
    trained weight) on each device, not a quarter of it on the host."""
    n = tiny_plan().model.parameters()
    offload = estimate(tiny_plan(devices=4, offload=True))
    plain = estimate(tiny_plan(devices=4))
    assert part(offload, "gradients") == 4 * n
    assert part(plain, "gradients") == 4 * n // 4
