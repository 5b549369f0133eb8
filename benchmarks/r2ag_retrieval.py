"""Retrieval quality of R2AG's steering against single-step retrieval at the same average K.

Expands a retrieval tree for each validation question with the recipe's steering model (the
untrained model is the paper's prompted R2AG-p; ``--ckpt`` loads a trained checkpoint), then
retrieves the question alone with the same retriever at K = the trees' average number of
retrieved documents (rounded), and prints Recall, Full-Recall and mAP side by side (Table 1
and Table 5 columns), with the reader's EM and the seconds per query (Table 4).

    python benchmarks/r2ag_retrieval.py --config recipes/r2ag_quickstart.yaml --questions 32
    python benchmarks/r2ag_retrieval.py --config recipes/r2ag_quickstart.yaml --questions 32 \
        --ckpt runs/r2ag_quickstart/version_0/checkpoints/last.ckpt
    python benchmarks/r2ag_retrieval.py --quick     # a few minutes: 6 questions

The trees expand at the recipe's ``trainer.precision`` as ``lit-rag fit`` resolves it (``auto``:
bf16 autocast where the CPU computes bf16 natively, else fp32; other options go to lit-rag's CLI,
e.g. ``--trainer.precision=32-true``). The output names it, and ends with the date, commit,
machine, library versions and command (``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import time

import _bench
import torch

from lit_rag.api import exact_match
from lit_rag.cli.commands import build_cli
from lit_rag.metrics.retrieval import average_precision


def scores(ranked: list[list[str]], gold: list[list[str]]) -> dict[str, float]:
    n = len(ranked)
    return {
        "recall": sum(len(set(r) & set(g)) / len(g) for r, g in zip(ranked, gold, strict=True)) / n,
        "full_recall": sum(set(g) <= set(r) for r, g in zip(ranked, gold, strict=True)) / n,
        "avg_k": sum(len(r) for r in ranked) / n,
        "map": sum(average_precision(r, g) for r, g in zip(ranked, gold, strict=True)) / n,
    }


#: --quick: fewer validation questions, the same table
QUICK = {"questions": 6}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="recipes/r2ag_quickstart.yaml")
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument(
        "--ckpt", default=None, help="a checkpoint of a training run (LoRA adapters)"
    )
    args, extra = _bench.parse_args(parser, QUICK, argv, known=True)
    cli = build_cli(
        ["--config", args.config, f"--data.num_val={args.questions}", *extra], run=False
    )
    module, data = cli.model, cli.datamodule
    module.configure_model()
    if args.ckpt:
        state = torch.load(args.ckpt, map_location="cpu", weights_only=True)["state_dict"]
        missing = module.load_state_dict(state, strict=False)
        print(
            f"# loaded {len(state)} tensors from {args.ckpt} "
            f"({len(missing.unexpected_keys)} unexpected)"
        )
    data.setup("validate")
    examples = [ex for ex in data.val_examples() if ex.gold_ids][: args.questions]
    env = module.environment
    precision = str(cli.trainer.precision)  # auto resolved for this machine
    bf16 = "bf16" in precision
    torch.manual_seed(0)
    started = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        trajectories = module.rollout(examples, module.val_sampling, None)
    seconds = time.perf_counter() - started
    gold = [ex.gold_ids for ex in examples]
    tree = scores([t.contract.inference.ranked for t in trajectories], gold)
    em = sum(exact_match(env.extract_answer(t), t.example.answers) for t in trajectories) / len(
        examples
    )
    k = max(1, round(tree["avg_k"]))
    single_ranked = [
        [h.passage.id for h in hits]
        for hits in env.retriever.search([ex.question for ex in examples], k)
    ]
    single = scores(single_ranked, gold)
    label = "R2AG (trained)" if args.ckpt else "R2AG-p (untrained, prompted)"
    iterations = sum(t.contract.inference.iterations for t in trajectories) / len(trajectories)
    print(
        f"# {args.config}: {len(examples)} validation questions, steering top-{env.val_top_k} per "
        f"query, max {env.max_iterations} expansions; precision {precision}; {seconds:.0f} s"
    )
    print("| retrieval | avg K | Recall | Full-Recall | mAP | iterations | reader EM |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {label} | {tree['avg_k']:.2f} | {tree['recall']:.3f} | {tree['full_recall']:.3f} | "
        f"{tree['map']:.3f} | {iterations:.2f} | {em:.3f} |"
    )
    print(
        f"| single-step, question as query, K = {k} | {single['avg_k']:.2f} | "
        f"{single['recall']:.3f} | {single['full_recall']:.3f} | {single['map']:.3f} | 1 | - |"
    )
    _bench.print_provenance(__file__, argv, libraries=("bm25s",))


if __name__ == "__main__":
    main()
