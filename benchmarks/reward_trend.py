"""Did the reward rise? Mean of each reward component over the first and last fifth of a run.

    python benchmarks/reward_trend.py runs/quickstart/version_0/metrics.csv

It reads one file in a moment: ``--quick``, which the other benchmarks take, is accepted and
changes nothing. Under the table: the date, commit, machine, library versions and command
(``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import csv
import math

import _bench


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", help="a run's metrics.csv (Lightning's CSVLogger)")
    args = _bench.parse_args(parser, {}, argv, note="already quick (it reads one file)")
    path = args.metrics
    every = list(csv.DictReader(open(path, encoding="utf-8")))
    rows = [r for r in every if r.get("reward/total")]
    if not rows:
        raise SystemExit(f"{path}: no training steps with reward/total")
    fifth = max(1, math.ceil(len(rows) / 5))
    keys = sorted(k for k in rows[0] if k.startswith("reward/")) + [
        "train/kl",
        "rollout/completion_length",
    ]
    keys = [k for k in keys if rows[0].get(k, "") != "" or rows[-1].get(k, "") != ""]

    def mean(part: list[dict], key: str) -> float:
        values = [float(r[key]) for r in part if r.get(key, "") != ""]
        return sum(values) / len(values) if values else float("nan")

    first, last = rows[:fifth], rows[-fifth:]
    print(
        f"{path}: {len(rows)} steps; first fifth = steps {first[0]['step']}-{first[-1]['step']}, "
        f"last fifth = steps {last[0]['step']}-{last[-1]['step']}"
    )
    print(f"{'metric':<28}{'first fifth':>12}{'last fifth':>12}")
    for key in keys:
        print(f"{key:<28}{mean(first, key):>12.3f}{mean(last, key):>12.3f}")
    for r in every:
        if r.get("val/em"):
            print(
                "validation:",
                {k: round(float(v), 3) for k, v in r.items() if k.startswith("val/") and v},
            )
    _bench.print_provenance(__file__, argv)


if __name__ == "__main__":
    main()
