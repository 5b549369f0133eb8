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
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shlex
from argparse import RawDescriptionHelpFormatter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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
from lit_rag.data.readers import read_examples, write_litrag
from lit_rag.errors import CommandParser, DiskFullError, InputError
from lit_rag.retrieval.corpus import detect_corpus_format, pool_examples, write_corpus
from lit_rag.types import Example, Passage

USAGE = (
    "lit-rag data PAPER [--out DIR] [--source NAME=PATH ...] [--flashrag DIR] [--hub] "
    "[--seed 42] [--eval-only] | lit-rag data --list"
)
__all__ = [
    "ALIASES", "FLASHRAG_REPO", "PAPERS", "SOURCES", "DataFile", "Paper", "Source", "Take",
    "build_parser", "main", "paper", "prepare", "test_files",
]  # fmt: skip


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


# --------------------------------------------------------------------------- sources


@dataclass
class _Loaded:
    path: Path
    origin: str  # --source, --flashrag or --hub
    examples: list[Example] = field(default_factory=list)


def _hint(name: str, spec: Paper) -> str:
    src = SOURCES[name]
    if name in spec.paragraphs or name == "wiki18":
        return f"pass --source {name}=PATH ({src.original})"
    return f"pass --source {name}=PATH, --flashrag DIR (with {src.flashrag}) or --hub"


def resolve(name: str, spec: Paper, given: dict[str, Path], flashrag: Path | None, hub: bool):
    """Where source ``name`` is read from, and how it was found; None when it is absent.

    Raises:
        InputError: ``--hub`` could not import huggingface_hub or download the file.
    """
    if name in given:
        return given[name], "--source"
    if name in spec.paragraphs:  # lit-rag reads FlashRAG's QA layout without paragraphs
        return None
    candidate = flashrag / SOURCES[name].flashrag if flashrag else None
    if candidate is not None and candidate.is_file():
        return candidate, "--flashrag"
    if hub and name != "wiki18":  # wiki18 is a zip of ~21M passages: fetched by hand
        return _download(name, spec), "--hub"
    return None


def _download(name: str, spec: Paper) -> Path:
    """FlashRAG's file for ``name``, from the Hub's cache (huggingface_hub, imported here)."""
    filename = SOURCES[name].flashrag
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise InputError(
            f"data: --hub needs huggingface_hub for {name}; {_hint(name, spec)}"
        ) from None
    try:
        return Path(hf_hub_download(repo_id=FLASHRAG_REPO, repo_type="dataset", filename=filename))
    except Exception as exc:  # offline, not found, ...: the user can still pass the file
        reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise InputError(
            f"data: --hub could not download {FLASHRAG_REPO}/{filename} for {name} ({reason}); "
            f"pass --source {name}=PATH or --flashrag DIR"
        ) from None


def load(name: str, path: Path, origin: str, spec: Paper) -> _Loaded:
    """Read source ``name``: ids ``<source>/<id>``, ``meta`` with ``source`` and ``dataset``.

    Raises:
        InputError: A file this paper needs paragraphs from holds none (FlashRAG's layout).
    """
    src = SOURCES[name]
    examples = read_examples(path)
    if name in spec.paragraphs and examples and not any(e.references for e in examples):
        raise InputError(
            f"data: {name} ({path}) has no paragraphs; {spec.name} needs the original layout: "
            f"{_hint(name, spec)}"
        )
    seen: dict[str, int] = {}
    out = []
    for example in examples:
        base = f"{name}/{example.id}"
        seen[base] = seen.get(base, 0) + 1
        question = example.question.strip()
        if spec.question_mark and not question.endswith("?"):
            # Search-R1 scripts/data_process/qa_search_train_merge.py (and _test_merge.py):
            # "if example['question'][-1] != '?': example['question'] += '?'"
            question += "?"
        keep = name in spec.paragraphs  # a search agent retrieves; given paragraphs go unused
        out.append(
            replace(
                example,
                id=base if seen[base] == 1 else f"{base}#{seen[base]}",
                question=question,
                references=list(example.references) if keep else [],
                gold_ids=list(example.gold_ids) if keep else [],
                meta={
                    **example.meta,
                    "source": name,
                    "dataset": src.dataset,
                    "source_id": example.id,
                },
            )
        )
    return _Loaded(path, origin, out)


# --------------------------------------------------------------------------- sampling

_PUNCT = re.compile(r"[^\w\s]")


def question_key(question: str) -> str:
    """A question as duplicates are found: lower case, punctuation gone, spaces collapsed.

    >>> question_key("Who wrote  'Hamlet'?")
    'who wrote hamlet'
    """
    return " ".join(_PUNCT.sub(" ", question.lower()).split())


def _keys(example: Example) -> tuple[tuple[str, str], str]:
    return (example.meta["dataset"], str(example.meta["source_id"])), question_key(example.question)


@dataclass
class _Plan:
    """What sampling produced: each file's examples and composition, and what it noticed."""

    files: dict[str, list[Example]] = field(default_factory=dict)
    composition: dict[str, dict[str, dict]] = field(default_factory=dict)
    dropped: dict[str, dict[str, int]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


def sample(spec: Paper, loaded: dict[str, _Loaded], files: list[DataFile], seed: int) -> _Plan:
    """Each file's examples: test files first, then val, then train (see the module docstring)."""
    plan = _Plan()
    cursor: dict[str, int] = {}
    orders = {
        name: _permutation(len(item.examples), f"{seed}/{spec.name}/{name}")
        for name, item in loaded.items()
    }
    held: tuple[set, set] = (set(), set())  # evaluation (dataset, id) keys, question keys
    tested = {t.source for f in files if f.role == "test" for t in f.takes}
    sharing, demand = _demand(files)
    for data_file in sorted(files, key=lambda f: ("test", "val", "train").index(f.role)):
        rows: list[Example] = []
        parts: dict[str, dict] = {}
        for take in data_file.takes:
            if take.source not in loaded:
                continue
            pool = loaded[take.source].examples
            # train never holds an evaluation question, nor does a validation sample drawn from
            # a training split (EVO-RAG's and Search-R1's validation questions are test ones)
            exclude = data_file.role == "train" or take.source not in tested
            if take.count is None:
                chosen = [e for e in pool if not (exclude and _held(e, held))]
                skipped = len(pool) - len(chosen)
            else:
                # a source smaller than what its samples ask for together is shared in
                # proportion to their counts (each gets at least one record)
                quota = take.count
                if len(pool) < demand[take.source]:
                    quota = max(1, take.count * len(pool) // demand[take.source])
                chosen, skipped = _draw(
                    take, quota, pool, orders[take.source], cursor, held, exclude
                )
                if len(chosen) < take.count:
                    others = [n for n in sharing[take.source] if n != data_file.name]
                    plan.lines.append(
                        _short(take, data_file, len(pool), len(chosen), others, skipped)
                    )
            if exclude and skipped:
                plan.dropped.setdefault(data_file.name, {})[take.source] = skipped
            rows += chosen
            parts[take.source] = {
                "requested": "all" if take.count is None else take.count,
                "written": len(chosen),
                "section": take.cite,
            }
        if data_file.shuffle:
            random.Random(f"{seed}/{spec.name}/{data_file.name}").shuffle(rows)
        if data_file.role != "train":
            for example in rows:
                ident, text = _keys(example)
                held[0].add(ident)
                held[1].add(text)
        plan.files[data_file.name] = rows
        plan.composition[data_file.name] = parts
    return plan


def _demand(files: list[DataFile]) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Per source, the files that sample it and the records they ask for together."""
    sharing: dict[str, list[str]] = {}
    demand: dict[str, int] = {}
    for data_file in files:
        for take in data_file.takes:
            if take.count is not None:
                sharing.setdefault(take.source, []).append(data_file.name)
                demand[take.source] = demand.get(take.source, 0) + take.count
    return sharing, demand


def _permutation(n: int, key: str) -> list[int]:
    order = list(range(n))
    random.Random(key).shuffle(order)
    return order


def _held(example: Example, held: tuple[set, set]) -> bool:
    ident, text = _keys(example)
    return ident in held[0] or text in held[1]


def _draw(take: Take, quota: int, pool, order, cursor, held, exclude) -> tuple[list, int]:
    """Up to ``quota`` records from the source's permutation, from where the last take of it
    stopped; with ``exclude``, evaluation questions are passed over (and counted)."""
    chosen: list[Example] = []
    skipped = 0
    has_level = take.hard and any("level" in e.meta for e in pool)
    i = cursor.get(take.source, 0)
    while i < len(order) and len(chosen) < quota:
        example = pool[order[i]]
        i += 1
        if has_level and example.meta.get("level") != "hard":
            continue
        if exclude and _held(example, held):
            skipped += 1
            continue
        chosen.append(example)
    cursor[take.source] = i
    return chosen, skipped


def _short(
    take: Take, data_file: DataFile, total: int, got: int, others: list[str], skipped: int
) -> str:
    """The line for a source smaller than its count: ``lit-rag data: hotpotqa-train has 100
    records, the paper samples 10,000: took 100``."""
    who = f"{data_file.name} samples" if take.ours else "the paper samples"
    notes = [f"shared with {', '.join(others)}"] if others else []
    if skipped:
        notes.append(f"{skipped:,} passed over as evaluation questions")
    if take.hard:
        notes.append("hard-level records only, where the records carry a level")
    extra = f" ({'; '.join(notes)})" if notes else ""
    return f"{take.source} has {total:,} records{extra}, {who} {take.count:,}: took {got:,}"


# --------------------------------------------------------------------------- writing


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
    required = [t.source for f in files if f.role == "train" for t in f.takes]
    loaded: dict[str, _Loaded] = {}
    absent: dict[str, str] = {}
    for name in dict.fromkeys(t.source for f in files for t in f.takes):
        found = resolve(name, spec, given, flashrag, hub)
        if found is None:
            absent[name] = _hint(name, spec)
        else:
            loaded[name] = load(name, *found, spec)
    missing = [n for n in dict.fromkeys(required) if n in absent]
    if missing:
        raise InputError(
            f"data: {spec.name} needs {', '.join(missing)}: "
            + "; ".join(absent[n] for n in missing)
            + " (or --eval-only: the test files alone)"
        )
    plan = sample(spec, loaded, files, seed)
    for data_file in files:
        if data_file.role != "test" and not plan.files[data_file.name]:
            raise InputError(
                f"data: {data_file.name} would be empty: pass one of "
                f"{', '.join(t.source for t in data_file.takes)} with records that are not "
                "evaluation questions (or --eval-only)"
            )
    written = {name: rows for name, rows in plan.files.items() if rows}
    corpus: list[Passage] | None = None
    if spec.corpus:
        corpus, written = _pool(written)
    wiki = _wiki18(spec, given, flashrag) if spec.wiki18 else None
    if spec.wiki18 and wiki is None:
        absent["wiki18"] = _hint("wiki18", spec)
    out.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(out)
    checksums = {
        name: _atomic(out / name, lambda temp, rows=rows: write_litrag(rows, temp))
        for name, rows in written.items()
    }
    if corpus is not None:
        checksums["corpus.jsonl"] = _atomic(
            out / "corpus.jsonl", lambda temp: write_corpus(corpus, temp)
        )
    manifest = _manifest(spec, command, seed, loaded, plan, written, checksums, absent, wiki)
    if corpus is not None:
        manifest["files"]["corpus.jsonl"] = {
            "records": len(corpus), "sha256": checksums["corpus.jsonl"],
            "sources": {"paragraphs": {"written": len(corpus), "section": spec.corpus}},
        }  # fmt: skip
    text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
    _atomic(out / "manifest.json", lambda temp: temp.write_text(text, encoding="utf-8"))
    _report(spec, out, plan, manifest, absent, wiki, recipe or spec.name)
    return manifest


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


def _wiki18(spec: Paper, given: dict[str, Path], flashrag: Path | None) -> dict | None:
    """The wiki18 corpus's path, format, SHA-256 and passage count (it is not copied)."""
    found = resolve("wiki18", spec, given, flashrag, hub=False)
    if found is None:
        return None
    path, origin = found
    fmt = detect_corpus_format(path)
    if fmt not in ("flashrag", "litrag"):
        raise InputError(f"data: wiki18 ({path}) is a {fmt} QA file, not a corpus (id, contents)")
    if path.stat().st_size > 1 << 30:
        print(f"lit-rag data: hashing wiki18 ({path.stat().st_size / 2**30:.1f} GiB) ...")
    digest, lines = _sha256(path, count_lines=True)
    return {
        "path": str(path.resolve()),
        "from": origin,
        "format": fmt,
        "sha256": digest,
        "records": lines,
    }


def _sha256(path: Path, count_lines: bool = False) -> tuple[str, int]:
    digest, lines = hashlib.sha256(), 0
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            if count_lines:
                lines += chunk.count(b"\n")
    return digest.hexdigest(), lines


def _remove_stale_temps(out: Path) -> None:
    """Remove the temporary files of runs killed mid-write (their process is gone)."""
    for stale in out.glob(".*.tmp-*"):
        pid = stale.name.rpartition("-")[2]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            stale.unlink(missing_ok=True)
        except OSError:  # alive under another user: not ours to remove
            pass


def _atomic(path: Path, write: Callable[[Path], object]) -> str:
    """``write(temp)`` a temporary file beside ``path``, then rename it onto ``path`` (a cut run
    leaves the old file or none, never half of one); the SHA-256 of what was written.

    Raises:
        DiskFullError: The filesystem is full (the temporary file is removed).
    """
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(temp)
        with temp.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException as exc:
        temp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"data: disk full while writing {path}; free space or pass --out")
        raise
    return _sha256(path)[0]


def _manifest(spec, command, seed, loaded, plan, written, checksums, absent, wiki) -> dict:
    from lit_rag import __version__

    sources = {}
    for name, item in loaded.items():
        sources[name] = {
            "path": str(item.path.resolve()),
            "from": item.origin,
            "sha256": _sha256(item.path)[0],
            "records": len(item.examples),
        }
    if wiki is not None:
        sources["wiki18"] = wiki
    return {
        "paper": spec.name,
        "title": spec.title,
        "command": command,
        "seed": seed,
        "lit_rag_version": __version__,
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
    for name, hint in absent.items():
        print(f"lit-rag data: absent: {name} ({hint})")
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
    steps = []
    if spec.corpus:
        steps.append(spec.index.format(corpus=shlex.quote(str(out / "corpus.jsonl"))))
    elif spec.wiki18:
        steps.append(spec.index.format(corpus=shlex.quote(wiki["path"]) if wiki else "WIKI18"))
    if "train.jsonl" in manifest["files"]:
        default = Path("data") / spec.name
        data = "" if out == default else (
            f" --data.train={shlex.quote(str(out / 'train.jsonl'))}"
            f" --data.val={shlex.quote(str(out / 'val.jsonl'))}"
        )  # fmt: skip
        name = recipe if recipe in spec.recipes else spec.recipes[0]
        steps.append(f"lit-rag fit --config recipes/{name}.yaml{data}")
    for i, step in enumerate(steps):
        print(f"{'next:' if i == 0 else ''}".ljust(6) + step)
