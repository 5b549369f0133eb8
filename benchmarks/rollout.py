"""Rollout speed of the ``hf`` and ``vllm`` engines on the same prompts, in one process.

Two workloads, each run through both engines (SmolLM2-135M-Instruct, the recipes' LoRA policy):

1. single-turn ARENA (``recipes/quickstart.yaml``'s environment): ``--prompts`` prompts x
   ``--group-size`` samples x ``--new-tokens`` new tokens, temperature 0.9;
2. multi-turn episodes of each multi-turn environment (``--environments``), BM25 over the
   bundled synthetic world, through the episode loop (``lit_rag/contracts/episodes.py``):

   - ``search_agent``: Eval-RAR episodes (``recipes/eval_rar_quickstart.yaml``), ``--turns`` turns;
   - ``query_rewriter``: EVO-RAG's training rollout (``recipes/evo_rag_quickstart.yaml``, with
     BM25 instead of its hybrid retriever, so no embedding model is needed): each question's
     main episode of at most ``--turns`` steps, then its sibling branches;
   - ``retrieval_tree``: R2AG's inference trees (``recipes/r2ag_quickstart.yaml``'s
     ``validation_rollout``, ``--turns`` expansions at most, sampled at the training
     temperature, each question ``--group-size`` times), then the reader. Its training rollout
     is one expansion per sample: a single-turn generation.

   Every token the engine generates counts (a trajectory holds only some: EVO-RAG's siblings
   keep the action at their branching state, R2AG's inference its reader's answer). The
   reference is one ``generate`` call over the first prompts of the same ``--prompts`` x
   ``--group-size`` rows producing as many new tokens per row as the episodes did.
   Multi-turn cost per generated token = (reference tokens/s) / (multi-turn tokens/s); each
   environment runs ``--repeats`` times (each run with its reference, from a cold prefix cache)
   and the table shows the median run and every run's cost. On vLLM it also shows the tokens
   generated per engine step (how many sequences decode together: on a CPU a step of 32
   sequences costs ~2.8x a step of one, so a batch that thins out as episodes end costs more
   per token), the prompt tokens it had to compute per generated token (a multi-turn episode
   reads the documents inserted into it; prefix caching spares what it read before) and the
   share of the rollout spent inside vLLM's steps (the rest is the environment's own work
   between steps: handlers, retrieval, tokenizing).

Both engines run at the precision ``lit-rag fit`` gives them on this machine (``--precision
auto``, the default): the ``hf`` engine as the trainer runs it under the recipe's
``trainer.precision`` (``auto``: ``bf16-mixed``, fp32 weights under bf16 autocast, where the CPU
computes bf16 natively, else ``32-true``), ``vllm`` in the recipe engine's ``dtype`` (``native``:
bfloat16 there, else float32), eager (``enforce_eager``), prefix caching on. ``--precision
bf16`` or ``fp32`` forces one for both, for comparisons; the output names what ran. Each engine
generates once before it is timed (vLLM's first call warms its kernels up; its load time is
reported separately). Speed-ups are ratios of generated tokens/s, since the engines' samples
stop at different lengths. The last line is the single-turn ratio; under it, the date, commit,
machine, library versions and command (``benchmarks/_bench.py``).

    python benchmarks/rollout.py --prompts 8 --group-size 4 --new-tokens 64 --turns 3
    python benchmarks/rollout.py --quick     # a few minutes: 2 prompts x 2, 16 tokens, 2 turns

Needs the synthetic BM25 index of the quickstarts; it is built if missing (a few seconds).
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from pathlib import Path

import _bench
import torch

from lit_rag.cli.commands import build_cli
from lit_rag.plugins.engines.hf import HFEngine
from lit_rag.plugins.engines.vllm.engine import VLLMEngine
from lit_rag.rollout.base import RolloutEngine, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
#: --quick: the same table on the smallest sizes that still take every path
QUICK = {"prompts": 2, "group_size": 2, "new_tokens": 16, "turns": 2, "repeats": 1}


def load(recipe: str, extra: list[str]):
    """The recipe's policy module (model loaded, eval mode), its first training examples and
    its ``trainer.precision`` as ``lit-rag fit`` resolves it (``auto`` for this machine)."""
    cli = build_cli(
        ["--config", str(ROOT / "recipes" / recipe), "--model.engine=hf", *extra], run=False
    )
    module, data = cli.model, cli.datamodule
    module.configure_model()
    module.model.eval()
    data.setup("fit")
    return module, data.train_examples(), str(cli.trainer.precision)


def recipe_dtype(recipe: str) -> str:
    """The ``dtype`` of the recipe's engine (``native`` when it names none)."""
    from lit_rag.cli.recipe_args import load_recipe

    engine = (load_recipe(str(ROOT / "recipes" / recipe)).get("model") or {}).get("engine")
    init = engine.get("init_args") if isinstance(engine, dict) else None
    return str((init or {}).get("dtype", "native"))


class Steps:
    """While active, counts the vLLM engine's steps, the seconds spent inside them and the
    prompt tokens its finished requests had to compute (not found in the prefix cache);
    nothing for the ``hf`` engine, which has no steps to count."""

    def __init__(self, engine) -> None:
        llm = getattr(engine, "_llm", None)
        self.core = llm.llm_engine if llm is not None else None
        self.count, self.seconds, self.prefilled = 0, 0.0, 0

    def __enter__(self):
        if self.core is not None:
            inner = self.core.step

            def step(*args, **kwargs):
                started = time.perf_counter()
                outputs = inner(*args, **kwargs)
                self.count += 1
                self.seconds += time.perf_counter() - started
                for out in outputs:
                    if out.finished:
                        self.prefilled += len(out.prompt_token_ids) - (out.num_cached_tokens or 0)
                return outputs

            self.core.step = step
        return self

    def __exit__(self, *exc) -> None:
        if self.core is not None:
            del self.core.step  # the class's own method again


def timed(fn, engine, autocast: bool):
    """Run ``fn`` as the trainer would for that engine (``autocast``: the hf engine under
    ``bf16-mixed``), from a cold prefix cache (vLLM); (result, seconds, :class:`Steps`)."""
    if getattr(engine, "_llm", None) is not None:
        engine._llm.reset_prefix_cache()  # no run reuses the KV blocks of the one before
    started = time.perf_counter()
    with (
        torch.no_grad(),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
        Steps(engine) as steps,
    ):
        result = fn()
    return result, time.perf_counter() - started, steps


def single_turn(module, examples, engine, autocast: bool, args) -> dict:
    params = SamplingParams(
        max_new_tokens=args.new_tokens, temperature=0.9, stop=module.sampling.stop
    )
    env = module.environment
    env.rollout(examples[:1], engine, 1, SamplingParams(max_new_tokens=4))  # warm-up
    torch.manual_seed(0)
    trajectories, seconds, steps = timed(
        lambda: env.rollout(examples, engine, args.group_size, params), engine, autocast
    )
    prompt = sum(int(t.prompt_ids.numel()) for t in trajectories) / len(trajectories)
    return {
        "seconds": seconds,
        "tokens": sum(t.num_generated for t in trajectories),
        "prompt": prompt,
        "steps": steps.count,
        "prefilled": steps.prefilled,
    }


def settings(name: str, engine, precision: str) -> str:
    """What the engine ran with, so that two runs of this benchmark compare at one look: vLLM's
    constructor arguments as lit-rag passes them, or the hf engine's precision; then the
    threads and the allocator preload (the machine and versions: the provenance block)."""
    if name == "vllm":
        import vllm

        kwargs = engine.llm_kwargs()
        keys = (
            "dtype",
            "enforce_eager",
            "enable_prefix_caching",
            "block_size",
            "kv_cache_memory_bytes",
            "max_model_len",
            "logprobs_mode",
        )
        shown = ", ".join(f"{k}={kwargs.get(k)}" for k in keys)
        text = f"vllm {vllm.__version__}: {shown}; one request per sample"  # dtype resolved
    else:
        how = "under bf16 autocast" if "bf16" in precision else "in fp32"
        text = f"hf: transformers generate, {precision} (fp32 weights {how})"
    preload = os.environ.get("LD_PRELOAD", "") or "none"
    return f"{text}; {torch.get_num_threads()} threads, LD_PRELOAD {preload}"


BM25 = '{"class_path": "bm25", "init_args": {"index": "indexes/synthetic-bm25"}}'
#: Multi-turn environments: recipe, the key of its turn budget, the rollout measured, overrides.
MULTI_TURN = {
    "search_agent": ("eval_rar_quickstart.yaml", "max_turns", "rollout", []),
    # BM25 as the others: the recipe's hybrid retriever needs an embedding model
    "query_rewriter": (
        "evo_rag_quickstart.yaml",
        "t_max",
        "rollout",
        [f"--model.environment.init_args.retriever={BM25}"],
    ),
    "retrieval_tree": ("r2ag_quickstart.yaml", "max_iterations", "validation_rollout", []),
}


class Counted(RolloutEngine):
    """The engine, counting every token it generates, through ``generate`` or ``collect``."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine, self.tokenizer = engine, engine.tokenizer
        self.batches_continuously = engine.batches_continuously
        self.tokens = self.generations = 0

    def _count(self, generations) -> None:
        for g in generations:
            self.tokens += int(g.token_ids.numel())
            self.generations += 1

    def generate(self, prompts, params):
        out = self.engine.generate(prompts, params)
        self._count(out)
        return out

    def submit(self, prompt, params) -> int:
        return self.engine.submit(prompt, params)

    def collect(self):
        done = self.engine.collect()
        self._count(g for _, g in done)
        return done


def multi_turn(module, examples, engine, autocast: bool, kind: str, args) -> dict:
    """``--repeats`` runs of the environment's episodes, each followed by its reference (see the
    module docstring); the per-run figures and the median cost per token."""
    env, tok = module.environment, module.tokenizer
    s = module.sampling
    params = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, stop=s.stop)
    n = len(examples) * args.group_size
    prompts = [
        tok(env.build_prompt(ex, tok), add_special_tokens=False)["input_ids"] for ex in examples
    ]
    repeated = [p for p in prompts for _ in range(args.group_size)]
    runs = []
    for repeat in range(args.repeats):
        counted = Counted(engine)
        # the calls are bound now (partial), not closed over this loop's variables
        if MULTI_TURN[kind][2] == "validation_rollout":  # every question group_size times
            rows = [ex for ex in examples for _ in range(args.group_size)]
            run = functools.partial(env.validation_rollout, rows, counted, params)
        else:
            run = functools.partial(env.rollout, examples, counted, args.group_size, params)
        torch.manual_seed(repeat)
        _, seconds, steps = timed(run, engine, autocast)
        # the reference: the same first prompts, one call, as many new tokens per row
        budget = SamplingParams(
            max_new_tokens=max(1, round(counted.tokens / n)), temperature=params.temperature
        )
        torch.manual_seed(repeat)
        generations, single_s, single_steps = timed(
            functools.partial(engine.generate, repeated, budget), engine, autocast
        )
        single_tokens = sum(int(g.token_ids.numel()) for g in generations)
        runs.append(
            {
                "seconds": seconds,
                "tokens": counted.tokens,
                "per_row": counted.generations / n,
                "single_s": single_s,
                "single_tokens": single_tokens,
                "cost": (single_tokens / single_s) / (counted.tokens / seconds),
                "steps": steps.count,
                "in_steps": steps.seconds,
                "single_steps": single_steps.count,
                "prefilled": steps.prefilled,
                "single_prefilled": single_steps.prefilled,
            }
        )
    median = sorted(runs, key=lambda r: r["cost"])[len(runs) // 2]
    return {**median, "costs": [r["cost"] for r in runs]}


def make_engine(name: str, module, dtype: str) -> tuple[object, float]:
    """The engine bound to the module's policy, and its load time (vLLM's build + first push);
    ``dtype``: vLLM's (``native`` is resolved by the engine, as in a recipe)."""
    if name == "hf":
        engine = HFEngine()
        engine.bind(module.model, module.tokenizer)
        return engine, 0.0
    engine = VLLMEngine(dtype=dtype, enforce_eager=True, kv_cache_gib=2)
    engine.bind(module.model, module.tokenizer)
    started = time.perf_counter()
    engine.generate([[module.tokenizer.eos_token_id or 0]], SamplingParams(max_new_tokens=1))
    return engine, time.perf_counter() - started


def ensure_index() -> None:
    index = ROOT / "indexes" / "synthetic-bm25"
    if not (index / "manifest.json").exists():
        from lit_rag.cli.index import main as index_main

        index_main(["build", "--corpus", "synthetic", "--retriever", "bm25", "--out", str(index)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--engines", default="hf,vllm")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="multi-turn runs per environment and engine (each with its reference); "
        "the median is shown",
    )
    parser.add_argument(
        "--environments",
        default=",".join(MULTI_TURN),
        help=f"multi-turn environments to measure, of {', '.join(MULTI_TURN)}",
    )
    _bench.add_precision(parser, "both engines")
    args = _bench.parse_args(parser, QUICK, argv)
    engines, kinds = args.engines.split(","), args.environments.split(",")
    unknown = [k for k in kinds if k not in MULTI_TURN]
    if unknown:
        parser.error(
            f"--environments: unknown {', '.join(unknown)}; allowed: {', '.join(MULTI_TURN)}"
        )
    ensure_index()
    forced = (
        []
        if args.precision == "auto"
        else [f"--trainer.precision={_bench.PRECISIONS[args.precision][0]}"]
    )
    arena, arena_examples, precision = load("quickstart.yaml", forced)
    # vLLM: the quickstart engine's dtype (native: bf16 where the CPU computes it), or forced
    dtype = (
        recipe_dtype("quickstart.yaml")
        if args.precision == "auto"
        else _bench.PRECISIONS[args.precision][1]
    )
    multi = {}
    for kind in kinds:
        recipe, key, _, overrides = MULTI_TURN[kind]
        module, examples, _ = load(
            recipe, [f"--model.environment.init_args.{key}={args.turns}", *overrides, *forced]
        )
        module.environment.setup()
        multi[kind] = (module, examples)
    results: dict[str, dict] = {}
    for name in engines:
        engine, load_s = make_engine(name, arena, dtype)
        autocast = name == "hf" and "bf16" in precision
        single = single_turn(arena, arena_examples[: args.prompts], engine, autocast, args)
        described = settings(name, engine, precision)
        results[name] = {"load_s": load_s, "single": single, "settings": described}
        for kind, (module, examples) in multi.items():
            # same base model: vLLM re-syncs, no rebuild
            engine.bind(module.model, module.tokenizer)
            results[name][kind] = multi_turn(
                module, examples[: args.prompts], engine, autocast, kind, args
            )
    report(args, kinds, results)
    _bench.print_provenance(__file__, argv, libraries=("bm25s",))


def report(args, kinds: list[str], results: dict[str, dict]) -> None:
    n = args.prompts * args.group_size
    first = next(iter(results.values()))
    print(
        f"# SmolLM2-135M-Instruct, {torch.get_num_threads()} threads; single-turn: ARENA "
        f"quickstart prompts (mean {first['single']['prompt']:.0f} tokens) x G {args.group_size}, "
        f"{args.new_tokens} new tokens; multi-turn: {n} rows, at most {args.turns} turns"
    )
    print()
    for name, r in results.items():
        print(f"{name} settings: {r['settings']}")
    print()
    print(
        "| engine | load s | single-turn s | single-turn tok/s | engine steps "
        "| prompt tokens computed |"
    )
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        s = r["single"]
        computed = f"{s['prefilled']}" if s["steps"] else "-"
        print(
            f"| {name} | {r['load_s']:.1f} | {s['seconds']:.1f} | "
            f"{s['tokens'] / s['seconds']:.1f} | {s['steps'] or '-'} | {computed} |"
        )
    for kind in kinds:
        print()
        print(f"multi-turn: {kind} ({MULTI_TURN[kind][0]}, {MULTI_TURN[kind][2]})")
        print()
        print(
            "| engine | multi-turn s | generations / row | multi-turn tok/s | reference tok/s "
            "| multi-turn cost per token (each run) "
            "| tokens per engine step: multi-turn / reference "
            "| prompt tokens computed per generated token: multi-turn / reference "
            "| time inside engine steps |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for name, r in results.items():
            m = r[kind]
            multi_rate, ref_rate = m["tokens"] / m["seconds"], m["single_tokens"] / m["single_s"]
            costs = ", ".join(f"{c:.2f}" for c in m["costs"])
            occupancy = (
                f"{m['tokens'] / m['steps']:.1f} / {m['single_tokens'] / m['single_steps']:.1f}"
                if m["steps"] and m["single_steps"]
                else "-"
            )
            inside = f"{100 * m['in_steps'] / m['seconds']:.0f}%" if m["steps"] else "-"
            prefill = (
                f"{m['prefilled'] / m['tokens']:.1f} / "
                f"{m['single_prefilled'] / m['single_tokens']:.1f}"
                if m["steps"] and m["single_steps"]
                else "-"
            )
            print(
                f"| {name} | {m['seconds']:.1f} | {m['per_row']:.2f} | {multi_rate:.1f} | "
                f"{ref_rate:.1f} | {m['cost']:.2f}x ({costs}) | {occupancy} | {prefill} | "
                f"{inside} |"
            )
    print()
    if "hf" in results and "vllm" in results:
        rate = {k: r["single"]["tokens"] / r["single"]["seconds"] for k, r in results.items()}
        for kind in kinds:
            multi = {k: r[kind]["tokens"] / r[kind]["seconds"] for k, r in results.items()}
            print(f"vllm/hf multi-turn speed-up ({kind}): {multi['vllm'] / multi['hf']:.2f}x")
        print(f"vllm/hf rollout speed-up: {rate['vllm'] / rate['hf']:.2f}x")


if __name__ == "__main__":
    main()
