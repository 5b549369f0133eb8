"""The manifest every index folder carries (``manifest.json``).

It records how the index was built: retriever kind, encoder (dense retrievers), corpus
fingerprint (:func:`lit_rag.retrieval.corpus.corpus_fingerprint`), passage count, build
settings and the lit-rag version. Loading an index checks it against what the recipe expects
(:meth:`Manifest.check`), so a stale index fails with one line instead of silently returning
passages from another corpus.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lit_rag import __version__

MANIFEST_NAME = "manifest.json"


class IndexNotFoundError(FileNotFoundError):
    """The index folder, or the manifest inside it, does not exist."""


class IndexMismatchError(ValueError):
    """An index's manifest does not match the recipe (other encoder, changed corpus, ...)."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Manifest:
    """How an index was built.

    Args:
        retriever: Registered retriever kind, e.g. ``"bm25"``.
        encoder: Encoder model name for dense retrievers; ``None`` for sparse ones.
        corpus_fingerprint: SHA-256 of the corpus (see ``corpus_fingerprint``).
        passage_count: Number of passages indexed.
        settings: Build settings as actually used (JSON-serializable).
        lit_rag_version: lit-rag version that built the index.
        created: UTC ISO-8601 timestamp of the build.
    """

    retriever: str
    encoder: str | None
    corpus_fingerprint: str
    passage_count: int
    settings: dict[str, Any] = field(default_factory=dict)
    lit_rag_version: str = __version__
    created: str = field(default_factory=_now)

    def write(self, directory: str | Path) -> Path:
        """Write ``manifest.json`` into ``directory`` (created if needed); returns its path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / MANIFEST_NAME
        path.write_text(json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n", "utf-8")
        return path

    @classmethod
    def read(cls, directory: str | Path) -> Manifest:
        """Read ``directory/manifest.json``.

        Raises:
            IndexNotFoundError: The folder or its manifest is missing.
            ValueError: The manifest is not valid JSON or lacks a field.
        """
        directory = Path(directory)
        if not directory.is_dir():
            raise IndexNotFoundError(f"index folder not found: {directory}")
        path = directory / MANIFEST_NAME
        if not path.is_file():
            raise IndexNotFoundError(
                f"{directory} is not a lit-rag index: it has no {MANIFEST_NAME} "
                "(build one with Retriever.build + save)"
            )
        try:
            data = json.loads(path.read_text("utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from None
        names = [f.name for f in fields(cls)]
        if not isinstance(data, dict):
            raise ValueError(f"{path}: manifest must be a JSON object, got {type(data).__name__}")
        missing = [n for n in names[:4] if n not in data]
        if missing:
            raise ValueError(
                f"{path}: manifest lacks field(s) {missing}; needs: {', '.join(names)}"
            )
        return cls(**{n: data[n] for n in names if n in data})

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
