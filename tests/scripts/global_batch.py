"""An engine and a callback for fits whose global batch must not depend on the process count
(``test_global_batch.py``); the ranks load them by name (``--model.engine=global_batch.
PromptScripted``, ``--trainer.callbacks+=global_batch.RecordUpdate``), with this folder on
``PYTHONPATH``.

:class:`PromptScripted` is a fake engine (a random tiny model writes nothing a reward can tell
apart): its completions are a function of the prompt and of the sample's index in its group,
so one process and two ranks sample the same trajectories for the same examples. Their lengths
vary by prompt (1 to 48 words), so a token budget gives the ranks different micro-batch counts.

:class:`RecordUpdate` writes, at the first optimizer step, the full gradient of every parameter
(gathered under FSDP and ZeRO-3) to ``$RECORD_DIR/grads.pt`` on rank 0, and each rank's
micro-batch counts to ``$RECORD_DIR/rank<r>.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import torch
from lightning.pytorch import Callback

from lit_rag.rollout.base import Generation, RolloutEngine


class PromptScripted(RolloutEngine):
    """Completions chosen by a hash of the prompt and the sample's index (see above); every
    token's sampling log-prob is -0.5."""

    def generate(self, prompts, params):
        seen: Counter = Counter()
        out = []
        for prompt in prompts:
            key = tuple(int(t) for t in prompt)
            index, seen[key] = seen[key], seen[key] + 1
            digest = int(hashlib.sha256(repr(key).encode()).hexdigest()[:8], 16)
            words = " ".join(["the"] * (1 + (digest + 5 * index) % 48))
            if index % 2 == 0:  # well formed: ARENA's format reward differs within a group
                text = f"<relevance>[1]</relevance><analysis>{words}</analysis><answer>x</answer>"
            else:
                text = words
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            ids = ids[: params.max_new_tokens]
            out.append(
                Generation(
                    torch.tensor(ids, dtype=torch.long),
                    torch.full((len(ids),), -0.5),
                    self.tokenizer.decode(ids),
                    True,
                )
            )
        return out


def _name(name: str) -> str:
    """A parameter's name without FSDP's wrapper segments."""
    return ".".join(p for p in name.split(".") if p not in ("_fsdp_wrapped_module",))


def full_gradients(model: torch.nn.Module, strategy) -> dict[str, torch.Tensor]:
    """Every trainable parameter's whole gradient (a collective under FSDP and ZeRO-3)."""
    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy

    if isinstance(strategy, FSDPStrategy):
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(model, with_grads=True):
            return {
                _name(n): p.grad.detach().clone()
                for n, p in model.named_parameters()
                if p.grad is not None
            }
    if isinstance(strategy, DeepSpeedStrategy):
        from deepspeed.utils import safe_get_full_grad

        grads = {}
        for n, p in model.named_parameters():
            grad = safe_get_full_grad(p)
            if grad is not None:
                grads[n] = grad.detach().clone().reshape(getattr(p, "ds_shape", p.shape))
        return grads
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


class RecordUpdate(Callback):
    """Records the first optimizer step's gradient and each step's micro-batch counts."""

    def __init__(self) -> None:
        self.folder = Path(os.environ["RECORD_DIR"])
        self.done = False
        self.counts: list[int] = []

    def on_train_start(self, trainer, pl_module) -> None:
        update = pl_module.update  # built by then (configure_model, on_fit_start)
        plan = update.plan

        def recording(prepared):  # the rank's own micro-batches, before any re-split
            planned = plan(prepared)
            rows = torch.arange(planned.size)
            own = update.micro_slices(planned.batch, rows, planned.width) if planned.size else []
            self.counts.append(len(own))
            return planned

        update.plan = recording

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self.done:
            return
        self.done = True
        grads = full_gradients(pl_module.model, trainer.strategy)
        if trainer.global_rank == 0:
            torch.save({k: v.float().cpu() for k, v in grads.items()}, self.folder / "grads.pt")

    def on_train_end(self, trainer, pl_module) -> None:
        path = self.folder / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps({"micro_batches": self.counts}))


class UnsyncedAccumulation(Callback):
    """Runs an optimizer step's micro-batches but the last inside FSDP's ``no_sync()``, the path
    FSDP with CPU offload takes (``lit_rag.models.strategies.accumulates_unsynced``), on CPU
    ranks, where FSDP cannot offload (torch pins the offloaded shards' memory on an
    accelerator)."""

    def on_train_start(self, trainer, pl_module) -> None:
        assert not pl_module.update.unsynced  # FSDP without offload reduces every pass
        pl_module.update.unsynced = True


class RecordPeak(Callback):
    """Writes each rank's peak resident memory so far (``ru_maxrss``, KiB) when training starts,
    after the policy and its reference are loaded and sharded: ``$RECORD_DIR/peak<r>.json``."""

    def on_train_start(self, trainer, pl_module) -> None:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        path = Path(os.environ["RECORD_DIR"]) / f"peak{trainer.global_rank}.json"
        path.write_text(json.dumps({"max_rss_kib": peak}))
