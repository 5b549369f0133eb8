"""Is the policy copying the prompt's worked example? Copy rates over a run's logged samples.

python benchmarks/example_copies.py --config recipes/arena_hotpotqa_cpu.yaml \
    runs/arena_hotpotqa_cpu/version_0/rollouts.jsonl

A recipe whose prompt shows a worked output (environment ``example_output`` or
``example_outputs``) can be won in part by writing that output back: ARENA's format reward pays
a copy in full (issue 27). For each fifth of the run's steps this prints the share of logged
samples (``RolloutSampleLogger``) that are the shown worked output word for word, the share
whose <answer> is the shown output's answer, and the share whose <answer> is any worked
output's answer; with ``example_outputs`` the shown one is picked as the environment picks it
(:meth:`SingleTurnEnvironment.example_output_for`).
"""

from __future__ import annotations

import argparse
import json
import math

import yaml

from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.text import extract_tag
from lit_rag.types import Example


def _words(text: str) -> str:
    return " ".join(text.split())


def environment_of(config: str) -> SingleTurnEnvironment:
    with open(config, encoding="utf-8") as handle:
        recipe = yaml.safe_load(handle)
    args = recipe["model"]["environment"].get("init_args") or {}
    keep = ("example_output", "example_outputs", "assistant_prefix")
    return SingleTurnEnvironment(**{k: v for k, v in args.items() if k in keep})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("rollouts", nargs="+", help="rollouts.jsonl of one or more runs")
    args = parser.parse_args()
    env = environment_of(args.config)
    if not (env.example_output or env.example_outputs):
        raise SystemExit(f"{args.config}: the environment shows no worked output")
    print(f"recipe: {args.config}; {len(env.example_outputs) or 1} worked output(s)")
    outputs = env.example_outputs or [env.example_output]
    example_answers = {_words(extract_tag(o, "answer") or "") for o in outputs} - {""}
    print(f"{'run':<44}{'steps':>9}{'samples':>9}{'copied':>9}{'answer':>9}{'any':>9}")
    for path in args.rollouts:
        with open(path, encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
        steps = sorted({r["step"] for r in rows})
        if not steps:
            print(f"{path:<44}{'no samples':>9}")
            continue
        fifth = max(1, math.ceil(len(steps) / 5))
        for start in range(0, len(steps), fifth):
            part = set(steps[start : start + fifth])
            chosen = [r for r in rows if r["step"] in part]
            copied = answered = any_answer = 0
            for row in chosen:
                shown = env.example_output_for(
                    Example(id=row["example_id"], question="", answers=[])
                )
                completion = row["completion"]
                copied += _words(completion).startswith(_words(shown))
                answer = extract_tag(completion, "answer")
                answer = None if answer is None else _words(answer)
                answered += answer is not None and answer == _words(
                    extract_tag(shown, "answer") or ""
                )
                any_answer += answer in example_answers
            span = f"{min(part)}-{max(part)}"
            print(
                f"{path:<44}{span:>9}{len(chosen):>9}"
                f"{copied / len(chosen):>9.2f}{answered / len(chosen):>9.2f}"
                f"{any_answer / len(chosen):>9.2f}"
            )


if __name__ == "__main__":
    main()
