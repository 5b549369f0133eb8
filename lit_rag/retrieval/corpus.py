"""Retrieval corpora: every supported file format ends in a list of :class:`~lit_rag.types.Passage`.

Formats (``read_corpus(path, format=...)``):

- ``flashrag``: FlashRAG corpus JSONL, ``{"id", "contents"}`` where ``contents`` is
  ``'"Title"\\ntext'`` (split at the first newline, quotes around the title stripped).
- ``litrag``: our own corpus JSONL, ``{"id", "title", "text"}``, written by :func:`write_corpus`.
- ``hotpotqa``, ``2wiki``, ``musique``: the pooled reference paragraphs of every example of a
  QA file (read with :mod:`lit_rag.data.readers`), one passage per distinct paragraph; its id is
  its title (``"Title (2)"`` for a second paragraph under one title, as MuSiQue has).
  :func:`pool_examples` renames the examples' references and ``gold_ids`` to those ids.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from lit_rag.data.readers import (
    DatasetFormatError,
    Record,
    _check_exists,
    _iter_records,
    detect_format,
    read_2wiki,
    read_hotpotqa,
    read_musique,
)
from lit_rag.errors import InputError
from lit_rag.types import Example, Passage

CORPUS_FORMATS = ("auto", "flashrag", "litrag", "hotpotqa", "2wiki", "musique")
_POOLED: dict[str, Callable[[str | Path], list[Example]]] = {
    "hotpotqa": read_hotpotqa,
    "2wiki": read_2wiki,
    "musique": read_musique,
}


def _field(where: str, record: Record, key: str, fmt: str, needs: str) -> str:
    """The string value of ``record[key]``; a missing or non-scalar value names file:line."""
    if key not in record:
        raise DatasetFormatError(
            f"{where}: missing field '{key}' (a {fmt} corpus row needs: {needs})"
        )
    value = record[key]
    if isinstance(value, (dict, list)) or value is None:
        raise DatasetFormatError(
            f"{where}: field '{key}' must be a string, got {type(value).__name__}"
        )
    return str(value)


def split_contents(contents: str) -> tuple[str, str]:
    """FlashRAG ``contents`` -> ``(title, text)``: split at the first newline, unquote the title.

    >>> split_contents('"Evan Morris"\\nEvan Morris Evan L. Morris (1977-2015) ...')
    ('Evan Morris', 'Evan Morris Evan L. Morris (1977-2015) ...')
    """
    if "\n" not in contents:
        return "", contents.strip()
    title, text = contents.split("\n", 1)
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title.strip(), text.strip()


def join_contents(title: str, text: str) -> str:
    """``(title, text)`` -> FlashRAG / Search-R1 ``contents`` (``"Title"`` line, then the text);
    :func:`split_contents` reads it back.

    >>> join_contents("Evan Morris", "Evan L. Morris was a lobbyist.")
    '"Evan Morris"\\nEvan L. Morris was a lobbyist.'
    """
    return f'"{title}"\n{text}'


def _read_rows(path: str | Path, fmt: str) -> list[Passage]:
    """Read a one-passage-a-row corpus (``flashrag`` or ``litrag``); ids must be unique."""
    passages: list[Passage] = []
    first_seen: dict[str, str] = {}
    for where, record in _iter_records(path):
        if fmt == "flashrag":
            pid = _field(where, record, "id", fmt, "id, contents")
            title, text = split_contents(_field(where, record, "contents", fmt, "id, contents"))
        else:
            pid = _field(where, record, "id", fmt, "id, title, text")
            title = str(record.get("title") or "")
            text = _field(where, record, "text", fmt, "id, title, text")
        if pid in first_seen:
            raise DatasetFormatError(
                f"{where}: duplicate passage id '{pid}' (first at {first_seen[pid]}); "
                "corpus ids must be unique"
            )
        first_seen[pid] = where
        passages.append(Passage(id=pid, title=title, text=text))
    return passages


def pooled_ids(examples: Iterable[Example]) -> dict[tuple[str, str], str]:
    """The corpus id of every distinct ``(title, text)`` among ``examples``' references.

    A title's first text is the passage ``title``; a different text under the same title (MuSiQue
    gives one title to several paragraphs) is ``"Title (2)"``, ``"Title (3)"``, ..., skipping
    suffixed ids that are real titles. Order of first appearance.
    """
    examples = list(examples)
    titles = {ref.title for example in examples for ref in example.references}
    ids: dict[tuple[str, str], str] = {}
    counts: dict[str, int] = {}
    for example in examples:
        for ref in example.references:
            if (ref.title, ref.text) in ids:
                continue
            count = counts.get(ref.title, 0) + 1
            pid = ref.title if count == 1 else f"{ref.title} ({count})"
            while count > 1 and pid in titles:  # a real title already reads "X (2)"
                count += 1
                pid = f"{ref.title} ({count})"
            counts[ref.title] = count
            ids[(ref.title, ref.text)] = pid
    return ids


def pool_references(examples: Iterable[Example]) -> list[Passage]:
    """The reference paragraphs of ``examples`` as one corpus, one passage per distinct text.

    The id is the title (``"Title (2)"`` for a second text under one title, :func:`pooled_ids`),
    e.g. two examples both citing the same ``"Paris"`` paragraph give one passage
    ``Passage("Paris", "Paris", text)``.
    """
    return _passages(pooled_ids(examples))


def _passages(ids: dict[tuple[str, str], str]) -> list[Passage]:
    return [Passage(pid, title, text) for (title, text), pid in ids.items()]


def pool_examples(examples: Iterable[Example]) -> tuple[list[Passage], list[Example]]:
    """:func:`pool_references`, and ``examples`` with references and gold ids renamed to it.

    A retrieval method scores what it retrieves against ``gold_ids``, so its data must name
    gold paragraphs by their corpus ids; a reader's per-example ``"Title (2)"`` need not be the
    corpus's ``"Title (2)"``. References that pool into one passage are kept once.
    """
    examples = list(examples)
    ids = pooled_ids(examples)
    renamed: list[Example] = []
    for example in examples:
        to_corpus: dict[str, str] = {}  # the example's reference id -> corpus id
        references: dict[str, Passage] = {}
        for ref in example.references:
            pid = to_corpus[ref.id] = ids[(ref.title, ref.text)]
            references.setdefault(pid, Passage(pid, ref.title, ref.text))
        gold = list(dict.fromkeys(to_corpus.get(g, g) for g in example.gold_ids))
        renamed.append(replace(example, references=list(references.values()), gold_ids=gold))
    return _passages(ids), renamed


def corpus_ids(
    passages: Iterable[Passage], wanted: set[tuple[str, str]] | None = None
) -> dict[tuple[str, str], str]:
    """``(title, text) -> id`` of a corpus (the first id when a text repeats); with ``wanted``,
    only those keys (an index of millions of passages need not be mapped whole)."""
    ids: dict[tuple[str, str], str] = {}
    for passage in passages:
        key = (passage.title, passage.text)
        if wanted is None or key in wanted:
            ids.setdefault(key, passage.id)
    return ids


def pooled_gold_ids(example: Example, ids: dict[tuple[str, str], str] | None = None) -> list[str]:
    """The ids, in a corpus, of an example's gold references.

    With ``ids`` (:func:`corpus_ids` of the corpus) a gold reference is found by its title and
    text. Without it, or when its text is not in the corpus, by its title: a reader's
    ``"Title (2)"`` maps to ``"Title"`` (other ids, e.g. ``w12``, stay as they are).
    """
    refs = {ref.id: ref for ref in example.references}
    out: list[str] = []
    for gold in example.gold_ids:
        ref = refs.get(gold)
        if ref is None:
            pooled = gold
        elif ids is not None and (ref.title, ref.text) in ids:
            pooled = ids[(ref.title, ref.text)]
        else:
            pooled = ref.title if gold.startswith(f"{ref.title} (") else gold
        if pooled not in out:
            out.append(pooled)
    return out


def detect_corpus_format(path: str | Path) -> str:
    """Guess a corpus file's format from the keys of its first record.

    ``contents`` -> ``flashrag``; ``text`` (and no ``question``) -> ``litrag``; otherwise the
    QA-file detection of :func:`lit_rag.data.readers.detect_format` (``hotpotqa``, ``2wiki``,
    ``musique``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DatasetFormatError: The file is empty or is a QA file without paragraphs.
    """
    for where, record in _iter_records(path):
        if "contents" in record:
            return "flashrag"
        if "text" in record and "question" not in record:
            return "litrag"
        fmt = detect_format(path)
        if fmt not in _POOLED:
            raise DatasetFormatError(
                f"{where}: a '{fmt}' QA file has no paragraphs to pool into a corpus; "
                f"corpus formats: {', '.join(CORPUS_FORMATS[1:])}"
            )
        return fmt
    raise DatasetFormatError(f"{path}: cannot detect the corpus format of an empty file")


def read_corpus(path: str | Path, format: str = "auto") -> list[Passage]:
    """Read a retrieval corpus.

    Args:
        path: The corpus file (JSONL or a JSON list), or ``synthetic`` / ``synthetic:SEED`` for
            the bundled synthetic world's corpus (the world ``QADataModule`` draws its
            ``synthetic`` questions from, with ``synthetic_seed`` = SEED, default 0).
        format: One of ``auto``, ``flashrag``, ``litrag``, ``hotpotqa``, ``2wiki``,
            ``musique``; ``auto`` detects it from the first record.

    Returns:
        The passages in file order (pooled formats: order of first appearance).

    Raises:
        InputError: ``format`` is not a known name (an ``InputError`` is a ``ValueError``).
        FileNotFoundError: ``path`` does not exist.
        DatasetFormatError: A row is malformed (message names ``file:line`` and the field).
    """
    if format not in CORPUS_FORMATS:
        raise InputError(f"unknown corpus format '{format}'; allowed: {', '.join(CORPUS_FORMATS)}")
    spec = str(path)
    if spec == "synthetic" or spec.startswith("synthetic:"):
        return _synthetic_corpus(spec)
    _check_exists(Path(path))
    if format == "auto":
        format = detect_corpus_format(path)
    if format in _POOLED:
        return pool_references(_POOLED[format](path))
    return _read_rows(path, format)


def _synthetic_corpus(spec: str) -> list[Passage]:
    from lit_rag.data.synthetic import SyntheticWorld

    _, _, seed = spec.partition(":")
    try:
        value = int(seed) if seed else 0
    except ValueError:
        raise InputError(
            f"corpus '{spec}': the synthetic world seed must be an integer (synthetic:SEED)"
        ) from None
    return SyntheticWorld(seed=value).corpus()


def write_corpus(passages: Iterable[Passage], path: str | Path) -> Path:
    """Write passages as lit-rag corpus JSONL (``{"id", "title", "text"}`` a line).

    Args:
        passages: The corpus.
        path: Output file; parent folders are created.

    Returns:
        The path written; ``read_corpus(path)`` gives the passages back.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for p in passages:
            row = {"id": p.id, "title": p.title, "text": p.text}
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def corpus_fingerprint(passages: Iterable[Passage]) -> str:
    """SHA-256 (hex) over every passage's id, title and text, in order.

    Each passage contributes ``json.dumps([id, title, text]) + "\\n"``, so no two different
    corpora share the byte stream (JSON quoting keeps field boundaries unambiguous). The value
    is stable across runs, machines and Python versions.
    """
    digest = hashlib.sha256()
    for p in passages:
        digest.update(json.dumps([p.id, p.title, p.text], ensure_ascii=True).encode("ascii"))
        digest.update(b"\n")
    return digest.hexdigest()
