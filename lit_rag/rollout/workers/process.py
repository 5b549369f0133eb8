"""A rollout worker process (docs/DESIGN.md, "Rollout workers").

The trainer rank that owns a worker (:class:`~lit_rag.rollout.workers.pool.WorkerPool`) starts
it with :func:`main` (``spawn``), hands it the recipe's environment and engine, and then talks to
it through two queues and one weight link (:mod:`~lit_rag.rollout.workers.transport`); the
messages are :mod:`~lit_rag.rollout.workers.messages`:

- in: a ``Job`` (a batch of examples to roll out), ``Push(version)`` followed by one ``Bucket``
  per bucket and ``PushEnd``, ``Stop``;
- out: ``Ready``, ``Finished`` (a pickled ``Done``), ``Failed`` (the error as one line).

:class:`WorkerProcess` is the worker's side. Jobs run in order, one at a time, each a whole
``Environment.rollout`` (retrieval included) on the worker's own engine. Pushed weights are
applied as soon as they arrive, between two of the engine's steps (``RolloutEngine.step_hook``),
also in the middle of a job: requests in flight go on under the new weights, as AReaL's partial
rollouts do. Every generation therefore carries the ``(first, last)`` versions it was sampled
under (:class:`VersionedEngine`), and so does each segment of a trajectory
(``Trajectory.versions``). Its sampling log-probs are per token, each computed by the weights
that drew the token, so the trainer's importance-sampling correction stays exact for a segment
that spans versions; the staleness of a trajectory counts from its oldest segment. A push is
loaded as it arrives, bucket by bucket, all within one ``step_hook`` call: no engine step runs
between two of its buckets, so it is applied as one version.

A worker never outlives its trainer (:func:`watch_parent`): an orphan would wait forever
holding its GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from lit_rag.rng import restore_rng_states, rng_states, seed_all
from lit_rag.rollout.base import Generation, RolloutEngine, SamplingParams
from lit_rag.rollout.workers.messages import (
    Bucket,
    Done,
    Failed,
    Finished,
    Job,
    Push,
    Ready,
    Stop,
)
from lit_rag.rollout.workers.transport import WeightLink, unpack


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process starts from (pickled to it)."""

    index: int
    payload: bytes  # the recipe's (environment, engine), pickled before either started
    tokenizer: object  # the policy's
    model_path: str
    port: int
    backend: str = "gloo"
    device: str = "cpu"
    cores: tuple[int, ...] = ()
    timeout_s: float = 600.0  # the weight link's
    seed: int = 0  # the engine's seed where the recipe sets none
    parent: int = 0  # the trainer's pid (0: not watched)


def main(spec: WorkerSpec, inbox, outbox) -> None:
    """The worker process: start, say ready, serve until told to stop (or until its trainer
    dies)."""
    watch_parent(spec.parent, f"rollout worker {spec.index}")
    try:
        worker = WorkerProcess(spec, inbox, outbox)
    except BaseException as exc:  # noqa: BLE001 (reported to the trainer in one line)
        outbox.put(Failed(spec.index, _one_line(exc)))
        return
    try:
        worker.run()
    except BaseException as exc:  # noqa: BLE001
        outbox.put(Failed(spec.index, _one_line(exc)))
        raise


class WorkerProcess:
    """One worker's state: its engine, its link to the trainer and the policy version it holds."""

    def __init__(self, spec: WorkerSpec, inbox, outbox) -> None:
        self.spec, self.inbox, self.outbox = spec, inbox, outbox
        self.version = -1  # no pushed weights yet
        self.pending: deque = deque()  # jobs that arrived while another one ran
        self.stopping = False
        _pin(spec.cores)
        self.environment, self.engine = pickle.loads(spec.payload)
        if self.engine.seed is None:
            self.engine.seed = spec.seed
        self.environment.setup()
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(spec.model_path)
        self.engine.serve(spec.tokenizer, spec.model_path, config)
        self.engine.step_hook = self.poll
        dtype = str(self.engine.weight_dtype()).removeprefix("torch.")
        outbox.put(Ready(spec.index, dtype))
        # then the link (the trainer opens its side once it knows this worker started)
        self.link = WeightLink(
            spec.port, is_trainer=False, backend=spec.backend, timeout_s=spec.timeout_s,
            device=spec.device, alive=lambda: parent_alive(spec.parent),
        )  # fmt: skip

    def run(self) -> None:
        while not self.stopping:
            message = self.pending.popleft() if self.pending else self.inbox.get()
            self.handle(message)

    def handle(self, message: object) -> None:
        match message:
            case Job():
                self.run_job(message)
            case Push(version=version):
                self.receive(version)
            case Stop():
                self.stopping = True

    def poll(self) -> None:
        """Between engine steps: apply pushed weights now; keep jobs for later."""
        while True:
            try:
                message = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(message, Job):
                self.pending.append(message)
            else:
                self.handle(message)

    def receive(self, version: int) -> None:
        """A push, loaded as it arrives: the engine reads each bucket's tensors as soon as that
        bucket is in, and the next one is received when it asks for more, so this process holds
        about one bucket beside the engine's weights (never a second copy of them). The whole
        push is applied here, as one version."""
        pushed = self._pushed()
        self.engine.receive_weights(pushed)
        for _ in pushed:  # what the engine left unread still arrives: the next push starts clean
            pass
        self.version = version

    def _pushed(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The push's tensors, each bucket received when the one before has been read."""
        while isinstance(message := self.inbox.get(), Bucket):  # then PushEnd
            yield from unpack(message.entries, self.link.receive(message.size))

    def run_job(self, job: Job) -> None:
        started = time.perf_counter()
        if job.rng is not None:
            restore_rng_states(job.rng)
        else:
            seed_all(job.seed)
        engine = VersionedEngine(self.engine, self)
        if job.group_size is None:
            trajectories = self.environment.validation_rollout(job.examples, engine, job.params)
        else:
            trajectories = self.environment.rollout(
                job.examples, engine, job.group_size, job.params
            )
        self.engine.idle()
        for t in trajectories:  # an environment that records no segments: the job's span
            if not t.versions:
                t.versions = [(engine.first_version, self.version)]
        rng = rng_states() if job.rng is not None else None
        seconds = time.perf_counter() - started
        # by value: a tensor shared through a file descriptor is lost if this process dies
        # before the trainer reads it
        done = pickle.dumps(Done(job.id, trajectories, seconds, rng))
        self.outbox.put(Finished(self.spec.index, done))


class VersionedEngine(RolloutEngine):
    """The worker's engine as the environment sees it: every generation it returns carries the
    ``(first, last)`` policy versions it was sampled under (:attr:`Generation.versions`)."""

    def __init__(self, inner: RolloutEngine, worker: WorkerProcess) -> None:
        self.inner, self.worker = inner, worker
        self.tokenizer = inner.tokenizer
        self.batches_continuously = inner.batches_continuously
        self.first_version = worker.version
        self._started: dict[int, int] = {}

    def context_window(self) -> int | None:
        return self.inner.context_window()

    def submit(self, prompt: list[int], params: SamplingParams) -> int:
        ticket = self.inner.submit(prompt, params)
        self._started[ticket] = self.worker.version
        return ticket

    def collect(self) -> list[tuple[int, Generation]]:
        return [
            (t, replace(g, versions=(self._started.pop(t), self.worker.version)))
            for t, g in self.inner.collect()
        ]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        return self.generate_by_collect(prompts, params)

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        with self.inner.generating():
            yield


def watch_parent(parent: int, name: str, poll_s: float = 0.5) -> None:
    """End this process at once (``os._exit``: no cleanup that could wait on the dead trainer,
    and the GPU is freed) when ``parent``, the trainer that spawned it, dies, even by
    SIGKILL. On Linux the kernel sends SIGKILL (``prctl(PR_SET_PDEATHSIG)``; it fires when the
    parent's spawning thread ends, and the training loop spawns from its main thread);
    everywhere a thread compares ``os.getppid()`` with ``parent`` every ``poll_s``. 0: not
    watched."""
    if not parent:
        return
    _kill_with_parent()
    if not parent_alive(parent):  # it died before the signal was set
        _orphaned(parent, name)

    def watch() -> None:
        while parent_alive(parent):
            time.sleep(poll_s)
        _orphaned(parent, name)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def parent_alive(parent: int) -> bool:
    """Whether this process's parent is still ``parent`` (an orphan's is another: init, or a
    subreaper); 0: not watched."""
    return not parent or os.getppid() == parent


#: prctl's option (linux/prctl.h)
_PR_SET_PDEATHSIG = 1


def _kill_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies; elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _orphaned(parent: int, name: str) -> None:
    print(f"lit-rag: {name}: its trainer (pid {parent}) is gone; exiting", file=sys.stderr)
    sys.stderr.flush()
    os._exit(1)


def _pin(cores: tuple[int, ...]) -> None:
    """Keep this process (vLLM's OpenMP threads included) on ``cores``; none: as started."""
    if not cores:
        return
    os.sched_setaffinity(0, set(cores))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cores)
    torch.set_num_threads(len(cores))


def _one_line(exc: BaseException) -> str:
    """An exception as one line: its type, message and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}{where}"
