"""``lit-rag data``: each paper recipe's data, sampled as its paper describes, from local files.

    lit-rag data arena --source hotpotqa-train=hotpot_train_v1.1.json \\
        --source hotpotqa-dev=hotpot_dev_distractor_v1.json --source 2wiki-train=train.json ...
    lit-rag data search_r1 --flashrag FlashRAG_datasets/ --source wiki18=wiki-18.jsonl
    lit-rag data PAPER [--out DIR] [--source NAME=PATH ...] [--flashrag DIR] [--hub]
                       [--seed 42] [--eval-only]
    lit-rag data --list          # the papers, the files each writes, the sources each reads

PAPER is ``arena``, ``r2ag``, ``search_r1`` (alias ``eval_rar``: both papers train and evaluate
on the same data) or ``evo_rag``; the files go to ``data/<paper>/`` (``--out``): lit-rag JSONL
(``train.jsonl``, ``val.jsonl``, ``test_<dataset>.jsonl``), a pooled ``corpus.jsonl`` where the
paper retrieves from the datasets' own paragraphs, and ``manifest.json`` (the command, the seed,
each source's path and SHA-256, each file's records per source with the paper section behind its
count, absent sources, dropped duplicates).

A source is a local file (``--source NAME=PATH``), else ``DIR/<FlashRAG path>`` of ``--flashrag
DIR`` (a copy of the Hugging Face dataset ``RUC-NLPIR/FlashRAG_datasets``), else, with ``--hub``,
that file downloaded from the Hub. Sources whose paragraphs a paper needs (ARENA's references,
R2AG's and EVO-RAG's corpora) must be in their original layout and are only taken from
``--source``: lit-rag reads FlashRAG's QA layout (``id, question, golden_answers``) without
paragraphs.

Rules for every paper: sampling is deterministic under ``--seed``, one permutation per source
(``random.Random(f"{seed}/{paper}/{source}")``), so one source's sample does not move when
another source changes; a source that feeds several files is cut from its permutation in the
order test, val, train, so those samples are disjoint (a source smaller than what they ask for
together is shared in proportion to their counts). A training question that is also an
evaluation or validation question (same dataset and id, or the same question once lower-cased
and stripped of punctuation) is passed over and counted in the manifest, and so is a test
question met by a validation sample drawn from a training split. A source smaller than the
paper's count is taken whole, with one line saying so. Every file is written to a temporary
name and renamed, so a cut run leaves no half-written file. Ids become ``<source>/<id>``
(unique in every file); ``meta`` gains ``source``, ``dataset`` and ``source_id``.

This module is the command and the run from sources to files; finding and reading the sources
is :mod:`lit_rag.data.prepare.sources`, the sampling :mod:`lit_rag.data.prepare.sampling`, the
atomic writes and hashes :mod:`lit_rag.data.prepare.files`.
"""

from __future__ import annotations

import json
import shlex
from argparse import RawDescriptionHelpFormatter
from pathlib import Path

from lit_rag.data.papers import (
    ALIASES,
    FLASHRAG_REPO,
    PAPERS,
    SOURCES,
    DataFile,
    Paper,
    Source,
    Take,
    listing,
    paper,
    test_files,
)
from lit_rag.data.prepare.files import atomic
from lit_rag.data.prepare.sampling import Plan, sample
from lit_rag.data.prepare.sources import Loaded, hint, load, resolve, wiki18_entry
from lit_rag.data.readers import write_litrag
from lit_rag.errors import CommandParser, InputError
from lit_rag.files import remove_stale_temps, sha256_file
from lit_rag.retrieval.corpus import pool_examples, write_corpus
from lit_rag.types import Example, Passage

USAGE = (
    "lit-rag data PAPER [--out DIR] [--source NAME=PATH ...] [--flashrag DIR] [--hub] "
    "[--seed 42] [--eval-only] | lit-rag data --list"
)
__all__ = [
    "ALIASES",
    "FLASHRAG_REPO",
    "PAPERS",
    "SOURCES",
    "DataFile",
    "Paper",
    "Source",
    "Take",
    "build_parser",
    "main",
    "paper",
    "prepare",
    "test_files",
]


# --------------------------------------------------------------------------- command line


#: ``lit-rag data --help``: the line ``lit-rag --help`` gives the command, then examples
DESCRIPTION = """\
Prepare a paper recipe's data sets from local or FlashRAG files.

  lit-rag data --list              the papers, the files each writes, the sources each reads
  lit-rag data search_r1 --flashrag FlashRAG_datasets/ --source wiki18=wiki-18.jsonl
  lit-rag data arena --source hotpotqa-train=hotpot_train_v1.1.json \\
      --source hotpotqa-dev=hotpot_dev_distractor_v1.json --source 2wiki-train=train.json ...

Samples each source as the paper describes, deterministically under --seed, and writes
lit-rag JSONL (train, val, test_<dataset>), a corpus where the paper needs one, and
manifest.json (sources, hashes, counts) to data/<paper>/."""


def build_parser() -> CommandParser:
    """The parser of ``lit-rag data``."""
    parser = CommandParser(
        "data", USAGE, description=DESCRIPTION, formatter_class=RawDescriptionHelpFormatter
    )
    aliases = ", ".join(f"{alias} for {name}" for alias, name in ALIASES.items())
    parser.add_argument(
        "paper", nargs="?", help=f"{', '.join(PAPERS)} (alias {aliases}); --list describes each"
    )
    parser.add_argument(
        "--list", action="store_true", help="list the papers, their files and sources"
    )
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="output folder (default: data/<paper>)"
    )
    parser.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a local source file, by the name --list gives it (repeatable)",
    )
    parser.add_argument(
        "--flashrag",
        default=None,
        metavar="DIR",
        help=f"a local copy of {FLASHRAG_REPO} (a Hugging Face dataset)",
    )
    parser.add_argument(
        "--hub",
        action="store_true",
        help="download from the Hub the FlashRAG sources not found locally",
    )
    parser.add_argument("--seed", type=int, default=42, help="sampling seed (default: 42)")
    parser.add_argument("--eval-only", action="store_true", help="write the test files only")
    return parser


def main(args: list[str]) -> None:
    """``lit-rag data``: see the module docstring."""
    parser = build_parser()
    options = parser.parse_args(args)
    if options.list:
        print(listing())
        return
    if options.paper is None:
        raise InputError(f"data: name a paper or pass --list (usage: {USAGE})")
    spec = paper(options.paper)
    out = Path(options.out) if options.out else Path("data") / spec.name
    given = parse_sources(options.source, spec)
    if options.flashrag is not None and not Path(options.flashrag).is_dir():
        raise InputError(f"data: --flashrag {options.flashrag}: not a folder")
    prepare(
        spec,
        out,
        given,
        flashrag=Path(options.flashrag) if options.flashrag else None,
        hub=options.hub,
        seed=options.seed,
        eval_only=options.eval_only,
        command=shlex.join(["lit-rag", "data", *args]),
        recipe=options.paper.replace("-", "_"),
    )


def parse_sources(values: list[str], spec: Paper) -> dict[str, Path]:
    """``--source NAME=PATH`` values as ``name -> path``; a known source this paper does not
    read is ignored with a line.

    Raises:
        InputError: A value without ``=``, an unknown name, a repeated name, a missing file.
    """
    given: dict[str, Path] = {}
    for value in values:
        name, eq, path = value.partition("=")
        name = name.strip()
        if not eq or not name or not path:
            raise InputError(f"data: --source expects NAME=PATH, got {value!r}")
        if name not in SOURCES:
            raise InputError(f"data: unknown source {name!r}; sources: {', '.join(SOURCES)}")
        if name in given:
            raise InputError(f"data: --source {name} is given twice")
        if not Path(path).is_file():
            raise InputError(f"data: --source {name}: file not found: {path}")
        if name not in spec.sources:
            print(f"lit-rag data: {spec.name} does not read {name}: ignored")
            continue
        given[name] = Path(path)
    return given


# --------------------------------------------------------------------------- the files


def prepare(
    spec: Paper,
    out: Path,
    given: dict[str, Path],
    flashrag: Path | None = None,
    hub: bool = False,
    seed: int = 42,
    eval_only: bool = False,
    command: str = "",
    recipe: str | None = None,
) -> dict:
    """Write ``spec``'s files into ``out`` and return the manifest (also ``out/manifest.json``).

    Raises:
        InputError: A train or val source is missing (not with ``eval_only``), a source cannot
            be read, or a file would be empty.
    """
    if out.exists() and not out.is_dir():
        raise InputError(f"data: --out {out} is a file, not a folder")
    files = [f for f in spec.files if f.role == "test" or not eval_only]
    loaded, absent = _load_sources(spec, files, given, flashrag, hub)
    plan = sample(spec, loaded, files, seed)
    _check_not_empty(plan, files)
    written = {name: rows for name, rows in plan.files.items() if rows}
    corpus: list[Passage] | None = None
    if spec.corpus:
        corpus, written = _pool(written)
    wiki = wiki18_entry(spec, given, flashrag) if spec.wiki18 else None
    if spec.wiki18 and wiki is None:
        absent["wiki18"] = hint("wiki18", spec)
    checksums = _write_files(out, written, corpus)
    manifest = _manifest(spec, command, seed, loaded, plan, written, checksums, absent, wiki)
    if corpus is not None:
        manifest["files"]["corpus.jsonl"] = {
            "records": len(corpus),
            "sha256": checksums["corpus.jsonl"],
            "sources": {"paragraphs": {"written": len(corpus), "section": spec.corpus}},
        }
    text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
    atomic(out / "manifest.json", lambda temp: temp.write_text(text, encoding="utf-8"))
    _report(spec, out, plan, manifest, absent, wiki, recipe or spec.name)
    return manifest


def _load_sources(
    spec: Paper, files: list[DataFile], given: dict[str, Path], flashrag: Path | None, hub: bool
) -> tuple[dict[str, Loaded], dict[str, str]]:
    """Every source ``files`` sample, read; and each absent one with how to give it.

    Raises:
        InputError: A source of a train file is absent.
    """
    required = [t.source for f in files if f.role == "train" for t in f.takes]
    loaded: dict[str, Loaded] = {}
    absent: dict[str, str] = {}
    for name in dict.fromkeys(t.source for f in files for t in f.takes):
        found = resolve(name, spec, given, flashrag, hub)
        if found is None:
            absent[name] = hint(name, spec)
        else:
            loaded[name] = load(name, *found, spec)
    missing = [n for n in dict.fromkeys(required) if n in absent]
    if missing:
        raise InputError(
            f"data: {spec.name} needs {', '.join(missing)}: "
            + "; ".join(absent[n] for n in missing)
            + " (or --eval-only: the test files alone)"
        )
    return loaded, absent


def _check_not_empty(plan: Plan, files: list[DataFile]) -> None:
    """Fail when a train or val file would be empty (a test file may be)."""
    for data_file in files:
        if data_file.role != "test" and not plan.files[data_file.name]:
            raise InputError(
                f"data: {data_file.name} would be empty: pass one of "
                f"{', '.join(t.source for t in data_file.takes)} with records that are not "
                "evaluation questions (or --eval-only)"
            )


def _write_files(
    out: Path, written: dict[str, list[Example]], corpus: list[Passage] | None
) -> dict[str, str]:
    """Each file (and the pooled corpus) into ``out``, atomically; their SHA-256 by name."""
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out)
    checksums = {
        name: atomic(out / name, lambda temp, rows=rows: write_litrag(rows, temp))
        for name, rows in written.items()
    }
    if corpus is not None:
        checksums["corpus.jsonl"] = atomic(
            out / "corpus.jsonl", lambda temp: write_corpus(corpus, temp)
        )
    return checksums


def _pool(files: dict[str, list[Example]]) -> tuple[list[Passage], dict[str, list[Example]]]:
    """The paragraphs of every question of every file as one corpus, and the files with their
    references and gold ids renamed to its ids (:func:`~lit_rag.retrieval.corpus.pool_examples`)."""
    every = [e for rows in files.values() for e in rows]
    passages, renamed = pool_examples(every)
    out, start = {}, 0
    for name, rows in files.items():
        out[name] = renamed[start : start + len(rows)]
        start += len(rows)
    return passages, out


def _manifest(spec, command, seed, loaded, plan, written, checksums, absent, wiki) -> dict:
    from lit_rag.version import build_version

    sources = {}
    for name, item in loaded.items():
        sources[name] = {
            "path": str(item.path.resolve()),
            "from": item.origin,
            "sha256": sha256_file(item.path),
            "records": len(item.examples),
        }
    if wiki is not None:
        sources["wiki18"] = wiki
    return {
        "paper": spec.name,
        "title": spec.title,
        "command": command,
        "seed": seed,
        "lit_rag_version": build_version(),
        "sources": sources,
        "files": {
            name: {
                "records": len(rows),
                "sha256": checksums[name],
                "sources": plan.composition[name],
            }
            for name, rows in written.items()
        },
        "absent": absent,
        "dropped_duplicates": plan.dropped,
        "notes": [*plan.lines, *spec.notes],
    }


def _report(spec, out, plan, manifest, absent, wiki, recipe) -> None:
    """The lines the command prints: shortfalls, absent sources, the table, what to run next."""
    for line in plan.lines:
        print(f"lit-rag data: {line}")
    for name, how in absent.items():
        print(f"lit-rag data: absent: {name} ({how})")
    for name, drops in plan.dropped.items():
        counts = ", ".join(f"{s} {n:,}" for s, n in drops.items())
        print(f"lit-rag data: {name}: dropped evaluation questions: {counts}")
    rows = [("file", "records", "sources")]
    for name, entry in manifest["files"].items():
        parts = ", ".join(f"{s} {p['written']:,}" for s, p in entry["sources"].items())
        rows.append((name, f"{entry['records']:,}", parts))
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    for row in rows:
        print(f"{row[0].ljust(width[0])}  {row[1].rjust(width[1])}  {row[2]}".rstrip())
    print(f"wrote {len(manifest['files'])} files and manifest.json to {out}")
    for i, step in enumerate(_next_steps(spec, out, manifest, wiki, recipe)):
        print(f"{'next:' if i == 0 else ''}".ljust(6) + step)


def _next_steps(
    spec: Paper, out: Path, manifest: dict, wiki: dict | None, recipe: str
) -> list[str]:
    """The commands to run next: build the index (where the paper retrieves), then train."""
    steps = []
    if spec.corpus:
        steps.append(spec.index.format(corpus=shlex.quote(str(out / "corpus.jsonl"))))
    elif spec.wiki18:
        steps.append(spec.index.format(corpus=shlex.quote(wiki["path"]) if wiki else "WIKI18"))
    if "train.jsonl" in manifest["files"]:
        default = Path("data") / spec.name
        data = ""
        if out != default:
            data = (
                f" --data.train={shlex.quote(str(out / 'train.jsonl'))}"
                f" --data.val={shlex.quote(str(out / 'val.jsonl'))}"
            )
        name = recipe if recipe in spec.recipes else spec.recipes[0]
        steps.append(f"lit-rag fit --config recipes/{name}.yaml{data}")
    return steps
