"""Rollout in separate worker processes (docs/DESIGN.md, "Rollout workers").

``model.rollout.workers: N`` moves rollout out of the training processes: N processes, each with
its own copy of the recipe's engine (``vllm``) and environment, generate whole trajectories and
hand them back with the policy version they were sampled under. After every optimizer step the
trainer pushes the new weights to them (:mod:`~lit_rag.rollout.workers.transport`). With
``max_staleness: k`` the workers may run up to k batches ahead of the trainer (k = 0: the
colocated order, rollout then update; 1: verl's one-step-off; more: asynchronous), and a sample
older than k versions is dropped or regenerated (``stale``). :class:`WorkerPool` is the
trainer side, a rank's set of worker processes
(:class:`~lit_rag.rollout.workers.process.WorkerProcess` each): it starts them, splits batches
into jobs, collects results, restarts a worker that dies and never counts a job twice.

Placement. The workers are split evenly over the training ranks (``workers`` must be a multiple
of them); each rank starts and feeds its own. On CPU with one training process the workers take
``cores_per_worker`` cores each from the end of the process's CPU set and the trainer keeps the
rest. On GPUs (the strategy's root device, not a parameter's: FSDP's ``cpu_offload`` keeps those
on the CPU) a rank's workers take the GPUs after the node's training ranks: local rank r's j-th
worker gets the ``local_world_size + r * per_rank + j``-th GPU this process sees, an index into
its own ``CUDA_VISIBLE_DEVICES`` when that is set (:func:`worker_gpus`). A worker's
environment is the trainer's with its GPU as ``CUDA_VISIBLE_DEVICES`` (:func:`child_environ`).

Faults. A worker that dies, that finishes no job within ``job_timeout_s`` (a stalled engine, a
retriever without a timeout), or that has not received a whole push within ``push_timeout_s``
is ended (its weight link aborted; the process terminated, killed after a grace period, joined)
and started again with its unfinished jobs, up to ``max_restarts`` in a run. A worker that dies
before its weight link is set up did not start. A worker exits by itself when its trainer dies.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from lit_rag.errors import InputError
from lit_rag.rng import restore_rng_states, rng_states
from lit_rag.rollout.base import Placement, SamplingParams
from lit_rag.rollout.weights import checkpoint_weights, is_zero3
from lit_rag.rollout.workers.messages import (
    Bucket,
    Done,
    Failed,
    Finished,
    Job,
    Push,
    PushEnd,
    Ready,
    Stop,
)
from lit_rag.rollout.workers.process import WorkerSpec, main
from lit_rag.rollout.workers.transport import WeightLink, buckets, listen
from lit_rag.types import Example, Trajectory

STALE = ("regenerate", "drop")
ON_FAULT = ("restart", "stop")
#: how much longer a weight link's collectives may wait than any deadline the trainer sets on
#: them, so the trainer's deadline (which aborts the link) always comes before NCCL's watchdog
LINK_GRACE_S = 60.0


@dataclass
class RolloutSettings:
    """Where rollouts run (``model.rollout`` in a recipe).

    Args:
        workers: Rollout worker processes, each with its own engine; 0: the engine runs in the
            training process (colocated). A multiple of the training ranks.
        max_staleness: Most policy versions a trained sample may lag the trainer's (0: every
            sample comes from the current weights; 1: one-step-off).
        prefetch: Batches the workers may start ahead of the trainer; default ``max_staleness``,
            at most that (a batch sent further ahead is always too old when it is trained).
        stale: ``regenerate`` (a group with a sample older than the bound is sampled again from
            the current weights) or ``drop`` (the step trains on the other groups; a step left
            with none regenerates).
        on_fault: ``restart`` a worker that dies (its unfinished jobs run again on the new one)
            or ``stop`` the run with a checkpoint of the last update.
        max_restarts: Restarts allowed in a run (a resumed run gets the whole budget again)
            before a fault stops it.
        cores_per_worker: CPU cores each worker takes (CPU, one training process).
        bucket_mib: Largest piece of a weight push.
        backend: The weight link's transport: ``auto`` (``nccl`` on GPUs, else ``gloo``),
            ``gloo`` or ``nccl``.
        timeout_s: How long a worker may take to start (its weight link set up included).
        push_timeout_s: How long the trainer waits, in all, for a worker to receive a whole
            weight push (every bucket); past it the worker is stuck and is ended and restarted
            as a dead one is (its link aborted). ``null``: ``timeout_s``.
        job_timeout_s: How long a worker may work on its jobs without finishing one; past it the
            worker is stuck (a stalled engine, a retriever without a timeout) and is ended and
            restarted as a dead one is. ``null``: no deadline.
    """

    workers: int = 0
    max_staleness: int = 0
    prefetch: int | None = None
    stale: str = "regenerate"
    on_fault: str = "restart"
    max_restarts: int = 3
    cores_per_worker: int = 1
    bucket_mib: float = 512.0
    backend: str = "auto"
    timeout_s: float = 900.0
    push_timeout_s: float | None = None
    job_timeout_s: float | None = 3600.0

    def __post_init__(self) -> None:
        problems = []
        if self.workers < 0 or self.max_staleness < 0 or self.max_restarts < 0:
            problems.append("workers, max_staleness and max_restarts must be >= 0")
        if self.prefetch is not None and self.prefetch < 0:
            problems.append(f"prefetch must be >= 0 or null, got {self.prefetch}")
        elif self.prefetch is not None and self.prefetch > self.max_staleness >= 0:
            # a batch sent further ahead than the bound is always too old when it is trained
            problems.append(
                f"prefetch {self.prefetch} is above max_staleness {self.max_staleness}: every "
                f"batch sent that far ahead would be regenerated; allowed: prefetch 0 to "
                f"{self.max_staleness} or null"
            )
        if self.stale not in STALE:
            problems.append(f"stale '{self.stale}' is not known; allowed: {', '.join(STALE)}")
        if self.on_fault not in ON_FAULT:
            problems.append(
                f"on_fault '{self.on_fault}' is not known; allowed: {', '.join(ON_FAULT)}"
            )
        if self.backend not in ("auto", "gloo", "nccl"):
            problems.append(f"backend '{self.backend}' is not known; allowed: auto, gloo, nccl")
        if self.cores_per_worker < 1 or self.bucket_mib <= 0:
            problems.append("cores_per_worker must be >= 1 and bucket_mib > 0")
        problems.extend(self._timeout_problems())
        if problems:
            raise InputError(f"model rollout: {'; '.join(problems)}")

    def _timeout_problems(self) -> list[str]:
        problems = [f"timeout_s must be > 0, got {self.timeout_s}"] if self.timeout_s <= 0 else []
        for key in ("push_timeout_s", "job_timeout_s"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                problems.append(f"{key} must be > 0 or null, got {value}")
        return problems

    @property
    def ahead(self) -> int:
        """Batches the workers may start ahead of the trainer."""
        return self.max_staleness if self.prefetch is None else self.prefetch

    @property
    def push_deadline_s(self) -> float:
        """How long a whole weight push may take (``push_timeout_s``, else ``timeout_s``)."""
        return self.timeout_s if self.push_timeout_s is None else self.push_timeout_s

    @property
    def link_timeout_s(self) -> float:
        """The weight link's own timeout: :data:`LINK_GRACE_S` past the longest the trainer
        waits on it (to start, for a push)."""
        return max(self.timeout_s, self.push_deadline_s) + LINK_GRACE_S


class WorkerFault(RuntimeError):
    """A worker died and the run stops (``on_fault: stop``, or restarts used up)."""


@dataclass
class _Slot:
    """One worker as its trainer rank sees it."""

    index: int
    process: object = None
    inbox: object = None
    link: WeightLink | None = None
    jobs: list[int] = field(default_factory=list)  # job ids sent and not answered
    busy_since: float | None = None  # when it last had no job, or last finished one
    store: object = None  # the trainer side of the link's store, listening from the spawn on
    dtype: torch.dtype = torch.float32


@dataclass(frozen=True)
class _Launch:
    """What every worker of a rank starts from (its own cores, GPU and seed picked from
    these by its index)."""

    model_path: str
    backend: str
    cores: list[list[int]]  # per worker; none: not pinned
    gpus: list[str]  # per worker, as CUDA_VISIBLE_DEVICES names it; none: the CPU
    seed: int  # the first worker's
    tokenizer: object


@dataclass
class Batch:
    """A batch's trajectories and what they cost."""

    trajectories: list[Trajectory]
    worker_seconds: float = 0.0
    wait_seconds: float = 0.0


class WorkerPool:
    """The trainer side of a rank's rollout worker processes.

    Args:
        settings: ``model.rollout``.
        payload: ``(environment, engine)`` pickled as the recipe built them.
    """

    def __init__(self, settings: RolloutSettings, payload: bytes) -> None:
        self.settings, self.payload = settings, payload
        self.version = 0  # policy versions pushed: optimizer steps that moved the weights
        self.restarts = 0  # in this run: what max_restarts bounds
        self.earlier_restarts = 0  # in the runs this one resumed (a checkpoint's count)
        self.slots: list[_Slot] = []
        self._model = None
        self._started = False
        self._outbox = None
        self._context = None
        self._jobs: dict[int, tuple[int, Job]] = {}  # job id -> (slot index, job)
        self._results: dict[int, Done] = {}
        self._next_job = 0
        self._launch: _Launch | None = None
        self._errors: dict[int, str] = {}  # worker index -> the line its death left
        self._ready: dict[int, str] = {}  # worker index -> its dtype, said before it was awaited
        self._sharded = False  # FSDP / ZeRO-3: pushes gather on every rank together
        self._device = torch.device("cpu")  # the training process's (buckets are sent from it)

    # ---- lifecycle -----------------------------------------------------------------------
    def start(
        self,
        model: torch.nn.Module,
        tokenizer: object,
        model_path: str,
        placement: Placement,
        seed: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        """Start this rank's workers and push ``model``'s weights to them (a collective with a
        sharded policy: every rank calls it). ``seed``: the engine's (each worker adds its
        index to it, each job its id). ``device``: the training process's own (the strategy's
        root device), which says whether the workers take GPUs."""
        import torch.multiprocessing as mp
        from torch.distributed.fsdp import FullyShardedDataParallel

        world = placement.world_size
        if self.settings.workers % world:
            raise InputError(
                f"model rollout workers {self.settings.workers} must be a multiple of the "
                f"training processes ({world}); allowed: {world}, {2 * world}, {3 * world}, ..."
            )
        per_rank = self.settings.workers // world
        self._device = torch.device(device)
        cuda = self._device.type == "cuda"
        backend = self.settings.backend
        if backend == "auto":
            backend = "nccl" if cuda else "gloo"
        self._model = model
        self._sharded = is_zero3(model) or any(
            isinstance(m, FullyShardedDataParallel) for m in model.modules()
        )
        self._context = mp.get_context("spawn")
        self._outbox = self._context.Queue()
        cores = _split_cores(per_rank, self.settings.cores_per_worker, placement, cuda)
        gpus = worker_gpus(placement, per_rank, _visible_gpus()) if cuda else []
        self._launch = _Launch(
            model_path, backend, cores, gpus, seed + placement.rank * per_rank, tokenizer
        )
        self.slots = [_Slot(j) for j in range(per_rank)]
        self._ready.clear()
        try:
            for slot in self.slots:
                self._spawn(slot)
            for slot in self.slots:
                self._await_ready(slot)
        except WorkerFault as exc:  # the recipe's engine or environment cannot start there
            self.close()
            raise InputError(str(exc)) from None
        self._started = True
        self.push(self.version)

    @property
    def started(self) -> bool:
        return self._started

    def close(self) -> None:
        """Stop the workers (politely, then for good) and end their links."""
        for slot in self.slots:
            if slot.process is not None and slot.process.is_alive():
                slot.inbox.put(Stop())
        for slot in self.slots:
            if slot.process is not None:
                slot.process.join(timeout=10)
                end_process(slot.process)
            _end_link(slot)
        self.slots, self._started = [], False

    def _spawn(self, slot: _Slot) -> None:
        launch = self._launch
        store = listen(self.settings.timeout_s)
        cores = launch.cores[slot.index] if launch.cores else ()
        gpu = launch.gpus[slot.index] if launch.gpus else None
        worker = WorkerSpec(
            index=slot.index,
            payload=self.payload,
            tokenizer=launch.tokenizer,
            model_path=launch.model_path,
            port=store.port,
            backend=launch.backend,
            device="cuda" if gpu is not None else "cpu",
            cores=tuple(cores),
            timeout_s=self.settings.link_timeout_s,
            seed=launch.seed + slot.index,
            parent=os.getpid(),
        )
        slot.inbox = self._context.Queue()
        slot.busy_since = None
        self._ready.pop(slot.index, None)
        # a spawned child starts with this process's environment as it is at start(): set
        # before it imports anything (torch and vLLM read theirs at import or first use)
        with environment(child_environ(gpu)):
            slot.process = self._context.Process(
                target=main, args=(worker, slot.inbox, self._outbox), name=f"rollout-{slot.index}"
            )
            slot.process.start()
        slot.store = store

    def _await_ready(self, slot: _Slot) -> None:
        """Wait for ``slot``'s worker to say it is ready, then set up its weight link (both
        sides complete one transfer); another worker's ``Ready`` read meanwhile is kept for
        its own turn."""
        deadline = time.monotonic() + self.settings.timeout_s
        while time.monotonic() < deadline:
            if slot.index not in self._ready:
                self._receive(0.5)
            if slot.index in self._ready:
                slot.dtype = getattr(torch, self._ready.pop(slot.index))
                self._connect(slot, deadline)
                return
            if not slot.process.is_alive():
                break
        raise WorkerFault(f"rollout worker {slot.index} did not start: {self._last_error(slot)}")

    def _connect(self, slot: _Slot, deadline: float) -> None:
        """The trainer's side of ``slot``'s link, once its worker is up (it connects next); a
        worker that dies first, or has not connected by ``deadline``, did not start."""
        process = slot.process
        try:
            slot.link = WeightLink(
                slot.store.port, is_trainer=True, backend=self._launch.backend,
                timeout_s=self.settings.link_timeout_s, device=str(self._device),
                store=slot.store, alive=process.is_alive,
                setup_s=max(deadline - time.monotonic(), 1.0),
            )  # fmt: skip
        except OSError as exc:  # ConnectionError, TimeoutError (the link is aborted)
            process.join(timeout=1.0)  # one that died: its exit code
            if process.exitcode is not None:
                why = self._last_error(slot)
            elif isinstance(exc, TimeoutError):
                why = f"its weight link was not set up in timeout_s={self.settings.timeout_s:g} s"
            else:
                why = str(exc)
            raise WorkerFault(f"rollout worker {slot.index} did not start: {why}") from None

    # ---- weights -------------------------------------------------------------------------
    def push(self, version: int) -> float:
        """Send the policy's weights, as policy ``version``, to every worker; the seconds it
        took. A worker that dies meanwhile, or has not received them within
        ``push_timeout_s``, is handled as any fault."""
        started = time.perf_counter()
        self.version = version
        failed = self._send_weights([s for s in self.slots if s.process.is_alive()])
        for slot in self.slots:
            if slot.index in failed or not slot.process.is_alive():
                self._fault(slot, late=failed.get(slot.index))
        return time.perf_counter() - started

    def _send_weights(self, slots: list[_Slot]) -> dict[int, str | None]:
        """Stream the policy's weights (one walk over them) to ``slots``, each waited for at
        most ``push_timeout_s`` in all (the time spent on the others' buckets is not its own);
        the workers whose push failed, each with why it is late (None: it died or its link
        broke). A failed worker's link is aborted and it gets no more buckets."""
        limit = self.settings.push_deadline_s
        left = {slot.index: limit for slot in slots}  # seconds each worker may still take
        for slot in slots:
            slot.inbox.put(Push(self.version))
        dtype = slots[0].dtype if slots else torch.float32
        device = self._device  # NCCL sends from the training process's GPU
        failed: dict[int, str | None] = {}
        for entries, bucket in buckets(
            checkpoint_weights(self._model), dtype, self.settings.bucket_mib, device
        ):
            for slot in slots:
                if slot.index in failed:
                    continue
                slot.inbox.put(Bucket(entries, bucket.numel()))
                sent = time.monotonic()
                try:
                    slot.link.send(bucket, slot.process.is_alive, sent + left[slot.index])
                    left[slot.index] -= time.monotonic() - sent
                except TimeoutError:
                    failed[slot.index] = f"no weight push received in push_timeout_s={limit:g} s"
                    _end_link(slot)
                except ConnectionError:
                    failed[slot.index] = None
                    _end_link(slot)
                    slot.process.join(timeout=1.0)  # its exit code, for the line that says so
        for slot in slots:
            slot.inbox.put(PushEnd())
        return failed

    # ---- jobs ----------------------------------------------------------------------------
    def submit(
        self,
        examples: list[Example],
        group_size: int | None,
        params: SamplingParams,
        seed: int,
        share_rng: bool = False,
    ) -> list[int]:
        """Split ``examples`` over the workers (whole examples, in order); the job ids.
        ``share_rng``: one worker samples from this process's random stream (the colocated
        engine's: the same samples at ``max_staleness: 0``)."""
        parts = _split(examples, len(self.slots))
        ids = []
        for slot, part in zip(self.slots, parts, strict=True):
            if not part:
                continue
            rng = rng_states() if share_rng and len(self.slots) == 1 else None
            job = Job(self._next_job, part, group_size, params, seed + self._next_job, rng)
            self._next_job += 1
            self._send(slot, job)
            ids.append(job.id)
        return ids

    def take(self, ids: list[int]) -> Batch:
        """The trajectories of jobs ``ids`` in order (waiting for them), their groups numbered
        across the jobs."""
        started = time.perf_counter()
        while any(i not in self._results for i in ids):
            message = self._receive(0.5)
            if message is None:
                self._check_alive()
                self._check_stuck()
        trajectories, seconds, offset = [], 0.0, 0
        for i in ids:
            done = self._results.pop(i)
            if done.rng is not None:
                restore_rng_states(done.rng)  # the stream goes on where the worker left it
            for t in done.trajectories:
                t.group += offset
            offset = max((t.group + 1 for t in done.trajectories), default=offset)
            trajectories.extend(done.trajectories)
            seconds = max(seconds, done.seconds)
        return Batch(trajectories, seconds, time.perf_counter() - started)

    def forget(self, ids: list[int]) -> None:
        """Jobs whose results are no longer wanted (a prefetched batch that did not come)."""
        for i in ids:
            self._results.pop(i, None)
            if i in self._jobs:
                self._jobs[i] = (self._jobs[i][0], None)

    def _send(self, slot: _Slot, job: Job) -> None:
        self._jobs[job.id] = (slot.index, job)
        if not slot.jobs:  # idle until now: its deadline starts with this job
            slot.busy_since = time.monotonic()
        slot.jobs.append(job.id)
        slot.inbox.put(job)

    def _receive(self, timeout: float):
        """The next message from any worker (results filed), or None after ``timeout``."""
        try:
            message = self._outbox.get(timeout=timeout)
        except queue.Empty:
            return None
        match message:
            case Finished(done=done):
                self._file(pickle.loads(done))
            case Failed(worker=index, error=error):
                self._errors[index] = error
            case Ready(worker=index, dtype=dtype):  # kept for _await_ready, whichever it awaits
                self._ready[index] = dtype
        return message

    def _file(self, done: Done) -> None:
        """A finished job's result, kept unless it was forgotten or answered before (by a
        worker that died after sending it)."""
        slot_index, job = self._jobs.pop(done.job, (None, None))
        if slot_index is not None:
            slot = self.slots[slot_index]
            slot.jobs.remove(done.job)
            slot.busy_since = time.monotonic()  # it finished one: the next one's deadline
        if job is not None:
            self._results[done.job] = done

    def _check_alive(self) -> None:
        for slot in self.slots:
            if not slot.process.is_alive():
                self._fault(slot)

    def _check_stuck(self) -> None:
        """A live worker with jobs that finished none within ``job_timeout_s`` is stuck."""
        limit = self.settings.job_timeout_s
        if limit is None:
            return
        now = time.monotonic()
        for slot in self.slots:
            if slot.jobs and slot.busy_since is not None and now - slot.busy_since > limit:
                self._fault(slot, f"no job finished in job_timeout_s={limit:g} s")

    def _last_error(self, slot: _Slot) -> str:
        code = slot.process.exitcode if slot.process is not None else None
        error = self._errors.get(slot.index)
        return error or f"exit code {code}"

    # ---- faults --------------------------------------------------------------------------
    def _fault(self, slot: _Slot, stuck: str | None = None, late: str | None = None) -> None:
        """A worker died (or is ``stuck`` with jobs, or ``late`` with a push: why): one line;
        end it (and its link), restart it and resend its unfinished jobs, or stop."""
        while self._receive(0.05) is not None:  # results it sent before dying count once
            pass
        if stuck is not None and not slot.jobs:  # it answered meanwhile
            return
        stuck = stuck or late
        reason = stuck or self._last_error(slot)
        # an exception in the worker's own code: it would recur
        if stuck is None and slot.index in self._errors:
            raise WorkerFault(
                f"rollout worker {slot.index} failed at policy version {self.version}: {reason}"
            )
        unfinished = [i for i in slot.jobs if self._jobs.get(i, (None, None))[1] is not None]
        settings = self.settings
        what = "is stuck" if stuck is not None else "died"
        if self._sharded:  # a push gathers on every rank together: one rank cannot restart
            raise WorkerFault(
                f"rollout worker {slot.index} {what} ({reason}) at policy version "
                f"{self.version}; a sharded policy (FSDP, ZeRO-3) cannot restart one rank's worker"
            )
        if settings.on_fault == "stop" or self.restarts >= settings.max_restarts:
            end_process(slot.process)
            _end_link(slot)
            used_up = "" if settings.on_fault == "stop" else f"; {self.restarts} restarts used up"
            raise WorkerFault(
                f"rollout worker {slot.index} {what} ({reason}) at policy version "
                f"{self.version}{used_up}"
            )
        self.restarts += 1
        print(
            f"lit-rag: rollout worker {slot.index} {what} ({reason}) at policy version "
            f"{self.version}; restarting it ({self.restarts}/{self.settings.max_restarts}), "
            f"{len(unfinished)} unfinished job(s) sent again",
            file=sys.stderr,
            flush=True,
        )
        self._errors.pop(slot.index, None)
        jobs = [self._jobs.pop(i)[1] for i in unfinished]
        slot.jobs = []
        end_process(slot.process)  # an orphan would keep its memory (and its GPU)
        _end_link(slot)  # the new worker opens a new one
        self._spawn(slot)
        self._await_ready(slot)
        if slot.index in (failed := self._send_weights([slot])):
            why = failed[slot.index] or self._last_error(slot)
            raise WorkerFault(
                f"rollout worker {slot.index} died again while it got the weights ({why}) at "
                f"policy version {self.version}"
            )
        for job in jobs:
            self._send(slot, job)

    # ---- checkpoint ----------------------------------------------------------------------
    @property
    def total_restarts(self) -> int:
        """Restarts over this run and the runs it resumed (``rollout/worker_restarts``)."""
        return self.earlier_restarts + self.restarts

    def state_dict(self) -> dict:
        return {
            "version": self.version,
            "restarts": self.total_restarts,
            "next_job": self._next_job,
        }

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's state; its restarts are counted for the log, not against this run's
        ``max_restarts``."""
        self.version = int(state.get("version", 0))
        self.earlier_restarts, self.restarts = int(state.get("restarts", 0)), 0
        self._next_job = int(state.get("next_job", 0))


def _end_link(slot: _Slot) -> None:
    """Abort ``slot``'s weight link, if it has one (every failure path, and at close)."""
    link, slot.link = slot.link, None
    if link is not None:
        link.abort()


def _split(examples: list[Example], parts: int) -> list[list[Example]]:
    """``examples`` in ``parts`` contiguous runs whose sizes differ by at most one."""
    size, extra = divmod(len(examples), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(examples[start:end])
        start = end
    return out


def worker_gpus(placement: Placement, per_rank: int, visible: list[str]) -> list[str]:
    """The GPU each of a training process's workers gets, as its ``CUDA_VISIBLE_DEVICES``: local
    rank r's j-th worker takes the ``local_world_size + r * per_rank + j``-th GPU of ``visible``
    (the GPUs this process sees: its own ``CUDA_VISIBLE_DEVICES``, else all of them).

    Example:
        >>> worker_gpus(Placement(1, 2, 1, 2), 1, ["4", "5", "6", "7"])
        ['7']
    """
    first = placement.local_world_size + placement.local_rank * per_rank
    wanted = list(range(first, first + per_rank))
    if wanted and wanted[-1] >= len(visible):
        local = placement.local_world_size
        most = max(0, (len(visible) - local) // local) * placement.world_size
        raise InputError(
            f"model rollout workers: {local} training process(es) with {per_rank} worker(s) "
            f"each need {local * (1 + per_rank)} GPUs on a node, {len(visible)} visible "
            f"({','.join(visible) or 'none'}); allowed: model.rollout.workers <= {most}"
        )
    return [visible[i] for i in wanted]


def _visible_gpus() -> list[str]:
    """The GPUs this process sees, as ``CUDA_VISIBLE_DEVICES`` names them to a child."""
    names = os.environ.get("CUDA_VISIBLE_DEVICES")
    if names is not None:
        return [n.strip() for n in names.split(",") if n.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def child_environ(gpu: str | None) -> dict[str, str]:
    """The variables a worker's environment sets over this process's: its GPU, as
    ``CUDA_VISIBLE_DEVICES`` (none on the CPU)."""
    return {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set while the block runs (a process started there
    inherits them), then as it was."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def end_process(process, grace_s: float = 5.0) -> None:
    """End ``process`` for good: terminate, kill after ``grace_s``, and join (its pid is gone
    once this returns)."""
    if process is None:
        return
    if process.is_alive():
        process.terminate()
        process.join(timeout=grace_s)
    if process.is_alive():
        process.kill()
    process.join(timeout=grace_s)


def _split_cores(
    per_rank: int, per_worker: int, placement: Placement, cuda: bool
) -> list[list[int]]:
    """CPU cores for each worker (one training process on CPU), taken from the end of this
    process's CPU set; the trainer is pinned to the rest. Elsewhere none are pinned."""
    if cuda or placement.world_size > 1 or not hasattr(os, "sched_getaffinity"):
        return []
    cores = sorted(os.sched_getaffinity(0))
    wanted = per_rank * per_worker
    if wanted >= len(cores):
        raise InputError(
            f"model rollout: {per_rank} worker(s) x {per_worker} core(s) leave no core for "
            f"the trainer ({len(cores)} cores here); allowed: workers x cores_per_worker <= "
            f"{len(cores) - 1}"
        )
    trainer = cores[: len(cores) - wanted]
    os.sched_setaffinity(0, set(trainer))
    torch.set_num_threads(len(trainer))
    mine = cores[len(cores) - wanted :]
    return [mine[i * per_worker : (i + 1) * per_worker] for i in range(per_rank)]


def payload(environment: object, engine: object) -> bytes:
    """The recipe's environment and engine as the workers receive them; one line when they
    cannot travel to another process."""
    try:
        return pickle.dumps((environment, engine))
    except Exception as exc:  # noqa: BLE001
        raise InputError(
            f"model rollout workers: the environment or engine cannot be sent to a worker "
            f"process ({type(exc).__name__}: {exc}); use model.rollout.workers: 0"
        ) from exc
