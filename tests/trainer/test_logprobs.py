"""Chunked, checkpointed log-probs equal the plain full-logits computation (values and grads)."""

import pytest
import torch

from lit_rag.trainer.logprobs import completion_logprobs, full_logprobs_reference


def batch(tokenizer):
    # two rows, prompts left-padded to 5, completions right-padded to 4
    pad = tokenizer.pad_token_id
    ids = torch.tensor(
        [[pad, pad, 10, 11, 12, 20, 21, 22, pad], [13, 14, 15, 16, 17, 23, 24, 25, 26]]
    )
    mask = (torch.arange(9) >= 2).long().unsqueeze(0).repeat(2, 1)
    mask[1] = 1
    mask[0, 8] = 0
    return ids, mask


@pytest.mark.parametrize("chunk", [1, 3, 512])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_full(tiny_policy, chunk, temperature):
    model, tok = tiny_policy
    ids, mask = batch(tok)
    ours = completion_logprobs(model, ids, mask, 4, temperature=temperature, chunk_tokens=chunk)
    ref = full_logprobs_reference(model, ids, mask, 4, temperature=temperature)
    valid = mask[:, -4:].bool()
    assert ours.shape == (2, 4)
    assert torch.allclose(ours[valid], ref[valid], atol=1e-5)


def test_gradients_match(tiny_policy):
    model, tok = tiny_policy
    model.train()
    ids, mask = batch(tok)
    valid = mask[:, -4:].float()
    grads = []
    for fn in (
        lambda: completion_logprobs(model, ids, mask, 4, chunk_tokens=2),
        lambda: full_logprobs_reference(model, ids, mask, 4),
    ):
        model.zero_grad()
        (fn() * valid).sum().backward()
        grads.append(
            torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        )
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_left_padding_does_not_change_logprobs(tiny_policy):
    # position ids come from the attention mask, so padding on the left changes nothing
    model, tok = tiny_policy
    pad = tok.pad_token_id
    plain = torch.tensor([[10, 11, 12, 20, 21]])
    padded = torch.tensor([[pad, pad, 10, 11, 12, 20, 21]])
    a = completion_logprobs(model, plain, torch.ones_like(plain), 2)
    b = completion_logprobs(
        model, padded, (padded != pad).long() | (torch.arange(7) >= 2).long(), 2
    )
    assert torch.allclose(a, b, atol=1e-5)
