"""Retrieval: build time, index size on disk, peak memory and queries/s, ours against baselines.

Four sides, on the same corpus and the same queries (top ``k=10``):

- ``bm25-ours``: :class:`lit_rag.plugins.retrievers.bm25.BM25Retriever` (bm25s) with its defaults
  (lowercase, regex words, English stopwords, Snowball stemming when PyStemmer is installed);
  build + save, then in a fresh process ``load`` (score matrices memory-mapped) + ``search``.
- ``rank-bm25``: ``rank_bm25.BM25Okapi`` over exactly the token lists our tokenizer produces (so
  both index the same terms). It has no on-disk format: its "index on disk" is the pickle of
  the ``BM25Okapi`` object, loaded back with ``pickle.load`` in the serving process. It has no
  multi-query call either, so "batch 64" is a loop of ``get_scores`` + top-k over 64 queries;
  it scores every document in Python per query term, so it runs ``--rank-bm25-queries`` only.
- ``dense-faiss-flat``: :class:`lit_rag.plugins.retrievers.dense.DenseRetriever` with
  ``faiss_index="flat"`` (``IndexFlatIP``) through its own build/save/load/search; its
  ``encode`` is overridden to hand back precomputed embeddings (DenseRetriever has no way to
  take them otherwise), so no encoder time is counted.
- ``dense-numpy``: brute force over the same embeddings: ``emb @ q.T`` + ``argpartition`` top-k;
  its "index" is the embedding matrix saved with ``np.save`` and read back with ``np.load``.

Embeddings: by default random L2-normalized 384-d float32 vectors (the size of
all-MiniLM-L6-v2), the same array for faiss and numpy; a query's vector is a noisy copy of its
source passage's vector. ``--dense-encoder PATH`` encodes with sentence-transformers instead
(slow on CPU: hours for 100k passages on 2 cores).

Corpora: a generated corpus of short English-like passages (2-4 template sentences about
made-up people, places and organizations, filler words drawn from a Zipf distribution over a
pseudo-word vocabulary, so the vocabulary keeps growing with the corpus like real text) at each
``--sizes`` value, deterministic from ``--seed``; plus the 1k-passage real FlashRAG wiki sample
(``--real``) when the file exists. Queries: 4-7 consecutive words of a random passage with one
word replaced by a random vocabulary word.

Every side runs in two subprocesses per corpus: "build" (read corpus, build, save) and "serve"
(load the saved index, search), so a side's memory never counts for another side and serving
memory is measured apart from building. Peak RSS is the child's ``ru_maxrss``; "delta" subtracts
the RSS right before the side starts (interpreter, libraries and the corpus/queries in memory).

Run (the issue's setting; a few minutes on 2 cores):

    python benchmarks/retrieval.py --passages 100000 --sizes 10000 100000

A run of a minute or two (5,000 and 20,000 generated passages, 64 queries; flags given win;
without rank-bm25 installed, its side is left out with a line saying so):

    python benchmarks/retrieval.py --quick

Smoke test (seconds):

    python benchmarks/retrieval.py --passages 2000 --sizes 500 2000 --queries 32

Under the tables: the date, commit, machine, library versions and command
(``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _bench
import numpy as np

SIDES = ("bm25-ours", "rank-bm25", "dense-faiss-flat", "dense-numpy")
PHASES = ("build", "serve")
K = 10
DIM = 384
TARGET = 21_000_000  # passages in the FlashRAG / DPR Wikipedia dump
DEFAULT_REAL = (
    Path(__file__).resolve().parent.parent.parent
    / "shared"
    / "data"
    / "wiki_corpus1000_flashrag.jsonl"
)
QUERY_NOISE = 0.6  # query vector = normalize(passage vector + QUERY_NOISE * unit noise)
#: --quick: corpora of 5,000 and 20,000 passages (--passages / 4 and --passages), 64 queries;
#: the rank-bm25 side only where it is installed
QUICK = {
    "passages": 20_000,
    "queries": 64,
    "only": [s for s in SIDES if s != "rank-bm25" or _bench.installed("rank-bm25")],
}
#: the libraries the sides use, named under the tables
LIBRARIES = (
    "bm25s",
    "rank-bm25",
    ("faiss-cpu", "faiss-gpu", "faiss"),
    "numpy",
    "PyStemmer",
    "sentence-transformers",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--passages", type=int, default=100_000, help="largest generated corpus size")
    p.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=None,
        help="generated corpus sizes to measure growth over (default: 10000 and --passages)",
    )
    p.add_argument("--queries", type=int, default=256, help="queries per corpus")
    p.add_argument(
        "--rank-bm25-queries",
        type=int,
        default=64,
        help="queries rank-bm25 runs (it scores every document per query term in Python)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--real", default=str(DEFAULT_REAL), help="FlashRAG corpus JSONL (skipped if absent)"
    )
    p.add_argument(
        "--dense-encoder",
        default=None,
        help="sentence-transformers model for the dense sides (default: random embeddings)",
    )
    p.add_argument("--only", nargs="+", choices=SIDES, default=list(SIDES))
    p.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="BLAS/faiss threads per child"
    )
    p.add_argument(
        "--workdir",
        default=None,
        help="keep corpora and indexes here (default: a temp dir, removed)",
    )
    p.add_argument("--verbose", action="store_true", help="show the children's output")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    p.add_argument("--_dir", help=argparse.SUPPRESS)
    args = _bench.parse_args(p, QUICK, argv)
    if args.sizes is None:
        small = args.passages // 4 if args.quick else 10_000
        args.sizes = sorted({min(small, args.passages), args.passages})
    args.sizes = sorted(set(args.sizes))
    for key in ("passages", "queries", "rank_bm25_queries", "threads"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1")
    if min(args.sizes) < 100:
        p.error("--sizes must be >= 100")
    if not args._child and "rank-bm25" in args.only and not _bench.installed("rank-bm25"):
        others = " ".join(side for side in SIDES if side != "rank-bm25")
        p.error(f"rank-bm25 is not installed: pip install 'lit-rag[bench]', or --only {others}")
    return args


# ---------------------------------------------------------------------------------------------
# generated corpus
# ---------------------------------------------------------------------------------------------
_ONSETS = (
    "b",
    "d",
    "f",
    "g",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "st",
    "tr",
    "ch",
    "sh",
    "gl",
    "pl",
    "cr",
)
_VOWELS = ("a", "e", "i", "o", "u", "ea", "ou")
_CODAS = ("", "", "n", "r", "l", "s", "m", "nd", "rt")
_SYLLABLES = [o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS]
_OCCUPATIONS = (
    "painter",
    "weaver",
    "sailor",
    "potter",
    "baker",
    "scholar",
    "miner",
    "poet",
    "architect",
    "surgeon",
    "merchant",
    "composer",
    "farmer",
    "astronomer",
    "judge",
    "engineer",
    "chemist",
    "sculptor",
    "lawyer",
    "teacher",
    "historian",
    "physician",
)
_PRODUCTS = (
    "clocks",
    "lamps",
    "ropes",
    "boats",
    "maps",
    "glass",
    "paper",
    "bells",
    "bicycles",
    "violins",
    "telescopes",
    "cheese",
    "textiles",
    "engines",
    "radios",
    "furniture",
)
_COMMON = (
    "the old",
    "a small",
    "the new",
    "a large",
    "the northern",
    "the local",
    "a famous",
    "the first",
    "a rural",
    "the royal",
)
_SENTENCES = (
    "{s} was born in {c} in {y} and later worked as a {o}.",
    "{s} is a {o} known for {f}.",
    "In {y}, {s} moved to {c}, where {m} {f} was built.",
    "{s} founded {g} in {c}, which makes {p} and {f}.",
    "The family of {s} lived near {m} {f} in {c} for many years.",
    "{c} is a town in {r} with {m} {f} and a population of {n}.",
    "After {y}, {g} opened a second office in {c} to sell {p}.",
    "{s} studied {f} at {g} before teaching in {c}.",
    "Records from {y} describe {m} {f} near the river in {r}.",
    "{s} married {t} in {y} and the couple settled in {c}.",
    "{g} employed {n} workers in {y}, most of them from {r}.",
    "Historians note that {s} wrote about {f} and {f2}.",
)


def _words(indices: np.ndarray, syllables_per_word: int) -> list[str]:
    """Pseudo-word number i: the base-len(_SYLLABLES) digits of i as syllables (unique by
    construction)."""
    base = len(_SYLLABLES)
    out = []
    for i in indices.tolist():
        parts = []
        for _ in range(syllables_per_word):
            i, d = divmod(i, base)
            parts.append(_SYLLABLES[d])
        out.append("".join(parts))
    return out


def generate_corpus(n: int, seed: int) -> list[dict]:
    """``n`` passages ``{"id", "title", "text"}`` of 2-4 template sentences, deterministic from
    ``seed``."""
    rng = np.random.default_rng(seed)
    vocab_size = 200_000
    base = len(_SYLLABLES)
    # 3-syllable filler words
    vocab = _words(rng.permutation(base**2 * 2)[:vocab_size] + base**2, 3)
    ranks = np.arange(1, vocab_size + 1, dtype=np.float64)
    zipf = 1.0 / (ranks + 2.7) ** 1.07
    zipf /= zipf.sum()
    # entity pools grow with the corpus (as names do in Wikipedia); two-syllable name parts
    n_people, n_places, n_orgs, n_regions = (
        max(50, n // 2),
        max(20, n // 10),
        max(20, n // 8),
        max(5, n // 500),
    )
    parts = _words(rng.permutation(base**2)[: 2 * n_people + n_places + n_orgs + n_regions], 2)
    parts = [w.capitalize() for w in parts]
    people = [
        f"{a} {b}" for a, b in zip(parts[:n_people], parts[n_people : 2 * n_people], strict=True)
    ]
    rest = parts[2 * n_people :]
    places = [
        w + s
        for w, s in zip(
            rest[:n_places],
            np.array(("ford", "holm", "ton", "dale", "port", "wick"))[rng.integers(0, 6, n_places)],
            strict=True,
        )
    ]
    orgs = [
        f"{w} {k}"
        for w, k in zip(
            rest[n_places : n_places + n_orgs],
            np.array(("Works", "Press", "Guild", "Company", "Mills", "Institute", "Society"))[
                rng.integers(0, 7, n_orgs)
            ],
            strict=True,
        )
    ]
    regions = [w + "ia" for w in rest[n_places + n_orgs :]]
    n_sent = rng.integers(2, 5, n)
    total = int(n_sent.sum())
    tmpl = rng.integers(0, len(_SENTENCES), total)
    filler = rng.choice(vocab_size, size=(total, 4), p=zipf)
    person_ix = rng.integers(0, n_people, (total, 2))
    place_ix = rng.integers(0, n_places, total)
    org_ix = rng.integers(0, n_orgs, total)
    region_ix = rng.integers(0, n_regions, total)
    years = rng.integers(1700, 2020, total)
    numbers = rng.integers(100, 90_000, total)
    occ = rng.integers(0, len(_OCCUPATIONS), total)
    prod = rng.integers(0, len(_PRODUCTS), total)
    common = rng.integers(0, len(_COMMON), total)
    title_ix = rng.integers(0, n_people, n)
    passages = []
    j = 0
    for i in range(n):
        subject = people[title_ix[i]]
        sentences = []
        for _ in range(int(n_sent[i])):
            f = filler[j]
            sentences.append(
                _SENTENCES[tmpl[j]].format(
                    s=subject,
                    t=people[person_ix[j, 1]],
                    c=places[place_ix[j]],
                    g=orgs[org_ix[j]],
                    r=regions[region_ix[j]],
                    y=years[j],
                    n=numbers[j],
                    o=_OCCUPATIONS[occ[j]],
                    p=_PRODUCTS[prod[j]],
                    m=_COMMON[common[j]],
                    f=f"{vocab[f[0]]} {vocab[f[1]]}",
                    f2=f"{vocab[f[2]]} {vocab[f[3]]}",
                )
            )
            j += 1
        passages.append({"id": f"g{i}", "title": subject, "text": " ".join(sentences)})
    return passages


def make_queries(texts: list[str], count: int, seed: int) -> tuple[list[str], list[int]]:
    """``count`` queries: 4-7 consecutive words of a random passage, one word swapped for another
    passage's word (so queries have hits but are not exact substrings); returns texts and
    sources."""
    rng = np.random.default_rng(seed + 1)
    queries, gold = [], []
    for _ in range(count):
        src = int(rng.integers(0, len(texts)))
        words = texts[src].split()
        length = int(min(len(words), rng.integers(4, 8)))
        start = int(rng.integers(0, len(words) - length + 1))
        window = words[start : start + length]
        other = texts[int(rng.integers(0, len(texts)))].split()
        window[int(rng.integers(0, len(window)))] = other[int(rng.integers(0, len(other)))]
        queries.append(" ".join(window))
        gold.append(src)
    return queries, gold


# ---------------------------------------------------------------------------------------------
# children
# ---------------------------------------------------------------------------------------------
def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _dir_mib(path: Path, skip: tuple[str, ...] = ()) -> float:
    if path.is_file():
        return path.stat().st_size / 2**20
    return (
        sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and f.name not in skip) / 2**20
    )


def _load_corpus(d: Path):
    from lit_rag.retrieval.corpus import read_corpus

    passages = read_corpus(d / "corpus.jsonl", format="litrag")
    q = json.loads((d / "queries.json").read_text())
    return passages, q["queries"], q["gold"]


def child_prepare(args: argparse.Namespace, d: Path) -> dict:
    """Write corpus.jsonl, queries.json, emb.npy and qemb.npy for one corpus into ``d``."""
    from lit_rag.retrieval.corpus import read_corpus, write_corpus
    from lit_rag.types import Passage

    spec = json.loads((d / "spec.json").read_text())
    t0 = time.perf_counter()
    if spec["kind"] == "real":
        passages = read_corpus(spec["path"])
    else:
        passages = [Passage(**p) for p in generate_corpus(spec["n"], args.seed)]
    gen_s = time.perf_counter() - t0
    write_corpus(passages, d / "corpus.jsonl")
    texts = [f"{p.title}\n{p.text}" if p.title else p.text for p in passages]
    queries, gold = make_queries([p.text for p in passages], args.queries, args.seed)
    (d / "queries.json").write_text(json.dumps({"queries": queries, "gold": gold}))
    if args.dense_encoder:
        from lit_rag.plugins.retrievers.dense import DenseRetriever

        enc = DenseRetriever(encoder=args.dense_encoder)
        emb, qemb = enc.encode(texts), enc.encode(queries)
    else:
        rng = np.random.default_rng(args.seed + 2)
        emb = rng.standard_normal((len(passages), DIM), dtype=np.float32)
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)
        noise = rng.standard_normal((len(queries), DIM), dtype=np.float32)
        noise /= np.linalg.norm(noise, axis=1, keepdims=True)
        qemb = emb[gold] + QUERY_NOISE * noise
        qemb /= np.linalg.norm(qemb, axis=1, keepdims=True)
    np.save(d / "emb.npy", np.ascontiguousarray(emb, dtype=np.float32))
    np.save(d / "qemb.npy", np.ascontiguousarray(qemb, dtype=np.float32))
    words = sum(len(t.split()) for t in texts)
    return {
        "ok": True,
        "passages": len(passages),
        "gen_s": gen_s,
        "words_per_passage": words / len(passages),
        "text_mib": _dir_mib(d / "corpus.jsonl"),
        "dim": int(emb.shape[1]),
    }


def _dense_retriever_class():
    from lit_rag.plugins.retrievers.dense import DenseRetriever

    class PrecomputedDense(DenseRetriever):
        """DenseRetriever whose encoder returns precomputed vectors (passages: all rows; queries:
        by text)."""

        table: np.ndarray | None = None
        query_row: dict[str, int] = {}

        def encode(self, texts, prefix=""):
            if self.table is not None and len(texts) == len(self.table) and not self.query_row:
                return self.table
            return self.qtable[[self.query_row[t] for t in texts]]

    return PrecomputedDense


def _timed_search(search, queries: list[str], batch: int) -> tuple[float, list]:
    for _ in range(3):
        search(queries[:1])  # warm-up, not counted
    out = []
    t0 = time.perf_counter()
    for i in range(0, len(queries), batch):
        out.extend(search(queries[i : i + batch]))
    return len(queries) / (time.perf_counter() - t0), out


def child_side(side: str, phase: str, args: argparse.Namespace, d: Path) -> dict:
    passages, queries, gold = (
        _load_corpus(d) if phase == "build" else (None, *_load_corpus_queries(d))
    )
    import bm25s  # noqa: F401  (libraries are part of the baseline, not of the side's memory)
    import faiss  # noqa: F401

    if "rank-bm25" in args.only:  # installed only with the bench extra
        import rank_bm25  # noqa: F401

    import lit_rag.plugins.retrievers.bm25  # noqa: F401
    import lit_rag.plugins.retrievers.dense  # noqa: F401

    idx = d / f"index-{side}"
    baseline = _rss_mib()
    res: dict = {"ok": True, "baseline_rss_mib": baseline}
    t0 = time.perf_counter()
    if phase == "build":
        _build_side(side, passages, d, idx, res, t0)
    else:
        _search_side(side, queries, gold, args, d, idx, res, t0)
    res["peak_rss_mib"] = _peak_rss_mib()
    res["delta_rss_mib"] = res["peak_rss_mib"] - baseline
    return res


def _build_side(side: str, passages, d: Path, idx: Path, res: dict, t0: float) -> None:
    """Build and save ``side``'s index into ``idx``; its times and sizes go into ``res``."""
    if idx.exists():
        shutil.rmtree(idx)
    idx.mkdir(parents=True)
    if side == "bm25-ours":
        from lit_rag.plugins.retrievers.bm25 import BM25Retriever

        r = BM25Retriever()
        r.build(passages)
        t1 = time.perf_counter()
        r.save(idx)
        res["index_mib"] = _dir_mib(idx, skip=("passages.jsonl", "manifest.json"))
        res["store_mib"] = _dir_mib(idx / "passages.jsonl")
        res["stemmer"] = r.settings["stemmer"]
    elif side == "rank-bm25":
        from rank_bm25 import BM25Okapi

        from lit_rag.plugins.retrievers.bm25 import BM25Retriever

        tok = BM25Retriever()._tokenize([f"{p.title}\n{p.text}" for p in passages])
        bm = BM25Okapi(tok)
        t1 = time.perf_counter()
        with open(idx / "bm25okapi.pkl", "wb") as f:
            pickle.dump(bm, f, protocol=pickle.HIGHEST_PROTOCOL)
        res["index_mib"] = _dir_mib(idx)
        res["store_mib"] = 0.0
    elif side == "dense-faiss-flat":
        cls = _dense_retriever_class()
        r = cls(faiss_index="flat", encoder="precomputed")
        r.table = np.load(d / "emb.npy")
        t0 = time.perf_counter()  # loading the embeddings is not building
        r.build(passages)
        r.table = None
        t1 = time.perf_counter()
        r.save(idx)
        res["index_mib"] = _dir_mib(idx, skip=("passages.jsonl", "manifest.json"))
        res["store_mib"] = _dir_mib(idx / "passages.jsonl")
    else:  # dense-numpy
        emb = np.load(d / "emb.npy")
        t0 = time.perf_counter()
        emb = np.ascontiguousarray(emb, dtype=np.float32)
        t1 = time.perf_counter()
        np.save(idx / "emb.npy", emb)
        res["index_mib"] = _dir_mib(idx)
        res["store_mib"] = 0.0
    t2 = time.perf_counter()
    res.update(build_s=t1 - t0, save_s=t2 - t1)


def _search_side(
    side: str, queries, gold, args: argparse.Namespace, d: Path, idx: Path, res: dict, t0: float
) -> None:
    """Load ``side``'s index and time its searches; load time, throughput, the top hits and
    recall go into ``res``."""
    n_q = len(queries)
    if side == "bm25-ours":
        from lit_rag.plugins.retrievers.bm25 import BM25Retriever

        r = BM25Retriever.load(idx)
        res["load_s"] = time.perf_counter() - t0
        search = lambda qs: [[h.passage.id for h in hits] for hits in r.search(qs, K)]  # noqa: E731
    elif side == "rank-bm25":
        with open(idx / "bm25okapi.pkl", "rb") as f:
            bm = pickle.load(f)
        from lit_rag.plugins.retrievers.bm25 import BM25Retriever

        tokenizer = BM25Retriever()._tokenize
        res["load_s"] = time.perf_counter() - t0
        n_q = min(n_q, args.rank_bm25_queries)

        def search(qs):
            out = []
            for toks in tokenizer(qs):
                scores = bm.get_scores(toks)
                top = (
                    np.argpartition(-scores, K - 1)[:K]
                    if len(scores) > K
                    else np.arange(len(scores))
                )
                top = top[np.lexsort((top, -scores[top]))]
                out.append([int(i) for i in top if scores[i] > 0])
            return out
    elif side == "dense-faiss-flat":
        cls = _dense_retriever_class()
        r = cls.load(idx, encoder="precomputed")
        r.qtable = np.load(d / "qemb.npy")
        r.query_row = {q: i for i, q in reversed(list(enumerate(queries)))}
        res["load_s"] = time.perf_counter() - t0
        search = lambda qs: [[h.passage.id for h in hits] for hits in r.search(qs, K)]  # noqa: E731
    else:
        emb = np.load(idx / "emb.npy")
        qemb = np.load(d / "qemb.npy")
        row = {q: i for i, q in reversed(list(enumerate(queries)))}
        res["load_s"] = time.perf_counter() - t0

        def search(qs):
            q = qemb[[row[t] for t in qs]]
            scores = emb @ q.T  # [N, Q]
            kk = min(K, len(emb))
            top = np.argpartition(-scores, kk - 1, axis=0)[:kk].T  # [Q, k]
            out = []
            for j, ids in enumerate(top):
                s = scores[ids, j]
                out.append([int(i) for i in ids[np.lexsort((ids, -s))]])
            return out

    qs = queries[:n_q]
    res["queries_run"] = n_q
    res["qps_1"], top1 = _timed_search(search, qs, 1)
    res["qps_64"], top64 = _timed_search(search, qs, 64)
    ids = [
        [int(str(x).lstrip("g")) if str(x).lstrip("g").isdigit() else x for x in hits]
        for hits in top64
    ]
    res["top"] = ids[:64]
    # the gold passages of the queries run (rank-bm25 runs only --rank-bm25-queries of them)
    hits = [g in h for g, h in zip(gold[:n_q], ids, strict=True)]
    res["recall"] = float(np.mean(hits)) if ids else 0.0


def _load_corpus_queries(d: Path):
    q = json.loads((d / "queries.json").read_text())
    return q["queries"], q["gold"]


def child_main(args: argparse.Namespace) -> None:
    d = Path(args._dir)
    try:
        if args._child == "prepare":
            res = child_prepare(args, d)
        else:
            side, phase = args._child.rsplit(":", 1)
            res = child_side(side, phase, args, d)
    except Exception as exc:  # reported in the table, with the log
        import traceback

        traceback.print_exc()
        res = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    (d / f"result-{args._child.replace(':', '-')}.json").write_text(json.dumps(res))


# ---------------------------------------------------------------------------------------------
# parent
# ---------------------------------------------------------------------------------------------
def spawn(child: str, d: Path, raw: list[str], args: argparse.Namespace) -> dict:
    result = d / f"result-{child.replace(':', '-')}.json"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, os.path.abspath(__file__), *raw, "--_child", child, "--_dir", str(d)]
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[var] = str(args.threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        env=env,
        text=True,
        stdout=None if args.verbose else subprocess.PIPE,
        stderr=None if args.verbose else subprocess.STDOUT,
    )
    if result.exists():
        res = json.loads(result.read_text())
    else:
        tail = [ln for ln in (proc.stdout or "").splitlines() if ln.strip()]
        res = {
            "ok": False,
            "error": f"killed by signal {-proc.returncode} (out of memory?)"
            if proc.returncode < 0
            else (tail[-1] if tail else f"exit status {proc.returncode}"),
        }
    if not res.get("ok") and proc.stdout:
        log = d / f"{child.replace(':', '-')}.log"
        log.write_text(proc.stdout)
        res["log"] = str(log)
    res["wall_s"] = time.perf_counter() - t0
    return res


def _overlap(a: list, b: list) -> float:
    """Mean overlap of two sides' top hits, over the queries both ran (rank-bm25 runs only
    --rank-bm25-queries of them, so its list may be the shorter: strict=False)."""
    pairs = [(x, y) for x, y in zip(a, b, strict=False) if x or y]
    if not pairs:
        return float("nan")
    return float(np.mean([len(set(x) & set(y)) / max(len(x), len(y)) for x, y in pairs]))


def _fmt(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}" if x >= 1 or digits > 1 else f"{x:.2f}"


def print_table(label: str, info: dict, results: dict, args: argparse.Namespace) -> None:
    print()
    print(
        f"== {label}: {info.get('passages', '?')} passages, "
        f"{info.get('words_per_passage', 0):.0f} words/passage, "
        f"text {info.get('text_mib', 0):.1f} MiB as JSONL; {args.queries} queries, k={K}"
    )
    header = (
        "side",
        "build s",
        "index MiB on disk",
        "peak RSS MiB build (delta)",
        "peak RSS MiB serve (delta)",
        "load s",
        "q/s batch 1",
        "q/s batch 64",
        "hit@10",
    )
    rows = []
    for side, (b, s) in results.items():
        if not b.get("ok") or not s.get("ok"):
            err = b if not b.get("ok") else s
            rows.append((side, "FAILED", "-", "-", "-", "-", "-", "-", err.get("error", "")[:60]))
            continue
        rows.append(
            (
                side,
                f"{b['build_s'] + b['save_s']:.2f}",
                f"{b['index_mib']:.1f}",
                f"{b['peak_rss_mib']:.0f} ({b['delta_rss_mib']:.0f})",
                f"{s['peak_rss_mib']:.0f} ({s['delta_rss_mib']:.0f})",
                f"{s['load_s']:.2f}",
                _fmt(s["qps_1"]),
                _fmt(s["qps_64"]),
                f"{s['recall']:.2f}",
            )
        )
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    ok = {side: v for side, v in results.items() if v[0].get("ok") and v[1].get("ok")}
    for side, (b, s) in ok.items():
        extra = (
            f"; rank-bm25 ran {s['queries_run']} queries (batch 64 = a loop of get_scores)"
            if side == "rank-bm25"
            else ""
        )
        store = f"; + passages.jsonl {b['store_mib']:.1f} MiB" if b.get("store_mib") else ""
        print(
            f"  {side}: build {b['build_s']:.2f} s + save {b['save_s']:.2f} s{store}; baseline RSS "
            f"build {b['baseline_rss_mib']:.0f} / serve {s['baseline_rss_mib']:.0f} MiB{extra}"
        )
    if "bm25-ours" in ok and "rank-bm25" in ok:
        (ob, os_), (rb, rs) = ok["bm25-ours"], ok["rank-bm25"]
        print(
            f"  ratio bm25-ours / rank-bm25: q/s batch 1 {os_['qps_1'] / rs['qps_1']:.1f}x, batch "
            f"64 {os_['qps_64'] / rs['qps_64']:.1f}x, build time "
            f"{(ob['build_s'] + ob['save_s']) / (rb['build_s'] + rb['save_s']):.2f}, disk "
            f"{ob['index_mib'] / rb['index_mib']:.2f}, serve RSS delta "
            f"{os_['delta_rss_mib'] / max(rs['delta_rss_mib'], 1e-9):.2f}; top-10 overlap "
            f"{_overlap(os_['top'], rs['top']):.2f} (lucene vs Okapi idf)"
        )
    if "dense-faiss-flat" in ok and "dense-numpy" in ok:
        (fb, fs), (nb, ns) = ok["dense-faiss-flat"], ok["dense-numpy"]
        print(
            f"  ratio faiss-flat / numpy: q/s batch 1 {fs['qps_1'] / ns['qps_1']:.2f}x, batch 64 "
            f"{fs['qps_64'] / ns['qps_64']:.2f}x, disk {fb['index_mib'] / nb['index_mib']:.2f}; "
            f"top-10 overlap {_overlap(fs['top'], ns['top']):.2f} (exact search: should be 1.00)"
        )


def print_growth(sizes: list[int], per_size: dict, args: argparse.Namespace) -> None:
    lo, hi = sizes[0], sizes[-1]
    print()
    print(
        f"== growth between {lo:,} and {hi:,} generated passages (measured), extrapolated linearly "
        f"to {TARGET / 1e6:.0f}M passages (value at {hi:,} + slope x {TARGET - hi:,})"
    )
    header = (
        "side",
        "build s/1M passages",
        "disk KiB/passage",
        "build RSS KiB/passage",
        "serve RSS KiB/passage",
        f"{TARGET // 10**6}M: build",
        f"{TARGET // 10**6}M: disk",
        f"{TARGET // 10**6}M: build RAM",
        f"{TARGET // 10**6}M: serve RAM",
        f"{TARGET // 10**6}M: q/s b1 (b64)",
    )
    rows = []
    gib = 2**30
    for side in args.only:
        a, b = per_size[lo]["sides"].get(side), per_size[hi]["sides"].get(side)
        if not a or not b or not all(x.get("ok") for x in (*a, *b)):
            continue
        n = hi - lo
        t = lambda r: r[0]["build_s"] + r[0]["save_s"]  # noqa: E731
        slope_t = (t(b) - t(a)) / n
        slope_d = (b[0]["index_mib"] - a[0]["index_mib"]) * 2**20 / n
        slope_bm = (b[0]["delta_rss_mib"] - a[0]["delta_rss_mib"]) * 2**20 / n
        slope_sm = (b[1]["delta_rss_mib"] - a[1]["delta_rss_mib"]) * 2**20 / n
        ext = lambda at_hi, slope: at_hi + slope * (TARGET - hi)  # noqa: E731
        build_h = ext(t(b), slope_t) / 3600
        disk = ext(b[0]["index_mib"] * 2**20, slope_d) / gib
        bram = ext(b[0]["delta_rss_mib"] * 2**20, slope_bm) / gib
        sram = ext(b[1]["delta_rss_mib"] * 2**20, slope_sm) / gib
        # search cost grows ~linearly with N for every side here (exhaustive scoring / postings)
        q1, q64 = b[1]["qps_1"] * hi / TARGET, b[1]["qps_64"] * hi / TARGET
        rows.append(
            (
                side,
                f"{slope_t * 1e6:.1f}",
                f"{slope_d / 1024:.2f}",
                f"{slope_bm / 1024:.2f}",
                f"{slope_sm / 1024:.2f}",
                f"{build_h * 60:.0f} min" if build_h < 2 else f"{build_h:.1f} h",
                f"{disk:.1f} GiB",
                f"{bram:.1f} GiB",
                f"{sram:.1f} GiB",
                f"{q1:.2g} ({q64:.2g})",
            )
        )
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    store = (
        (per_size[hi]["info"]["text_mib"] - per_size[lo]["info"]["text_mib"]) * 2**20 / (hi - lo)
    )
    print(
        "  passage text store (passages.jsonl, both lit-rag retrievers keep it in RAM once "
        f"loaded): {store:.0f} B/passage measured here (synthetic passages are shorter than "
        "Wikipedia's ~100-word ones); q/s at 21M assumes search time grows linearly with N "
        "(exhaustive scoring)."
    )
    n = TARGET
    nlist = 65536
    ivfpq = n * (48 + 8) + nlist * DIM * 4 + 48 * 256 * (DIM // 48) * 4
    print("  COMPUTED, not measured (faiss index sizes at 21M x 384-d fp32):")
    print(
        "    Flat (IndexFlatIP): 384 x 4 B = 1.5 KiB/passage -> "
        f"{n * DIM * 4 / gib:.1f} GiB disk and RAM"
    )
    print(
        "    HNSW32 (IndexHNSWFlat): 1.5 KiB + 2 x 32 x 4 B links -> "
        f"~{n * (DIM * 4 + 256) / gib:.1f} GiB"
    )
    print(
        f"    IVF65536,PQ48x8 (IndexIVFPQ): 48 B code + 8 B id = 56 B/passage + coarse centroids "
        f"{nlist * DIM * 4 / 2**20:.0f} MiB + PQ codebooks "
        f"{48 * 256 * (DIM // 48) * 4 / 2**10:.0f} KiB -> {ivfpq / gib:.2f} GiB; search touches "
        "nprobe/nlist of the lists"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args._child:
        child_main(args)
        return
    raw = list(sys.argv[1:] if argv is None else argv)
    if args.quick and "rank-bm25" not in args.only and not _bench.installed("rank-bm25"):
        print("rank-bm25 is not installed (pip install 'lit-rag[bench]'): --quick leaves it out")
    started = time.perf_counter()
    work = (
        Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="litrag-retrieval-"))
    )
    corpora = _corpora(args)
    try:
        tables, per_size = _measure(corpora, work, raw, args)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print()
    _print_setup(args, started)
    for label, info, results in tables:
        print_table(label, info, results, args)
    gen = sorted(per_size)
    if len(gen) >= 2:
        print_growth(gen, per_size, args)
    _bench.print_provenance(__file__, raw, libraries=LIBRARIES)
    if not all(b.get("ok") and s.get("ok") for _, _, r in tables for b, s in r.values()):
        raise SystemExit(1)


def _corpora(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """The corpora to measure: a generated one per size, then the real sample if present."""
    corpora: list[tuple[str, dict]] = [
        (f"generated-{n}", {"kind": "generated", "n": n}) for n in args.sizes
    ]
    real = Path(args.real)
    if real.is_file():
        corpora.append(("real-wiki-sample", {"kind": "real", "path": str(real.resolve())}))
    else:
        print(f"note: real corpus {real} not found; skipping the real sample")
    return corpora


def _measure(
    corpora: list[tuple[str, dict]], work: Path, raw: list[str], args: argparse.Namespace
) -> tuple[list, dict]:
    """Each corpus prepared, then each side built and served in its own child process:
    ``(tables, per_size)``, a ``(label, info, results)`` per corpus prepared and the generated
    corpora's results by size."""
    per_size: dict = {}
    tables = []
    for label, spec in corpora:
        d = work / label
        d.mkdir(parents=True, exist_ok=True)
        (d / "spec.json").write_text(json.dumps(spec))
        print(f"[{label}] preparing corpus, queries and embeddings ...", flush=True)
        info = spawn("prepare", d, raw, args)
        if not info.get("ok"):
            print(f"[{label}] prepare FAILED: {info.get('error')} ({info.get('log')})")
            continue
        results = {}
        for side in args.only:
            print(f"[{label}] {side} ...", flush=True)
            b = spawn(f"{side}:build", d, raw, args)
            s = (
                spawn(f"{side}:serve", d, raw, args)
                if b.get("ok")
                else {"ok": False, "error": "build failed"}
            )
            results[side] = (b, s)
            shutil.rmtree(d / f"index-{side}", ignore_errors=True)
        tables.append((label, info, results))
        if spec["kind"] == "generated":
            per_size[spec["n"]] = {"info": info, "sides": results}
    return tables, per_size


def _print_setup(args: argparse.Namespace, started: float) -> None:
    """What the tables were measured with: embeddings, BM25 and threads (the command and versions
    follow the tables)."""
    enc = (
        f"sentence-transformers encoder {args.dense_encoder}"
        if args.dense_encoder
        else f"NO encoder: random L2-normalized {DIM}-d fp32 embeddings (seed {args.seed}), the "
        "same array for faiss and numpy; query = noisy copy of its source passage's vector"
    )
    print(
        f"dense embeddings: {enc}; dense-faiss-flat = DenseRetriever(faiss_index='flat') with "
        "encode() returning the precomputed vectors (no encoder time counted)"
    )
    print(
        "bm25: both sides index the token lists of BM25Retriever's tokenizer; rank-bm25's on-disk "
        f"index is a pickle of BM25Okapi (it has no disk format); {args.threads} BLAS/faiss "
        "thread(s), bm25s 1 thread"
    )
    print(
        "build s = build + save; RSS delta = peak minus RSS before the side started; hit@10 = the "
        f"query's source passage is in the top 10; total wall {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
