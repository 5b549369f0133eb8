"""What serving an index over HTTP costs: queries/s of a local search against the same index
behind ``lit-rag index serve`` queried by ``retriever: http``, at several request sizes.

    python benchmarks/retrieval_server.py --retriever bm25 --batches 1 16 64 --queries 512
    python benchmarks/retrieval_server.py --quick     # 128 queries, one timed pass each

Builds the index over the bundled synthetic world (1307 passages) in a temporary folder, starts
the server as a separate process on 127.0.0.1 (as a user runs it), and times the same queries
(the synthetic world's questions) both ways, after one warm-up pass each. Results are checked
to be identical. Run it alone: the server and the client share the machine's cores. Under the
table: the date, commit, machine, library versions and command (``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _bench

#: --quick: fewer queries, one timed pass per request size (after the warm-up), the same table
QUICK = {"queries": 128, "repeats": 1}


def _questions(n: int) -> list[str]:
    from lit_rag.data.synthetic import SyntheticWorld

    world = SyntheticWorld(seed=0)
    return [ex.question for ex in world.examples(n)]


def _time(search, queries: list[str], batch: int, k: int, repeats: int) -> tuple[float, list]:
    """Median queries/s over ``repeats`` passes; the hits of the last pass."""
    rates, hits = [], []
    search(queries[:batch], k)  # warm-up
    for _ in range(repeats):
        hits = []
        started = time.perf_counter()
        for i in range(0, len(queries), batch):
            hits.extend(search(queries[i : i + batch], k))
        rates.append(len(queries) / (time.perf_counter() - started))
    return statistics.median(rates), hits


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--retriever", default="bm25", help="bm25 or dense (MiniLM)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--queries", type=int, default=512)
    parser.add_argument("-k", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = _bench.parse_args(parser, QUICK, argv)

    from lit_rag.cli.commands import main as cli
    from lit_rag.plugins.retrievers.http import HttpRetriever
    from lit_rag.retrieval.base import open_index

    queries = _questions(args.queries)
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "index"
        cli(
            [
                "index",
                "build",
                "--corpus",
                "synthetic",
                "--retriever",
                args.retriever,
                "--out",
                str(index),
            ]
        )
        local = open_index(index)
        server = subprocess.Popen(
            [sys.executable, "-m", "lit_rag", "index", "serve", str(index), "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            url = server.stdout.readline().split(" at ")[-1].strip()
            remote = HttpRetriever(url)
            rows = []
            for batch in args.batches:
                here, local_hits = _time(local.search, queries, batch, args.k, args.repeats)
                there, remote_hits = _time(remote.search, queries, batch, args.k, args.repeats)
                same = [[h.passage.id for h in q] for q in local_hits] == [
                    [h.passage.id for h in q] for q in remote_hits
                ]
                rows.append((batch, here, there, same))
        finally:
            server.terminate()
            server.wait(30)
    print(
        f"\n{args.retriever}, {len(queries)} queries, k={args.k}, median of {args.repeats} passes"
    )
    print("| queries per request | local q/s | http q/s | http / local | same hits |")
    print("|---|---|---|---|---|")
    for batch, here, there, same in rows:
        print(
            f"| {batch} | {here:.0f} | {there:.0f} | {there / here:.2f} | "
            f"{'yes' if same else 'NO'} |"
        )
    libraries = ("bm25s",) if args.retriever == "bm25" else ("sentence-transformers", "faiss-cpu")
    _bench.print_provenance(__file__, argv, libraries=libraries)


if __name__ == "__main__":
    main()
