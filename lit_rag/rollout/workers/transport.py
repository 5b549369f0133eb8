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
worker's engine loads each bucket's tensors as soon as that bucket is in, and the next bucket
is received when the engine asks for more (``WorkerProcess.receive``), so a worker holds about
one bucket beside its engine's weights, never a second copy of them; the trainer's send of a
bucket therefore waits for the worker to have loaded the one before.

Faults. A link is set up eagerly: both sides build the group and complete a one-byte broadcast
(NCCL connects on its first collective, which blocks) in a helper thread while the caller checks
that the other side lives, so a worker that dies before its first push is a ``ConnectionError``
within a poll, not a wait in the transport's setup. Every send waits with the same check and
the push's deadline (``TimeoutError`` past it). A link that failed is aborted
(:meth:`WeightLink.abort`): NCCL's pending work cannot be cancelled, and its watchdog would end
the trainer's process once that work passed the group's timeout, which the group's options carry
(:func:`group_options`; longer than any deadline the trainer waits with).
"""

from __future__ import annotations

import contextlib
import datetime
import math
import threading
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


def group_options(backend: str, timeout_s: float, options_type: type | None = None):
    """The options a link's process group is built with, carrying its timeout in torch's own
    field (``_timeout``, as ``init_process_group`` sets it): ``ProcessGroupNCCL.Options``
    (whose default timeout, 10 minutes, would otherwise end a rank through NCCL's watchdog)
    or ``ProcessGroupGloo._Options`` with the machine's default device. ``options_type``: the
    class to build, torch's for ``backend`` by default.

    Example:
        >>> group_options("gloo", 90)._timeout
        datetime.timedelta(seconds=90)
    """
    import torch.distributed as dist

    nccl = backend == "nccl"
    if options_type is None:
        options_type = dist.ProcessGroupNCCL.Options if nccl else dist.ProcessGroupGloo._Options
    options = options_type()
    options._timeout = datetime.timedelta(seconds=timeout_s)
    if nccl:
        options.is_high_priority_stream = False  # as init_process_group builds NCCL's
    else:
        options._devices = [dist.ProcessGroupGloo.create_default_device()]
    return options


class WeightLink:
    """One trainer rank (rank 0 of the link) and one worker (rank 1), connected when this
    returns (see the module docstring): raises ``ConnectionError`` when the other side dies
    first (``alive`` turns False, or the transport reports it gone) and ``TimeoutError`` after
    ``setup_s``.

    Args:
        port: The link's ``TCPStore`` port (the trainer side listens).
        is_trainer: This process is the trainer side.
        backend: ``gloo`` (CPU tensors) or ``nccl`` (CUDA tensors).
        timeout_s: The group's timeout: a transfer that waits longer fails (NCCL's watchdog
            ends the process).
        host: The trainer's address.
        device: Where this side's buckets live (``cpu``, or a ``cuda`` device).
        store: The trainer side's store from :func:`listen` (its port is ``port``); none:
            open one here (the worker side connects to the trainer's).
        alive: Whether the other side's process still runs; none: not checked.
        setup_s: The longest the setup waits for the other side; none: ``timeout_s``.
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
        alive: Callable[[], bool] | None = None,
        setup_s: float | None = None,
    ) -> None:
        import torch.distributed as dist

        if store is None:
            timeout = datetime.timedelta(seconds=timeout_s)
            store = dist.TCPStore(host, port, 2, is_trainer, timeout=timeout)
        self.backend, self.device, self.group = backend, device, None
        self._pending = None  # a send's work that did not complete
        rank = 0 if is_trainer else 1
        options = group_options(backend, timeout_s)
        deadline = time.monotonic() + (timeout_s if setup_s is None else setup_s)
        self._connect(store, rank, options, alive or _always, deadline)

    def _connect(self, store, rank: int, options, alive, deadline: float) -> None:
        """Build the group and complete one broadcast in a helper thread (both can block in
        the transport for as long as the other side is missing) while this one watches
        ``alive`` and the deadline."""
        import torch.distributed as dist

        kind = dist.ProcessGroupNCCL if self.backend == "nccl" else dist.ProcessGroupGloo
        probe = torch.zeros(1, dtype=torch.uint8, device=self._probe_device())
        setup = _Setup(lambda: kind(store, rank, 2, options), probe)
        while not setup.finished.wait(0.01):
            failure = _failure(alive, deadline, "before the weight link was set up")
            if failure is not None:
                self.group = setup.take()
                self.abort()
                raise failure
        self.group = setup.take()
        if setup.error is not None:
            self.abort()
            raise ConnectionError(f"the weight link could not be set up: {setup.error}")

    def _probe_device(self) -> str:
        return self.device if self.backend == "nccl" else "cpu"

    def send(
        self, bucket: torch.Tensor, alive: Callable[[], bool], deadline: float = math.inf
    ) -> None:
        """Broadcast one bucket to the worker; raises ``ConnectionError`` when the worker dies
        (``alive`` turns False, or the transport reports the peer gone) before it has it, and
        ``TimeoutError`` when it does not have it by ``deadline`` (``time.monotonic()``)."""
        if self.group is None:
            raise ConnectionError("the rollout worker's weight link was aborted")
        self._pending = self.group.broadcast(bucket, 0)
        self._wait(self._pending, alive, deadline)
        self._pending = None

    def receive(self, size: int) -> torch.Tensor:
        """The next bucket (``size`` bytes) from the trainer."""
        bucket = torch.empty(size, dtype=torch.uint8, device=self.device)
        self.group.broadcast(bucket, 0).wait()
        return bucket

    def abort(self) -> None:
        """End the link for good, on every failure: NCCL's communicators are aborted (its
        pending work cannot be cancelled otherwise, and its watchdog would end this process at
        the group's timeout). The group is released by a thread of its own once its pending
        send has ended (gloo's ends when the peer's process does, or at the group's timeout):
        released before, a gloo group waits for it holding the interpreter's lock. A restarted
        worker opens a new link."""
        group, pending, self.group, self._pending = self.group, self._pending, None, None
        if group is None:
            return
        try:
            group.abort()
        except Exception:  # noqa: BLE001, S110 (already broken: nothing more to end)
            pass
        threading.Thread(
            target=_release, args=(group, pending), name="weight-link-end", daemon=True
        ).start()

    @staticmethod
    def _wait(work, alive: Callable[[], bool], deadline: float = math.inf) -> None:
        while not work.is_completed():
            failure = _failure(alive, deadline, "during a weight push")
            if failure is not None:
                raise failure
            time.sleep(0.002)
        try:
            work.wait()
        except RuntimeError as exc:  # gloo: "Connection closed by peer"
            raise ConnectionError(f"the rollout worker's link broke: {exc}") from exc


def _failure(alive: Callable[[], bool], deadline: float, when: str) -> OSError | None:
    """Why a wait on the link ends now (``when``: during what), or None: it goes on."""
    if not alive():
        return ConnectionError(f"the other side of the weight link died {when}")
    if time.monotonic() > deadline:
        return TimeoutError(f"the other side of the weight link did not answer {when} in time")
    return None


class _Setup:
    """A link's group built, and its first broadcast completed, in a thread of its own. The
    group is the waiting thread's once it takes it (:meth:`take`): a setup given up on then
    ends a group it builds later itself, so no reference is left in the waiting thread's
    frames (gloo's group waits for its pending work when released)."""

    def __init__(self, make: Callable[[], object], probe: torch.Tensor) -> None:
        self.make, self.probe = make, probe
        self.group, self.error, self.given_up = None, None, False
        self.finished = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="weight-link-setup", daemon=True).start()

    def _run(self) -> None:
        try:
            group = self.make()
            with self._lock:
                if self.given_up:
                    group.abort()
                    return
                self.group = group
            group.broadcast(self.probe, 0).wait()
        except Exception as exc:  # noqa: BLE001 (reported by the waiting thread)
            self.error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        finally:
            self.finished.set()

    def take(self):
        """The group (None if not built yet); nothing of it is left here."""
        with self._lock:
            self.given_up = True
            group, self.group = self.group, None
        return group


def _always() -> bool:
    return True


def _release(group, pending) -> None:
    """Drop the last reference to an aborted group once its ``pending`` work (if any) has
    ended; ``wait`` lets go of the interpreter's lock meanwhile."""
    if pending is not None:
        with contextlib.suppress(Exception):
            pending.wait()
    del group


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
