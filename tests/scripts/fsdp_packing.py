"""Shared-prefix log-probs under FSDP on two CPU processes (gloo); run by ``test_fsdp_packing.py``.

    python tests/scripts/fsdp_packing.py OUT_DIR {full | lora}

Each rank builds the same tiny policy, shards it as the policy module does under FSDP
(:func:`lit_rag.models.strategies.fsdp_wrap`: one unit per decoder layer, the policy as the
root) and computes the packed log-probs of one batch through the model's forward (the sharded
path, ``through_forward``) twice: a group's prompt once (``share=True``, split attention) and
once per row (``share=False``), each followed by a backward pass of a weighted sum. Both ranks
take the same batch, so FSDP's averaged gradient is the one-process gradient. Rank 0 also runs
the unsharded model on the batch (the reference) and writes ``OUT_DIR/result.json``: the
largest differences between the three, of log-probs and of every parameter's gradient
(gathered with ``summon_full_params(with_grads=True)``), in units of the unit tests' tolerance
(at most 1 where ``torch.allclose`` holds).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the kit

from lit_rag.contracts.algorithm import collate  # noqa: E402
from lit_rag.models.packing import pack  # noqa: E402
from lit_rag.models.strategies import fsdp_wrap  # noqa: E402
from lit_rag.trainer.logprobs import packed_logprobs  # noqa: E402


def _batch():
    from kit import multi_turn_trajectories, single_turn_trajectories  # as the unit tests

    return collate(single_turn_trajectories() + multi_turn_trajectories(), pad_id=0)


def _model(lora: bool) -> torch.nn.Module:
    from kit import packing_policy

    torch.manual_seed(0)  # LoRA's A matrices are drawn at random: the same on every rank and copy
    return packing_policy(lora)


def _run(model, batch, share: bool, through_forward: bool) -> tuple[torch.Tensor, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    packed = pack(batch.input_ids, batch.attention_mask, batch.width, share=share)
    out = packed_logprobs(
        model, packed, temperature=0.7, chunk_tokens=5, through_forward=through_forward
    )
    weights = torch.linspace(0.5, 1.5, out.numel()).view_as(out)
    (out * batch.completion_mask * weights).sum().backward()
    return out.detach(), packed.layout is not None


def _grads(model) -> dict[str, torch.Tensor]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from lit_rag.rollout.weights import strip_wrappers

    with FSDP.summon_full_params(model, with_grads=True, writeback=False):
        return {
            strip_wrappers(n): p.grad.detach().clone()
            for n, p in model.named_parameters()
            if p.requires_grad and p.grad is not None
        }


RTOL, ATOL = 1e-5, 1e-6  # as the unit tests of tests/models/test_packing.py


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest ``|a - b| / (ATOL + RTOL |b|)``: at most 1 where ``torch.allclose`` holds."""
    return float(((a - b).abs() / (ATOL + RTOL * b.abs())).max()) if a.numel() else 0.0


def worker(rank: int, out_dir: str, kind: str) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import enable_wrap

    dist.init_process_group("gloo", init_method=f"file://{out_dir}/pg", rank=rank, world_size=2)
    torch.set_num_threads(1)
    lora = kind == "lora"
    batch = _batch()
    mask = batch.completion_mask.bool()
    with enable_wrap(wrapper_cls=FSDP, device_id=torch.device("cpu")):
        sharded = fsdp_wrap(_model(lora), SimpleNamespace(kwargs={}))
    shared, had_layout = _run(sharded, batch, share=True, through_forward=True)
    shared_grads = _grads(sharded)
    plain, _ = _run(sharded, batch, share=False, through_forward=True)
    plain_grads = _grads(sharded)
    if rank == 0:
        whole = _model(lora)
        reference, _ = _run(whole, batch, share=False, through_forward=False)
        reference_grads = {
            n: p.grad for n, p in whole.named_parameters() if p.requires_grad and p.grad is not None
        }
        result = {
            "packed_a_group": had_layout,
            "attention": sharded.module.config._attn_implementation
            if hasattr(sharded.module, "config")
            else None,
            "logprobs_shared_vs_unshared": _relative(shared[mask], plain[mask]),
            "logprobs_shared_vs_unsharded_model": _relative(shared[mask], reference[mask]),
            "grad_names": sorted(shared_grads) == sorted(plain_grads) == sorted(reference_grads),
            "grads": len(shared_grads),
            "grads_shared_vs_unshared": max(
                _relative(g, plain_grads[n]) for n, g in shared_grads.items()
            ),
            "grads_shared_vs_unsharded_model": max(
                _relative(g, reference_grads[n]) for n, g in shared_grads.items()
            ),
        }
        Path(out_dir, "result.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    # the result is written and the group is gone: leave without the interpreter's teardown, in
    # which gloo's threads once ended a worker with "terminate called without an active
    # exception" (SIGABRT) in CI, failing a run whose result was already in
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(worker, args=(sys.argv[1], sys.argv[2]), nprocs=2, join=True)
