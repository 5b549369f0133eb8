"""Attention of a packed shared-prefix sequence without the dense block mask.

A packed sequence ``[prompt | completion 1 | ... | completion k]`` (:mod:`lit_rag.models.packing`)
under a block mask makes SDPA score every query against every key of the sequence: with a
2,000-token prompt and 7 completions of 256 tokens that is 3,792^2 scores per head, most of them
masked, and SDPA's causal fast path is lost. Prefix Grouper (Liu et al., arXiv 2506.05433,
Section 3.2, "grouped attention") splits the computation instead, and so do we:

- the prompt attends to itself, causal (``is_causal``: the kernel skips the upper triangle);
- the completions of the prompt attend, as one batch, to the prompt's keys and values plus their
  own earlier tokens (each completion padded to the longest of its group).

The outputs are put back in the packed layout, so the result and its gradients equal the masked
computation's (within float rounding: only the order of the sums differs). With the example
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
    _, heads, length, dim = query.shape
    rows = []
    for r, (p, segments) in enumerate(
        zip(shared_prefix.prompts, shared_prefix.completions, strict=True)
    ):
        q, k, v = query[r : r + 1], key[r : r + 1], value[r : r + 1]
        # the prompt attends causally to itself: [p, H, D]
        pieces = [_sdpa(q[:, :, :p], k[:, :, :p], v[:, :, :p], None, dropout, scaling, True)[0]]
        if segments:
            pieces += _completions(q, k, v, p, segments, dropout, scaling)
        used = p + sum(c for _, c in segments)
        if used < length:  # padding of the micro-batch: attends nowhere, read by nothing
            pieces.append(query.new_zeros(length - used, heads, dim))
        rows.append(torch.cat(pieces))
    return torch.stack(rows), None


def _completions(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    p: int,
    segments: tuple[tuple[int, int], ...],
    dropout: float,
    scaling: float | None,
) -> list[torch.Tensor]:
    """Each completion of one packed row attending to the row's prompt (its first ``p``
    positions) and causally to itself: one ``[c, H, D]`` per segment."""
    n, width = len(segments), max(c for _, c in segments)
    device = q.device
    # [n, H_kv, p + width, D]
    keys = torch.cat([k[:, :, :p].expand(n, -1, -1, -1), _each(k, segments, width)], 2)
    values = torch.cat([v[:, :, :p].expand(n, -1, -1, -1), _each(v, segments, width)], 2)
    lengths = torch.tensor([c for _, c in segments], device=device)
    own = torch.ones(width, width, dtype=torch.bool, device=device).tril()  # [width, width]
    real = torch.arange(width, device=device) < lengths[:, None]  # [n, width] key is a token
    prompt = torch.ones(n, width, p, dtype=torch.bool, device=device)
    allowed = torch.cat([prompt, own & real[:, None, :]], 2).unsqueeze(1)  # [n, 1, width, p+width]
    out = _sdpa(_each(q, segments, width), keys, values, allowed, dropout, scaling, False)
    return [out[j, :c] for j, (_, c) in enumerate(segments)]  # out: [n, width, H, D]
