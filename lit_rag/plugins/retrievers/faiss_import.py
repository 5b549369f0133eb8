"""Import a dense faiss index built by FlashRAG or Search-R1 as a lit-rag index, no re-encoding.

    lit-rag index import --faiss e5_Flat.index --corpus wiki-18.jsonl \\
        --encoder intfloat/e5-base-v2 --out indexes/wiki18-e5 --link

What the source tools do (Search-R1 ``search_r1/search/index_builder.py`` and
``retrieval_server.py``; FlashRAG follows the same conventions):

- the corpus is JSONL ``{"id", "contents": '"Title"\\ntext'}``; faiss row ``i`` is corpus line
  ``i`` (the server returns ``corpus[idx]`` by row number, not by id);
- passages are encoded from ``contents`` with ``"passage: "`` in front when the method is e5;
  queries with ``"query: "`` (e5) or BGE's instruction (queries only);
- token pooling by method name (e5 mean, bge cls, contriever and jina mean, else mean), then
  L2-normalized; ``faiss.index_factory(dim, faiss_type, METRIC_INNER_PRODUCT)``, saved as
  ``{method}_{faiss_type}.index``.

What we do: read the corpus as ``flashrag`` (title and text split out of ``contents``), check
that the index has one row per corpus line, and write ``passages.jsonl``, the faiss file (copied,
or hard-linked with ``link=True``) and a manifest recording the encoder, prefixes and pooling;
:class:`~lit_rag.plugins.retrievers.dense.DenseRetriever` then searches it with queries encoded
as the source tool encodes them. Nothing is encoded at import and the encoder is never loaded.

Where we depart, and why:

- Only inner-product indexes are imported. An L2 index (``METRIC_L2``) is refused with one line:
  lit-rag ranks by similarity (higher is better) and fuses scores in hybrid retrieval, so
  distances would need another code path; FlashRAG and Search-R1 always build inner product.
- Only the index families lit-rag knows how to tune at search time: flat (``IndexFlat*``), hnsw
  (``IndexHNSW*``) and ivf (``IndexIVF*``, any coarse codec: ``IVF4096,PQ64``, ``IVF1024,SQ8``).
  Others (``PQ64`` alone, ``OPQ``/``PCA`` pre-transforms) are refused: their search parameters
  would silently stay at faiss's defaults.
- Search parameters: lit-rag searches ivf with ``nprobe=16`` (at most ``nlist``) and hnsw with
  ``efSearch=max(64, k)``; Search-R1's server keeps faiss's defaults (``nprobe=1``,
  ``efSearch=16``), so on approximate indexes lit-rag can find better (hence different)
  neighbours. A flat index gives the same hits and scores.
- Query length: queries are cut at the encoder's ``max_seq_length`` (sentence-transformers),
  Search-R1 at its ``max_length`` (256); only queries longer than that differ.
- Defaults from names: the prefixes and pooling follow Search-R1's rules applied to the last
  part of ``encoder`` (``intfloat/e5-base-v2`` -> e5), or, when that names neither e5 nor bge,
  to the faiss file name (Search-R1 names it after the method: ``e5_Flat.index``). Search-R1
  adds ``"passage: "`` to passages only when the method is exactly ``e5``; lit-rag records the
  passage prefix for information only (nothing is encoded at import), so pass
  ``passage_prefix`` if you need the record exact.

The encoder: ``encoder`` is recorded as given. A hub id such as ``intfloat/e5-base-v2`` need not
exist here; at search time pass the id itself (loaded from your hub cache) or a local folder
named like its last part (``/models/e5-base-v2``) or its hub-cache snapshot: see
``lit_rag.plugins.retrievers.dense._same_encoder``. A folder of another model with the same name and
another vector size fails at the first search with one line.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from lit_rag.api import InputError

log = logging.getLogger(__name__)

#: Search-R1's BGE query instruction (``retrieval_server.py``)
BGE_INSTRUCTION = "Represent this sentence for searching relevant passages: "
#: name part -> (query prefix, passage prefix, pooling): Search-R1's rules, first match wins
NAME_RULES: dict[str, tuple[str, str, str]] = {
    "e5": ("query: ", "passage: ", "mean"),
    "bge": (BGE_INSTRUCTION, "", "cls"),
    "contriever": ("", "", "mean"),
    "jina": ("", "", "mean"),
}
_ADVICE = "give the faiss index file FlashRAG or Search-R1 wrote (--faiss), e.g. e5_Flat.index"
_FAMILIES = (("IndexFlat", "flat"), ("IndexHNSW", "hnsw"), ("IndexIVF", "ivf"))


def name_defaults(*names: str) -> tuple[str, str, str]:
    """``(query_prefix, passage_prefix, pooling)`` Search-R1 uses for the first name that
    contains a known method (case-insensitive); ``("", "", "mean")`` when none does.

    >>> name_defaults("e5-base-v2")
    ('query: ', 'passage: ', 'mean')
    >>> name_defaults("my-encoder", "bge_HNSW64.index")[2]
    'cls'
    """
    for name in names:
        for key, defaults in NAME_RULES.items():
            if key in name.lower():
                return defaults
    return "", "", "mean"


def import_dense_index(
    faiss_path: str | Path,
    corpus_path: str | Path,
    encoder: str,
    out: str | Path,
    *,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    pooling: str | None = None,
    link: bool = False,
) -> Path:
    """Turn a FlashRAG / Search-R1 faiss index and its corpus into a lit-rag index folder.

    Args:
        faiss_path: The faiss index file (``index_factory(dim, type, METRIC_INNER_PRODUCT)``).
        corpus_path: The FlashRAG corpus JSONL the index was built from, row ``i`` = line ``i``.
        encoder: The encoder the index was built with, a hub id (``intfloat/e5-base-v2``) or a
            local path; recorded, never loaded.
        out: The index folder to write (absent, empty, or a lit-rag index it replaces).
        query_prefix: Prepended to queries; None: Search-R1's rule for the name (see
            :func:`name_defaults`).
        passage_prefix: The prefix the passages were encoded with (recorded only); None: the rule.
        pooling: ``mean``, ``cls`` or ``max``; None: the rule.
        link: Hard-link the faiss file into ``out`` instead of copying it, where the file system
            allows (same file system, and you may link the file); else it is copied. The
            manifest records which (``settings.imported_from.index_file``).

    Returns:
        ``out``.

    Raises:
        InputError: Bad ``pooling`` or ``encoder``; an unreadable faiss file, a metric other than
            inner product or an unsupported index type; a corpus not in FlashRAG format, empty,
            or with another number of rows than the index (all one line naming the file).
        FileNotFoundError: A missing corpus file, or a local ``encoder`` path that does not exist.
    """
    from lit_rag.api import atomic_index_dir

    faiss_path, corpus_path = Path(faiss_path), Path(corpus_path)
    encoding = _encoding(encoder, faiss_path, query_prefix, passage_prefix, pooling)
    with atomic_index_dir(out) as folder:
        _write_imported(folder, faiss_path, corpus_path, encoder, encoding, link)
    return Path(out)


def _encoding(
    encoder: str,
    faiss_path: Path,
    query_prefix: str | None,
    passage_prefix: str | None,
    pooling: str | None,
) -> dict[str, str]:
    """The prefixes and pooling the manifest records: those given, else Search-R1's rule for
    the encoder's (or the faiss file's) name (:func:`name_defaults`)."""
    from .dense import POOLINGS

    if pooling is not None and pooling not in POOLINGS:
        raise InputError(f"--pooling: got '{pooling}'; allowed: {', '.join(POOLINGS)}")
    _check_encoder(encoder)
    rule = name_defaults(Path(encoder).name, faiss_path.name)
    return {
        "query_prefix": rule[0] if query_prefix is None else query_prefix,
        "passage_prefix": rule[1] if passage_prefix is None else passage_prefix,
        "pooling": rule[2] if pooling is None else pooling,
    }


def _write_imported(
    folder: Path,
    faiss_path: Path,
    corpus_path: Path,
    encoder: str,
    encoding: dict[str, str],
    link: bool,
) -> None:
    """Check the faiss file and the corpus against each other, then write them into ``folder``
    as a dense index: ``index.faiss``, ``passages.jsonl`` and the manifest."""
    from lit_rag.api import PASSAGES_NAME, Manifest, corpus_fingerprint, read_corpus, write_corpus

    from .dense import _INDEX_FILE

    index = _read_index(faiss_path)
    settings = describe_index(index, faiss_path)
    passages = read_corpus(corpus_path, "flashrag")
    if not passages:
        raise InputError(f"--corpus {corpus_path}: no passages (an empty file)")
    if int(index.ntotal) != len(passages):
        raise InputError(
            f"{faiss_path} holds {index.ntotal} vectors but {corpus_path} has "
            f"{len(passages)} passages; faiss row i is corpus line i, so give the corpus the "
            "index was built from"
        )
    del index  # release the mapped file before it is copied or linked
    placed = _place(faiss_path, folder / _INDEX_FILE, link)
    write_corpus(passages, folder / PASSAGES_NAME)
    source = {"faiss": faiss_path.name, "corpus": corpus_path.name, "format": "flashrag"}
    settings.update(encoding, imported_from={**source, "index_file": placed})
    Manifest(
        retriever="dense",
        encoder=encoder,
        corpus_fingerprint=corpus_fingerprint(passages),
        passage_count=len(passages),
        settings=settings,
    ).write(folder, record=[_INDEX_FILE])


def _check_encoder(encoder: str) -> None:
    """A hub id or an existing local path / ``pkg://`` folder; nothing is loaded or imported."""
    from lit_rag.api import resolve_path

    if not encoder.strip():
        raise InputError(
            "--encoder: got an empty name; give the hub id or local folder of the "
            "encoder the index was built with, e.g. intfloat/e5-base-v2"
        )
    resolve_path(encoder)  # FileNotFoundError: a local path that does not exist


def _read_index(path: Path) -> Any:
    """The faiss index at ``path``, its codes memory-mapped where faiss can (a 60 GB flat
    index is not read into memory to count its rows)."""
    import faiss

    from lit_rag.api import IndexCorruptError

    from .dense import _read_faiss

    try:
        return _read_faiss(path, _ADVICE, getattr(faiss, "IO_FLAG_MMAP_IFC", 0))
    except IndexCorruptError as err:  # the user's input file, not a lit-rag index
        raise InputError(str(err)) from None


def describe_index(index: Any, path: Path) -> dict[str, Any]:
    """The manifest settings of a faiss index: family, faiss class, size and structure.

    Returns:
        ``{"faiss_index": "flat" | "hnsw" | "ivf", "faiss_class": e.g. "IndexIVFPQ", "dim": D}``
        plus ``hnsw_m`` (hnsw), ``nlist`` and, with a product quantizer, ``pq_m`` (ivf).

    Raises:
        InputError: A metric other than inner product, or a type outside the three families.
    """
    import faiss

    inner = faiss.downcast_index(index)
    name = type(inner).__name__
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        metric = "L2" if index.metric_type == faiss.METRIC_L2 else f"type {index.metric_type}"
        raise InputError(
            f"{path}: a {name} with metric {metric}; lit-rag imports inner-product indexes only "
            "(as FlashRAG and Search-R1 build them: faiss.index_factory(dim, type, "
            "faiss.METRIC_INNER_PRODUCT) over L2-normalized vectors)"
        )
    family = next((fam for prefix, fam in _FAMILIES if name.startswith(prefix)), None)
    if family is None:
        raise InputError(
            f"{path}: faiss index type {name} is not supported; lit-rag imports flat "
            "(IndexFlat*), hnsw (IndexHNSW*) and ivf (IndexIVF*) indexes"
        )
    settings: dict[str, Any] = {"faiss_index": family, "faiss_class": name, "dim": int(index.d)}
    if family == "hnsw":
        settings["hnsw_m"] = int(inner.hnsw.nb_neighbors(1))  # level 0 has 2*M links
    if family == "ivf":
        settings["nlist"] = int(inner.nlist)
        if getattr(inner, "pq", None) is not None:
            settings["pq_m"] = int(inner.pq.M)
    return settings


def _place(src: Path, dst: Path, link: bool) -> str:
    """Hard-link (``link``) or copy ``src`` to ``dst``; returns what was done, in words."""
    if link:
        try:
            os.link(src, dst)
            return "hard link"
        except OSError as err:  # another file system, a file you may not link, no links at all
            why = "another file system" if err.errno == errno.EXDEV else err.strerror
            log.warning(
                "--link: cannot hard-link %s into %s (%s); copying it", src, dst.parent, why
            )
            shutil.copyfile(src, dst)
            return f"copy (hard link failed: {why})"
    shutil.copyfile(src, dst)
    return "copy"
