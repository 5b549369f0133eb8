"""Rollout speed of the ``hf`` and ``vllm`` engines on the same prompts, in one process.

Two workloads, each run through both engines (SmolLM2-135M-Instruct, the recipes' LoRA policy):

1. single-turn ARENA (``recipes/quickstart.yaml``'s environment): ``--prompts`` prompts x
   ``--group-size`` samples x ``--new-tokens`` new tokens, temperature 0.9;
2. multi-turn Eval-RAR episodes (``recipes/eval_rar_quickstart.yaml``'s ``search_agent``, BM25
   over the bundled synthetic world, ``--turns`` turns), and as its reference one ``generate``
   call over the same prompts producing as many new tokens per trajectory as the episodes did.
   Multi-turn cost per generated token = (single-turn tokens/s) / (multi-turn tokens/s).

The ``hf`` engine runs as the trainer runs it under ``precision: bf16-mixed`` (fp32 weights,
bf16 autocast); ``vllm`` in bf16, eager (``enforce_eager``), prefix caching on. Each engine
generates once before it is timed (vLLM's first call warms its kernels up; its load time is
reported separately). Speed-ups are ratios of generated tokens/s, since the engines' samples
stop at different lengths. The last line is the single-turn ratio.

    python benchmarks/rollout.py --prompts 8 --group-size 4 --new-tokens 64 --turns 3

Needs the Eval-RAR quickstart index; it is built if missing (a few seconds).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from lit_rag.cli import build_cli
from lit_rag.rollout.base import SamplingParams
from lit_rag.rollout.hf import HFEngine
from lit_rag.rollout.vllm import VLLMEngine

ROOT = Path(__file__).resolve().parents[1]


def load(recipe: str, extra: list[str]):
    """The recipe's policy module (model loaded, eval mode) and its first training examples."""
    cli = build_cli(["--config", str(ROOT / "recipes" / recipe), "--model.engine=hf", *extra], run=False)
    module, data = cli.model, cli.datamodule
    module.configure_model()
    module.model.eval()
    data.setup("fit")
    return module, data.train_examples()


def timed(fn, engine_name: str):
    """Run ``fn`` as the trainer would for that engine; (result, seconds)."""
    started = time.perf_counter()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=engine_name == "hf"):
        result = fn()
    return result, time.perf_counter() - started


def single_turn(module, examples, engine, name: str, args) -> dict:
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.9, stop=module.sampling.stop)
    env = module.environment
    env.rollout(examples[:1], engine, 1, SamplingParams(max_new_tokens=4))  # warm-up
    torch.manual_seed(0)
    trajectories, seconds = timed(lambda: env.rollout(examples, engine, args.group_size, params), name)
    prompt = sum(int(t.prompt_ids.numel()) for t in trajectories) / len(trajectories)
    return dict(seconds=seconds, tokens=sum(t.num_generated for t in trajectories), prompt=prompt)


def multi_turn(module, examples, engine, name: str, args) -> dict:
    env, tok = module.environment, module.tokenizer
    params = SamplingParams(max_new_tokens=module.sampling.max_new_tokens, temperature=module.sampling.temperature)
    n = len(examples) * args.group_size
    torch.manual_seed(0)
    trajectories, seconds = timed(lambda: env.rollout(examples, engine, args.group_size, params), name)
    tokens = sum(t.num_generated for t in trajectories)
    # the reference: the same prompts, one call, as many new tokens per trajectory
    prompts = [tok(env.build_prompt(ex, tok), add_special_tokens=False)["input_ids"] for ex in examples]
    budget = SamplingParams(max_new_tokens=max(1, round(tokens / n)), temperature=params.temperature)
    repeated = [p for p in prompts for _ in range(args.group_size)]
    torch.manual_seed(0)
    generations, single_s = timed(lambda: engine.generate(repeated, budget), name)
    single_tokens = sum(int(g.token_ids.numel()) for g in generations)
    turns = float(env.metrics(trajectories)["turns"])
    return dict(seconds=seconds, tokens=tokens, turns=turns, single_s=single_s, single_tokens=single_tokens)


def make_engine(name: str, module) -> tuple[object, float]:
    """The engine bound to the module's policy, and its load time (vLLM's build + first push)."""
    if name == "hf":
        engine = HFEngine()
        engine.bind(module.model, module.tokenizer)
        return engine, 0.0
    engine = VLLMEngine(dtype="bfloat16", enforce_eager=True, kv_cache_gib=2)
    engine.bind(module.model, module.tokenizer)
    started = time.perf_counter()
    engine.generate([[module.tokenizer.eos_token_id or 0]], SamplingParams(max_new_tokens=1))
    return engine, time.perf_counter() - started


def ensure_index() -> None:
    index = ROOT / "indexes" / "synthetic-bm25"
    if not (index / "manifest.json").exists():
        from lit_rag.retrieval.commands import main as index_main

        index_main(["build", "--corpus", "synthetic", "--retriever", "bm25", "--out", str(index)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--engines", default="hf,vllm")
    args = parser.parse_args()
    engines = args.engines.split(",")
    ensure_index()
    arena, arena_examples = load("quickstart.yaml", [])
    evalrar, evalrar_examples = load("eval_rar_quickstart.yaml",
                                     [f"--model.environment.init_args.max_turns={args.turns}"])
    evalrar.environment.setup()
    results: dict[str, dict] = {}
    for name in engines:
        engine, load_s = make_engine(name, arena)
        single = single_turn(arena, arena_examples[: args.prompts], engine, name, args)
        engine.bind(evalrar.model, evalrar.tokenizer)  # same base model: vLLM re-syncs, no rebuild
        multi = multi_turn(evalrar, evalrar_examples[: args.prompts], engine, name, args)
        results[name] = dict(load_s=load_s, single=single, multi=multi)
    report(args, results)


def report(args, results: dict[str, dict]) -> None:
    n = args.prompts * args.group_size
    first = next(iter(results.values()))
    print(f"# SmolLM2-135M-Instruct, {torch.get_num_threads()} threads; single-turn: ARENA quickstart prompts "
          f"(mean {first['single']['prompt']:.0f} tokens) x G {args.group_size}, {args.new_tokens} new tokens; "
          f"multi-turn: Eval-RAR quickstart, max_turns {args.turns}, {n} episodes")
    print()
    print("| engine | load s | single-turn s | single-turn tok/s | multi-turn s | turns | multi-turn tok/s "
          "| reference tok/s | multi-turn cost per token |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        s, m = r["single"], r["multi"]
        multi_rate, ref_rate = m["tokens"] / m["seconds"], m["single_tokens"] / m["single_s"]
        print(f"| {name} | {r['load_s']:.1f} | {s['seconds']:.1f} | {s['tokens'] / s['seconds']:.1f} | "
              f"{m['seconds']:.1f} | {m['turns']:.2f} | {multi_rate:.1f} | {ref_rate:.1f} | {ref_rate / multi_rate:.2f}x |")
    print()
    print(f"command: python benchmarks/rollout.py --prompts {args.prompts} --group-size {args.group_size} "
          f"--new-tokens {args.new_tokens} --turns {args.turns} --engines {args.engines}")
    if "hf" in results and "vllm" in results:
        rate = {k: r["single"]["tokens"] / r["single"]["seconds"] for k, r in results.items()}
        multi = {k: r["multi"]["tokens"] / r["multi"]["seconds"] for k, r in results.items()}
        print(f"vllm/hf multi-turn speed-up: {multi['vllm'] / multi['hf']:.2f}x")
        print(f"vllm/hf rollout speed-up: {rate['vllm'] / rate['hf']:.2f}x")


if __name__ == "__main__":
    main()
