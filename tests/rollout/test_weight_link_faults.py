"""The weight link's faults, on gloo through the code NCCL runs (``transport.py``, ``pool.py``,
``process.py``), with real spawned processes: the group's options carry the link's timeout; a
worker that dies before the link is set up, or between two buckets of a push, and one that
stalls in a push, each end in the pool's one line within seconds, never in a wait on the
transport; a worker exits when its trainer is SIGKILLed; a push is loaded bucket by bucket.
Every wait here is bounded. NCCL itself needs a GPU: ``test_nccl_options_carry_the_timeout``
runs where torch has it, and the GPU smoke script kills a worker mid-push over NCCL."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
from collections import deque
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from fake_workers import FakeWorkerEngine

from lit_rag.errors import InputError
from lit_rag.rollout.base import Placement
from lit_rag.rollout.workers import pool as pool_module
from lit_rag.rollout.workers import process as process_module
from lit_rag.rollout.workers.messages import Bucket, PushEnd
from lit_rag.rollout.workers.pool import RolloutSettings, WorkerFault, WorkerPool, payload
from lit_rag.rollout.workers.process import WorkerProcess, WorkerSpec
from lit_rag.rollout.workers.transport import WeightLink, buckets, group_options, listen

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture(scope="module", autouse=True)
def link_threads_end():
    """A link given up on leaves its setup thread in the transport until the group's timeout
    (kept short here); it is waited for before the tests end, so none returns while the
    interpreter shuts down."""
    yield
    deadline = time.monotonic() + 60
    for thread in threading.enumerate():
        if thread.name.startswith("weight-link"):
            thread.join(max(deadline - time.monotonic(), 0))


# ---- (a) the group's options -----------------------------------------------------------------
def test_gloo_options_carry_the_timeout() -> None:
    options = group_options("gloo", 90)
    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, options)  # a group of one: no peer
    assert group.options._timeout == datetime.timedelta(seconds=90)


class StandInNcclOptions:
    """FAKE ``ProcessGroupNCCL.Options`` (the CPU build of torch has no NCCL): the two fields
    :func:`group_options` sets, at NCCL's defaults (10 minutes, a high-priority stream)."""

    def __init__(self) -> None:
        self._timeout = datetime.timedelta(minutes=10)
        self.is_high_priority_stream = True


def test_nccl_options_carry_the_timeout_on_cpu() -> None:
    options = group_options("nccl", 960, StandInNcclOptions)
    assert options._timeout == datetime.timedelta(seconds=960)
    assert options.is_high_priority_stream is False  # as init_process_group builds NCCL's


@pytest.mark.skipif(not dist.is_nccl_available(), reason="torch is built without NCCL")
def test_nccl_options_carry_the_timeout() -> None:
    assert group_options("nccl", 960)._timeout == datetime.timedelta(seconds=960)


def test_the_link_timeout_comes_after_every_deadline_the_trainer_sets() -> None:
    """The link's own timeout is the longest wait (start: timeout_s; a push: push_timeout_s,
    else timeout_s) plus 60 s: 900 + 60 = 960; with a 1200 s push, 1200 + 60 = 1260."""
    assert RolloutSettings(timeout_s=900).link_timeout_s == 960
    assert RolloutSettings(timeout_s=900).push_deadline_s == 900
    assert RolloutSettings(timeout_s=900, push_timeout_s=1200).link_timeout_s == 1260
    with pytest.raises(InputError, match="push_timeout_s must be > 0 or null, got 0"):
        RolloutSettings(push_timeout_s=0)


# ---- the link alone, with a real peer process --------------------------------------------------
def _never_connects() -> None:
    time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)


def _connects_then_stalls(port: int) -> None:
    link = WeightLink(port, is_trainer=False, timeout_s=60)
    time.sleep(120)
    del link


def test_a_peer_that_dies_before_the_setup_ends_it_within_a_poll() -> None:
    """(b) The peer dies before it connects: the setup raises as soon as it is gone (gloo's
    own wait would last the group's 20 s timeout)."""
    store = listen(20)
    child = SPAWN.Process(target=_never_connects)
    child.start()
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="died before the weight link was set up"):
        WeightLink(store.port, is_trainer=True, timeout_s=20, store=store, alive=child.is_alive)
    assert time.monotonic() - started < 15  # its start (a torch import) and 1 s, not 20 s
    child.join(timeout=10)


def test_a_push_to_a_stalled_peer_ends_at_its_deadline_and_the_link_is_aborted() -> None:
    """(d) The peer set the link up and never receives: the send raises at its deadline (2 s),
    and aborting the link returns at once though gloo's transfer is still pending."""
    store = listen(60)
    child = SPAWN.Process(target=_connects_then_stalls, args=(store.port,))
    child.start()
    try:
        link = WeightLink(store.port, is_trainer=True, timeout_s=60, store=store)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            link.send(torch.ones(1 << 20, dtype=torch.uint8), child.is_alive, started + 2)
        assert 2 <= time.monotonic() - started < 5
        started = time.monotonic()
        link.abort()
        assert time.monotonic() - started < 1 and link.group is None
        with pytest.raises(ConnectionError, match="aborted"):
            link.send(torch.ones(1, dtype=torch.uint8), child.is_alive)
    finally:
        child.kill()
        child.join(timeout=10)


# ---- a rank's pool around a fake engine -------------------------------------------------------
class LinkFaultEngine(FakeWorkerEngine):
    """FAKE engine (a real vLLM cannot die or stall on cue): at its ``at_push``-th push (the
    first is the pool's start) it reads the first pushed tensor and is SIGKILLed
    (``fault="die"``), or reads nothing and never returns (``"stall"``)."""

    def __init__(self, at_push: int = 0, fault: str = "") -> None:
        super().__init__()
        self.at_push, self.fault = at_push, fault

    def receive_weights(self, weights) -> None:
        self.pushes += 1
        weights = iter(weights)
        if self.pushes == self.at_push and self.fault == "die":
            next(weights)  # the first bucket is in, the second is not
            os.kill(os.getpid(), signal.SIGKILL)
        if self.pushes == self.at_push and self.fault == "stall":
            time.sleep(3600)
        for _ in weights:
            pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny model's folder (what a worker reads its config from) and its tokenizer."""
    from helpers import tiny_model_folder

    from lit_rag.models.loading import ModelConfig, TinyConfig, load_tokenizer

    tiny = TinyConfig(hidden_size=32, num_layers=2, num_heads=2)
    folder = tiny_model_folder(tmp_path_factory.mktemp("served"), tiny)
    return folder, load_tokenizer(ModelConfig(tiny=tiny))


def _start(served, settings: RolloutSettings, engine, device: str = "cpu") -> WorkerPool:
    """Rank 0 of 2 training processes (no core is pinned) with one worker, started on a
    ``Linear(2, 2)``'s weights: with ``bucket_mib`` 1e-5 (10 bytes) its weight (16 bytes)
    and its bias (8 bytes) are two buckets. ``cuda``: one training process on GPU 0, its
    worker on GPU 1."""
    from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment

    folder, tokenizer = served
    workers = WorkerPool(settings, payload(SingleTurnEnvironment(), engine))
    placement = Placement(0, 2, 0, 2) if device == "cpu" else Placement(0, 1, 0, 1)
    model = torch.nn.Linear(2, 2).to(device)
    workers.start(model, tokenizer, folder, placement, seed=0, device=device)
    return workers


def _settings(**kwargs) -> RolloutSettings:
    return RolloutSettings(**{"workers": 2, "timeout_s": 60, "bucket_mib": 1e-5, **kwargs})


def test_two_buckets_per_push() -> None:
    model = torch.nn.Linear(2, 2)
    assert len(list(buckets(model.state_dict().items(), torch.float32, 1e-5))) == 2


def test_a_worker_killed_before_its_link_is_set_up_did_not_start(served, monkeypatch) -> None:
    """(b) The worker is SIGKILLed as the trainer starts its side of the link: the start ends
    in the pool's one line within seconds (the link's 20 + 1 s timeout is not waited for)."""
    killed = []

    def kill_first(*args, alive, **kwargs):
        os.kill(alive.__self__.pid, signal.SIGKILL)
        killed.append(time.monotonic())
        return WeightLink(*args, alive=alive, **kwargs)

    monkeypatch.setattr(pool_module, "WeightLink", kill_first)
    monkeypatch.setattr(pool_module, "LINK_GRACE_S", 1.0)
    with pytest.raises(InputError) as error:
        _start(served, _settings(on_fault="stop", timeout_s=20), LinkFaultEngine())
    assert time.monotonic() - killed[0] < 5
    assert str(error.value) == "rollout worker 0 did not start: exit code -9"


def test_a_worker_killed_between_two_buckets_stops_the_push(served) -> None:
    """(c) The worker reads the push's first bucket and is SIGKILLed: the push ends in the
    one-line stop well within its 30 s deadline."""
    workers = _start(
        served, _settings(on_fault="stop", push_timeout_s=30), LinkFaultEngine(2, "die")
    )
    try:
        started = time.monotonic()
        with pytest.raises(WorkerFault) as fault:
            workers.push(1)
        assert time.monotonic() - started < 10
        assert str(fault.value) == "rollout worker 0 died (exit code -9) at policy version 1"
        assert workers.slots[0].link is None  # aborted
    finally:
        workers.close()


def test_a_stalled_push_stops_at_its_deadline(served) -> None:
    """(d) The worker is alive and never reads the push: after push_timeout_s (2 s) its link is
    aborted and the run stops, in one line naming the worker and the deadline."""
    workers = _start(
        served, _settings(on_fault="stop", push_timeout_s=2), LinkFaultEngine(2, "stall")
    )
    try:
        old = workers.slots[0].process.pid
        started = time.monotonic()
        with pytest.raises(WorkerFault) as fault:
            workers.push(1)
        assert 2 <= time.monotonic() - started < 10
        assert str(fault.value) == (
            "rollout worker 0 is stuck (no weight push received in push_timeout_s=2 s) at "
            "policy version 1"
        )
        assert not os.path.exists(f"/proc/{old}")  # ended and joined
    finally:
        workers.close()


def test_a_stalled_push_restarts_the_worker_on_a_new_link(served, capsys) -> None:
    """(d) With ``on_fault: restart`` the stalled worker is ended and a new one, on a new link,
    gets the weights (its first push: it does not stall)."""
    workers = _start(served, _settings(push_timeout_s=2), LinkFaultEngine(2, "stall"))
    try:
        old_process, old_link = workers.slots[0].process, workers.slots[0].link
        workers.push(1)
        slot = workers.slots[0]
        assert workers.restarts == 1 and slot.process.pid != old_process.pid
        assert slot.link is not None and slot.link is not old_link and old_link.group is None
        (line,) = [x for x in capsys.readouterr().err.splitlines() if "rollout worker" in x]
        assert line == (
            "lit-rag: rollout worker 0 is stuck (no weight push received in push_timeout_s=2 s) "
            "at policy version 1; restarting it (1/3), 0 unfinished job(s) sent again"
        )
    finally:
        workers.close()


# ---- the same faults over NCCL (two GPUs: NCCL refuses two ranks on one) -------------------
NCCL = pytest.mark.skipif(
    not dist.is_nccl_available() or torch.cuda.device_count() < 2,
    reason="the NCCL link needs two GPUs (the trainer's and its worker's)",
)


@NCCL
def test_nccl_a_worker_killed_between_two_buckets_stops_the_push(served) -> None:
    settings = _settings(workers=1, backend="nccl", on_fault="stop", push_timeout_s=30)
    workers = _start(served, settings, LinkFaultEngine(2, "die"), device="cuda:0")
    try:
        started = time.monotonic()
        with pytest.raises(WorkerFault) as fault:
            workers.push(1)
        assert time.monotonic() - started < 30
        assert str(fault.value) == "rollout worker 0 died (exit code -9) at policy version 1"
    finally:
        workers.close()


@NCCL
def test_nccl_a_stalled_push_is_aborted_and_the_watchdog_never_fires(served) -> None:
    """The stalled worker's link is aborted at the 2 s deadline and a new worker gets the
    weights on a new link; past the old link's own timeout (10 + 60 s) this process is still
    alive (NCCL's watchdog would have ended it) and pushes again."""
    settings = _settings(workers=1, backend="nccl", push_timeout_s=2, timeout_s=10)
    workers = _start(served, settings, LinkFaultEngine(2, "stall"), device="cuda:0")
    try:
        workers.push(1)
        assert workers.restarts == 1
        time.sleep(settings.link_timeout_s + 5)
        workers.push(2)
        assert workers.restarts == 1 and workers.slots[0].process.is_alive()
    finally:
        workers.close()


# ---- (e) a worker does not outlive its trainer -----------------------------------------------
class SleepingEnvironment:
    """FAKE environment whose ``setup`` says it started (a file) and never returns: the
    worker stays up, holding nothing."""

    def __init__(self, started: str) -> None:
        self.started = started

    def setup(self) -> None:
        open(self.started, "w").close()
        time.sleep(3600)


def _worker_without_prctl(spec, inbox, outbox) -> None:
    process_module._kill_with_parent = lambda: None  # the polling thread alone
    process_module.main(spec, inbox, outbox)


def _trainer(out, watch_by: str, started: str) -> None:
    """A trainer that starts one worker as the pool does (``process.main``, spawn, its pid as
    the parent; ``none``: no parent to watch) and waits; the test SIGKILLs it."""
    spec = WorkerSpec(
        index=0, payload=pickle.dumps((SleepingEnvironment(started), SimpleNamespace(seed=0))),
        tokenizer=None, model_path="", port=0, parent=0 if watch_by == "none" else os.getpid(),
    )  # fmt: skip
    target = _worker_without_prctl if watch_by == "poll" else process_module.main
    queues = SPAWN.Queue(), SPAWN.Queue()  # held here: the worker rebuilds them as it starts
    worker = SPAWN.Process(target=target, args=(spec, *queues))
    worker.start()
    out.put(worker.pid)
    time.sleep(3600)


def _exited(pid: int) -> bool:
    """Gone, or a zombie nobody reaps yet (its memory is freed either way)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _within(seconds: float, condition) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("watch_by", ["prctl", "poll", "none"])
def test_a_worker_exits_when_its_trainer_is_killed(watch_by, tmp_path) -> None:
    """The kernel's signal (``prctl``) or the polling thread alone (``poll``) ends the worker
    within 5 s of its trainer's SIGKILL; a worker that watches nothing (``none``: the control)
    would live on."""
    started, out = tmp_path / "started", SPAWN.Queue()
    trainer = SPAWN.Process(target=_trainer, args=(out, watch_by, str(started)))
    trainer.start()
    worker = out.get(timeout=60)
    try:
        assert _within(60, started.exists)  # the worker is up (and watching)
        trainer.kill()
        trainer.join(timeout=10)
        assert _within(5, lambda: _exited(worker)) == (watch_by != "none")
    finally:
        if not _exited(worker):
            os.kill(worker, signal.SIGKILL)


# ---- (f) a push is loaded bucket by bucket ----------------------------------------------------
class RecordingLink:
    """FAKE weight link: hands out the buckets it was given, in order, counting them."""

    def __init__(self, contents: list[torch.Tensor]) -> None:
        self.contents, self.received = deque(contents), 0

    def receive(self, size: int) -> torch.Tensor:
        bucket = self.contents.popleft()
        assert bucket.numel() == size
        self.received += 1
        return bucket


class RecordingEngine:
    """FAKE engine: for each tensor it loads, how many buckets had been received by then;
    ``reads``: how many tensors it reads before it returns (None: all)."""

    def __init__(self, link: RecordingLink, reads: int | None = None) -> None:
        self.link, self.reads, self.loads = link, reads, []

    def receive_weights(self, weights) -> None:
        for i, (name, _tensor) in enumerate(weights):
            self.loads.append((name, self.link.received))
            if self.reads is not None and i + 1 == self.reads:
                return


def _pushed_worker(reads: int | None = None):
    """A worker with a 3-bucket push (2 tensors, then 1, then 2) waiting in its inbox."""
    weights = [(f"t{i}", torch.full((4,), float(i))) for i in range(5)]
    packed = [
        next(buckets(part, torch.float32, 1)) for part in (weights[:2], weights[2:3], weights[3:])
    ]
    worker = WorkerProcess.__new__(WorkerProcess)
    worker.inbox, worker.version = queue.Queue(), 0
    for entries, bucket in packed:
        worker.inbox.put(Bucket(entries, bucket.numel()))
    worker.inbox.put(PushEnd())
    worker.link = RecordingLink([bucket for _, bucket in packed])
    worker.engine = RecordingEngine(worker.link, reads)
    return worker


def test_each_bucket_is_loaded_before_the_next_is_received() -> None:
    """Buckets [t0 t1] [t2] [t3 t4]: each tensor is loaded while its own bucket is the last
    one received, so the worker never holds a bucket beyond the one it loads."""
    worker = _pushed_worker()
    worker.receive(version=3)
    assert worker.engine.loads == [("t0", 1), ("t1", 1), ("t2", 2), ("t3", 3), ("t4", 3)]
    assert worker.version == 3 and worker.inbox.empty()


def test_buckets_the_engine_leaves_unread_are_still_received() -> None:
    """An engine that returns after t1: the other two buckets still arrive (the trainer is
    sending them) and PushEnd is read, so the next message is the next push's or job's."""
    worker = _pushed_worker(reads=2)
    worker.receive(version=4)
    assert worker.engine.loads == [("t0", 1), ("t1", 1)]
    assert worker.link.received == 3 and worker.inbox.empty() and worker.version == 4
