"""Where a dense index is searched from (the dense retriever's ``index_device``): memory-mapped
on the host, on one GPU, or sharded over the node's GPUs, decided by :func:`place_index`, a pure
function of the index's size and the GPUs' free memory, before training starts; and the faiss
calls that carry a decision out (:class:`FaissGpu`, the seam a test fills with a recording
stand-in). One index for a whole node, shared by every rank and rollout worker, is the
retrieval server's job (``lit-rag index serve`` with ``retriever: http``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lit_rag.api import InputError

#: where a dense index is searched from (``index_device``; :func:`place_index`)
IndexDevice = Literal["auto", "host", "gpu", "shard"]
INDEX_DEVICES: tuple[str, ...] = ("auto", "host", "gpu", "shard")
#: the setting as a recipe spells it, in errors
INDEX_DEVICE_KEY = "model.environment.init_args.retriever.init_args.index_device"

#: GPU memory faiss takes per process on each GPU it uses, beside the index: its temporary
#: memory (``StandardGpuResources``: at most 1.5 GiB) and a CUDA context with cuBLAS (~0.5 GiB)
GPU_OVERHEAD_BYTES = 2 * 2**30
#: an asked ``gpu`` or ``shard`` must fit in this share of each GPU's free memory
FIT_SHARE = 0.9
#: ``auto`` takes a GPU only when the copies fit in this share of its free memory: the policy,
#: its optimizer and vLLM load after the index and need the rest
AUTO_SHARE = 0.2
_ELSEWHERE = (
    "host (memory-mapped, one copy per node in the page cache), or one index for the node "
    "behind lit-rag index serve with retriever: http"
)


@dataclass(frozen=True)
class IndexPlacement:
    """Where a dense index is searched from, and why.

    Args:
        where: ``host``, ``gpu`` or ``shard``.
        devices: The GPUs it is on (CUDA ordinals as this process sees them); none on the host.
        reason: One line: the request, the sizes and the free memory it was decided from.
    """

    where: str
    devices: tuple[int, ...] = ()
    reason: str = ""

    @property
    def label(self) -> str:
        """``host``, ``gpu 3`` or ``shard 0,1,2,3``."""
        return " ".join([self.where, ",".join(map(str, self.devices))]).strip()


@dataclass(frozen=True)
class _Plan:
    """A placement on GPUs with what it needs: ``need`` bytes on each of ``devices`` (the
    node's every process counted) against ``free``, the least free of them (None: unread)."""

    where: str
    devices: tuple[int, ...]
    need: int
    free: int | None
    how: str

    def fits(self, share: float) -> bool:
        return self.free is not None and self.need <= share * self.free


def check_index_device(value: str, faiss_index: str = "flat") -> None:
    """The checks ``index_device`` gets wherever it is set, in one place.

    Raises:
        InputError: A value outside :data:`INDEX_DEVICES`, or GPUs for an hnsw index.
    """
    if value not in INDEX_DEVICES:
        raise InputError(f"{INDEX_DEVICE_KEY}: got {value!r}; allowed: {', '.join(INDEX_DEVICES)}")
    if faiss_index == "hnsw" and value in ("gpu", "shard"):
        raise InputError(
            f"{INDEX_DEVICE_KEY}: got {value!r} for an hnsw index, but faiss has no GPU HNSW; "
            "allowed for hnsw: auto, host (or build a flat or ivf index for GPUs)"
        )


def place_index(
    requested: str,
    kind: str,
    index_bytes: int,
    gpu_free: Sequence[int | None],
    local_rank: int = 0,
    local_world_size: int = 1,
) -> IndexPlacement:
    """Where a dense index goes: a pure function of the request and the node (no faiss, no CUDA).

    Each rank counts the copies of the node's every rank, so all take their part of one plan
    for the node. Rank ``r`` of ``n`` GPUs uses GPU ``r % n``: ``gpu`` is a copy there from each
    rank on it, ``shard`` a ``1/n`` slice on every GPU from every rank, each process adding
    :data:`GPU_OVERHEAD_BYTES`. Asked for, it must fit in :data:`FIT_SHARE` of free memory;
    ``auto`` takes ``gpu`` (or, for one process, ``shard``) within :data:`AUTO_SHARE`, else host.

    Args:
        requested: ``auto``, ``host``, ``gpu`` or ``shard`` (``index_device``).
        kind: The faiss index: ``flat``, ``ivf`` or ``hnsw``.
        index_bytes: The index's size (its file, or its vectors and ids).
        gpu_free: Free bytes of each GPU faiss can use, by CUDA ordinal; empty without faiss-gpu
            or GPUs. None for a GPU not read (the caller reads only what the request can use).
        local_rank: This process's rank on its node.
        local_world_size: The ranks on the node that share these GPUs.

    Raises:
        InputError: An asked placement that does not fit, or GPUs where there are none.

    Example:
        A 65 GiB flat index, 8 ranks on 8 GPUs of 80 GiB free: a copy on each GPU needs
        67 GiB (with faiss's 2) > 16 GiB (a fifth of 80), so ``auto`` keeps it on the host.
    """
    check_index_device(requested, kind)
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local_rank {local_rank} outside 0..{local_world_size - 1}")
    size = f"the {_gib(index_bytes)} {kind} index"
    host = _host_only(requested, kind, size, bool(gpu_free))
    if host is not None:
        return host
    one = _one_gpu(index_bytes, gpu_free, local_rank, local_world_size)
    split = _shard(index_bytes, gpu_free, local_world_size)
    if requested == "gpu":
        return _asked(one, requested, size)
    if requested == "shard":
        return _asked(split, requested, size)
    candidates = [one, split] if local_world_size == 1 and len(gpu_free) > 1 else [one]
    for plan in candidates:
        if plan.fits(AUTO_SHARE):
            return _chosen(plan, f"auto; {size}")
    return IndexPlacement(
        "host",
        (),
        f"auto; {size} does not fit beside the model: {one.how}: {_gib(one.need)} needed, "
        f"over {AUTO_SHARE:.0%} of the {_gib(one.free)} free (index_device: gpu or shard to "
        "insist, or lit-rag index serve and retriever: http for one GPU index per node)",
    )


def _host_only(requested: str, kind: str, size: str, gpus: bool) -> IndexPlacement | None:
    """The host where no GPU is in question: asked for, an hnsw index, or no GPU for faiss."""
    if requested == "host":
        return IndexPlacement("host", (), f"asked ({size} memory-mapped)")
    if kind == "hnsw":
        return IndexPlacement("host", (), f"{size}: faiss has no GPU HNSW")
    if gpus:
        return None
    if requested == "auto":
        return IndexPlacement("host", (), f"{size}: no GPU faiss can use here")
    raise InputError(
        f"{INDEX_DEVICE_KEY}: got {requested!r}, but faiss can use no GPU here (faiss-gpu "
        "not installed, or no GPU visible: pip install 'lit-rag[gpu]'); allowed: auto, host"
    )


def _asked(plan: _Plan, requested: str, size: str) -> IndexPlacement:
    """``plan``, asked for by name: it must fit in :data:`FIT_SHARE` of the free memory."""
    if not plan.fits(FIT_SHARE):
        raise InputError(
            f"{INDEX_DEVICE_KEY}: got {requested!r}, but {size} does not fit: {plan.how}: "
            f"{_gib(plan.need)} needed, {_gib(plan.free)} free (at most {FIT_SHARE:.0%} may "
            f"go); allowed: {_ELSEWHERE}"
        )
    return _chosen(plan, f"asked; {size}")


def _one_gpu(
    index_bytes: int, gpu_free: Sequence[int | None], local_rank: int, ranks: int
) -> _Plan:
    """A copy on GPU ``local_rank % n`` from every rank on it."""
    device = local_rank % len(gpu_free)
    copies = len(range(device, ranks, len(gpu_free)))  # ranks d, d + n, d + 2n, ...
    need = copies * (index_bytes + GPU_OVERHEAD_BYTES)
    how = f"{copies} cop{'y' if copies == 1 else 'ies'} on GPU {device} (one per rank there)"
    return _Plan("gpu", (device,), need, gpu_free[device], how)


def _shard(index_bytes: int, gpu_free: Sequence[int | None], ranks: int) -> _Plan:
    """A ``1/n`` slice on each of the ``n`` GPUs, from each of the node's ``ranks``."""
    n = len(gpu_free)
    need = ranks * (-(-index_bytes // n) + GPU_OVERHEAD_BYTES)
    free = None if None in gpu_free else min(f for f in gpu_free if f is not None)
    how = f"a 1/{n} slice on each of {n} GPUs" + (
        f" from each of {ranks} ranks" if ranks > 1 else ""
    )
    return _Plan("shard", tuple(range(n)), need, free, how)


def _chosen(plan: _Plan, why: str) -> IndexPlacement:
    reason = f"{why}: {plan.how}: {_gib(plan.need)} of {_gib(plan.free)} free"
    return IndexPlacement(plan.where, plan.devices, reason)


def _gib(n: int | None) -> str:
    return "an unread amount" if n is None else f"{n / 2**30:.1f} GiB"


def node_ranks(environ: Mapping[str, str], gpus: int) -> tuple[int, int]:
    """``(local rank, ranks on the node that share this process's GPUs)`` from the launcher's
    variables: ``LOCAL_RANK`` (torchrun, Lightning), ``LOCAL_WORLD_SIZE`` (torchrun), else
    ``WORLD_SIZE`` capped at the ``gpus`` seen (Lightning sets no ``LOCAL_WORLD_SIZE``; one rank
    per GPU: several nodes of fewer ranks than GPUs are over-counted, which only errs to the
    host). A process whose ``CUDA_VISIBLE_DEVICES`` shows it fewer GPUs than the node's ranks
    has GPUs of its own (a rollout worker): ``(0, 1)``.

    Example:
        >>> node_ranks({"LOCAL_RANK": "3", "WORLD_SIZE": "4"}, gpus=8)
        (3, 4)
    """
    local_rank = int(environ.get("LOCAL_RANK") or 0)
    given = environ.get("LOCAL_WORLD_SIZE")
    ranks = int(given) if given else min(int(environ.get("WORLD_SIZE") or 1), max(gpus, 1))
    ranks = max(ranks, local_rank + 1)
    if "CUDA_VISIBLE_DEVICES" in environ and 0 < gpus < ranks:
        return 0, 1
    return local_rank, ranks


def built_bytes(index: Any, kind: str) -> int:
    """An index's size in memory: its codes (``d`` floats a vector for flat), and an 8-byte id
    a vector for ivf (what a file of it holds, centroids aside)."""
    code = int(getattr(index, "code_size", 4 * index.d))
    return int(index.ntotal) * (code + (8 if kind == "ivf" else 0))


class FaissGpu:
    """The faiss and CUDA calls that put an index on GPUs, and nothing else: the seam a test
    fills with a recording stand-in for faiss's GPU side (faiss-cpu has none of it).

    Args:
        faiss: The module whose ``get_num_gpus``, ``StandardGpuResources``,
            ``index_cpu_to_gpu``, ``GpuMultipleClonerOptions``, ``index_cpu_to_all_gpus`` and
            ``index_gpu_to_cpu`` it calls; None: ``import faiss`` on first use.
        free_bytes: A GPU's free memory; None: ``torch.cuda.mem_get_info``.
    """

    def __init__(self, faiss: Any = None, free_bytes: Callable[[int], int] | None = None) -> None:
        self._faiss, self._free_bytes = faiss, free_bytes
        self._resources: dict[int, Any] = {}  # one StandardGpuResources per GPU, kept

    @property
    def faiss(self) -> Any:
        if self._faiss is None:
            import faiss

            self._faiss = faiss
        return self._faiss

    def count(self) -> int:
        """The GPUs faiss can use: 0 without faiss-gpu."""
        if not hasattr(self.faiss, "StandardGpuResources"):
            return 0
        return int(self.faiss.get_num_gpus())

    def free(self, device: int) -> int:
        """Free bytes on GPU ``device`` (this opens a CUDA context there)."""
        if self._free_bytes is not None:
            return self._free_bytes(device)
        import torch

        return int(torch.cuda.mem_get_info(device)[0])

    def place(self, index: Any, placement: IndexPlacement) -> Any:
        """A GPU copy of the CPU ``index`` on ``placement``'s GPU, or sharded over its GPUs."""
        faiss = self.faiss
        if placement.where == "gpu":
            (device,) = placement.devices
            if device not in self._resources:
                self._resources[device] = faiss.StandardGpuResources()
            return faiss.index_cpu_to_gpu(self._resources[device], device, index)
        options = faiss.GpuMultipleClonerOptions()
        options.shard = True  # a slice on each GPU, not a whole copy on each
        return faiss.index_cpu_to_all_gpus(index, co=options, ngpu=len(placement.devices))

    def to_cpu(self, index: Any) -> Any:
        """The CPU form of a GPU index (what is saved)."""
        return self.faiss.index_gpu_to_cpu(index)


#: the GPU calls of every dense retriever (a test replaces it)
GPU = FaissGpu()
