"""The output head's log-probs of the sampled tokens, fused: no ``[T, V]`` logits kept.

``log p(y_t) = z_t[y_t] - logsumexp(z_t)`` with ``z_t = cap(W h_t + b) / temperature`` needs the
full-vocabulary row ``z_t`` only for a moment. :class:`HeadLogprobs` computes it a chunk of rows
at a time, keeps one fp32 number per token (the log-sum-exp) and writes its own backward:
``d log p(y_t) / d z_t = onehot(y_t) - softmax(z_t)``.

- **Frozen head** (LoRA, the usual case): the gradient of ``log p(y_t)`` with respect to
  ``h_t`` depends on row ``t`` alone, so the forward computes it while the chunk's logits exist
  (``G_t = (onehot - softmax) W``, ``[T, H]``) and the backward scales it by the incoming
  gradient. The head runs once per micro-batch: no recomputation.
- **Trained head** (full fine-tuning, tied embeddings): the weight's gradient sums over tokens
  with the incoming gradients, unknown in the forward, so the backward recomputes each chunk's
  logits once (as verl's ``FusedLinearForPPO`` does) and adds ``dz^T h`` to the weight's.

Against checkpointing each chunk through autograd (what this replaces), nothing of a chunk
stays saved for the backward but the log-sum-exp, and a frozen head skips the recomputation.
The matmuls run in the dtype the head's own ``F.linear`` would (the autocast dtype under mixed
precision, else the weight's), so values and gradients equal the plain computation's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fusable(head: torch.nn.Module, inside_forward: bool = False) -> bool:
    """Whether ``head`` is a plain ``nn.Linear`` whose weight the fused function may read: not
    quantized (bitsandbytes), not a LoRA wrapper, not a sharded ``DTensor``, and (outside the
    model's forward) with no instance-level ``forward`` a hook library installed."""
    if not isinstance(head, torch.nn.Linear) or type(head).forward is not torch.nn.Linear.forward:
        return False
    if not inside_forward and "forward" in head.__dict__:
        return False
    weight = head.weight
    if not weight.is_floating_point() or type(weight).__name__ == "DTensor":
        return False
    return weight.dim() == 2 and weight.numel() > 0


def head_logprobs(
    head: torch.nn.Linear,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    softcap: float | None = None,
    chunk_tokens: int = 512,
) -> torch.Tensor:
    """``[n]`` fp32 log-probs of ``targets`` (``[n]``) from ``hidden`` (``[n, H]``) through a
    :func:`fusable` head, ``chunk_tokens`` rows of logits at a time."""
    return HeadLogprobs.apply(
        hidden, head.weight, head.bias, targets, float(temperature), softcap, int(chunk_tokens)
    )


def _matmul_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype ``F.linear`` computes in here: autocast's where it is on, else the weight's."""
    device = weight.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype


def _logits(h, weight, bias, dtype, temperature, softcap):
    """``(z, capped)``: a chunk's fp32 logits after the cap and the temperature, and the capped
    value before the temperature (``None`` without a cap) for the cap's derivative."""
    b = bias.to(dtype) if bias is not None else None
    z = F.linear(h.to(dtype), weight.to(dtype), b).float()
    capped = None
    if softcap:
        capped = torch.tanh(z / softcap) * softcap
        z = capped
    if temperature != 1.0:
        z = z / temperature
    return z, capped


def _dz(z, lse, targets, capped, temperature, softcap, scale=None):
    """``d log p(y) / d(W h + b)`` of a chunk, times ``scale`` per row when given (fp32)."""
    dz = -torch.exp(z - lse.unsqueeze(-1))  # -softmax
    dz.scatter_add_(-1, targets.unsqueeze(-1), torch.ones_like(lse).unsqueeze(-1))
    if scale is not None:
        dz.mul_(scale.unsqueeze(-1))
    if capped is not None:
        dz.mul_(1.0 - (capped / softcap) ** 2)
    if temperature != 1.0:
        dz.div_(temperature)
    return dz


class HeadLogprobs(torch.autograd.Function):
    """``log softmax(cap(h W^T + b) / temperature)[y]`` a chunk at a time (see the module)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, softcap, chunk):
        dtype = _matmul_dtype(weight)
        trained = weight.requires_grad or (bias is not None and bias.requires_grad)
        per_row = ctx.needs_input_grad[0] and not trained  # G_t, computed now
        n = hidden.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(out)
        grads = hidden.new_empty(hidden.shape, dtype=torch.float32) if per_row else None
        w = weight.to(dtype)  # one copy where autocast computes in another dtype
        with torch.autocast(hidden.device.type, enabled=False):
            for i in range(0, n, chunk):
                h, y = hidden[i : i + chunk], targets[i : i + chunk]
                z, capped = _logits(h, weight, bias, dtype, temperature, softcap)
                lse[i : i + chunk] = torch.logsumexp(z, -1)
                out[i : i + chunk] = z.gather(-1, y.unsqueeze(-1)).squeeze(-1) - lse[i : i + chunk]
                if grads is not None:
                    dz = _dz(z, lse[i : i + chunk], y, capped, temperature, softcap)
                    grads[i : i + chunk] = (dz.to(dtype) @ w).float()
        ctx.settings = (dtype, temperature, softcap, chunk, per_row)
        ctx.hidden_dtype = hidden.dtype
        if per_row:
            ctx.save_for_backward(grads)
        else:
            ctx.save_for_backward(hidden, weight, bias, targets, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        dtype, temperature, softcap, chunk, per_row = ctx.settings
        if per_row:
            (grads,) = ctx.saved_tensors
            return (grads * grad_out.unsqueeze(-1)).to(ctx.hidden_dtype), *([None] * 6)
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        grads = _recomputed_grads(ctx, hidden, weight, bias, targets, lse, grad_out)
        return (*grads, None, None, None, None)


def _recomputed_grads(ctx, hidden, weight, bias, targets, lse, grad_out):
    """The trained head's backward: each chunk's logits once more, the hidden states' gradient
    and the weight's (and bias's) summed in fp32."""
    dtype, temperature, softcap, chunk, _ = ctx.settings
    want_h, want_w, want_b = ctx.needs_input_grad[:3]
    grad_h = torch.empty_like(hidden) if want_h else None
    grad_w = (
        torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
    )
    grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if want_b else None
    w = weight.to(dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        for i in range(0, hidden.shape[0], chunk):
            h, y = hidden[i : i + chunk], targets[i : i + chunk]
            z, capped = _logits(h, weight, bias, dtype, temperature, softcap)
            dz = _dz(
                z, lse[i : i + chunk], y, capped, temperature, softcap, grad_out[i : i + chunk]
            )
            dz = dz.to(dtype)
            if grad_h is not None:
                grad_h[i : i + chunk] = (dz @ w).to(hidden.dtype)
            if grad_w is not None:
                grad_w += (dz.t() @ h.to(dtype)).float()
            if grad_b is not None:
                grad_b += dz.float().sum(0)
    grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
    grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
    return grad_h, grad_w, grad_b
