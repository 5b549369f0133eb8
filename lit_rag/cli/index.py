"""``lit-rag index build | search | eval | serve | import``: build, query, score, serve and import
retrieval indexes.

    lit-rag index build --corpus corpus.jsonl --retriever bm25 --out indexes/wiki-bm25
    lit-rag index search indexes/wiki-bm25 "who founded Orbel Mills" -k 5
    lit-rag index eval indexes/wiki-bm25 --data hotpot_dev.json -k 1 5 10
    lit-rag index serve indexes/wiki-bm25 --host 127.0.0.1 --port 8000
    lit-rag index import --faiss e5_Flat.index --corpus wiki-18.jsonl \\
        --encoder intfloat/e5-base-v2 --out indexes/wiki18-e5

A build writes beside ``--out`` and swaps the finished index into place under a lock
(:mod:`lit_rag.retrieval.storage`). ``search`` and ``eval`` open the retriever the manifest
names among the registered ones; a dense (or hybrid) index built with another encoder than the
bundled default needs ``--encoder PATH`` (or ``--trust-manifest-encoder``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
from pathlib import Path

from lit_rag import registry
from lit_rag.data.readers import FORMATS
from lit_rag.errors import InputError
from lit_rag.retrieval.base import IndexedRetriever, Retriever, check_search_args, open_index
from lit_rag.retrieval.corpus import CORPUS_FORMATS
from lit_rag.retrieval.documents import PASSAGE_WORDS

_ENCODER_HELP = (
    "dense and hybrid indexes: the encoder the index was built with (default: the "
    "bundled all-MiniLM-L6-v2)"
)
_BUILD_EPILOG = """\
retriever options: every parameter of the retriever's constructor, as a recipe's init_args,
  e.g. --k1 1.2 --b 0.75 --stemmer null (bm25), --encoder PATH --faiss-index hnsw
  --query-prefix "query: " (dense); a hybrid passes each to itself (--k, --depth) and to
  the fused retrievers that name it. An unknown option lists the retriever's own.
"""
_TRUST_HELP = (
    "load the encoder path the index's manifest records (an index is data: its "
    "model path is not followed unless you allow it)"
)


#: ``lit-rag index --help``: the line ``lit-rag --help`` gives the command, then examples
DESCRIPTION = "Build, search, score, serve and import retrieval indexes."
_EXAMPLES = """\
examples:
  lit-rag index build --corpus corpus.jsonl --retriever bm25 --out indexes/wiki-bm25
  lit-rag index search indexes/wiki-bm25 "who founded Orbel Mills" -k 5
  lit-rag index eval indexes/wiki-bm25 --data hotpot_dev.json -k 1 5 10
  lit-rag index serve indexes/wiki-bm25 --port 8000
  lit-rag index import --faiss e5_Flat.index --corpus wiki-18.jsonl \\
      --encoder intfloat/e5-base-v2 --out indexes/wiki18-e5

lit-rag index COMMAND --help: a command's options.
"""
#: each command's line in ``lit-rag index --help``, and the start of its own ``--help``
INDEX_COMMANDS = {
    "build": "Index a corpus with a registered retriever (bm25, dense, hybrid, ...).",
    "search": "Print the passages an index ranks first for a query.",
    "eval": "Score an index on a QA file with gold passages: Recall@k, Full-Recall@k, mAP.",
    "serve": "Serve an index over HTTP with Search-R1's API (POST /retrieve).",
    "import": "Import a FlashRAG or Search-R1 faiss index and its corpus, encoding nothing again.",
}
_INDEX_HELP = "index folder (written by lit-rag index build or import)"


class IndexParser(argparse.ArgumentParser):
    """argparse for ``lit-rag index`` and its commands (``add_subparsers`` makes theirs of this
    class too): a usage error is one :class:`InputError` line, not argparse's usage text."""

    def error(self, message: str):
        command = self.prog.removeprefix("lit-rag ")
        raise InputError(f"{command}: {message} (options: {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``lit-rag index`` and its commands (retriever options of ``build`` are
    parsed later, from what this parser leaves)."""
    parser = IndexParser(
        prog="lit-rag index",
        description=DESCRIPTION,
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, title="commands")
    _add_build(sub)
    _add_search(sub)
    _add_eval(sub)
    _add_serve(sub)
    _add_import(sub)
    return parser


def _command(sub: argparse._SubParsersAction, name: str, **kwargs) -> argparse.ArgumentParser:
    """The parser of ``lit-rag index NAME``, its line in :data:`INDEX_COMMANDS`."""
    line = INDEX_COMMANDS[name]
    return sub.add_parser(name, help=line, description=line, **kwargs)


def _add_opening(command: argparse.ArgumentParser) -> None:
    """The options of a command that opens an index: the encoder, and whether to trust the
    manifest's."""
    command.add_argument("--encoder", default=None, help=_ENCODER_HELP)
    command.add_argument("--trust-manifest-encoder", action="store_true", help=_TRUST_HELP)


def _add_build(sub: argparse._SubParsersAction) -> None:
    build = _command(
        sub, "build", epilog=_BUILD_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    build.add_argument(
        "--corpus",
        required=True,
        help=(
            "FlashRAG / lit-rag JSONL, a HotpotQA / 2Wiki / MuSiQue file, "
            "synthetic[:SEED] (the bundled world), or a folder of .txt / .md documents"
        ),
    )
    build.add_argument(
        "--passage-words",
        type=int,
        default=PASSAGE_WORDS,
        help=f"a folder's documents: most words a passage holds (default: {PASSAGE_WORDS})",
    )
    build.add_argument(
        "--format",
        default="auto",
        help=f"corpus format: {', '.join(CORPUS_FORMATS)} (default: auto, from its first record)",
    )
    build.add_argument(
        "--retriever",
        default="bm25",
        help="registered retriever: bm25, dense, hybrid, ... (see lit-rag plugins)",
    )
    build.add_argument("--out", required=True, help="index folder to write")
    build.add_argument(
        "--retrievers",
        default="bm25,dense",
        help="hybrid: the registered retrievers it fuses (default: bm25,dense)",
    )


def _add_search(sub: argparse._SubParsersAction) -> None:
    search = _command(sub, "search")
    search.add_argument("index", help=_INDEX_HELP)
    search.add_argument("query", nargs="+", help="the query (several words are joined by spaces)")
    search.add_argument("-k", type=int, default=5, help="passages to print (default: 5)")
    _add_opening(search)


def _add_eval(sub: argparse._SubParsersAction) -> None:
    evaluate = _command(sub, "eval")
    evaluate.add_argument("index", help=_INDEX_HELP)
    evaluate.add_argument(
        "--data",
        required=True,
        help="QA file whose questions name their gold passages (HotpotQA, 2Wiki, MuSiQue, "
        "lit-rag JSONL with gold_ids)",
    )
    evaluate.add_argument(
        "--format",
        default="auto",
        help=f"format of --data: {', '.join(FORMATS)} (default: auto, from its first record)",
    )
    evaluate.add_argument(
        "-k",
        type=int,
        nargs="+",
        default=[1, 5, 10],
        help="cut-offs k for Recall@k and Full-Recall@k (default: 1 5 10); mAP at the largest",
    )
    evaluate.add_argument(
        "--batch-size", type=int, default=64, help="questions searched at once (default: 64)"
    )
    _add_opening(evaluate)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    serve = _command(sub, "serve")
    serve.add_argument("index", help=_INDEX_HELP)
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1, this machine only)",
    )
    serve.add_argument(
        "--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)"
    )
    serve.add_argument(
        "--topk",
        type=int,
        default=3,
        help="passages per query when a request gives no topk (default: 3)",
    )
    serve.add_argument(
        "--max-queries", type=int, default=4096, help="most queries one request may hold"
    )
    _add_opening(serve)


def _add_import(sub: argparse._SubParsersAction) -> None:
    imp = _command(sub, "import")
    imp.add_argument(
        "--faiss",
        required=True,
        help="the faiss index file, e.g. e5_Flat.index (inner product: flat, HNSW or IVF)",
    )
    imp.add_argument(
        "--corpus",
        required=True,
        help=(
            "the FlashRAG corpus JSONL it was built from, faiss row i = line i, e.g. wiki-18.jsonl"
        ),
    )
    imp.add_argument(
        "--encoder",
        required=True,
        help=(
            "the encoder it was built with: hub id (intfloat/e5-base-v2) or local path; "
            "recorded, not loaded"
        ),
    )
    imp.add_argument("--out", required=True, help="index folder to write")
    imp.add_argument(
        "--query-prefix",
        default=None,
        help=(
            'prepended to queries (default from the encoder name, as Search-R1: e5 "query: ", '
            "bge its instruction)"
        ),
    )
    imp.add_argument(
        "--passage-prefix",
        default=None,
        help='the passages were encoded with (recorded; default: e5 "passage: ")',
    )
    imp.add_argument(
        "--pooling",
        default=None,
        help="mean, cls or max (default from the encoder name: bge cls, else mean)",
    )
    imp.add_argument(
        "--link",
        action="store_true",
        help="hard-link the faiss file instead of copying it, where the file system allows",
    )


def _check_args(args: argparse.Namespace) -> None:
    """Option values argparse's types cannot check, as one-line errors."""
    k = getattr(args, "k", 1)
    for value in k if isinstance(k, list) else [k]:
        if value < 1:
            raise InputError(f"-k: got {value}; expected an integer >= 1")
    if getattr(args, "topk", 1) < 1:
        raise InputError(f"--topk: got {args.topk}; expected an integer >= 1")
    if getattr(args, "batch_size", 1) < 1:
        raise InputError(f"--batch-size: got {args.batch_size}; expected an integer >= 1")
    if not 0 <= getattr(args, "port", 0) <= 65535:
        raise InputError(f"--port: got {args.port}; expected 0 to 65535")
    if getattr(args, "max_queries", 1) < 1:
        raise InputError(f"--max-queries: got {args.max_queries}; expected an integer >= 1")


#: constructor parameters that are not build options: ``index build`` names the folder and
#: the corpus itself; the others belong to opening an index, or to fusing (``--retrievers``)
_NOT_OPTIONS = frozenset(
    {"self", "index", "corpus", "expected_corpus", "retrievers", "trust_manifest_encoder"}
)


def _retriever_class(kind: str) -> type[IndexedRetriever]:
    """The class for ``--retriever`` as the user typed it (a registered name or a dotted path),
    which must build an index of its own."""
    cls = registry.resolve("retriever", kind)
    if not (isinstance(cls, type) and issubclass(cls, Retriever) and cls.builds_index):
        building = [name for name in registry.available("retriever") if _builds(name)]
        raise InputError(
            f"--retriever {kind}: builds no index of its own (it searches a "
            f"service or another index); retrievers that build one: "
            f"{', '.join(building)}"
        )
    return cls


def _builds(name: str) -> bool:
    try:
        cls = registry.load("retriever", name)
    except Exception:  # noqa: BLE001 -- a broken third-party entry point is not listed here
        return False
    return isinstance(cls, type) and issubclass(cls, Retriever) and cls.builds_index


def build_options(cls: type) -> list[str]:
    """The ``index build`` options of a retriever: its constructor's parameters."""
    params = inspect.signature(cls.__init__).parameters.values()
    return [
        p.name
        for p in params
        if p.name not in _NOT_OPTIONS and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _split_options(extra: list[str]) -> dict[str, str]:
    """``--name value`` / ``--name=value`` pairs (dashes read as underscores), in order."""
    options: dict[str, str] = {}
    i = 0
    while i < len(extra):
        word = extra[i]
        if not word.startswith("--") or len(word) < 3:
            raise InputError(
                f"index build: unexpected argument {word!r}; retriever options are --NAME VALUE"
            )
        name, eq, value = word[2:].partition("=")
        if not eq:
            if i + 1 >= len(extra):
                raise InputError(f"index build: --{name} needs a value")
            value = extra[i + 1]
            i += 1
        options[name.replace("-", "_")] = value
        i += 1
    return options


def _construct(cls: type, options: dict[str, str], **fixed: object) -> IndexedRetriever:
    """``cls(**fixed, **typed)``: the ``options`` its constructor names, each read with the
    parameter's type as a recipe's ``init_args`` are (jsonargparse)."""
    import jsonargparse

    names = [n for n in build_options(cls) if n in options]
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(
        cls, skip=set(inspect.signature(cls.__init__).parameters) - set(names)
    )
    try:
        parsed = parser.parse_args([f"--{n}={options[n]}" for n in names])
    except argparse.ArgumentError as err:
        raise InputError(f"index build: {' '.join(str(err).split())}") from None
    try:
        return cls(**fixed, **{n: parsed[n] for n in names})
    except ValueError as err:
        raise InputError(f"index build --retriever {cls.kind or cls.__name__}: {err}") from None


def _new_retriever(args: argparse.Namespace, extra: list[str]) -> IndexedRetriever:
    """The retriever ``--retriever`` names, built from the options its constructor takes
    (``--k1 1.2``, ``--faiss-index hnsw``, ``--encoder PATH``); a hybrid's options go to it and
    to each fused retriever that names them."""
    cls = _retriever_class(args.retriever)
    options = _split_options(extra)
    classes = [cls]
    if "retrievers" in inspect.signature(cls.__init__).parameters:
        classes += [_retriever_class(kind.strip()) for kind in args.retrievers.split(",")]
    known = {name for c in classes for name in build_options(c)}
    unknown = [name for name in options if name not in known]
    if unknown:
        raise InputError(
            f"index build --retriever {args.retriever}: unknown option "
            f"--{unknown[0].replace('_', '-')}; its options: "
            f"{', '.join('--' + n.replace('_', '-') for n in sorted(known))}"
        )
    if len(classes) == 1:
        return _construct(cls, options)
    children = [_construct(child, options) for child in classes[1:]]
    return _construct(cls, options, retrievers=children)


def load_index(
    path: str, encoder: str | None = None, trust_manifest_encoder: bool = False
) -> Retriever:
    """Open an index folder with the registered retriever its manifest names.

    Args:
        path: The index folder.
        encoder: The encoder for a dense (or hybrid) index; see ``DenseRetriever.load``.
        trust_manifest_encoder: Load the encoder path the manifest records instead.
    """
    return open_index(path, encoder=encoder, trust_manifest_encoder=trust_manifest_encoder)


def build(args: argparse.Namespace, extra: list[str]) -> None:
    from lit_rag.retrieval.storage import atomic_index_dir

    retriever = _new_retriever(args, extra)
    # the lock first (it also puts back an index an interrupted build set aside), then the corpus
    with atomic_index_dir(args.out) as folder:
        check_corpus(args.corpus)
        passages = _corpus_passages(args)
        for part in retriever.parts():
            part.show_progress = True
        started = time.perf_counter()
        retriever.build(passages)
        retriever.save(folder)
    print(
        f"indexed {len(passages)} passages with {args.retriever} "
        f"in {time.perf_counter() - started:.1f} s -> {args.out}"
    )


def check_corpus(corpus: str) -> None:
    """Fail in one line when ``--corpus`` names no file or folder (before any model loads)."""
    if corpus == "synthetic" or corpus.startswith("synthetic:") or Path(corpus).exists():
        return
    raise InputError(
        f"index build: corpus file or folder not found: {corpus}; --corpus takes a corpus file "
        "(FlashRAG or lit-rag JSONL, a HotpotQA / 2Wiki / MuSiQue file), a folder of .txt / .md "
        "documents, or synthetic[:SEED]"
    )


def _corpus_passages(args: argparse.Namespace) -> list:
    """The passages of ``--corpus``: a corpus file, or a folder's documents cut into passages
    (:mod:`lit_rag.retrieval.documents`)."""
    from lit_rag.retrieval.corpus import read_corpus
    from lit_rag.retrieval.documents import read_documents

    if not Path(args.corpus).is_dir():
        return read_corpus(args.corpus, args.format)
    if args.format != "auto":
        raise InputError(
            f"--format {args.format}: a corpus folder is read as documents (.txt, .md); "
            "--format names the format of a corpus file"
        )
    return read_documents(args.corpus, args.passage_words)


def search(args: argparse.Namespace) -> None:
    query = " ".join(args.query)
    _check_query(query)
    retriever = load_index(args.index, args.encoder, args.trust_manifest_encoder)
    (hits,) = retriever.search([query], args.k)
    for hit in hits:
        text = hit.passage.text if len(hit.passage.text) <= 160 else hit.passage.text[:157] + "..."
        line = f"{hit.rank + 1:>3}  {hit.score:8.3f}  {hit.passage.id}  {hit.passage.title}: {text}"
        print(line.encode("utf-8", "backslashreplace").decode("utf-8"))  # any text prints


def _check_query(query: str) -> None:
    try:
        check_search_args([query], 1)
    except ValueError as err:
        raise InputError(f"{err} (the command line held bytes that are not UTF-8)") from None


def evaluate(args: argparse.Namespace) -> dict:
    from lit_rag.data.readers import read_examples
    from lit_rag.metrics.retrieval import FullRecallAtK, MeanAveragePrecision, RecallAtK
    from lit_rag.retrieval.corpus import corpus_ids, pooled_gold_ids

    examples = [ex for ex in read_examples(args.data, args.format) if ex.gold_ids]
    if not examples:
        raise InputError(
            f"{args.data}: no example has gold passage ids; "
            "eval needs HotpotQA, 2Wiki, MuSiQue or lit-rag rows with gold_ids"
        )
    retriever = load_index(args.index, args.encoder, args.trust_manifest_encoder)
    # gold paragraphs are found in the index by title and text (MuSiQue repeats titles)
    gold = {(r.title, r.text) for ex in examples for r in ex.references if r.id in ex.gold_ids}
    indexed = isinstance(retriever, IndexedRetriever)
    ids = corpus_ids(retriever.passages, gold) if indexed else None
    depth = max(args.k)
    metrics = {f"recall@{k}": RecallAtK(k) for k in args.k}
    metrics.update({f"full_recall@{k}": FullRecallAtK(k) for k in args.k})
    metrics[f"map@{depth}"] = MeanAveragePrecision()
    started = time.perf_counter()
    for i in range(0, len(examples), args.batch_size):
        batch = examples[i : i + args.batch_size]
        ranked = [
            [h.passage.id for h in hits]
            for hits in retriever.search([ex.question for ex in batch], depth)
        ]
        for metric in metrics.values():
            metric.update(ranked, [pooled_gold_ids(ex, ids) for ex in batch])
    seconds = time.perf_counter() - started
    result = {name: round(float(m.compute()), 4) for name, m in metrics.items()}
    result["queries"] = len(examples)
    result["queries_per_s"] = round(len(examples) / max(seconds, 1e-9), 1)
    print(json.dumps(result, indent=2))
    return result


def serve(args: argparse.Namespace) -> None:
    from lit_rag.retrieval.server import bind, serve

    bind(args.host, args.port).close()  # a taken port fails before the index loads
    retriever = load_index(args.index, args.encoder, args.trust_manifest_encoder)
    serve(
        retriever,
        args.host,
        args.port,
        topk=args.topk,
        max_queries=args.max_queries,
        name=args.index,
    )


def import_index(args: argparse.Namespace) -> None:
    from lit_rag.plugins.retrievers.faiss_import import import_dense_index
    from lit_rag.retrieval.manifest import Manifest

    for option, path, what in (
        ("--faiss", args.faiss, "the faiss index file"),
        ("--corpus", args.corpus, "the FlashRAG corpus JSONL the index was built from"),
    ):
        if not Path(path).is_file():
            raise InputError(f"index import: {option} {path}: file not found; give {what}")
    started = time.perf_counter()
    out = import_dense_index(
        args.faiss,
        args.corpus,
        args.encoder,
        args.out,
        query_prefix=args.query_prefix,
        passage_prefix=args.passage_prefix,
        pooling=args.pooling,
        link=args.link,
    )
    manifest = Manifest.read(out)
    s = manifest.settings
    print(
        f"imported {manifest.passage_count} passages (dim {s['dim']}, {s['faiss_index']} "
        f"{s['faiss_class']}, pooling {s['pooling']}, query prefix {s['query_prefix']!r}), "
        f"index.faiss as a {s['imported_from']['index_file']}, in "
        f"{time.perf_counter() - started:.1f} s -> {args.out}"
    )


def main(argv: list[str]) -> None:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "build":
        build(args, extra)
        return
    if extra:
        parser.parse_args(argv)  # argparse's own error for the unrecognized arguments
    _check_args(args)
    commands = {"search": search, "eval": evaluate, "serve": serve, "import": import_index}
    commands[args.command](args)
