"""``lagged``: sample from a copy of the policy that is refreshed every ``sync_every`` steps.

Asynchronous RL trainers generate with weights a few optimizer steps older than the ones they
train (Noukhovitch et al., 2024, "Asynchronous RLHF: Faster and More Efficient Off-Policy RL for
Language Models"), and an inference engine often samples in another precision than the trainer
(vLLM in bfloat16 beside a float32 policy). This engine reproduces both in one process, so their
effect on a recipe can be measured before any cluster is involved:

- it keeps its own copy of the policy and samples through another engine bound to that copy
  (``hf`` by default);
- the policy module calls :meth:`~LaggedEngine.sync_weights` after every optimizer step, and the
  copy is reloaded from the policy only at every ``sync_every``-th of them (at the start of the
  next rollout), in ``dtype``.

With ``sync_every: 1`` and no ``dtype`` it samples as its inner engine would, with a second copy
of the weights in memory. Logged with each step: ``engine/policy_lag`` (optimizer steps between
the weights that sampled the step and the policy being trained) and ``time/weight_sync_s``;
lit-rag itself logs the trainer/engine log-prob gap (``rollout/logprob_diff_mean``), which
GRPO's ``importance_sampling_cap`` corrects for.

The copy is a model of the policy's architecture built from its config
(``transformers.AutoModelForCausalLM.from_config``) and loaded tensor by tensor from
:func:`lit_rag.api.checkpoint_weights`, the walk the ``vllm`` engine syncs with: a sharded policy
(FSDP, DeepSpeed ZeRO-3) is gathered one unit at a time, LoRA adapters are merged into copies of
the base weights. A quantized policy is refused: the copy would need its quantized layers.

On resume the copy is not in the checkpoint: it is reloaded from the restored policy (lag 0),
and the count of optimizer steps comes back from :meth:`~LaggedEngine.state_dict`, so reloads
fall on the same steps as in a run that was never interrupted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from importlib import metadata

import torch

from lit_rag.api import (
    Generation,
    Placement,
    RolloutEngine,
    SamplingParams,
    checkpoint_weights,
    resolve_dtype,
)

__all__ = ["DTYPES", "LaggedEngine"]

#: ``dtype`` values: a floating type, or ``native`` (bfloat16 where the device has it natively)
DTYPES = ("float32", "bfloat16", "float16", "native")


def registered_engine(name: str) -> RolloutEngine:
    """A new engine of the kind registered as ``name`` in ``lit_rag.engines``, with its defaults."""
    found = [ep for ep in metadata.entry_points(group="lit_rag.engines") if ep.name == name]
    if not found:
        raise ValueError(f"engine '{name}' is not installed (entry-point group lit_rag.engines)")
    return found[0].load()()


class LaggedEngine(RolloutEngine):
    """Samples from its own copy of the policy, reloaded every ``sync_every`` optimizer steps.

    Example:
        With ``sync_every: 2`` the rollout of step 0 samples from the initial weights w0 (lag
        0), step 1 from w0 again (lag 1: the policy is at w1), step 2 from w2 (lag 0), step 3
        from w2 (lag 1), and so on.

    Args:
        engine: The engine that generates from the copy; default the registered ``hf`` engine.
            It must sample from the model it is bound to.
        sync_every: Reload the copy at every this-many optimizer steps (1: on-policy).
        dtype: The copy's dtype: ``float32``, ``bfloat16``, ``float16`` or ``native``; ``None``
            keeps the policy's.
    """

    def __init__(
        self,
        engine: RolloutEngine | None = None,
        sync_every: int = 1,
        dtype: str | None = None,
    ) -> None:
        if sync_every < 1:
            raise ValueError(f"engine sync_every: got {sync_every}; expected a whole number >= 1")
        if dtype is not None and dtype not in DTYPES:
            raise ValueError(f"engine dtype: got {dtype!r}; allowed: {', '.join(DTYPES)}")
        self.engine = engine if engine is not None else registered_engine("hf")
        self.sync_every, self.dtype = sync_every, dtype
        self.copy: torch.nn.Module | None = None
        self.updates = 0  # optimizer steps seen (sync_weights calls)
        self.copied_at = 0  # the step whose weights the copy holds
        self._reload = False  # reload the copy at the next rollout
        self._restored = False  # a checkpoint was loaded: its sync reloads, it is no step
        self._lag: int | None = None  # the lag of the last rollout, until metrics() reads it
        self._sync_seconds: list[float] = []

    # ---- the contract: place, bind, sync, generate -------------------------------------------
    def place(self, placement: Placement) -> None:
        super().place(placement)
        self.engine.place(placement)

    def bind(self, model: torch.nn.Module, tokenizer: object) -> None:
        """Attach the policy; the copy is built from it at the first rollout (on its device)."""
        if getattr(getattr(model, "config", None), "quantization_config", None) is not None:
            raise ValueError(
                "engine lagged: the policy is quantized (model quantization); the copy would "
                "need its quantized layers. Use the hf engine, or a policy without quantization"
            )
        super().bind(model, tokenizer)
        self.copy = None

    def sync_weights(self) -> None:
        """One optimizer step is done: the copy is reloaded at the next rollout when the step
        count reaches a multiple of ``sync_every`` (or right after a checkpoint was loaded)."""
        if self._restored:
            self._restored, self._reload = False, True
            return
        if self.copy is None:  # no rollout yet: the copy will be built from these weights
            return
        self.updates += 1
        if self.updates % self.sync_every == 0:
            self._reload = True

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """Around one rollout (every rank enters it): reload the copy when due, then the inner
        engine's own preparation."""
        self._refresh()
        with self.engine.generating():
            yield

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        self._refresh()
        return self.engine.generate(prompts, params)

    def submit(self, prompt: list[int], params: SamplingParams) -> int:
        self._refresh()
        return self.engine.submit(prompt, params)

    def collect(self) -> list[tuple[int, Generation]]:
        return self.engine.collect()

    def idle(self) -> None:
        self.engine.idle()

    def metrics(self) -> dict[str, float]:
        """The inner engine's figures, ``engine/policy_lag`` of the last rollout and the seconds
        spent reloading the copy since the last call (``time/weight_sync_s``)."""
        out = dict(self.engine.metrics())
        if self._lag is not None:
            out["engine/policy_lag"], self._lag = float(self._lag), None
        if self._sync_seconds:
            out["time/weight_sync_s"], self._sync_seconds = sum(self._sync_seconds), []
        return out

    def state_dict(self) -> dict:
        return {"updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.updates = int(state["updates"])
        self._restored = True  # the policy module syncs once the weights are loaded

    # ---- the copy --------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Build the copy at the first rollout and reload it when due; record the lag."""
        if self.model is None:
            raise RuntimeError("the lagged engine is not bound to a model; call bind(model, tok)")
        if self.copy is None or self._reload:
            started = time.perf_counter()
            if self.copy is None:
                self.copy = self._build()
                self.engine.bind(self.copy, self.tokenizer)
            self._load()
            self.engine.sync_weights()  # the inner engine's model changed
            self.copied_at, self._reload = self.updates, False
            self._sync_seconds.append(time.perf_counter() - started)
        self._lag = self.updates - self.copied_at

    def _build(self) -> torch.nn.Module:
        """An empty model of the policy's architecture, on its device, in ``dtype``."""
        from transformers import AutoModelForCausalLM

        first = next(self.model.parameters())
        dtype = first.dtype if self.dtype is None else self.dtype
        if isinstance(dtype, str):
            dtype = getattr(torch, resolve_dtype(dtype, first.device.type))
        copy = AutoModelForCausalLM.from_config(self.model.config, dtype=dtype)
        return copy.to(first.device).eval().requires_grad_(False)

    @torch.no_grad()
    def _load(self) -> None:
        """Every tensor of the copy from the policy's checkpoint walk (cast to the copy's dtype);
        a tensor either side lacks is an error naming it."""
        target = self.copy.state_dict()  # name -> the copy's tensor (shared storage)
        written: set[int] = set()
        unknown = []
        for name, tensor in checkpoint_weights(self.model):
            if name not in target:
                unknown.append(name)
                continue
            target[name].copy_(tensor)
            written.add(target[name].data_ptr())
        missing = [name for name, t in target.items() if t.data_ptr() not in written]
        if unknown or missing:
            raise RuntimeError(
                "engine lagged: the copy and the policy's weights differ; "
                f"not in the copy: {unknown[:3]}, not in the policy: {missing[:3]}"
            )
