"""The ``vllm`` rollout engine: a vLLM copy of the policy on the training GPU, synced after
each optimizer step (DESIGN.md, "Scale": one GPU, vLLM engine, LoRA/QLoRA).

Targets the vLLM V1 offline API of vLLM >= 0.10.2 (``vllm.LLM``, ``vllm.SamplingParams``,
``vllm.lora.request.LoRARequest``, ``LLM.sleep`` / ``LLM.wake_up`` / ``LLM.reset_prefix_cache``,
the ``logprobs_mode`` engine argument). Importing this module never imports vLLM: the import
happens when the first ``generate`` builds the engine, so a CPU install can list and resolve
the plugin without vLLM.

How it follows the :class:`~lit_rag.rollout.base.Generation` contract:

- Sampling log-probs. vLLM V1 returns the log-prob of the sampled token at every position
  when ``SamplingParams(logprobs=0)`` (0 extra top-k entries, the sampled token always
  included). By default V1 reports *raw* log-probs (before temperature and top-k/top-p); the
  engine builds vLLM with ``logprobs_mode="processed_logprobs"`` so the values are log-probs
  under the distribution the token was drawn from, as the ``hf`` engine reports them. Their
  role in training is small: ``PolicyModule.optimize`` never puts ``sampling_logprobs`` into
  the loss (with ``mu == 1`` the old log-probs are the detached new ones; with ``mu > 1`` they
  are recomputed from the policy before the update), so they are a record on each
  ``Trajectory`` (e.g. to measure the inference/training mismatch), not the ratio's base.
- Groups arrive as repeated prompts, so every request asks for ``n=1``; no per-request seed
  is set (a seeded request draws the same sample for every copy of a prompt), the engine
  seed goes to ``LLM(seed=...)`` instead.
- ``finished`` is ``finish_reason == "stop"`` (EOS or a stop string); ``"length"`` (the
  budget) and an aborted request are not finished. Stop strings are kept in the output.
  ``text`` is decoded from ``token_ids`` with the policy's tokenizer, as the ``hf`` engine
  does, so text and ids always agree.

Weight sync (after ``sync_weights``, pushed on the next ``generate``; also on the first one,
so a run resumed from a checkpoint samples from the restored weights, not the ones on disk):

- ``lora_sync="merge"``: for a peft model the adapters are merged into the base weights,
  the state dict is renamed to the base model's checkpoint names (the TRL
  ``GRPOTrainer._move_model_to_vllm`` recipe: strip ``base_model.model.``, drop
  ``.base_layer``, skip ``lora_*`` tensors and ``original_module`` copies, unwrap
  ``modules_to_save``), loaded with the vLLM model's own ``load_weights`` and unmerged again.
  A fully fine-tuned model is loaded under its plain state-dict names.
- ``lora_sync="adapter"``: the adapter is saved with ``save_pretrained`` and served through a
  new ``LoRARequest`` whose id is one higher (vLLM caches adapters by id), on a vLLM built
  with ``enable_lora=True``; the base weights in vLLM never change.

Sleep mode (``sleep_mode=True``, colocated): vLLM sleeps at level 1 (weights offloaded to
CPU, KV cache freed) after every ``generate``, so the update step gets the GPU memory. One
``generate`` runs: wake the weights -> load pending weights -> wake the KV cache -> reset the
prefix cache -> generate -> sleep (when ``LLM.wake_up`` takes ``tags``; an older vLLM wakes
everything at once, the order is otherwise the same).

Not covered: policies sharded across ranks (FSDP, DeepSpeed ZeRO-3) would need their state
dict gathered before the push; with tensor parallelism the weights travel to vLLM's worker
processes through ``LLM.apply_model`` (CPU copies), which is slower than the in-process path.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Iterable

import torch

from lit_rag.modules.loading import has_adapters
from lit_rag.rollout.base import Generation, RolloutEngine, SamplingParams

INSTALL_HINT = "the vllm engine needs vLLM on a CUDA machine: pip install 'lit-rag[vllm]'"
LORA_SYNC = ("merge", "adapter")
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
# max_lora_rank values vLLM's LoRAConfig accepts; a peft rank is rounded up to the next one
_VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
_MODULES_TO_SAVE = re.compile(r"\.modules_to_save\.[^.]+\.")


def _import_vllm():
    """The ``vllm`` module, or one clear ImportError."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return vllm


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


def _driver_model(llm) -> torch.nn.Module | None:
    """vLLM's model when its worker runs in this process (tensor parallel 1, in-process
    engine core); ``None`` otherwise."""
    executor = getattr(getattr(llm, "llm_engine", None), "model_executor", None)
    worker = getattr(executor, "driver_worker", None)
    worker = getattr(worker, "worker", worker)  # V1 wraps the worker in a WorkerWrapperBase
    runner = getattr(worker, "model_runner", None)
    return getattr(runner, "model", None)


class VLLMEngine(RolloutEngine):
    """Sampling with vLLM on the training GPU, weights synced after each optimizer step.

    Args:
        model_path: Weights vLLM loads at start (HF folder or hub id); default: the policy's
            own ``name_or_path`` (the base model's for a LoRA policy).
        gpu_memory_utilization: Fraction of GPU memory vLLM may take (weights + KV cache).
        tensor_parallel_size: GPUs vLLM shards the model over.
        sleep_mode: Offload vLLM's weights and free its KV cache between rollouts.
        lora_sync: ``merge`` (merged full weights are loaded into vLLM) or ``adapter`` (the
            LoRA adapter is saved and served as a ``LoRARequest``; needs a LoRA policy).
        max_model_len: Longest prompt + completion vLLM plans for; default: the model's.
        dtype: vLLM weight dtype (``auto`` = the checkpoint's).
        enforce_eager: Skip CUDA graphs (less memory, slower decoding).
        seed: vLLM engine seed.
        logprobs_mode: ``processed_logprobs`` (after temperature/top-k/top-p, the sampling
            distribution), ``raw_logprobs`` (vLLM's default), or ``None`` to not pass the
            argument (vLLM < 0.10.2).
    """

    def __init__(
        self,
        model_path: str | None = None,
        gpu_memory_utilization: float = 0.6,
        tensor_parallel_size: int = 1,
        sleep_mode: bool = True,
        lora_sync: str = "merge",
        max_model_len: int | None = None,
        dtype: str = "auto",
        enforce_eager: bool = False,
        seed: int = 0,
        logprobs_mode: str | None = "processed_logprobs",
    ) -> None:
        if lora_sync not in LORA_SYNC:
            raise ValueError(f"engine lora_sync '{lora_sync}' is not known; allowed: {', '.join(LORA_SYNC)}")
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"engine gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if tensor_parallel_size < 1:
            raise ValueError(f"engine tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        if logprobs_mode is not None and logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"engine logprobs_mode '{logprobs_mode}' is not supported; "
                f"allowed: {', '.join(LOGPROBS_MODES)}"
            )
        self.model_path = model_path
        self.gpu_memory_utilization = gpu_memory_utilization
        self.tensor_parallel_size = tensor_parallel_size
        self.sleep_mode = sleep_mode
        self.lora_sync = lora_sync
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.enforce_eager = enforce_eager
        self.seed = seed
        self.logprobs_mode = logprobs_mode
        self._llm = None
        self._asleep = False
        self._stale = True  # the first generate pushes the live weights too
        self._lora_id = 0
        self._lora_request = None
        self._adapter_dir: str | None = None

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
        """Mark vLLM's weights stale; the next ``generate`` pushes the policy's."""
        self._stale = True

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if self.model is None or self.tokenizer is None:
            raise RuntimeError("the vllm engine is not bound to a model; call bind(model, tokenizer)")
        if not prompts:
            return []
        vllm = _import_vllm()
        self._prepare()
        try:
            outputs = self._llm.generate(
                [{"prompt_token_ids": [int(t) for t in p]} for p in prompts],
                vllm.SamplingParams(**to_vllm_sampling(params)),
                use_tqdm=False,
                lora_request=self._lora_request,
            )
        finally:
            self._sleep()
        return [to_generation(out.outputs[0], self.tokenizer) for out in outputs]

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
            "seed": self.seed,
            "enable_sleep_mode": self.sleep_mode,
        }
        if self.logprobs_mode is not None:
            kwargs["logprobs_mode"] = self.logprobs_mode
        if self.lora_sync == "adapter":
            rank = int(next(iter(self.model.peft_config.values())).r)
            kwargs.update(
                enable_lora=True,
                max_loras=1,
                max_lora_rank=next((r for r in _VLLM_LORA_RANKS if r >= rank), rank),
            )
        return kwargs

    def _make_llm(self):
        """Build ``vllm.LLM`` (the one place vLLM is constructed; tests replace it)."""
        vllm = _import_vllm()
        if self.tensor_parallel_size == 1:
            # engine core and worker in this process: weights are loaded by reference, no copy
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        else:
            # LLM.apply_model ships our own closure to vLLM's worker processes
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        return vllm.LLM(**self.llm_kwargs())

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
        if self.sleep_mode and self._llm is not None and not self._asleep:
            self._llm.sleep(level=1)  # level 1 keeps the weights (in CPU memory) for validation
            self._asleep = True

    # ---- weight sync ---------------------------------------------------------------------
    def _push_weights(self) -> None:
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

    def _load_weights(self, pairs: list[tuple[str, torch.Tensor]]) -> None:
        """Load (checkpoint name, tensor) pairs into vLLM's model (it shards and casts them)."""
        model = _driver_model(self._llm)
        if model is not None:
            model.load_weights(weights=pairs)
            return
        cpu = [(name, tensor.detach().cpu()) for name, tensor in pairs]
        self._llm.apply_model(lambda vllm_model: vllm_model.load_weights(weights=cpu))

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


def _is_quantized(model: torch.nn.Module) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(getattr(base, "is_quantized", False) or getattr(base, "is_loaded_in_4bit", False)
                or getattr(base, "is_loaded_in_8bit", False))
