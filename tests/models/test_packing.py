"""Shared-prefix packing: a group's prompt computed once gives the unshared rows'
log-probs and gradients (fp32, relative 1e-5), and micro-batches respect their token budget."""

from dataclasses import replace

import pytest
import torch
from kit import (
    multi_turn_trajectories,
    packing_policy,
    packing_trajectory,
    single_turn_trajectories,
)

from lit_rag.contracts.algorithm import collate
from lit_rag.models import activation_checkpointing
from lit_rag.models.loading import LoraSettings, ModelConfig, TinyConfig
from lit_rag.models.packing import pack, packed_cost, plan_micro_batches, split_rows
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.trainer.logprobs import _base_model, completion_logprobs, packed_logprobs

RTOL, ATOL = 1e-5, 1e-6


def _logprobs_and_grads(model, batch, width, share: bool):
    model.zero_grad(set_to_none=True)
    packed = pack(batch.input_ids, batch.attention_mask, width, share=share)
    out = packed_logprobs(model, packed, temperature=0.7, chunk_tokens=5)
    (
        out * batch.completion_mask * torch.linspace(0.5, 1.5, out.numel()).view_as(out)
    ).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads, packed


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("kind", ["single_turn", "multi_turn"])
def test_shared_equals_unshared(kind, lora):
    model = packing_policy(lora)
    trajectories = (
        single_turn_trajectories() if kind == "single_turn" else multi_turn_trajectories()
    )
    batch = collate(trajectories, pad_id=0)
    width = batch.width
    shared, shared_grads, packed = _logprobs_and_grads(model, batch, width, share=True)
    plain, plain_grads, unshared = _logprobs_and_grads(model, batch, width, share=False)
    assert packed.real_tokens < unshared.real_tokens  # the prompts ran once per group
    mask = batch.completion_mask.bool() | (batch.attention_mask[:, -width:] > 0)
    assert torch.allclose(shared[mask], plain[mask], rtol=RTOL, atol=ATOL)
    assert set(shared_grads) == set(plain_grads) and shared_grads
    for name, grad in shared_grads.items():
        assert torch.allclose(grad, plain_grads[name], rtol=RTOL, atol=ATOL), name
    # and both equal the left-padded full-row computation the module used before packing
    before = completion_logprobs(
        model, batch.input_ids, batch.attention_mask, width, temperature=0.7
    )
    assert torch.allclose(shared[mask], before.detach()[mask], rtol=RTOL, atol=ATOL)


def _grouped_query_model() -> torch.nn.Module:
    """A tiny Llama with 4 query heads sharing 2 key/value heads (SmolLM2: 9 and 3)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).train()


@pytest.mark.parametrize("model_kind", ["full", "lora", "grouped_query"])
@pytest.mark.parametrize("kind", ["single_turn", "multi_turn"])
def test_split_attention_equals_the_block_mask(kind, model_kind):
    # lit_rag.models.attention: the prompt causal, the completions against prompt + own
    # tokens, put back in the packed layout; values and gradients as the dense block mask gives
    model = (
        _grouped_query_model()
        if model_kind == "grouped_query"
        else packing_policy(model_kind == "lora")
    )
    trajectories = (
        single_turn_trajectories() if kind == "single_turn" else multi_turn_trajectories()
    )
    batch = collate(
        trajectories + single_turn_trajectories(), pad_id=0
    )  # packed rows of different lengths
    packed = pack(batch.input_ids, batch.attention_mask, batch.width)
    assert packed.layout is not None and len(set(packed.layout.prompts)) >= 2

    def run(split: bool):
        model.zero_grad(set_to_none=True)
        out = packed_logprobs(model, packed, temperature=0.7, chunk_tokens=5, split=split)
        (
            out * batch.completion_mask * torch.linspace(0.5, 1.5, out.numel()).view_as(out)
        ).sum().backward()
        return out.detach(), {
            n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
        }

    split, split_grads = run(True)
    assert model.config._attn_implementation == "lit_rag_sdpa"  # the split path ran
    masked, masked_grads = run(False)
    mask = batch.completion_mask.bool()
    assert torch.allclose(split[mask], masked[mask], rtol=RTOL, atol=ATOL)
    assert set(split_grads) == set(masked_grads) and split_grads
    for name, grad in split_grads.items():
        # the split sums keys in another order and over other block sizes: each gradient
        # within 1e-5 of its own largest element (fp32 rounding), not of every element
        reference = masked_grads[name]
        atol = RTOL * float(reference.abs().max())
        torch.testing.assert_close(grad, reference, rtol=RTOL, atol=atol, msg=name)


@pytest.mark.parametrize("mode", ["selective", "full"])
@pytest.mark.parametrize("lora", [False, True], ids=["full_ft", "lora"])
def test_split_attention_under_gradient_checkpointing(mode, lora):
    # a checkpointed layer is recomputed in the backward pass: the layout must reach it again;
    # selective checkpointing replays the kept matmul / attention outputs in the recomputation
    model = packing_policy(lora)
    batch = collate(single_turn_trajectories(), pad_id=0)
    packed = pack(batch.input_ids, batch.attention_mask, batch.width)
    plain, plain_grads, _ = _logprobs_and_grads(model, batch, batch.width, share=False)
    activation_checkpointing.enable(model, mode)
    assert _base_model(model).is_gradient_checkpointing
    shared, shared_grads, _ = _logprobs_and_grads(model, batch, batch.width, share=True)
    assert packed.layout is not None and model.config._attn_implementation == "lit_rag_sdpa"
    mask = batch.completion_mask.bool()
    assert torch.allclose(shared[mask], plain[mask], rtol=RTOL, atol=ATOL)
    for name, grad in shared_grads.items():
        assert torch.allclose(grad, plain_grads[name], rtol=RTOL, atol=ATOL), name


def test_eager_attention_takes_an_additive_mask():
    batch = collate(single_turn_trajectories(), pad_id=0)
    sdpa = packing_policy(attn="sdpa")
    eager = packing_policy(attn="eager")
    packed = pack(batch.input_ids, batch.attention_mask, batch.width)
    with torch.no_grad():
        a = packed_logprobs(sdpa, packed)
        b = packed_logprobs(eager, packed)
    assert torch.allclose(a, b, rtol=RTOL, atol=1e-5)


def test_through_forward_equals_decoder_and_head():
    # the path of sharded models (FSDP, ZeRO-3): the model's own forward, logits kept at the
    # predicting positions only
    model = packing_policy()
    batch = collate(single_turn_trajectories() + multi_turn_trajectories(), pad_id=0)
    packed = pack(batch.input_ids, batch.attention_mask, batch.width)
    with torch.no_grad():
        a = packed_logprobs(model, packed, temperature=0.7)
        b = packed_logprobs(model, packed, temperature=0.7, through_forward=True)
    assert torch.allclose(a, b, rtol=RTOL, atol=1e-5)


def test_grpo_loss_equal_shared_and_unshared():
    model = packing_policy()
    trajectories = single_turn_trajectories()
    from lit_rag.types import RewardBreakdown

    rewards = RewardBreakdown(total=torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 0.2, 0.7]))
    grpo = GRPO(beta=0.0)
    batch = grpo.prepare(trajectories, rewards).batch
    losses = []
    for share in (True, False):
        batch.logprobs = packed_logprobs(
            model, pack(batch.input_ids, batch.attention_mask, batch.width, share=share)
        )
        batch.old_logprobs = batch.logprobs.detach()
        losses.append(grpo.loss(batch).loss.detach())
    assert torch.allclose(losses[0], losses[1], rtol=RTOL, atol=ATOL)


def test_packed_layout():
    # one group of three rows: prompt once, completions after it at the prompt's position
    batch = collate(
        [
            packing_trajectory([7, 8, 9], [20, 21], 0),
            packing_trajectory([7, 8, 9], [30], 0),
            packing_trajectory([5], [40, 41, 42], 1),
        ]
    )
    packed = pack(batch.input_ids, batch.attention_mask, batch.width)
    assert packed.input_ids.tolist() == [[7, 8, 9, 20, 21, 30], [5, 40, 41, 42, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 3], [0, 1, 2, 3, 0, 0]]
    allowed = packed.attention_mask[0, 0]
    assert allowed[5].tolist() == [True, True, True, False, False, True]  # not the other completion
    assert packed.real_tokens == 10
    assert packed.sources.tolist()[:3] == [
        [0, 2],
        [0, 3],
        [0, 2],
    ]  # row 1's token predicted by the prompt's end


def test_plan_keeps_groups_within_budget():
    prompts = [(1,) * 10] * 4 + [(2,) * 30] * 4 + [(3,) * 5] * 2
    completions = [4, 6, 2, 3, 10, 10, 10, 10, 1, 1]
    plan = plan_micro_batches(prompts, completions, max_tokens=40)
    assert sorted(i for micro in plan for i in micro) == list(range(10))
    for micro in plan:
        cost = packed_cost([prompts[i] for i in micro], [completions[i] for i in micro])
        assert cost <= 40 or len({prompts[i] for i in micro}) == 1  # only a lone piece may exceed
    # the 10-token group fits whole (10 + 15 = 25 tokens): its rows stay in one micro-batch
    assert any(set(range(4)) <= set(micro) for micro in plan)
    # the 30-token group (30 + 40) is cut into pieces that each carry the prompt: 30 + 10 = 40
    assert sum(1 for micro in plan if any(4 <= i < 8 for i in micro)) == 4


def test_plan_rows_cap_and_pairs():
    prompts = [(1,), (1,), (2,), (2,), (3,), (3,)]
    plan = plan_micro_batches(prompts, [1] * 6, max_tokens=None, max_rows=2, row_group=2)
    assert sorted(map(sorted, plan)) == [[0, 1], [2, 3], [4, 5]]
    unshared = plan_micro_batches(prompts, [1] * 6, max_tokens=6, share=False)
    assert all(
        packed_cost([prompts[i] for i in m], [1] * len(m), share=False) <= 6 for m in unshared
    )


def test_split_rows_reads_the_collated_layout():
    batch = collate([packing_trajectory([7, 8, 9], [20, 21], 0), packing_trajectory([5], [40], 1)])
    assert split_rows(batch.input_ids, batch.attention_mask, batch.width) == [
        ((7, 8, 9), [20, 21]),
        ((5,), [40]),
    ]


def _accumulated_grads(module, batch) -> tuple[dict, float, int]:
    """One pass of the module's micro-batching: GRPO loss per micro-batch, gradients summed."""
    module.model.zero_grad(set_to_none=True)
    total, micro_batches = (
        0.0,
        module.update.micro_slices(batch, torch.arange(batch.size), batch.width),
    )
    for rows in micro_batches:
        micro = batch.rows(rows)
        micro.logprobs = module.update.logprobs(module.model, micro, batch.width)
        micro.old_logprobs = micro.logprobs.detach()
        loss = module.algorithm.loss(micro).loss
        loss.backward()
        total += float(loss.detach())
    grads = {n: p.grad.clone() for n, p in module.model.named_parameters() if p.grad is not None}
    return grads, total, len(micro_batches)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_module_micro_batches_accumulate_the_unshared_gradient(lora):
    """The policy module's token-budget micro-batches with shared prompts (a group cut across
    micro-batches too) accumulate the gradient of one unshared row per micro-batch."""
    from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
    from lit_rag.plugins.rewards.qa import ExactMatchReward
    from lit_rag.trainer.policy import PolicyModule
    from lit_rag.types import RewardBreakdown

    torch.manual_seed(0)
    module = PolicyModule(
        policy=ModelConfig(
            tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2, seed=3),
            lora=LoraSettings(r=4, alpha=8, dropout=0.0) if lora else None,
        ),
        environment=SingleTurnEnvironment(),
        reward=ExactMatchReward(),
        algorithm=GRPO(beta=0.0),
    )
    module.configure_model()
    module.model.train()
    trajectories = single_turn_trajectories() + [
        packing_trajectory(t.prompt_ids.tolist(), t.completion_ids.tolist(), 2, inserted=(0, 2))
        for t in multi_turn_trajectories()
    ]
    rewards = RewardBreakdown(
        total=torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 0.2, 0.7, 0.3, 0.9, 0.0])
    )
    batch = module.algorithm.prepare(trajectories, rewards).batch
    settings = module.update.settings
    module.update.settings = replace(
        settings, share_prefix=True, micro_batch_tokens=30, micro_batch_size=None
    )
    shared, shared_loss, count = _accumulated_grads(module, batch)
    assert count > 3  # the 11-token group (11 + 14) and the 9-token one (9 + 37) are cut
    module.update.settings = replace(
        settings, share_prefix=False, micro_batch_tokens=None, micro_batch_size=1
    )
    plain, plain_loss, _ = _accumulated_grads(module, batch)
    assert abs(shared_loss - plain_loss) <= RTOL * abs(plain_loss) + ATOL
    assert set(shared) == set(plain) and shared
    for name, grad in shared.items():
        assert torch.allclose(grad, plain[name], rtol=RTOL, atol=ATOL), name


def test_split_attention_runs_two_kernels_a_layer_whatever_the_rows(monkeypatch):
    """No Python per packed row or completion: every layer runs one causal call for all prompts
    and one masked call for all completions, with the indices built once per layout."""
    from lit_rag.models import attention

    calls, built = [], []
    sdpa, of = attention._sdpa, attention.Indices.of
    monkeypatch.setattr(attention, "_sdpa", lambda *a: calls.append(a[3] is None) or sdpa(*a))
    monkeypatch.setattr(attention.Indices, "of", lambda *a: built.append(1) or of(*a))
    model = packing_policy(False)
    batch = collate(multi_turn_trajectories() + single_turn_trajectories(), pad_id=0)
    packed = pack(batch.input_ids, batch.attention_mask, batch.width)
    assert len(packed.layout.prompts) >= 3
    packed_logprobs(model, packed).sum().backward()
    layers = model.config.num_hidden_layers
    assert calls == [True, False] * layers
    assert built == [1]


def test_balance_re_splits_towards_the_count_another_rank_runs():
    from lit_rag.models.packing import balance

    assert balance([[0, 1, 2, 3, 4, 5], [6, 7]], 4) == [[0], [1, 2], [3, 4, 5], [6, 7]]
    assert balance([[0, 1], [2]], 5) == [[0], [1], [2]]  # a row is not split: idle passes then
    assert balance([[0, 1, 2, 3]], 3, unit=2) == [[0, 1], [2, 3]]  # a DPO pair stays whole
    assert balance([[0], [1]], 1) == [[0], [1]]  # already as many: unchanged
    assert balance([], 3) == []
    rows = [list(range(10)), list(range(10, 13))]
    pieces = balance(rows, 5)
    assert len(pieces) == 5 and sorted(sum(pieces, [])) == list(range(13))
