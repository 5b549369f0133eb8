"""LaggedEngine on a tiny random Llama built here (no download): it generates through the real
``hf`` engine, its copy follows the policy only at every ``sync_every``-th optimizer step, and
its step count survives a checkpoint."""

from __future__ import annotations

from importlib import metadata

import pytest
import torch
from lit_rag_lagged_engine import LaggedEngine, registered_engine

from lit_rag.api import RolloutEngine, SamplingParams

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)
PROMPTS = [[2, 3, 4], [5, 6]]


@pytest.fixture
def policy():
    """A 1-layer Llama with tied embeddings and a 32-word tokenizer (ids 0 pad, 1 eos)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(30)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>"
    )
    config = LlamaConfig(
        vocab_size=len(words),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval(), tokenizer


def optimizer_step(model: torch.nn.Module, seed: int) -> None:
    """What an update does to the policy: every weight moves."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.5)


def rollout(engine: RolloutEngine) -> list[list[int]]:
    """One rollout as the policy module runs it."""
    with engine.generating():
        out = engine.generate(PROMPTS, GREEDY)
    engine.idle()
    return [g.token_ids.tolist() for g in out]


def live(model, tokenizer) -> list[list[int]]:
    """Greedy completions of the built-in hf engine on the policy itself."""
    hf = registered_engine("hf")
    hf.bind(model, tokenizer)
    return [g.token_ids.tolist() for g in hf.generate(PROMPTS, GREEDY)]


def test_on_policy_it_generates_what_the_policy_does(policy) -> None:
    model, tokenizer = policy
    engine = LaggedEngine()  # sync_every 1, the policy's dtype
    engine.bind(model, tokenizer)
    assert rollout(engine) == live(model, tokenizer)
    assert engine.copy is not model and engine.engine.model is engine.copy
    with engine.generating():
        ours = engine.generate(PROMPTS, GREEDY)
    hf = registered_engine("hf")
    hf.bind(model, tokenizer)
    theirs = hf.generate(PROMPTS, GREEDY)
    for a, b in zip(ours, theirs, strict=True):  # same weights, same dtype: the same log-probs
        torch.testing.assert_close(a.logprobs, b.logprobs)
    assert engine.context_window() == 64  # the policy's max_position_embeddings


def test_the_copy_follows_every_second_step(policy) -> None:
    model, tokenizer = policy
    engine = LaggedEngine(sync_every=2)
    engine.bind(model, tokenizer)
    lags, follows = [], []
    for step in range(4):
        completions = rollout(engine)
        follows.append(completions == live(model, tokenizer))
        lags.append(engine.metrics()["engine/policy_lag"])
        optimizer_step(model, seed=step)
        engine.sync_weights()
    # step 0: w0 (built), step 1: still w0 while the policy is at w1, step 2: reloaded at w2, ...
    assert lags == [0.0, 1.0, 0.0, 1.0]
    assert follows[0] and follows[2]  # lag 0: the policy's own completions
    assert engine.updates == 4 and engine.copied_at == 2
    torch.testing.assert_close(  # the copy holds w2, not w4
        engine.copy.lm_head.weight, model.lm_head.weight - _moves(model, seeds=(2, 3))
    )


def _moves(model, seeds) -> torch.Tensor:
    """The sum of ``optimizer_step``'s moves of the (tied) head weight over ``seeds``."""
    total = torch.zeros_like(model.lm_head.weight)
    for seed in seeds:
        generator = torch.Generator().manual_seed(seed)
        for p in model.parameters():
            move = torch.randn(p.shape, generator=generator) * 0.5
            if p is model.lm_head.weight:
                total += move
    return total


def test_metrics_report_the_reload_time_once(policy) -> None:
    model, tokenizer = policy
    engine = LaggedEngine()
    engine.bind(model, tokenizer)
    rollout(engine)
    first = engine.metrics()
    assert first["engine/policy_lag"] == 0.0 and first["time/weight_sync_s"] > 0
    assert engine.metrics() == {}  # nothing new since


def test_a_bfloat16_copy(policy) -> None:
    model, tokenizer = policy
    engine = LaggedEngine(dtype="bfloat16")
    engine.bind(model, tokenizer)
    completions = rollout(engine)
    assert engine.copy.lm_head.weight.dtype == torch.bfloat16
    assert model.lm_head.weight.dtype == torch.float32  # the policy is untouched
    assert all(0 < len(c) <= 6 for c in completions)  # it generates (EOS kept, budget 6)


def test_resume_reloads_and_keeps_counting(policy) -> None:
    model, tokenizer = policy
    before = LaggedEngine(sync_every=2)
    before.bind(model, tokenizer)
    for step in range(3):  # 3 optimizer steps: reloaded after step 2, lag 1 now
        rollout(before)
        optimizer_step(model, seed=step)
        before.sync_weights()
    state = before.state_dict()
    assert state == {"updates": 3}

    after = LaggedEngine(sync_every=2)  # a new process: checkpoint loaded, then one sync
    after.bind(model, tokenizer)
    after.load_state_dict(state)
    after.sync_weights()  # the policy module's sync after restoring the weights: not a step
    assert after.updates == 3
    assert rollout(after) == live(model, tokenizer)  # lag 0: the restored weights
    assert after.metrics()["engine/policy_lag"] == 0.0
    optimizer_step(model, seed=3)
    after.sync_weights()  # step 4: a multiple of 2, as in the uninterrupted run
    rollout(after)
    assert after.updates == 4 and after.copied_at == 4


def test_bad_settings_and_a_quantized_policy(policy) -> None:
    with pytest.raises(ValueError, match="engine sync_every: got 0; expected"):
        LaggedEngine(sync_every=0)
    with pytest.raises(ValueError, match="engine dtype: got 'fp8'; allowed: float32, bfloat16"):
        LaggedEngine(dtype="fp8")
    model, tokenizer = policy
    model.config.quantization_config = {"load_in_4bit": True}
    with pytest.raises(ValueError, match="engine lagged: the policy is quantized"):
        LaggedEngine().bind(model, tokenizer)
    with pytest.raises(RuntimeError, match="not bound to a model"):
        LaggedEngine().generate(PROMPTS, GREEDY)


def test_registered_as_lagged() -> None:
    (ep,) = [ep for ep in metadata.entry_points(group="lit_rag.engines") if ep.name == "lagged"]
    assert ep.dist.metadata["Name"] == "lit-rag-lagged-engine"
    assert ep.load() is LaggedEngine
    assert issubclass(LaggedEngine, RolloutEngine)
