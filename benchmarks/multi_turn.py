"""Rollout throughput of the multi-turn search environment against plain single-turn generation.

One run, one model, the same prompts: (a) the recipe's ``search_agent`` environment
(``max_turns`` turns, retrieval and evaluation phases), then (b) one ``generate`` call per
prompt group producing as many new tokens per trajectory as (a) generated on average. The
ratio of generated tokens/s, (b) over (a), is the multi-turn overhead: re-reading the growing
context every turn, rows waiting for the slowest one in each phase, retrieval, tokenization.

    python benchmarks/multi_turn.py --config recipes/eval_rar_quickstart.yaml --prompts 8 --turns 3

Needs the recipe's index (``lit-rag index build --corpus synthetic --retriever bm25 --out
indexes/synthetic-bm25`` for the quickstart).
"""

from __future__ import annotations

import argparse
import time

import torch

from lit_rag.cli import build_cli
from lit_rag.rollout.base import SamplingParams


class _Timed:
    """Wraps a callable and adds up its wall time and calls."""

    def __init__(self, fn):
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started
            self.calls += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="recipes/eval_rar_quickstart.yaml")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args, extra = parser.parse_known_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cli = build_cli(["--config", args.config, f"--model.environment.init_args.max_turns={args.turns}", *extra], run=False)
    module, data = cli.model, cli.datamodule
    module.configure_model()
    module.model.eval()
    data.setup("fit")
    examples = data.train_examples()[: args.prompts]
    env, engine, params = module.environment, module.engine, module.sampling
    bf16 = "bf16" in str(cli.trainer.precision)
    generate = engine.generate = _Timed(engine.generate)
    search = env.retriever.search = _Timed(env.retriever.search)
    n = len(examples) * args.group_size

    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        trajectories = env.rollout(examples, engine, args.group_size, params)
    multi_s = time.perf_counter() - started
    multi_tokens = sum(t.num_generated for t in trajectories)
    multi = dict(seconds=multi_s, tokens=multi_tokens, calls=generate.calls, gen_s=generate.seconds,
                 search_s=search.seconds)
    metrics = {k: float(v) for k, v in env.metrics(trajectories).items()}

    # the reference: the same prompts, one call, the same number of new tokens per trajectory
    tok = engine.tokenizer
    prompts = [tok(env.build_prompt(ex, tok), add_special_tokens=False)["input_ids"] for ex in examples]
    repeated = [p for p in prompts for _ in range(args.group_size)]
    budget = max(1, round(multi_tokens / n))
    single_params = SamplingParams(max_new_tokens=budget, temperature=params.temperature,
                                   top_p=params.top_p, top_k=params.top_k)
    generate.calls, generate.seconds = 0, 0.0
    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        generations = engine.generate(repeated, single_params)
    single_s = time.perf_counter() - started
    single_tokens = sum(int(g.token_ids.numel()) for g in generations)

    multi_rate, single_rate = multi_tokens / multi_s, single_tokens / single_s
    print(f"# {args.config}: {args.prompts} prompts x G {args.group_size}, max_turns {args.turns}, "
          f"{params.max_new_tokens} new tokens per generation, threads {torch.get_num_threads()}, "
          f"{'bf16 autocast' if bf16 else 'fp32'}")
    print(f"# multi-turn episodes: turns {metrics['turns']:.2f}, valid searches {metrics['valid_searches']:.2f}, "
          f"evaluations {metrics['evaluations']:.2f}, answered {metrics['answered']:.2f}, "
          f"response length {metrics['response_length']:.0f} tokens (generated {multi_tokens / n:.0f})")
    print()
    print("| rollout | wall s | generate calls | generate s | retrieval s | trajectories/s | generated tokens/s |")
    print("|---|---|---|---|---|---|---|")
    print(f"| search_agent (multi-turn) | {multi_s:.1f} | {multi['calls']} | {multi['gen_s']:.1f} | "
          f"{multi['search_s']:.3f} | {n / multi_s:.3f} | {multi_rate:.1f} |")
    print(f"| single generate, {budget} new tokens | {single_s:.1f} | {generate.calls} | {generate.seconds:.1f} | "
          f"- | {n / single_s:.3f} | {single_rate:.1f} |")
    print()
    print(f"multi-turn overhead (single-turn tokens/s over multi-turn tokens/s): {single_rate / multi_rate:.2f}x")
    print(f"command: python benchmarks/multi_turn.py --config {args.config} --prompts {args.prompts} "
          f"--group-size {args.group_size} --turns {args.turns}")


if __name__ == "__main__":
    main()
