"""Attention of a packed shared-prefix sequence without the dense block mask.

A packed sequence ``[prompt | completion 1 | ... | completion k]`` (:mod:`lit_rag.models.packing`)
under a block mask makes SDPA score every query against every key of the sequence: with a
2,000-token prompt and 7 completions of 256 tokens that is 3,792^2 scores per head, most of them
masked, and SDPA's causal fast path is lost. Prefix Grouper (Liu et al., arXiv 2506.05433,
Section 3.2, "grouped attention") splits the computation instead, and so do we:

- the prompt attends to itself, causal (``is_causal``: the kernel skips the upper triangle);
- the completions of the prompt attend, as one batch, to the prompt's keys and values plus their
  own earlier tokens (each completion padded to the longest of its group).

Both run as one kernel call per layer for the whole micro-batch: every packed row's first ``P``
positions (``P`` the longest prompt) attend causally in one call, a shorter prompt's queries
never seeing past it; every completion of every row is gathered, with its row's prompt keys, into
one ``[N, H, W, D]`` batch (``W`` the longest completion) under one boolean mask. The gather and
scatter indices are built once per layout (:meth:`Layout.indices`) and reused by every layer and
pass: no Python per row or completion. The outputs are put back in the packed layout, so the
result and its gradients equal the masked computation's (within float rounding: only the order
of the sums differs). With the example
above, 2,000^2/2 + 7 x 256 x 2,256 scores instead of 3,792^2: 6.0M instead of 14.4M per head.
Measured on a 2-core AMD EPYC (AVX2, fp32, one layer's attention, 9 heads of 64, forward and
backward): 0.73 s split against 1.44 s masked and 1.95 s for the 7 unshared rows.

The model keeps its own attention modules: :func:`enable` registers ``lit_rag_sdpa`` with
transformers' ``AttentionInterface`` (SDPA itself whenever no ``shared_prefix`` layout is passed)
and points the model's config at it; the layout reaches every layer as the forward keyword
``shared_prefix``, which transformers hands down to the attention function, also when a
checkpointed layer is recomputed in the backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

NAME = "lit_rag_sdpa"


@dataclass(frozen=True)
class Layout:
    """Where the prompt and the completions of each packed row lie.

    Args:
        prompts: Prompt length of each packed row.
        completions: ``(start, length)`` of each non-empty completion of each packed row, in
            order, contiguous after the prompt.
    """

    prompts: tuple[int, ...]
    completions: tuple[tuple[tuple[int, int], ...], ...]

    def indices(self, device: torch.device) -> Indices:
        """The gather and scatter indices of the split computation on ``device``, built once
        per layout and device (every layer of every pass reuses them: no Python per row)."""
        cache = self.__dict__.setdefault("_indices", {})
        if device not in cache:
            cache[device] = Indices.of(self, device)
        return cache[device]


@dataclass(frozen=True)
class Indices:
    """A :class:`Layout` as tensors: ``P`` the longest prompt, ``N`` completions, ``W`` the
    longest completion.

    Args:
        prompt_width: ``P``.
        prompt_tokens: ``[R, P, 1, 1]`` True where position ``t`` is in row ``r``'s prompt.
        rows: ``[N]`` each completion's packed row.
        positions: ``[N, W]`` each completion's token positions, the last repeated as padding.
        mask: ``[N, 1, W, P + W]`` True where a completion's query may attend to a key: its
            row's prompt, and its own earlier tokens.
        kept: ``[K]`` flat indices into ``[N * W]`` of the real (not padding) completion tokens.
        kept_rows: ``[K]`` their packed row.
        kept_positions: ``[K]`` their position in it.
    """

    prompt_width: int
    prompt_tokens: torch.Tensor
    rows: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    kept: torch.Tensor
    kept_rows: torch.Tensor
    kept_positions: torch.Tensor

    @classmethod
    def of(cls, layout: Layout, device: torch.device) -> Indices:
        prompts = torch.tensor(layout.prompts, dtype=torch.long)
        width_p = int(prompts.max())
        spans = [(r, s, c) for r, row in enumerate(layout.completions) for s, c in row]
        row, start, length = torch.tensor(spans, dtype=torch.long).view(-1, 3).unbind(1)
        width = int(length.max()) if len(spans) else 1
        step = torch.arange(width)
        real = step < length[:, None]  # [N, W]
        positions = start[:, None] + torch.minimum(step, (length - 1).clamp(min=0)[:, None])
        prompt_keys = (torch.arange(width_p) < prompts[row][:, None])[:, None, :]  # [N, 1, P]
        own = torch.ones(width, width, dtype=torch.bool).tril() & real[:, None, :]  # [N, W, W]
        mask = torch.cat([prompt_keys.expand(-1, width, -1), own], 2).unsqueeze(1)
        kept = real.reshape(-1).nonzero().squeeze(1)
        tensors = {
            "prompt_tokens": (torch.arange(width_p) < prompts[:, None])[:, :, None, None],
            "rows": row,
            "positions": positions,
            "mask": mask,
            "kept": kept,
            "kept_rows": row.repeat_interleave(width)[kept],
            "kept_positions": positions.reshape(-1)[kept],
        }
        return cls(width_p, **{k: v.to(device) for k, v in tensors.items()})


def supported(config) -> bool:
    """Whether the split computation is exact for this model: SDPA attention, no sliding window,
    no logit soft-capping in the attention (those go through the masked form)."""
    if getattr(config, "_attn_implementation", None) not in ("sdpa", NAME):
        return False
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True):
        return False
    return not getattr(config, "attn_logit_softcapping", None)


def enable(model: torch.nn.Module) -> bool:
    """Route the model's SDPA attention through ``lit_rag_sdpa`` (once; the same computation when
    no layout is given). Returns whether packed calls may pass a :class:`Layout`."""
    config = getattr(model, "config", None)
    if config is None or not supported(config):
        return False
    if config._attn_implementation != NAME:
        _register()
        for module in model.modules():  # sub-configs (text_config) carry their own copy
            sub = getattr(module, "config", None)
            if sub is not None and getattr(sub, "_attn_implementation", None) == "sdpa":
                sub._attn_implementation = NAME
    return True


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, prefix_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)


def _sdpa(
    query, key, value, mask, dropout: float, scaling: float | None, causal: bool
) -> torch.Tensor:
    """``[b, q, H, D]`` attention output. Grouped key/value heads are not repeated (``enable_gqa``:
    on the CPU with a mask as fast as the repeated form or faster, and no copy)."""
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=dropout,
        is_causal=causal,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2)


def _each(x: torch.Tensor, segments: tuple[tuple[int, int], ...], width: int) -> torch.Tensor:
    """``[n, h, width, D]``: the completions of ``x`` (``[1, h, L, D]``), each right-padded."""
    return torch.cat([F.pad(x[:, :, s : s + c], (0, 0, 0, width - c)) for s, c in segments])


def prefix_sdpa(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    shared_prefix: Layout | None = None,
    **kwargs,
):
    """transformers attention function: SDPA, split by prompt and completions when given a layout.

    ``query``: ``[R, H, L, D]``; ``key``, ``value``: ``[R, H_kv, L, D]``. Returns ``([R, L, H, D],
    None)`` as transformers' ``sdpa_attention_forward`` does.
    """
    if shared_prefix is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    return _split(query, key, value, shared_prefix.indices(query.device), dropout, scaling), None


def _split(query, key, value, ix: Indices, dropout: float, scaling: float | None) -> torch.Tensor:
    """``[R, L, H, D]``: every row's prompt attending causally to itself (one call over the
    first ``P`` positions of every row: a shorter prompt's queries never see past it), then all
    completions of all rows as one batch (each gathered with its row's prompt keys), scattered
    back to their positions. Padding positions are 0: they attend nowhere, read by nothing."""
    rows, _, length, _ = query.shape
    p = ix.prompt_width
    prompt = _sdpa(query[:, :, :p], key[:, :, :p], value[:, :, :p], None, dropout, scaling, True)
    out = F.pad(prompt * ix.prompt_tokens, (0, 0, 0, 0, 0, length - p))  # [R, L, H, D]
    if not len(ix.rows):
        return out
    at = (ix.rows[:, None], slice(None), ix.positions)  # [N, W, H, D] once indexed

    def gathered(x: torch.Tensor) -> torch.Tensor:  # [N, H, P + W, D]: row prompt, own tokens
        return torch.cat([x[ix.rows, :, :p], x[at].transpose(1, 2)], 2)

    own = _sdpa(
        query[at].transpose(1, 2), gathered(key), gathered(value), ix.mask, dropout, scaling, False
    )  # [N, W, H, D]
    picked = own.reshape(-1, *own.shape[2:])[ix.kept]
    return out.index_put((ix.kept_rows, ix.kept_positions), picked)
