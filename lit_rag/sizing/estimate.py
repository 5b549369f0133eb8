"""The memory one device (one process on CPU) needs for a run, component by component.

A :class:`Plan` holds what a recipe says that memory depends on; :func:`estimate` turns it into
:class:`Part` rows and a total, and :func:`largest_micro_batch` finds the most rows a micro-batch
can hold within a given memory. The arithmetic, per device, ``N`` devices, ``P`` weights
(``P_t`` of them trained: the LoRA adapters, or all), ``T`` packed token positions per
micro-batch (``T_c`` of them completion tokens), ``V`` the vocabulary:

- policy weights: ``P x bytes`` as held, or ``/ N`` plus two gathered layers under FSDP and
  ZeRO-3. Trained weights are held as fp32 masters whatever dtype the recipe loads (4 bytes;
  2 under a pure ``bf16-true`` / ``16-true`` precision): all of them in full training and under
  FSDP (a unit's weights share one dtype), the adapters alone with LoRA elsewhere (the frozen
  base keeps the loaded dtype);
- gradients: ``P_t x`` master bytes (twice under DDP: its reduction buckets copy them),
  ``/ N`` under FSDP and ZeRO-2/3, but whole on the device under FSDP with CPU offload (the
  micro-batches add up inside ``no_sync``);
- optimizer state: AdamW's two states, ``2 x P_t x`` master bytes (``/ N`` under FSDP);
  DeepSpeed holds the module in the compute dtype and fp32 master weights and states,
  ``12 x P_t / N``;
- reference model: a frozen copy sharded as the policy, where the algorithm needs one and the
  policy has no LoRA adapters (with LoRA the adapters are switched off instead);
- activations: ``T x layers x`` the bytes a layer keeps per token under the recipe's
  ``gradient_checkpointing`` (:func:`layer_bytes`), plus one layer recomputed;
- logits: ``min(T_c, logprob_chunk_tokens) x V x (compute + 12)`` bytes (fp32 copy, its
  log-sum-exp and its gradient), also where FSDP or ZeRO-3 runs the model's own forward (the
  head is chunked inside it);
- rollout engine: ``hf``'s KV cache for the generation batch and its per-step sampling scores;
  ``vllm``'s copy of the weights and KV cache on CPU, its ``gpu_memory_utilization`` share of
  the device on GPU;
- reward model, retrieval encoders and index, and the process's fixed overhead.

Some parts exist only in one phase of a step: the rollout engine's cache while it generates,
gradients, activations and logits during the update, the reward model's forward while it is fit.
The total is what is always held plus the largest phase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from lit_rag.sizing.shapes import ModelShape

GiB = 2**30

#: a ``lit-rag fit`` process on CPU before it loads a model: Python, torch, Lightning,
#: transformers, peft, vLLM's modules and lit-rag imported, the recipe's objects built
#: (measured: 0.536 GiB, tcmalloc, the quickstart recipe; see docs/memory.md)
CPU_RUNTIME_BYTES = int(0.54 * GiB)
#: what vLLM's CPU build adds to a process beside its weights and KV cache once its engine is
#: built (measured: 1.913 GiB for SmolLM2-135M, bf16, kv_cache_gib 1; see docs/memory.md)
VLLM_CPU_RUNTIME_BYTES = int(0.66 * GiB)
#: on CPU, what the allocator (tcmalloc) keeps over a run of the memory a step frees, as a
#: fraction of the largest phase: a run's resident memory grows over its first steps as
#: micro-batches of changing sizes come and go, then levels off (measured, see docs/memory.md)
CPU_ALLOCATOR_RETENTION = 1.0
_RETENTION_NOTE = "freed blocks kept over a run: the largest phase again (measured)"
#: a CUDA process's context, cuBLAS and NCCL workspaces: a typical figure, not measured here
CUDA_CONTEXT_BYTES = 1 * GiB
#: DeepSpeed's gradient reduction bucket (Lightning's ``reduce_bucket_size``, elements)
DEEPSPEED_BUCKET = 200_000_000

PHASES = ("always", "rollout", "update", "reward model")


@dataclass(frozen=True)
class Part:
    """One row of the estimate.

    Args:
        name: The component.
        bytes: Its bytes on one device (or in one CPU process).
        phase: When it is held: ``always`` or only during one of :data:`PHASES`.
        host: Held in host memory (CPU RAM) on a GPU run, so not in the device's total.
        share: A fraction of the device's memory instead of fixed bytes (vLLM's
            ``gpu_memory_utilization``); ``bytes`` is then filled in by :func:`estimate`.
        minimum: What the share must hold at least (vLLM: its weights and the KV cache of one
            sequence of its longest length, or it does not start).
        note: How the figure was reached, in a few words.
    """

    name: str
    bytes: int
    phase: str = "always"
    host: bool = False
    share: float = 0.0
    minimum: int = 0
    note: str = ""


@dataclass(frozen=True)
class Engine:
    """The rollout engine, as memory goes.

    Args:
        kind: ``hf``, ``vllm`` or another plugin's name (not counted).
        weight_bytes: vLLM's bytes per weight of its own copy.
        kv_cache_bytes: vLLM's KV cache (``kv_cache_gib``) where set.
        utilization: vLLM's ``gpu_memory_utilization``.
        sleeps: vLLM frees its GPU memory during the update (sleep mode).
        max_batch_size: hf's most sequences per ``generate`` call.
        max_model_len: vLLM's longest sequence (None: the model's).
    """

    kind: str = "hf"
    weight_bytes: float = 2.0
    kv_cache_bytes: int | None = None
    utilization: float = 0.6
    sleeps: bool = True
    max_batch_size: int | None = None
    max_model_len: int | None = None


@dataclass(frozen=True)
class Retrieval:
    """A retriever's memory: its index (host memory) and its encoder (on the device).

    Args:
        name: The retriever and its index, as the recipe names them.
        index_bytes: The index's size, or ``None`` when it is not on this machine.
        encoder_params: The query encoder's parameters (dense retrievers), else 0.
        note: Where ``index_bytes`` comes from.
    """

    name: str
    index_bytes: int | None
    encoder_params: int = 0
    note: str = ""


@dataclass(frozen=True)
class RewardModel:
    """EVO-RAG's preference model: a frozen language model read in batches.

    Args:
        shape: The encoder's numbers.
        weight_bytes: Bytes per weight (its dtype).
        batch: Texts per forward pass.
        max_length: Tokens per text at most.
    """

    shape: ModelShape
    weight_bytes: float
    batch: int
    max_length: int


@dataclass(frozen=True)
class Plan:
    """What one run's memory per device depends on (read from a recipe by
    :func:`lit_rag.sizing.recipe.plan`).

    Args:
        model: The policy's numbers.
        accelerator: ``cpu`` or ``gpu``.
        devices: Processes in the run (devices x nodes).
        strategy: ``single``, ``ddp``, ``fsdp``, ``deepspeed_stage_1`` / ``_2`` / ``_3``.
        offload: FSDP's ``cpu_offload`` or DeepSpeed's offload: sharded state on the host.
        weight_bytes: Bytes per policy weight as loaded (its dtype; the reference's).
        master_bytes: Bytes per trained weight as held: 4 (fp32 masters), 2 under a pure
            ``bf16-true`` / ``16-true`` precision.
        compute_bytes: Bytes per activation (2 under bf16 / fp16, 4 in fp32).
        quantized_bytes: Bytes per weight of the quantized linear layers (QLoRA), else None.
        lora_rank: LoRA's rank (adapters on every linear layer), or None for full training.
        reference: The algorithm needs reference log-probs.
        checkpointing: ``none``, ``selective`` or ``full``.
        prompt_tokens: Tokens of one prompt.
        completion_tokens: Tokens of one trained completion (tool output included).
        new_tokens: Tokens one generation call writes at most.
        group_size: Samples per prompt.
        prompts: Prompts per device per step.
        micro_rows: The recipe's ``micro_batch_size`` (None: tokens alone bound it).
        micro_tokens: The recipe's ``micro_batch_tokens`` (None: rows alone bound it).
        share_prefix: A group's prompt is packed once.
        logprob_chunk: ``logprob_chunk_tokens``.
        row_group: Rows that stay together (2 for DPO's pairs).
        engine: The rollout engine.
        retrieval: The retrievers.
        reward_model: EVO-RAG's preference model, if the recipe has one.
        runtime_bytes: The process's fixed overhead (None: the measured default).
    """

    model: ModelShape
    accelerator: str = "cpu"
    devices: int = 1
    strategy: str = "single"
    offload: bool = False
    weight_bytes: float = 4.0
    master_bytes: float = 4.0
    compute_bytes: int = 2
    quantized_bytes: float | None = None
    lora_rank: int | None = None
    reference: bool = False
    checkpointing: str = "selective"
    prompt_tokens: int = 512
    completion_tokens: int = 64
    new_tokens: int = 64
    group_size: int = 4
    prompts: int = 8
    micro_rows: int | None = None
    micro_tokens: int | None = 4096
    share_prefix: bool = True
    logprob_chunk: int = 512
    row_group: int = 1
    engine: Engine = field(default_factory=Engine)
    retrieval: tuple[Retrieval, ...] = ()
    reward_model: RewardModel | None = None
    runtime_bytes: int | None = None

    @property
    def sharded(self) -> bool:
        """Weights sharded across devices (FSDP, ZeRO-3)."""
        return self.strategy in ("fsdp", "deepspeed_stage_3")

    @property
    def deepspeed(self) -> bool:
        return self.strategy.startswith("deepspeed")

    @property
    def on_gpu(self) -> bool:
        return self.accelerator == "gpu"


@dataclass(frozen=True)
class Estimate:
    """The parts, with vLLM's share filled in, and what they add up to.

    Args:
        parts: The rows.
        total: Bytes one device needs at its peak (always held + the largest phase).
        host: Host memory per process on a GPU run (0 on CPU: it is all in ``total``).
        memory: The device memory the shares were taken of.
    """

    parts: list[Part]
    total: int
    host: int
    memory: int


@dataclass(frozen=True)
class MicroBatch:
    """A micro-batch's size: rows, packed token positions and completion tokens."""

    rows: int
    tokens: int
    completion_tokens: int


# ---- the arithmetic ------------------------------------------------------------------------


def trained_parameters(plan: Plan) -> int:
    """``P_t``: LoRA's ``r x (in + out)`` per linear layer, or every weight.

    SmolLM2-135M, r = 16: per layer 16 x (1,152 + 768 + 768 + 1,152 + 2,112 x 3) = 162,816;
    x 30 layers = 4,884,480.
    """
    if plan.lora_rank is None:
        return plan.model.parameters()
    per_layer = sum(plan.lora_rank * (a + b) for a, b in plan.model.linears())
    return plan.model.layers * per_layer


def held_bytes(plan: Plan) -> float:
    """Bytes per policy weight as the trainer holds it: DeepSpeed's module in its dtype;
    fp32 masters (``master_bytes``) in full training and under FSDP; the loaded dtype for a LoRA
    base elsewhere (its adapters are fp32 and few)."""
    if plan.deepspeed or (plan.lora_rank is not None and plan.strategy != "fsdp"):
        return plan.weight_bytes
    return plan.master_bytes


def _policy_weight_bytes(plan: Plan) -> float:
    """The policy's weights, whole: quantized linear layers at their bytes, the rest as held."""
    model = plan.model
    if plan.quantized_bytes is None:
        return model.parameters() * held_bytes(plan)
    linear = model.layers * sum(a * b for a, b in model.linears())
    return linear * plan.quantized_bytes + (model.parameters() - linear) * plan.weight_bytes


def _layer_weights(plan: Plan) -> float:
    """One decoder layer's weights (what FSDP gathers at a time)."""
    model = plan.model
    return sum(a * b for a, b in model.linears()) * min(held_bytes(plan), plan.compute_bytes)


def weight_parts(plan: Plan) -> list[Part]:
    """The policy's weights and the frozen reference copy."""
    whole, n = _policy_weight_bytes(plan), plan.devices
    if plan.sharded and n > 1:
        gathered = 2 * _layer_weights(plan)  # the unit in use and the one prefetched
        where = "on the host (offload)" if plan.offload else f"1/{n} per device"
        parts = [
            Part(
                "policy weights",
                int(whole / n),
                host=plan.offload,
                note=f"{_gb(whole)} whole, {where}",
            ),
            Part("gathered layers", int(gathered), note="two decoder layers gathered whole"),
        ]
    else:
        parts = [Part("policy weights", int(whole), note=_weights_note(plan))]
    if not plan.reference:
        return parts + [Part("reference model", 0, note="the algorithm needs none")]
    if plan.lora_rank is not None:
        return parts + [Part("reference model", 0, note="LoRA: the adapters are switched off")]
    reference = plan.model.parameters() * plan.weight_bytes
    if plan.sharded and n > 1:
        note = f"frozen copy, 1/{n} per device" + (" on the host" if plan.offload else "")
        return parts + [Part("reference model", int(reference / n), host=plan.offload, note=note)]
    return parts + [Part("reference model", int(reference), note="frozen copy, whole")]


def _weights_note(plan: Plan) -> str:
    if plan.quantized_bytes is not None:
        weights = _count(plan.model.parameters())
        return f"{weights} weights, linear layers at {plan.quantized_bytes:g} bytes"
    return f"{_count(plan.model.parameters())} x {held_bytes(plan):g} bytes"


def optimizer_parts(plan: Plan) -> list[Part]:
    """Gradients (update only) and AdamW's state (always)."""
    trained, n = trained_parameters(plan), plan.devices
    # fp32 masters (LoRA's adapters too); DeepSpeed's gradients are in its module's dtype
    grad_bytes = plan.weight_bytes if plan.deepspeed else plan.master_bytes
    grads = trained * grad_bytes
    if plan.strategy == "ddp" and n > 1:
        grad = Part("gradients", int(2 * grads), "update", note="trained weights' + DDP buckets")
    elif plan.strategy == "fsdp" and plan.offload:
        # FSDP1 cannot add up offloaded shards: micro-batches accumulate the whole gradient on
        # the device inside no_sync (lit_rag.models.strategies.accumulates_unsynced)
        note = "whole on the device: micro-batches add up inside no_sync (offload)"
        grad = Part("gradients", int(grads), "update", note=note)
    elif plan.strategy in ("fsdp", "deepspeed_stage_3", "deepspeed_stage_2") and n > 1:
        bucket = min(trained, DEEPSPEED_BUCKET) * grad_bytes if plan.deepspeed else 0
        note = f"1/{n} per device" + (" + reduction bucket" if bucket else "")
        grad = Part("gradients", int(grads / n + bucket), "update", host=plan.offload, note=note)
    else:
        grad = Part("gradients", int(grads), "update", note=f"{_count(trained)} trained weights")
    if plan.deepspeed:  # fp32 master weights + two fp32 states, partitioned (ZeRO >= 1)
        state = Part(
            "optimizer state",
            int(12 * trained / n),
            host=plan.offload,
            note=f"AdamW: fp32 master + 2 fp32 states{_per(n)}",
        )
    else:
        shard = plan.strategy == "fsdp" and n > 1
        state_bytes = 2 * trained * grad_bytes / (n if shard else 1)
        note = f"AdamW: 2 states x {grad_bytes:g} bytes" + (_per(n) if shard else "")
        state = Part("optimizer state", int(state_bytes), host=plan.offload, note=note)
    return [grad, state]


def layer_bytes(plan: Plan, mode: str | None = None) -> float:
    """Bytes one decoder layer keeps per token for the backward pass.

    ``full`` keeps the layer's input (the residual stream, in the weights' dtype). ``selective``
    also keeps the outputs of the matrix products and of attention (q, k, v, attention, o,
    gate, up, down). ``none`` keeps everything: also each RMSNorm's fp32 intermediates and the
    input it hands the next matrix product, the rotary embeddings' outputs, the keys and values
    repeated for grouped-query attention, SiLU's output and the gated product, and the residual
    after attention.

    SmolLM2-135M (h 576, q 576, kv 192, i 1,536), fp32 weights, bf16 compute:
    full 4 x 576 = 2,304; selective 2,304 + 2 x (576 + 192 + 192 + 576 + 576 + 1,536 x 2 +
    576) = 13,824; none 13,824 + 2 x (4 x 576 + 2 x 576) + 2 x 2 x (576 + 192) + 2 x 2 x 576 +
    2 x 2 x 1,536 + 4 x 576 = 34,560.
    """
    m, r, c = plan.model, held_bytes(plan), plan.compute_bytes
    q, kv, h, i = m.heads * m.head_dim, m.kv_heads * m.head_dim, m.hidden, m.intermediate
    mode = mode or plan.checkpointing
    full = r * h
    if mode == "full":
        return full
    selective = full + c * (q + 2 * kv + q + h + 2 * i + h)
    if mode == "selective":
        return selective
    norm = 4 * h + (4 * h if r < 4 else 0) + c * h  # fp32 normalized (+ upcast), matmul input
    rotary = 2 * c * (q + kv)
    repeated = 2 * c * q if kv < q else 0
    return selective + 2 * norm + rotary + repeated + 2 * c * i + r * h


def micro_batch(plan: Plan, rows: int | None = None) -> MicroBatch:
    """The largest micro-batch the plan makes: ``rows`` rows (default: the recipe's bound, else
    a step's rows), cut to the token budget (a row over it goes alone).

    Packed positions: each group's prompt once (``share_prefix``) plus every completion.
    """
    available = plan.prompts * plan.group_size
    rows = min(rows if rows is not None else (plan.micro_rows or available), available)
    rows = max(rows, plan.row_group)
    if plan.micro_tokens is not None:
        while rows > plan.row_group and _positions(plan, rows) > plan.micro_tokens:
            rows -= plan.row_group
    return MicroBatch(rows, _positions(plan, rows), rows * plan.completion_tokens)


def _positions(plan: Plan, rows: int) -> int:
    if plan.share_prefix:
        prompts = math.ceil(rows / plan.group_size)
        return prompts * plan.prompt_tokens + rows * plan.completion_tokens
    return rows * (plan.prompt_tokens + plan.completion_tokens)


def update_parts(plan: Plan, batch: MicroBatch) -> list[Part]:
    """Activations and logits of one micro-batch's forward and backward."""
    m, tokens = plan.model, batch.tokens
    per_layer = layer_bytes(plan)
    recompute = layer_bytes(plan, "none") if plan.checkpointing != "none" else 0
    edges = tokens * m.hidden * (held_bytes(plan) + 8)  # embedding output, final norm
    activations = tokens * (m.layers * per_layer + recompute) + edges
    note = f"{tokens:,} positions x {m.layers} layers, checkpointing {plan.checkpointing}"
    # a chunk at a time, on the sharded path too (the head chunked inside the model's forward)
    rows = min(batch.completion_tokens, plan.logprob_chunk)
    logits = rows * m.vocab * (plan.compute_bytes + 12)
    how = "one chunk"
    return [
        Part("activations", int(activations), "update", note=note),
        Part(
            "logits", int(logits), "update", note=f"{rows:,} positions x {m.vocab:,} vocab, {how}"
        ),
    ]


def engine_parts(plan: Plan) -> list[Part]:
    """The rollout engine's own memory."""
    engine, m = plan.engine, plan.model
    if engine.kind == "vllm":
        return _vllm_parts(plan)
    if engine.kind != "hf":
        return [Part("rollout engine", 0, note=f"'{engine.kind}': not counted")]
    rows = plan.prompts * plan.group_size
    if engine.max_batch_size:
        rows = min(rows, engine.max_batch_size)
    context = plan.prompt_tokens + plan.completion_tokens
    kv = rows * context * 2 * m.layers * m.kv_heads * m.head_dim * plan.compute_bytes
    scores = rows * plan.new_tokens * m.vocab * 4  # generate keeps every step's fp32 scores
    parts = [
        Part(
            "rollout KV cache",
            int(kv + scores),
            "rollout",
            note=f"hf: {rows} sequences x {context:,} tokens, + sampling scores",
        ),
    ]
    if plan.sharded and plan.devices > 1:
        whole = m.parameters() * held_bytes(plan)  # summon_full_params: full precision
        parts.append(Part("rollout weights", int(whole), "rollout", note="hf gathers them whole"))
    return parts


def _vllm_parts(plan: Plan) -> list[Part]:
    engine, m = plan.engine, plan.model
    weights = m.parameters() * engine.weight_bytes
    if plan.on_gpu:
        phase = "rollout" if engine.sleeps else "always"
        asleep = "; sleeps during the update" if engine.sleeps else ""
        longest = engine.max_model_len or m.context or plan.prompt_tokens + plan.completion_tokens
        kv = longest * 2 * m.layers * m.kv_heads * m.head_dim * engine.weight_bytes
        return [
            Part(
                "vLLM",
                0,
                phase,
                share=engine.utilization,
                minimum=int(weights + kv),
                note=f"gpu_memory_utilization {engine.utilization:g}{asleep}",
            ),
        ]
    kv = engine.kv_cache_bytes if engine.kv_cache_bytes is not None else 2 * GiB
    return [
        Part("vLLM weights", int(weights), note=f"its copy, {engine.weight_bytes:g} bytes each"),
        Part("vLLM KV cache", int(kv), note="kv_cache_gib"),
        Part("vLLM runtime", VLLM_CPU_RUNTIME_BYTES, note="measured, CPU build"),
    ]


def other_parts(plan: Plan) -> list[Part]:
    """The reward model, the retrievers and the process's fixed overhead."""
    parts: list[Part] = []
    if plan.reward_model is not None:
        rm = plan.reward_model
        shape = rm.shape
        parts.append(
            Part(
                "reward model",
                int(shape.parameters() * rm.weight_bytes),
                note=f"{shape.name}, frozen, whole",
            )
        )
        # its forward returns every layer's hidden states and the full logits
        width = shape.vocab + (shape.layers + 1) * shape.hidden
        forward = rm.batch * rm.max_length * width * plan.compute_bytes
        parts.append(
            Part(
                "reward model forward",
                int(forward),
                "reward model",
                note=f"{rm.batch} x {rm.max_length:,} tokens: logits + hidden states",
            )
        )
    for retriever in plan.retrieval:
        if retriever.encoder_params:
            parts.append(
                Part(f"{retriever.name} encoder", retriever.encoder_params * 4, note="fp32")
            )
        parts.append(
            Part(
                f"{retriever.name} index",
                retriever.index_bytes or 0,
                host=plan.on_gpu,
                note=retriever.note,
            )
        )
    runtime = plan.runtime_bytes if plan.runtime_bytes is not None else CPU_RUNTIME_BYTES
    parts.append(Part("Python + torch runtime", runtime, host=plan.on_gpu, note="measured on CPU"))
    if plan.on_gpu:
        parts.append(Part("CUDA context", CUDA_CONTEXT_BYTES, note="typical, not measured"))
    return parts


def parts(plan: Plan, rows: int | None = None) -> list[Part]:
    """Every part of the plan (``rows``: the micro-batch's rows, default the recipe's)."""
    batch = micro_batch(plan, rows)
    return [
        *weight_parts(plan),
        *optimizer_parts(plan),
        *update_parts(plan, batch),
        *engine_parts(plan),
        *other_parts(plan),
    ]


def estimate(plan: Plan, memory: int | None = None, rows: int | None = None) -> Estimate:
    """The parts and their total per device. vLLM's share is taken of ``memory``; without it,
    of the smallest device that holds the rest (``total = rest / (1 - share)``) and gives the
    share its minimum. A share below its minimum makes the total the memory that would give it
    (so it does not fit)."""
    rows_of = parts(plan, rows)
    device = [p for p in rows_of if not (p.host and plan.on_gpu)]
    fixed = {ph: sum(p.bytes for p in device if p.phase == ph) for ph in PHASES}
    if not plan.on_gpu:  # what the allocator keeps of the phases' freed memory, held from then on
        kept = int(CPU_ALLOCATOR_RETENTION * max(fixed[ph] for ph in PHASES[1:]))
        rows_of.append(Part("allocator retention", kept, note=_RETENTION_NOTE))
        fixed["always"] += kept
    shares = {ph: sum(p.share for p in device if p.phase == ph) for ph in PHASES}
    smallest = max((math.ceil(p.minimum / p.share) for p in device if p.share), default=0)
    if memory is None:
        memory = max(
            smallest,
            *(
                math.ceil(
                    (fixed["always"] + fixed[ph]) / max(1e-9, 1 - shares["always"] - shares[ph])
                )
                for ph in PHASES[1:]
            ),
        )
    filled = [replace(p, bytes=int(p.share * memory)) if p.share else p for p in rows_of]
    total = max(
        smallest,
        *(
            fixed["always"] + fixed[ph] + int((shares["always"] + shares[ph]) * memory)
            for ph in PHASES[1:]
        ),
    )
    host = sum(p.bytes for p in filled if p.host) if plan.on_gpu else 0
    return Estimate(filled, total, host, memory)


def largest_micro_batch(plan: Plan, memory: int) -> MicroBatch | None:
    """The micro-batch with the most rows whose run fits ``memory`` per device, the token
    budget raised with it; None when one row does not fit. Memory grows with rows, so a
    binary search finds it."""
    unbound = replace(plan, micro_tokens=None)
    available = plan.prompts * plan.group_size
    unit = plan.row_group

    def fits(rows: int) -> bool:
        return estimate(unbound, memory, rows).total <= memory

    if not fits(unit):
        return None
    low, high = 1, max(1, available // unit)  # in units of row_group; low fits
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle * unit):
            low = middle
        else:
            high = middle - 1
    return micro_batch(unbound, low * unit)


def _per(devices: int) -> str:
    return f", 1/{devices} per device" if devices > 1 else ""


def _gb(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
