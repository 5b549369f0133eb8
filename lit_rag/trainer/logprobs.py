"""Log-probs of sampled tokens without holding the full-vocabulary logits.

For SmolLM2 a batch of 8 x 512 tokens has 8 x 512 x 49,152 logits (800 MB in fp32, twice that
with the log-softmax). We run the decoder once for hidden states, then apply the output head
to the completion positions only, a chunk of rows at a time, through the fused log-prob head
(:mod:`lit_rag.trainer.head`: its own backward, nothing of a chunk kept, no recomputation for a
frozen head). A head it cannot read (quantized, LoRA-wrapped, sharded) has each chunk
checkpointed instead, so the backward pass recomputes that chunk's logits. Peak extra memory
is one chunk: ``chunk_tokens x vocab`` floats. A sharded model (FSDP,
ZeRO-3) gathers its head's weights only inside its own forward, so there the head is swapped,
for the call, for one that does the same chunked computation inside the forward
(:func:`_forward_picked_logprobs`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from lit_rag.models import attention as prefix_attention
from lit_rag.models.packing import Packed, model_mask
from lit_rag.trainer.head import fusable, head_logprobs


def _base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper (LoRA layers are injected in place)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _chunk_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    softcap: float | None,
) -> torch.Tensor:
    logits = head(hidden).float()  # [n, V]
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:
        logits = logits / temperature
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [n]
    return picked - torch.logsumexp(logits, dim=-1)


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    temperature: float = 1.0,
    chunk_tokens: int = 512,
) -> torch.Tensor:
    """Log-probs of the last ``completion_length`` tokens of each row.

    Args:
        model: A transformers causal LM, or a peft model around one.
        input_ids: ``[B, P + C]``, prompts left-padded, completions right-padded.
        attention_mask: ``[B, P + C]``, 0 on padding.
        completion_length: ``C``.
        temperature: Divide logits by this (match the sampling temperature).
        chunk_tokens: Rows of the output head computed at once.

    Returns:
        ``[B, C]`` log-probs (values at padded positions are meaningless; mask them).
    """
    base = _base_model(model)
    decoder = base.get_decoder()
    head = base.get_output_embeddings()
    softcap = getattr(base.config, "final_logit_softcapping", None)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, P+C]
    hidden = decoder(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    ).last_hidden_state  # [B, P+C, H]
    batch, width = input_ids.shape
    start = width - completion_length
    # position t predicts token t+1: hidden[start-1 : width-1] predicts the completion
    h = hidden[:, start - 1 : width - 1].reshape(batch * completion_length, -1)  # [B*C, H]
    targets = input_ids[:, start:].reshape(-1)  # [B*C]
    return _head_logprobs(head, h, targets, temperature, softcap, chunk_tokens).view(
        batch, completion_length
    )


def _head_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    softcap: float | None,
    chunk_tokens: int,
    inside_forward: bool = False,
) -> torch.Tensor:
    """``[n]`` log-probs of ``targets`` from ``[n, H]`` hidden states, the head applied a chunk of
    rows at a time: fused (:func:`~lit_rag.trainer.head.head_logprobs`) where the head is a plain
    linear layer, else checkpointed under autograd (the backward recomputes a chunk's logits).
    ``head`` may be a module's original ``forward`` (the picking head's), its module then
    ``head.__self__``."""
    module = getattr(head, "__self__", head)
    if isinstance(module, torch.nn.Module) and fusable(module, inside_forward):
        return head_logprobs(module, hidden, targets, temperature, softcap, chunk_tokens)
    out = []
    for i in range(0, hidden.shape[0], chunk_tokens):
        hc, tc = hidden[i : i + chunk_tokens], targets[i : i + chunk_tokens]
        if torch.is_grad_enabled() and hc.requires_grad:
            out.append(
                checkpoint(_chunk_logprobs, head, hc, tc, temperature, softcap, use_reentrant=False)
            )
        else:
            out.append(_chunk_logprobs(head, hc, tc, temperature, softcap))
    return torch.cat(out) if out else hidden.new_zeros(0)


def packed_logprobs(
    model: torch.nn.Module,
    packed: Packed,
    temperature: float = 1.0,
    chunk_tokens: int = 512,
    through_forward: bool = False,
    split: bool = True,
) -> torch.Tensor:
    """``[rows, width]`` log-probs of the completion tokens of a packed micro-batch
    (:func:`lit_rag.models.packing.pack`; 0 where a row has no token).

    The decoder runs once over the packed sequences and the output head only at the positions
    that predict a completion token, in chunks (see :func:`completion_logprobs`).
    ``through_forward``: call the model's own forward instead (FSDP, ZeRO-3: see
    :func:`root_forward_logprobs`), keeping the logits of the predicting positions only.
    ``split``: a shared prompt's attention runs split by prompt and completions
    (:mod:`lit_rag.models.attention`) where the model's attention allows; ``False``
    keeps the dense block mask (the same values).
    """
    base = _base_model(model)
    if packed.layout is not None and split and prefix_attention.enable(base):
        inputs = {"attention_mask": None, "shared_prefix": packed.layout}  # no dense block mask
    else:
        inputs = {
            "attention_mask": model_mask(
                packed.attention_mask, getattr(base.config, "_attn_implementation", None)
            )
        }
    if through_forward:
        values = _forward_picked_logprobs(model, packed, inputs, temperature, chunk_tokens)
    else:
        rows, positions = packed.sources[:, 0], packed.sources[:, 1]
        hidden = base.get_decoder()(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            use_cache=False,
            **inputs,
        ).last_hidden_state  # [R, L, H]
        values = _head_logprobs(
            base.get_output_embeddings(),
            hidden[rows, positions],
            packed.targets,
            temperature,
            getattr(base.config, "final_logit_softcapping", None),
            chunk_tokens,
        )
    out = torch.zeros(packed.rows * packed.width, dtype=values.dtype, device=values.device)
    return out.index_copy(0, packed.slots, values).view(packed.rows, packed.width)


def _forward_picked_logprobs(
    model: torch.nn.Module,
    packed: Packed,
    inputs: dict,
    temperature: float,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """``[T]`` log-probs of a packed micro-batch's completion tokens through the model's own
    forward (FSDP, ZeRO-3: the output head's weights are gathered only inside it).

    With ``chunk_tokens`` the output head itself is swapped, for this call, for one that picks
    the completion positions and computes their log-probs ``chunk_tokens`` rows at a time
    (:func:`_head_logprobs`: checkpointed under autograd), inside the forward where the head's
    weights are whole: no ``[T, V]`` logits (Qwen's 151,936-token vocabulary at 4,096 tokens:
    2.5 GB in fp32, several times that with their copies and gradient). The backward recomputes
    a chunk after FSDP's pre-backward hook has gathered the head again. A model that soft-caps
    its logits after the head (Gemma 2) keeps the whole-logits path: the forward would cap the
    log-probs."""
    rows, positions = packed.sources[:, 0], packed.sources[:, 1]
    keep = torch.unique(positions)  # sorted
    picked_at = torch.searchsorted(keep, positions.contiguous())  # [T]: index into keep
    base = _base_model(model)
    head = base.get_output_embeddings()
    softcap = getattr(base.config, "final_logit_softcapping", None)
    picking = chunk_tokens is not None and head is not None and not softcap
    with (
        _picking_head(head, rows, picked_at, packed.targets, temperature, chunk_tokens)
        if picking
        else contextlib.nullcontext()
    ):
        logits = model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            use_cache=False,
            logits_to_keep=keep,
            **inputs,
        ).logits  # picking: [T] log-probs; else [R, K, V]
    if picking:
        return logits
    picked = logits[rows, picked_at].float()  # [T, V]
    if temperature != 1.0:
        picked = picked / temperature
    chosen = picked.gather(-1, packed.targets.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(picked, -1)


@contextlib.contextmanager
def _picking_head(
    head: torch.nn.Module,
    rows: torch.Tensor,
    picked_at: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk_tokens: int,
) -> Iterator[None]:
    """``head`` returns, while open, the ``[T]`` log-probs of ``targets`` at ``(rows,
    picked_at)`` of the hidden states it is given (``[R, K, H]``), chunk by chunk."""
    own = head.__dict__.get("forward")  # an instance-level forward (a hook library's) stays
    original = head.forward

    def picking(hidden: torch.Tensor) -> torch.Tensor:
        return _head_logprobs(
            original, hidden[rows, picked_at], targets, temperature, None, chunk_tokens, own is None
        )

    head.forward = picking
    try:
        yield
    finally:
        if own is not None:
            head.forward = own
        else:
            del head.forward


def root_forward_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """:func:`completion_logprobs` through the model's own forward, for sharded models.

    Under FSDP the output head and the embeddings belong to the root unit, whose parameters are
    gathered only inside the root's forward, so the decoder and the head cannot be called one by
    one. ``logits_to_keep`` limits the logits to the completion positions (``[B, C, V]``, not
    chunked: the price of sharding).
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    # position t predicts token t + 1: [B, C, V]
    logits = (
        model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=completion_length + 1,
        )
        .logits[:, :-1]
        .float()
    )
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, -completion_length:]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def full_logprobs_reference(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_length: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """The plain (memory-hungry) computation, for tests: full logits, log-softmax, gather."""
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = (
        model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).logits.float()
        / temperature
    )
    logp = F.log_softmax(logits[:, -completion_length - 1 : -1], dim=-1)
    return logp.gather(-1, input_ids[:, -completion_length:].unsqueeze(-1)).squeeze(-1)
