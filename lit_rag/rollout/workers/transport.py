"""How a trainer rank's weights reach its rollout workers (docs/DESIGN.md, "Rollout workers").

Each worker and the trainer rank that owns it share a two-process group of their own (torch's
``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on GPUs, over a ``TCPStore``): it is not the
trainer's default process group, so Lightning's collectives and the weight pushes never wait for
each other, and a worker that dies breaks only its own link (a restarted worker opens a new
one). A broadcast tree over all of a rank's workers would send fewer bytes from the trainer,
but one dead worker would then stall every push.

A push sends the policy's checkpoint tensors (:func:`~lit_rag.rollout.weights.checkpoint_weights`:
gathered one unit at a time on FSDP / ZeRO-3, LoRA merged) cast to the worker's dtype and packed
into byte buckets of at most ``bucket_mib`` as they come (:func:`buckets`): each bucket's names,
shapes and offsets travel on the worker's control queue, then the bucket is one broadcast. The
worker receives every bucket before it loads any tensor, so the trainer waits for the transfer
only, never for the worker's reload (the worker holds one received copy of the weights meanwhile).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterable, Iterator

import torch

#: dtype names as they travel in a bucket's entries
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.uint8,
        torch.bool,
    )
}

#: one tensor of a bucket: ``(name, dtype, shape, offset, bytes)``
Entry = tuple[str, str, tuple[int, ...], int, int]


def listen(timeout_s: float = 600.0, host: str = "127.0.0.1"):
    """The trainer side's ``TCPStore`` of a new link, already listening on a port the system
    picked (``.port``): opened before the worker is spawned and held from then on, so nothing
    else started meanwhile (the worker's vLLM, a resumed run's own process group) can take the
    port. Probing for a free port and binding it later loses that race."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    return dist.TCPStore(host, 0, 2, True, timeout=timeout, wait_for_workers=False)


class WeightLink:
    """One trainer rank (rank 0 of the link) and one worker (rank 1).

    Args:
        port: The link's ``TCPStore`` port (the trainer side listens).
        is_trainer: This process is the trainer side.
        backend: ``gloo`` (CPU tensors) or ``nccl`` (CUDA tensors).
        timeout_s: How long a transfer may wait for the other side.
        host: The trainer's address.
        device: Where received buckets live (``cpu``, or the worker's ``cuda`` device).
        store: The trainer side's store from :func:`listen` (its port is ``port``); none:
            open one here (the worker side connects to the trainer's).
    """

    def __init__(
        self,
        port: int,
        is_trainer: bool,
        backend: str = "gloo",
        timeout_s: float = 600.0,
        host: str = "127.0.0.1",
        device: str = "cpu",
        store=None,
    ) -> None:
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:
            store = dist.TCPStore(host, port, 2, is_trainer, timeout=timeout)
        rank = 0 if is_trainer else 1
        if backend == "nccl":
            self.group = dist.ProcessGroupNCCL(store, rank, 2, dist.ProcessGroupNCCL.Options())
        else:
            self.group = dist.ProcessGroupGloo(store, rank, 2, timeout)
        self.backend, self.device = backend, device

    def send(self, bucket: torch.Tensor, alive: Callable[[], bool]) -> None:
        """Broadcast one bucket to the worker; raises ``ConnectionError`` when the worker dies
        (``alive`` turns False, or the transport reports the peer gone) before it has it."""
        self._wait(self.group.broadcast(bucket, 0), alive)

    def receive(self, size: int) -> torch.Tensor:
        """The next bucket (``size`` bytes) from the trainer."""
        bucket = torch.empty(size, dtype=torch.uint8, device=self.device)
        self.group.broadcast(bucket, 0).wait()
        return bucket

    @staticmethod
    def _wait(work, alive: Callable[[], bool]) -> None:
        while not work.is_completed():
            if not alive():
                raise ConnectionError("the rollout worker died during a weight push")
            time.sleep(0.002)
        try:
            work.wait()
        except RuntimeError as exc:  # gloo: "Connection closed by peer"
            raise ConnectionError(f"the rollout worker's link broke: {exc}") from exc


def buckets(
    weights: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    bucket_mib: float,
    device: str | torch.device = "cpu",
) -> Iterator[tuple[list[Entry], torch.Tensor]]:
    """``weights`` cast to ``dtype`` (floating tensors) and packed into byte buckets of at most
    ``bucket_mib`` (a tensor larger than that is a bucket of its own), as they come: the trainer
    holds one bucket beyond the policy, never a second copy of it.

    Example:
        >>> [(e, b.numel()) for e, b in buckets([("a", torch.ones(2))], torch.bfloat16, 1)]
        [([('a', 'bfloat16', (2,), 0, 4)], 4)]
    """
    limit = int(bucket_mib * 2**20)
    entries: list[Entry] = []
    pending: list[torch.Tensor] = []
    used = 0
    for name, tensor in weights:
        if tensor.is_floating_point():
            tensor = tensor.to(dtype)
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).to(device)
        pad = -used % 16  # each tensor starts 16-byte aligned: a view needs its element size
        if used and used + pad + raw.numel() > limit:
            yield entries, torch.cat(pending)
            entries, pending, used, pad = [], [], 0, 0
        if pad:
            pending.append(torch.zeros(pad, dtype=torch.uint8, device=raw.device))
            used += pad
        kind = str(tensor.dtype).removeprefix("torch.")
        entries.append((name, kind, tuple(tensor.shape), used, raw.numel()))
        pending.append(raw)
        used += raw.numel()
    if pending:
        yield entries, torch.cat(pending)


def unpack(entries: list[Entry], bucket: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """A received bucket's tensors, as views into it."""
    for name, dtype, shape, offset, nbytes in entries:
        yield name, bucket[offset : offset + nbytes].view(_DTYPES[dtype]).view(shape)
