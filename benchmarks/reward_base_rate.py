"""Reward per component of the untrained policy on a recipe's training data.

GRPO learns only from groups whose samples score differently. Run this before tuning a
recipe: each component's mean should sit between the extremes, and the fraction of groups
with reward variance should be well above zero.

    python benchmarks/reward_base_rate.py --config recipes/quickstart.yaml --prompts 8
    python benchmarks/reward_base_rate.py --config recipes/quickstart.yaml --quick  # 4 x 2

The rollout runs at the recipe's ``trainer.precision`` as ``lit-rag fit`` resolves it (``auto``:
bf16 autocast where the CPU computes bf16 natively, else fp32); the output names it, and ends
with the date, commit, machine, library versions and command (``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import time

import _bench
import torch

from lit_rag.cli.commands import build_cli

#: --quick: fewer prompts, groups of two (the smallest with a variance); same tokens per sample
QUICK = {"prompts": 4, "group_size": 2}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--show", type=int, default=3, help="completions to print")
    parser.add_argument(
        "overrides", nargs="*", help="extra CLI overrides, e.g. --model.sampling.max_new_tokens=96"
    )
    args, extra = _bench.parse_args(parser, QUICK, argv, known=True)
    cli = build_cli(["--config", args.config, *extra, *args.overrides], run=False)
    module, data = cli.model, cli.datamodule
    module.configure_model()
    data.setup("fit")
    examples = data.train_examples()[: args.prompts]
    group = args.group_size or module.group_size
    torch.manual_seed(0)
    started = time.perf_counter()
    precision = str(cli.trainer.precision)  # auto resolved for this machine
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled="bf16" in precision):
        trajectories = module.rollout(examples, module.sampling, group)
    seconds = time.perf_counter() - started
    rewards = module.reward(trajectories)
    if rewards.total.dim() == 2:  # step-level rewards [N, T]: report each trajectory's return
        print("step-level rewards: per-trajectory sums over steps (weighted total = the return)")
        rewards = type(rewards)(
            total=rewards.total.sum(-1),
            components={k: v.sum(-1) for k, v in rewards.components.items()},
        )
    groups = torch.tensor([t.group for t in trajectories])
    varied = sum(float(rewards.total[groups == g].std()) > 0 for g in groups.unique())
    prompt_tokens = sum(t.prompt_ids.numel() for t in trajectories[::group]) / len(examples)
    print(
        f"recipe: {args.config}; {len(examples)} prompts x {group} samples; "
        f"mean prompt {prompt_tokens:.0f} tokens; precision {precision}; rollout {seconds:.1f} s"
    )
    print(f"{'component':<14}{'mean':>8}{'min':>8}{'max':>8}")
    for name, values in {"total": rewards.total, **rewards.components}.items():
        v = values.float()
        print(f"{name:<14}{v.mean():>8.3f}{v.min():>8.3f}{v.max():>8.3f}")
    lengths = torch.tensor([float(t.num_generated) for t in trajectories])
    print(
        f"groups with reward variance: {varied}/{len(examples)}; "
        f"mean completion {lengths.mean():.1f} tokens; truncated "
        f"{sum(t.truncated for t in trajectories)}/{len(trajectories)}"
    )
    for name, value in module.environment.metrics(trajectories).items():
        print(f"{name:<20}{float(value):>8.3f}  (mean per trajectory)")
    prepared = module.algorithm.prepare(trajectories, module.reward(trajectories))
    print("algorithm:", ", ".join(f"{k} {float(v):.3f}" for k, v in prepared.metrics.items()))
    _bench.print_provenance(__file__, argv)
    for t in trajectories[: args.show]:
        print("----", t.example.answers, "\n" + t.text)


if __name__ == "__main__":
    main()
