"""Dataset readers: every supported file format ends in a list of :class:`~lit_rag.types.Example`.

Formats (``read_examples(path, format=...)``):

- ``hotpotqa``: HotpotQA distractor setting, JSON list (official) or JSONL.
- ``2wiki``: 2WikiMultiHopQA, same ``context`` / ``supporting_facts`` shape plus ``evidences``.
- ``musique``: MuSiQue-Ans, ``paragraphs`` with ``is_supporting`` flags.
- ``flashrag``: FlashRAG QA JSONL (``id, question, golden_answers``); no references.
- ``litrag``: our own JSONL, written by :func:`write_litrag`; any reader's output round-trips.

Preprocessing follows ARENA Appendix B (after PIKE-RAG): references are the dataset's paragraphs
in their original order, and the gold reference ids are the paragraphs that hold a supporting
fact. A reference's id is its title; when a title repeats inside one example, later copies get
``" (2)"``, ``" (3)"``, ... appended to the id (the ``title`` field keeps the raw title).

Files are UTF-8, with or without a byte-order mark, with LF or CRLF line ends, read and checked
by :mod:`lit_rag.data.records`. Every example needs a question and an answer that are not empty
or only whitespace; a record without one is a :class:`DatasetFormatError` naming the file and
line (JSON list: item).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# lit_rag.retrieval.corpus imports _check_exists and _iter_records from here
from lit_rag.data.records import DatasetFormatError, Record
from lit_rag.data.records import check_exists as _check_exists
from lit_rag.data.records import iter_records as _iter_records
from lit_rag.types import Example, Passage

HOTPOTQA_FIELDS = ("_id", "question", "answer", "context", "supporting_facts")
TWOWIKI_FIELDS = ("_id", "question", "answer", "context", "supporting_facts")
MUSIQUE_FIELDS = ("id", "question", "answer", "paragraphs")
FLASHRAG_FIELDS = ("id", "question", "golden_answers")
LITRAG_FIELDS = ("id", "question", "answers")


# --------------------------------------------------------------------------- reading


def _read(
    path: str | Path,
    name: str,
    required: tuple[str, ...],
    convert: Callable[[Record], Example],
) -> list[Example]:
    """Read every record of ``path`` and convert it, naming the record in any error."""
    examples = []
    for where, record in _iter_records(path):
        examples.append(_convert_one(where, record, name, required, convert))
    return examples


def _convert_one(
    where: str,
    record: Record,
    name: str,
    required: tuple[str, ...],
    convert: Callable[[Record], Example],
) -> Example:
    for key in required:
        if key not in record:
            raise DatasetFormatError(
                f"{where}: missing field '{key}' (the {name} reader needs: {', '.join(required)})"
            )
    try:
        return convert(record)
    except DatasetFormatError as err:
        raise DatasetFormatError(f"{where}: {err}") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as err:
        raise DatasetFormatError(
            f"{where}: malformed {name} record ({type(err).__name__}: {err})"
        ) from None


# --------------------------------------------------------------------------- shared helpers

_SPACES = re.compile(r" {2,}")


def _join_sentences(sentences: Iterable[str]) -> str:
    """Join sentences with single spaces (HotpotQA sentences after the first start with one)."""
    return _SPACES.sub(" ", " ".join(sentences)).strip()


def _answers(values: Iterable[Any], field: str) -> list[str]:
    """Non-empty answer strings in their order, duplicates removed; non-strings via ``str()``."""
    answers: list[str] = []
    for value in values:
        if value is None:
            continue
        text = value.strip() if isinstance(value, str) else str(value)
        if text and text not in answers:
            answers.append(text)
    if not answers:
        raise DatasetFormatError(f"field '{field}' holds no non-empty answer")
    return answers


def _question(value: Any) -> str:
    """The question as text (``str()`` of a non-string); a null, empty or whitespace-only
    question is refused, as an empty answer list is."""
    text = "" if value is None else str(value)
    if not text.strip():
        raise DatasetFormatError(
            f"field 'question' is empty (got {'null' if value is None else repr(text)}); "
            "every example needs a question"
        )
    return text


def _unique_ids(titles: list[str]) -> list[str]:
    """Titles made unique: the 2nd, 3rd, ... copy of a title gets ``" (2)"``, ``" (3)"``, ..."""
    seen: dict[str, int] = {}
    used = set(titles)
    ids = []
    for title in titles:
        count = seen.get(title, 0) + 1
        seen[title] = count
        if count == 1:
            ids.append(title)
            continue
        candidate = f"{title} ({count})"
        while candidate in used:  # a real title already reads "X (2)"
            count += 1
            candidate = f"{title} ({count})"
        seen[title] = count
        used.add(candidate)
        ids.append(candidate)
    return ids


def _list_field(record: Record, key: str, shape: str) -> list[Any]:
    value = record[key]
    if not isinstance(value, list):
        raise DatasetFormatError(
            f"field '{key}' must be a list of {shape}, got {type(value).__name__}"
        )
    return value


# --------------------------------------------------------------------------- HotpotQA / 2Wiki


def _context_example(record: Record, meta_keys: tuple[str, ...]) -> Example:
    """Shared conversion for HotpotQA and 2WikiMultiHopQA (same context/supporting_facts)."""
    context = _list_field(record, "context", "[title, [sentences]] pairs")
    titles = [str(title) for title, _ in context]
    sentences = [list(sents) for _, sents in context]
    ids = _unique_ids(titles)
    references = [
        Passage(id=pid, title=title, text=_join_sentences(sents))
        for pid, title, sents in zip(ids, titles, sentences, strict=True)
    ]
    facts = _list_field(record, "supporting_facts", "[title, sentence index] pairs")
    gold_positions = {_fact_position(titles, sentences, fact) for fact in facts}
    gold_positions.discard(None)
    gold_ids = [ids[i] for i in sorted(gold_positions)]  # reference order, deduplicated
    meta = {key: record[key] for key in meta_keys if key in record}
    return Example(
        id=str(record["_id"]),
        question=_question(record["question"]).strip(),
        answers=_answers([record["answer"]], "answer"),
        references=references,
        gold_ids=gold_ids,
        meta=meta,
    )


def _fact_position(titles: list[str], sentences: list[list[str]], fact: list[Any]) -> int | None:
    """Index of the paragraph a supporting fact ``[title, sent_idx]`` points into.

    With a repeated title, the first paragraph long enough to hold ``sent_idx`` wins. A title
    absent from the context (a known quirk of some dumps) supports nothing and is skipped.
    """
    title, sent_idx = str(fact[0]), int(fact[1])
    candidates = [i for i, t in enumerate(titles) if t == title]
    for i in candidates:
        if sent_idx < len(sentences[i]):
            return i
    return candidates[0] if candidates else None


def read_hotpotqa(path: str | Path) -> list[Example]:
    """Read HotpotQA (distractor setting) from a JSON list or JSONL file.

    Args:
        path: File with ``_id, question, answer, supporting_facts, context`` records
            (``type`` and ``level`` go to ``meta`` when present).

    Returns:
        One :class:`Example` per record; references are the context paragraphs in their
        original order, gold ids the paragraphs named in ``supporting_facts``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DatasetFormatError: A record is not valid JSON or lacks a required field.
    """
    return _read(
        path, "hotpotqa", HOTPOTQA_FIELDS, lambda r: _context_example(r, ("type", "level"))
    )


def read_2wiki(path: str | Path) -> list[Example]:
    """Read 2WikiMultiHopQA from a JSON list or JSONL file.

    Args:
        path: File with ``_id, type, question, context, supporting_facts, evidences, answer``
            records; ``type`` and ``evidences`` go to ``meta``.

    Returns:
        One :class:`Example` per record (same reference/gold rules as :func:`read_hotpotqa`).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DatasetFormatError: A record is not valid JSON or lacks a required field.
    """
    return _read(
        path, "2wiki", TWOWIKI_FIELDS, lambda r: _context_example(r, ("type", "evidences"))
    )


# --------------------------------------------------------------------------- MuSiQue


def _musique_example(record: Record) -> Example:
    paragraphs = _list_field(record, "paragraphs", "{idx, title, paragraph_text} objects")
    paragraphs = sorted(paragraphs, key=lambda p: int(p.get("idx", 0)))  # already sorted upstream
    titles = [str(p["title"]) for p in paragraphs]
    ids = _unique_ids(titles)
    references = [
        Passage(id=pid, title=title, text=_SPACES.sub(" ", str(p["paragraph_text"])).strip())
        for pid, title, p in zip(ids, titles, paragraphs, strict=True)
    ]
    gold_ids = [pid for pid, p in zip(ids, paragraphs, strict=True) if p.get("is_supporting")]
    decomposition = record.get("question_decomposition") or []
    meta: dict[str, Any] = {"hops": len(decomposition)}
    if "answerable" in record:
        meta["answerable"] = record["answerable"]
    aliases = record.get("answer_aliases") or []
    return Example(
        id=str(record["id"]),
        question=_question(record["question"]).strip(),
        answers=_answers([record["answer"], *aliases], "answer"),
        references=references,
        gold_ids=gold_ids,
        meta=meta,
    )


def read_musique(path: str | Path) -> list[Example]:
    """Read MuSiQue (-Ans) from a JSON list or JSONL file.

    Args:
        path: File with ``id, paragraphs, question, question_decomposition, answer,
            answer_aliases, answerable`` records.

    Returns:
        One :class:`Example` per record: answers are ``[answer] + answer_aliases`` (duplicates
        removed, order kept), gold ids the paragraphs with ``is_supporting`` true, ``meta``
        holds ``answerable`` and ``hops`` (``len(question_decomposition)``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DatasetFormatError: A record is not valid JSON or lacks a required field.
    """
    return _read(path, "musique", MUSIQUE_FIELDS, _musique_example)


# --------------------------------------------------------------------------- FlashRAG


def _flashrag_example(record: Record) -> Example:
    golden = record["golden_answers"]
    golden = golden if isinstance(golden, list) else [golden]
    metadata = record.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise DatasetFormatError(
            f"field 'metadata' must be an object, got {type(metadata).__name__}"
        )
    return Example(
        id=str(record["id"]),
        question=_question(record["question"]).strip(),
        answers=_answers(golden, "golden_answers"),
        meta=dict(metadata),
    )


def read_flashrag(path: str | Path) -> list[Example]:
    """Read a FlashRAG QA file (``id, question, golden_answers``; optional ``metadata``).

    Args:
        path: JSONL (or JSON list) file in the FlashRAG benchmark layout.

    Returns:
        One :class:`Example` per record with no references (retrieval methods search a corpus).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DatasetFormatError: A record is not valid JSON or lacks a required field.
    """
    return _read(path, "flashrag", FLASHRAG_FIELDS, _flashrag_example)


# --------------------------------------------------------------------------- lit-rag JSONL


def _litrag_example(record: Record) -> Example:
    references = []
    for ref in record.get("references") or []:
        if not isinstance(ref, dict) or "id" not in ref or "text" not in ref:
            raise DatasetFormatError(
                "each item of 'references' needs 'id' and 'text' (and 'title')"
            )
        title = str(ref.get("title", ""))
        references.append(Passage(id=str(ref["id"]), title=title, text=str(ref["text"])))
    ref_ids = [ref.id for ref in references]
    if len(set(ref_ids)) != len(ref_ids):
        raise DatasetFormatError("reference ids must be unique within an example")
    gold_ids = [str(g) for g in record.get("gold_ids") or []]
    if references and not set(gold_ids) <= set(ref_ids):
        missing = sorted(set(gold_ids) - set(ref_ids))
        raise DatasetFormatError(f"gold_ids {missing} are not ids of this example's references")
    meta = record.get("meta") or {}
    if not isinstance(meta, dict):
        raise DatasetFormatError(f"field 'meta' must be an object, got {type(meta).__name__}")
    answers = record["answers"]
    return Example(
        id=str(record["id"]),
        question=_question(record["question"]),
        answers=_answers(answers if isinstance(answers, list) else [answers], "answers"),
        references=references,
        gold_ids=gold_ids,
        meta=dict(meta),
    )


def read_litrag(path: str | Path) -> list[Example]:
    """Read lit-rag's own JSONL format (the output of :func:`write_litrag`).

    Args:
        path: JSONL with ``id, question, answers`` and optional ``references`` (a list of
            ``{id, title, text}``), ``gold_ids`` and ``meta``.

    Returns:
        The examples, exactly as they were written.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DatasetFormatError: A record is not valid JSON, lacks a required field, or names a
            gold id that is not one of its references.
    """
    return _read(path, "litrag", LITRAG_FIELDS, _litrag_example)


def example_to_record(example: Example) -> Record:
    """The lit-rag JSON record of one example (what :func:`write_litrag` writes per line)."""
    return {
        "id": example.id,
        "question": example.question,
        "answers": list(example.answers),
        "references": [{"id": p.id, "title": p.title, "text": p.text} for p in example.references],
        "gold_ids": list(example.gold_ids),
        "meta": example.meta,
    }


def write_litrag(examples: Iterable[Example], path: str | Path) -> Path:
    """Write examples as lit-rag JSONL, one record a line; :func:`read_litrag` reads them back.

    ``meta`` must be JSON-serializable (tuples come back as lists).

    Args:
        examples: Examples from any reader or the synthetic world.
        path: Output file; parent folders are created.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for example in examples:
            handle.write(json.dumps(example_to_record(example), ensure_ascii=False) + "\n")
    return path


# --------------------------------------------------------------------------- dispatch

READERS: dict[str, Callable[[str | Path], list[Example]]] = {
    "hotpotqa": read_hotpotqa,
    "2wiki": read_2wiki,
    "musique": read_musique,
    "flashrag": read_flashrag,
    "litrag": read_litrag,
}
FORMATS = ("auto", *READERS)


def detect_format(path: str | Path) -> str:
    """Guess a file's format from the keys of its first record.

    ``supporting_facts`` + ``evidences`` -> ``2wiki``; ``supporting_facts`` -> ``hotpotqa``;
    ``paragraphs`` -> ``musique``; ``golden_answers`` -> ``flashrag``; ``answers`` -> ``litrag``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DatasetFormatError: The file is empty or its first record matches no format.
    """
    for where, record in _iter_records(path):
        keys = set(record)
        if "supporting_facts" in keys:
            return "2wiki" if "evidences" in keys else "hotpotqa"
        for key, name in (
            ("paragraphs", "musique"),
            ("golden_answers", "flashrag"),
            ("answers", "litrag"),
        ):
            if key in keys:
                return name
        raise DatasetFormatError(
            f"{where}: cannot detect the format from keys {sorted(keys)}; pass format= one of "
            f"{', '.join(READERS)}"
        )
    raise DatasetFormatError(f"{path}: cannot detect the format of an empty file")


def read_examples(path: str | Path, format: str = "auto") -> list[Example]:
    """Read any supported dataset file into examples.

    Args:
        path: The dataset file.
        format: One of ``auto``, ``hotpotqa``, ``2wiki``, ``musique``, ``flashrag``,
            ``litrag``; ``auto`` detects it from the first record (:func:`detect_format`).

    Returns:
        The examples, in file order.

    Raises:
        ValueError: ``format`` is not a known name.
        FileNotFoundError: ``path`` does not exist.
        DatasetFormatError: The file does not match the format.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown dataset format '{format}'; allowed: {', '.join(FORMATS)}")
    _check_exists(Path(path))
    if format == "auto":
        try:
            format = detect_format(path)
        except DatasetFormatError as err:
            if "empty file" in str(err):
                return []
            raise
    return READERS[format](path)
