"""What several ranks change, checked in one process: the weights an engine loads (names, LoRA
merged, the policy untouched), the global batch, DPO's pairs per rank, a rank that joins the
others' refill rounds with nothing to draw, and the one-line checks of a tensor-parallel group.
The multi-process runs on the real vLLM are in ``tests/plugins/test_vllm_ranks.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lit_rag.data.datamodule import QADataModule
from lit_rag.errors import InputError
from lit_rag.models.loading import LoraSettings, ModelConfig, TinyConfig, load_model
from lit_rag.plugins.algorithms.dpo import DPO
from lit_rag.plugins.engines.vllm.ranks import check_tensor_parallel, group_seed
from lit_rag.rollout.base import Placement
from lit_rag.rollout.weights import checkpoint_weights

TINY = TinyConfig(hidden_size=32, num_layers=2, num_heads=2)


def test_checkpoint_weights_of_a_plain_model_are_its_state_dict():
    model = load_model(ModelConfig(tiny=TINY))
    pairs = list(checkpoint_weights(model))
    state = model.state_dict()
    assert [name for name, _ in pairs] == list(state)  # the checkpoint's names, in its order
    for (
        name,
        tensor,
    ) in pairs:  # the parameters themselves (a rank holding them whole copies nothing)
        assert tensor.data_ptr() == state[name].data_ptr()


def test_lora_is_merged_layer_by_layer_and_the_policy_is_left_as_it_was():
    model = load_model(ModelConfig(tiny=TINY, lora=LoraSettings(r=4, alpha=8, dropout=0.0)))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # adapters away from their zero start, as after training
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    pairs = dict(checkpoint_weights(model))
    # peft's own merge, on a copy, is the reference
    import copy

    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    assert list(pairs) == list(merged)  # base checkpoint names, no adapter tensors
    for name, tensor in pairs.items():
        assert torch.allclose(tensor, merged[name], atol=1e-6), name
    # q_proj: W + (alpha / r) * B @ A = W + 2 B A, moved off the base weight
    base = before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"]
    a = before["base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"]
    b = before["base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"]
    assert torch.allclose(
        pairs["model.layers.0.self_attn.q_proj.weight"], base + 2.0 * b @ a, atol=1e-6
    )
    assert all(
        torch.equal(p, before[n]) for n, p in model.named_parameters()
    )  # nothing merged in place
    assert not any(getattr(m, "merged", False) for m in model.modules())
    adapter = [n for n, _ in checkpoint_weights(model, merge_lora=False) if ".lora_" in n]
    assert adapter and all(n in before for n in adapter)  # peft's own names, for save_pretrained


def test_global_batch_is_split_over_the_processes():
    data = QADataModule(global_batch_size=512)
    assert [data.process_batch_size(n) for n in (1, 4, 8)] == [512, 128, 64]
    assert QADataModule(batch_size=6).process_batch_size(8) == 6  # per process: as given
    assert QADataModule().process_batch_size(2) == 8  # neither set: 8 per process
    with pytest.raises(
        InputError, match=r"global_batch_size 256 cannot be split over 7 processes .* 1, 2, 4, 8"
    ):
        QADataModule(global_batch_size=256).process_batch_size(7)
    with pytest.raises(
        ValueError, match=r"both set; set one of them \(e.g. --data.batch_size=null\)"
    ):
        QADataModule(batch_size=4, global_batch_size=8)


def test_dpo_max_pairs_counts_over_all_ranks():
    dpo = DPO(max_pairs=64)
    assert dpo.pairs_per_rank() == 64
    dpo.place(Placement(rank=3, world_size=8, local_rank=3, local_world_size=8))
    assert dpo.pairs_per_rank() == 8  # 64 / 8: 64 pairs per optimizer step, as on one device
    dpo.place(Placement(rank=0, world_size=6, local_world_size=6))
    assert dpo.pairs_per_rank() == 11  # ceil(64 / 6): at least the paper's batch
    steps = dpo.mini_batches(22)  # 22 pairs on this rank: 11 + 11
    assert [len(rows) for rows, _ in steps] == [22, 22] and steps[0][1] == pytest.approx(1 / 11)


def test_tensor_parallel_groups_are_checked_in_one_line():
    eight = Placement(world_size=8, local_world_size=4)  # two nodes of four
    check_tensor_parallel(2, eight, SimpleNamespace(num_attention_heads=32, num_key_value_heads=8))
    with pytest.raises(
        InputError, match=r"tensor_parallel_size 8 must divide the training processes of a node \(4"
    ):
        check_tensor_parallel(8, eight, None)  # a group would span two nodes
    with pytest.raises(
        InputError,
        match=r"split the model's 9 attention heads \(3 key/value heads\) evenly; allowed: 1$",
    ):
        check_tensor_parallel(
            2,
            Placement(world_size=2, local_world_size=2),
            SimpleNamespace(num_attention_heads=9, num_key_value_heads=3),
        )  # SmolLM2-135M
    # a group of 4 over 2 key/value heads replicates each twice (vLLM does)
    check_tensor_parallel(
        4,
        Placement(world_size=4, local_world_size=4),
        SimpleNamespace(num_attention_heads=8, num_key_value_heads=2),
    )
    # seeds: one per group of two ranks (ranks 4 and 5 are group 2)
    assert [group_seed(10, Placement(rank=r, world_size=8), 2) for r in range(8)] == [
        10,
        10,
        11,
        11,
        12,
        12,
        13,
        13,
    ]


def test_a_rank_with_nothing_to_draw_joins_the_other_ranks_refill_rounds():
    """A rank whose groups all vary still rolls out (no prompt) as long as another rank refills:
    an engine shared by a tensor-parallel group needs every rank in every rollout."""
    from test_dapo_forest import refill_module

    from lit_rag.types import Example

    module = refill_module()
    varied = [Example(f"v{i}", f"varied question {i}", ["x"]) for i in range(2)]
    rows = module.rollout(varied, module.sampling, 2)
    others = iter([True, True, False])  # the other rank refills twice, then stops
    refill = module.refill()
    refill.any_rank = lambda mine: mine or next(others)
    rollouts = []
    original = refill.rollout
    refill.rollout = lambda examples: rollouts.append(list(examples)) or original(examples)
    rows, rewards, used = refill.run(rows, module.reward(rows), target=2, rounds=3)
    assert rollouts == [[], []] and used == 2  # two empty rollouts beside the other rank's rounds
    assert len(rows) == 4 and module.algorithm.informative_groups(rows, rewards) == 2
