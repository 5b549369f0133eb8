"""The manifest every index folder carries (``manifest.json``), and the checks made on load.

It records how the index was built: retriever kind, encoder (dense retrievers), corpus
fingerprint (:func:`lit_rag.retrieval.corpus.corpus_fingerprint`), passage count, build
settings, the lit-rag version, and the size (and, for files up to :data:`HASH_LIMIT`, the
SHA-256) of each file the index reads. Loading an index checks it against what the recipe
expects (:meth:`Manifest.check`) and its files against the manifest (:meth:`Manifest.check_files`,
:meth:`Manifest.read_passages`), so a stale index, a passages file from another corpus or a
truncated file fails with one line instead of silently returning passages from another corpus.

An index folder is data: nothing read from it chooses what gets imported. The retriever kind
it names is looked up among the registered retrievers only (:func:`lit_rag.registry.load`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lit_rag.errors import InputError, first_non_utf8
from lit_rag.version import build_version

if TYPE_CHECKING:  # lit_rag.types imports torch; the manifest alone does not need it
    from lit_rag.types import Passage

MANIFEST_NAME = "manifest.json"
#: the passages of an index, one ``{"id", "title", "text"}`` JSON object a line
PASSAGES_NAME = "passages.jsonl"
#: files up to this size get a SHA-256 in the manifest (hashed again on load); larger ones
#: only their byte size, so opening a Wikipedia-scale index does not read every byte twice
HASH_LIMIT = 64 * 2**20
#: the advice ending every message about a damaged or mismatched index
REBUILD = "rebuild the index (lit-rag index build)"


class IndexNotFoundError(FileNotFoundError):
    """The index folder, or the manifest inside it, does not exist."""


class IndexMismatchError(InputError):
    """An index's manifest does not match the recipe (other encoder, changed corpus, ...)."""


class IndexCorruptError(IndexMismatchError):
    """A file of an index folder is unreadable, truncated, or disagrees with the manifest."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


#: field -> accepted JSON types, checked by Manifest.read (bool is an int in Python: refused)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "retriever": (str,),
    "encoder": (str, type(None)),
    "corpus_fingerprint": (str,),
    "passage_count": (int,),
    "settings": (dict,),
    "lit_rag_version": (str,),
    "created": (str,),
    "files": (dict,),
}


@dataclass
class Manifest:
    """How an index was built.

    Args:
        retriever: Registered retriever kind, e.g. ``"bm25"``.
        encoder: Encoder model name for dense retrievers; ``None`` for sparse ones.
        corpus_fingerprint: SHA-256 of the corpus (see ``corpus_fingerprint``).
        passage_count: Number of passages indexed.
        settings: Build settings as actually used (JSON-serializable).
        lit_rag_version: lit-rag version that built the index, with the commit of the checkout it
            ran from (:func:`lit_rag.version.build_version`).
        created: UTC ISO-8601 timestamp of the build.
        files: Relative path -> ``{"bytes": size, "sha256": hex}`` of each file the index reads
            (``sha256`` only up to :data:`HASH_LIMIT`); empty in manifests of lit-rag 0.1.0,
            whose files are then not checked.
    """

    retriever: str
    encoder: str | None
    corpus_fingerprint: str
    passage_count: int
    settings: dict[str, Any] = field(default_factory=dict)
    lit_rag_version: str = field(default_factory=build_version)
    created: str = field(default_factory=_now)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    def write(self, directory: str | Path, record: Iterable[str] = ()) -> Path:
        """Write ``manifest.json`` into ``directory`` (created if needed); returns its path.

        Args:
            directory: The index folder.
            record: Paths (relative to ``directory``) of the index's files, already written;
                their sizes and hashes go into :attr:`files`.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in record:
            self.files[name] = _describe(directory / name)
        path = directory / MANIFEST_NAME
        partial = path.with_name(f".{MANIFEST_NAME}.partial")
        partial.write_text(json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n", "utf-8")
        os.replace(partial, path)  # a reader never sees half a manifest
        return path

    @classmethod
    def read(cls, directory: str | Path) -> Manifest:
        """Read ``directory/manifest.json``.

        Raises:
            IndexNotFoundError: The folder or its manifest is missing.
            IndexCorruptError: The manifest is not UTF-8 JSON, lacks a field or has a field of
                the wrong type (one line naming the file).
        """
        directory = Path(directory)
        if directory.exists() and not directory.is_dir():
            raise IndexNotFoundError(f"{directory} is a file, not an index folder")
        if not directory.is_dir():
            raise IndexNotFoundError(
                f"index folder not found: {directory}{_interrupted_hint(directory)}"
            )
        path = directory / MANIFEST_NAME
        if not path.is_file():
            raise IndexNotFoundError(
                f"{directory} is not a lit-rag index: it has no {MANIFEST_NAME} "
                "(build one with lit-rag index build, or Retriever.build + save)"
            )
        data = parse_json(path.read_bytes(), path, None, "the manifest")
        names = [f.name for f in fields(cls)]
        if not isinstance(data, dict):
            raise IndexCorruptError(
                f"{path}: manifest must be a JSON object, got {type(data).__name__}"
            )
        missing = [n for n in names[:4] if n not in data]
        if missing:
            raise IndexCorruptError(
                f"{path}: manifest lacks field(s) {missing}; needs: {', '.join(names)}"
            )
        for name in names:
            value = data.get(name)
            if name in data and (
                not isinstance(value, _FIELD_TYPES[name]) or isinstance(value, bool)
            ):
                allowed = " or ".join(
                    "null" if t is type(None) else t.__name__ for t in _FIELD_TYPES[name]
                )
                raise IndexCorruptError(
                    f"{path}: field '{name}' must be {allowed}, "
                    f"got {type(value).__name__} {value!r:.40}"
                )
        if data["passage_count"] < 0:
            raise IndexCorruptError(
                f"{path}: field 'passage_count' must be >= 0, got {data['passage_count']}"
            )
        return cls(**{n: data[n] for n in names if n in data})

    def check_files(self, directory: str | Path) -> None:
        """Fail when a recorded file is missing, has another size or another SHA-256.

        Catches a truncated or swapped matrix, vocabulary or faiss file before a library
        reads it. Manifests without :attr:`files` (lit-rag 0.1.0) are not checked.

        Raises:
            IndexCorruptError: One line naming the file and what differs.
        """
        directory = Path(directory)
        where = directory / MANIFEST_NAME
        for name, want in self.files.items():
            path = _inside(directory, name, where)
            if not isinstance(want, dict) or not isinstance(want.get("bytes"), int):
                raise IndexCorruptError(
                    f"{where}: files['{name}'] must be {{\"bytes\": N, ...}}, got {want!r:.60}"
                )
            if not path.is_file():
                raise IndexCorruptError(f"{path}: missing; {where} records it: {REBUILD}")
            size = path.stat().st_size
            if size != want["bytes"]:
                raise IndexCorruptError(
                    f"{path}: {size} bytes, but {where} records {want['bytes']} (truncated, or "
                    f"from another build); {REBUILD}"
                )
            if "sha256" in want and _sha256(path) != want["sha256"]:
                raise IndexCorruptError(
                    f"{path}: content differs from the SHA-256 {where} records (a file from "
                    f"another build?); {REBUILD}"
                )

    def read_passages(self, directory: str | Path) -> list[Passage]:
        """Read ``directory/passages.jsonl`` and check it against the manifest.

        Checks, in order: every line is a JSON object with string ``id``, ``title``,
        ``text``; the number of passages is :attr:`passage_count`; their
        :func:`~lit_rag.retrieval.corpus.corpus_fingerprint` is :attr:`corpus_fingerprint`.

        Raises:
            IndexCorruptError: One line naming the file (and line) and what differs.
        """
        from lit_rag.retrieval.corpus import corpus_fingerprint

        path = Path(directory) / PASSAGES_NAME
        where = Path(directory) / MANIFEST_NAME
        passages = _read_passage_lines(path)
        if len(passages) != self.passage_count:
            raise IndexCorruptError(
                f"{path}: holds {len(passages)} passages but {where} records passage_count="
                f"{self.passage_count}; the two files come from different builds: {REBUILD}"
            )
        if self.corpus_fingerprint:  # "" : a hybrid of children without passages (tests)
            have = corpus_fingerprint(passages)
            if have != self.corpus_fingerprint:
                raise IndexCorruptError(
                    f"{path}: corpus fingerprint {have[:12]}... differs from {where}'s "
                    f"corpus_fingerprint={self.corpus_fingerprint[:12]}... (passages from "
                    f"another corpus); {REBUILD}"
                )
        return passages

    def check_rows(self, what: str, rows: int, path: str | Path) -> None:
        """Fail when an index structure (score matrix, faiss index) has another row count.

        Raises:
            IndexCorruptError: ``"{path}: {what} has {rows} rows but ... passage_count=N"``.
        """
        if rows != self.passage_count:
            raise IndexCorruptError(
                f"{path}: {what} has {rows} rows but the manifest records passage_count="
                f"{self.passage_count} (a file from another build); {REBUILD}"
            )

    def check(self, expected: dict[str, Any], where: str | Path | None = None) -> None:
        """Fail when the index does not match what the recipe expects.

        Args:
            expected: Field -> expected value. Keys are manifest fields (``retriever``,
                ``encoder``, ``corpus_fingerprint``, ``passage_count``, ...) or, for any
                other key, an entry of ``settings``. ``None`` values are not checked.
            where: The index folder, named in the message.

        Raises:
            IndexMismatchError: The first mismatching field, in one line, e.g.
                ``index idx/ has encoder='e5-small' but the recipe expects encoder='bge-base'``.
        """
        top = {f.name for f in fields(self)} - {"settings"}
        for key, want in expected.items():
            if want is None:
                continue
            have = getattr(self, key) if key in top else self.settings.get(key, "<not recorded>")
            if have != want:
                place = f"index {where}" if where is not None else "the index"
                raise IndexMismatchError(
                    f"{place} has {key}={have!r} but the recipe expects {key}={want!r}; "
                    "rebuild the index or point the recipe at a matching one"
                )


def _describe(path: Path) -> dict[str, Any]:
    size = path.stat().st_size
    out: dict[str, Any] = {"bytes": size}
    if size <= HASH_LIMIT:
        out["sha256"] = _sha256(path)
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _inside(directory: Path, name: str, where: Path) -> Path:
    """``directory / name`` for a relative path that stays inside ``directory``."""
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise IndexCorruptError(
            f"{where}: file name {name!r} must be a relative path inside the index"
        )
    return directory / name


def parse_json(raw: bytes, path: Path, line: int | None, what: str) -> object:
    """``raw`` (a file, or line ``line`` of it) as JSON; bytes that are not UTF-8 or not JSON are
    an :class:`IndexCorruptError` naming ``file[:line]`` and ``what`` was damaged."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        found = first_non_utf8(raw.split(b"\n"))
        assert found is not None  # the bytes did not decode
        number, what = found
        where = f"{path}:{number if line is None else line}"
        raise IndexCorruptError(f"{where}: not UTF-8 text ({what}); {REBUILD}") from None
    except json.JSONDecodeError as err:
        raise IndexCorruptError(
            f"{path}:{err.lineno if line is None else line}: invalid JSON ({err.msg}); {what} is "
            f"truncated or damaged: {REBUILD}"
        ) from None


def _read_passage_lines(path: Path) -> list[Passage]:
    """Parse an index's ``passages.jsonl`` strictly; a bad line names ``file:line``."""
    from lit_rag.types import Passage

    if not path.is_file():
        raise IndexCorruptError(f"{path}: missing; an index folder holds its passages: {REBUILD}")
    passages: list[Passage] = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            row = parse_json(raw, path, number, "the file")
            if not isinstance(row, dict) or not all(
                isinstance(row.get(key), str) for key in ("id", "title", "text")
            ):
                raise IndexCorruptError(
                    f'{path}:{number}: expected {{"id", "title", "text"}} strings, got '
                    f"{raw[:60].decode('utf-8', 'replace')!r}; {REBUILD}"
                )
            passages.append(Passage(id=row["id"], title=row["title"], text=row["text"]))
    return passages


def _interrupted_hint(directory: Path) -> str:
    """Point at the previous index an interrupted ``index build`` set aside, if there is one."""
    aside = (
        sorted(directory.parent.glob(f".{directory.name}.old-*"))
        if directory.parent.is_dir()
        else []
    )
    if not aside:
        return ""
    return (
        f" (an interrupted lit-rag index build left the previous index at {aside[-1]}; "
        "run the build again, which puts it back first, or rename it)"
    )
