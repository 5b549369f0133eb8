"""The ``hf`` rollout engine: ``transformers.generate`` on the live policy.

Sampling log-probs come from the processed scores (after temperature / top-p / top-k), i.e.
the distribution the tokens were actually drawn from. Stop strings and EOS are detected by
one stopping criterion that also records where each row ended, so completions are cut
exactly (pad and EOS may be the same id).

Under FSDP (the paper's setting, Eval-RAR Appendix A.2) each rank holds a shard of the policy.
By default (``fsdp_generation="gather"``) the engine gathers the full weights once per rollout
(:meth:`HFEngine.generating`) and generates from them as a plain model, with no collective at
all, so each rank's multi-turn episodes take their own number of turns and generation calls.
This is what verl, which Search-R1 and Eval-RAR train with, does for its rollout (the full
weights are loaded into the rollout engine once per step). ``"per_layer"`` is the old path:
each FSDP unit gathers its layer at every decoding step (less memory: one layer whole at a
time); every generation is then a collective, so it suits only rollouts whose ranks make the
same generation calls (single-turn environments): a rank whose episodes are done early would
leave the others waiting forever.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from lit_rag.api import Generation, RolloutEngine, SamplingParams


class _EndTracker(StoppingCriteria):
    """Marks rows done on EOS or a stop string and remembers their lengths."""

    def __init__(self, tokenizer, prompt_width: int, eos_ids: set[int], stops: list[str]):
        self.tokenizer = tokenizer
        self.prompt_width = prompt_width
        self.eos_ids = eos_ids
        self.stops = stops
        self.tail = max((len(s) for s in stops), default=0) + 8
        self.lengths: dict[int, int] = {}

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        generated = input_ids.shape[1] - self.prompt_width
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for row in range(input_ids.shape[0]):
            if row in self.lengths:
                done[row] = True
                continue
            last = int(input_ids[row, -1])
            hit = last in self.eos_ids
            if not hit and self.stops:
                tail_ids = input_ids[row, max(self.prompt_width, input_ids.shape[1] - self.tail) :]
                text = self.tokenizer.decode(tail_ids, skip_special_tokens=False)
                hit = any(s in text for s in self.stops)
            if hit:
                self.lengths[row] = generated
                done[row] = True
        return done


class HFEngine(RolloutEngine):
    """Batched sampling with ``model.generate``.

    Args:
        max_batch_size: Most sequences per ``generate`` call (memory bound); ``None`` = all.
        fsdp_generation: With an FSDP-sharded policy on several ranks: ``gather`` the full
            weights once per rollout and generate without collectives (multi-turn safe; one
            whole copy of the weights per rank while generating), or gather them ``per_layer``
            at each decoding step (less memory; every rank must make the same generation
            calls, so single-turn rollouts only). See the module docstring.
    """

    def __init__(self, max_batch_size: int | None = None, fsdp_generation: str = "gather") -> None:
        if fsdp_generation not in FSDP_GENERATION:
            raise ValueError(
                f"engine fsdp_generation '{fsdp_generation}' is not known; "
                f"allowed: {', '.join(FSDP_GENERATION)}"
            )
        self.max_batch_size = max_batch_size
        self.fsdp_generation = fsdp_generation

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """Gather an FSDP-sharded policy for one rollout (see the module docstring).

        ``gather``: every unit's full parameters (``summon_full_params``, recursively, no
        write-back) and the nested units stepped around, so ``generate`` runs the plain modules
        on the gathered weights. ``per_layer``: only the root unit's own parameters (embeddings,
        head), which ``generate`` uses outside the root's forward; the layer units gather theirs
        in their forward. A no-op for an unsharded policy.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel

        if not isinstance(self.model, FullyShardedDataParallel):
            yield
            return
        recurse = self.fsdp_generation == "gather"
        with FullyShardedDataParallel.summon_full_params(
            self.model, recurse=recurse, writeback=False
        ):
            if not recurse:
                yield
                return
            with _units_bypassed(self.model.module):
                yield

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if self.model is None or self.tokenizer is None:
            raise RuntimeError("the hf engine is not bound to a model; call bind(model, tokenizer)")
        step = self.max_batch_size or len(prompts) or 1
        out: list[Generation] = []
        for i in range(0, len(prompts), step):
            out.extend(self._generate_batch(prompts[i : i + step], params))
        return out

    def _eos_ids(self) -> set[int]:
        ids = set()
        for source in (
            self.tokenizer.eos_token_id,
            getattr(self.model.generation_config, "eos_token_id", None),
        ):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(source)
        return ids

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        tok, model = self.tokenizer, self.model
        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        pad = tok.pad_token_id
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding
            input_ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[row, width - len(p) :] = 1
        eos = self._eos_ids()
        tracker = _EndTracker(tok, width, eos, params.stop)
        sample = not params.greedy
        kwargs = (
            {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k}
            if sample
            else {"temperature": None, "top_p": None, "top_k": None}
        )
        result = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            do_sample=sample,
            max_new_tokens=params.max_new_tokens,
            stopping_criteria=StoppingCriteriaList([tracker]),
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=pad,
            eos_token_id=sorted(eos) or None,
            use_cache=True,
            synced_gpus=_collective_forward(model),
            **kwargs,
        )
        new = result.sequences[:, width:].cpu()  # [N, T]
        # one [N, V] step at a time: never [N, T, V] at once
        picked = torch.zeros(new.shape, dtype=torch.float32)  # [N, T]
        for t, scores in enumerate(result.scores):
            chosen = new[:, t : t + 1].to(scores.device)
            picked[:, t] = (
                torch.log_softmax(scores.float(), dim=-1).gather(-1, chosen).squeeze(-1).cpu()
            )
        generations = []
        for row in range(len(prompts)):
            finished = row in tracker.lengths
            length = tracker.lengths.get(row, new.shape[1])
            ids = new[row, :length].clone()
            generations.append(
                Generation(
                    token_ids=ids,
                    logprobs=picked[row, :length].clone(),
                    text=tok.decode(ids, skip_special_tokens=True),
                    finished=finished,
                )
            )
        return generations


FSDP_GENERATION = ("gather", "per_layer")


def _collective_forward(model: torch.nn.Module) -> bool:
    """Whether a forward pass of ``model`` runs FSDP units (each gathers its layer from every
    rank) on several ranks: then every rank must run as many decoding steps as the slowest
    (transformers' ``synced_gpus``). False once :meth:`HFEngine.generating` has gathered the
    weights and stepped around the units (``gather``)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    inner = model.module if isinstance(model, FullyShardedDataParallel) else model
    return any(isinstance(m, FullyShardedDataParallel) for m in inner.modules())


@contextlib.contextmanager
def _units_bypassed(module: torch.nn.Module) -> Iterator[None]:
    """Each nested FSDP unit under ``module`` replaced by the module it wraps, then put back.

    Inside ``summon_full_params(recurse=True)`` the wrapped modules' parameters are the full
    ones, so their forward needs no unit: running a unit's own forward there would reshard
    (free) the gathered weights after each layer and gather them again, a collective.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    swapped: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []

    def bypass(parent: torch.nn.Module) -> None:
        for name, child in list(parent.named_children()):
            if isinstance(child, FullyShardedDataParallel):
                parent._modules[name] = child.module
                swapped.append((parent, name, child))
                child = child.module
            bypass(child)

    try:
        bypass(module)
        yield
    finally:
        for parent, name, unit in reversed(swapped):
            parent._modules[name] = unit
