"""The fused log-prob head (``lit_rag/trainer/head.py``) equals the checkpointed computation it
replaces: values, the hidden states' gradient and the head's, to 1e-5 in fp32, for a frozen head
(no recomputation) and a trained one, with a bias, a logit soft-cap, a sampling temperature and a
last chunk shorter than the others; and, through a tiny model's packed log-probs, every
parameter's gradient."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from lit_rag.models.loading import ModelConfig, TinyConfig, load_model
from lit_rag.models.packing import pack
from lit_rag.trainer import head as fused
from lit_rag.trainer import logprobs
from lit_rag.trainer.logprobs import _chunk_logprobs, packed_logprobs


def checkpointed(head, hidden, targets, temperature, softcap, chunk):
    """The computation before the fused head: each chunk checkpointed through autograd."""
    out = []
    for i in range(0, hidden.shape[0], chunk):
        args = (head, hidden[i : i + chunk], targets[i : i + chunk], temperature, softcap)
        out.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
    return torch.cat(out)


def run(fn, head, hidden, targets, weights, **kw):
    """Values and gradients of ``sum(weights * fn(...))``."""
    head.zero_grad()
    h = hidden.clone().requires_grad_(True)
    values = fn(head, h, targets, **kw)
    (values * weights).sum().backward()
    grads = [h.grad] + [p.grad for p in head.parameters() if p.requires_grad]
    return values.detach(), grads


@pytest.mark.parametrize("trained", [False, True], ids=["frozen", "trained"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize(
    ("temperature", "softcap"), [(1.0, None), (0.7, None), (1.0, 30.0), (0.6, 5.0)]
)
def test_fused_head_equals_the_checkpointed_chunks(trained, bias, temperature, softcap):
    torch.manual_seed(0)
    head = torch.nn.Linear(24, 97, bias=bias)
    head.requires_grad_(trained)
    hidden, targets = torch.randn(23, 24) * 3, torch.randint(0, 97, (23,))
    weights = torch.randn(23)  # the loss's per-token gradient: any sign, any size
    kw = {"temperature": temperature, "softcap": softcap}
    ours, our_grads = run(fused.head_logprobs, head, hidden, targets, weights, chunk_tokens=5, **kw)
    theirs, their_grads = run(checkpointed, head, hidden, targets, weights, chunk=5, **kw)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert len(our_grads) == len(their_grads) == 1 + trained * (1 + bias)
    for mine, reference in zip(our_grads, their_grads, strict=True):
        torch.testing.assert_close(mine, reference, atol=1e-5, rtol=1e-5)


def test_a_frozen_head_is_not_run_again_in_the_backward(monkeypatch):
    """The frozen head's gradient is computed in the forward: the backward runs no matmul with
    the head's weight (a trained head's recomputes each chunk once)."""
    calls = []
    linear = fused.F.linear
    monkeypatch.setattr(fused.F, "linear", lambda *a: calls.append(1) or linear(*a))
    for trained, after_backward in ((False, 0), (True, 3)):
        head = torch.nn.Linear(8, 31).requires_grad_(trained)
        hidden = torch.randn(10, 8, requires_grad=True)
        values = fused.head_logprobs(head, hidden, torch.randint(0, 31, (10,)), chunk_tokens=4)
        calls.clear()
        values.sum().backward()
        assert len(calls) == after_backward


def test_under_bf16_autocast_the_head_computes_as_f_linear_does():
    """Mixed precision: the head's matmul in bf16 as autocast runs ``F.linear``, fp32 weights."""
    torch.manual_seed(1)
    head = torch.nn.Linear(32, 64, bias=False)
    hidden, targets = torch.randn(12, 32), torch.randint(0, 64, (12,))
    weights = torch.randn(12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, our_grads = run(fused.head_logprobs, head, hidden, targets, weights, chunk_tokens=5)
        theirs, their_grads = run(
            checkpointed, head, hidden, targets, weights, chunk=5, temperature=1.0, softcap=None
        )
    torch.testing.assert_close(ours, theirs, atol=1e-3, rtol=0)
    for mine, reference in zip(our_grads, their_grads, strict=True):
        assert mine.dtype == reference.dtype
        torch.testing.assert_close(mine, reference, atol=2e-2, rtol=2e-2)


def test_heads_the_fused_function_cannot_read_keep_the_checkpointed_path():
    plain = torch.nn.Linear(4, 6)
    assert fused.fusable(plain)
    hooked = torch.nn.Linear(4, 6)
    hooked.forward = lambda x: x  # a hook library's instance-level forward
    assert not fused.fusable(hooked)
    assert fused.fusable(hooked, inside_forward=True)  # the picking head's own swap

    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    assert not fused.fusable(Scaled(4, 6))
    assert not fused.fusable(torch.nn.Embedding(4, 6))


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_a_tiny_models_packed_logprobs_and_every_gradient_are_unchanged(monkeypatch, tie):
    torch.manual_seed(2)
    model = load_model(ModelConfig(tiny=TinyConfig()))  # ties the head to the embeddings
    if not tie:
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    ids = torch.randint(3, 200, (4, 14))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a left-padded prompt
    mask[2, -4:] = 0  # a short completion
    packed = pack(ids, mask, 6, share=False)

    calls = []
    spy = fused.head_logprobs
    monkeypatch.setattr(logprobs, "head_logprobs", lambda *a: calls.append(1) or spy(*a))

    def values_and_grads(fuse: bool):
        monkeypatch.setattr(logprobs, "fusable", (lambda *a: False) if not fuse else fused.fusable)
        model.zero_grad()
        values = packed_logprobs(model, packed, temperature=0.9, chunk_tokens=4)
        (values * torch.linspace(-1, 2, values.numel()).view_as(values)).sum().backward()
        return values.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    ours, our_grads = values_and_grads(True)
    theirs, their_grads = values_and_grads(False)
    assert len(calls) == 1  # the fused head ran once, the second run checkpointed
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert our_grads.keys() == their_grads.keys()
    for name, grad in our_grads.items():
        torch.testing.assert_close(grad, their_grads[name], atol=1e-5, rtol=1e-5, msg=name)
