"""Rollout workers: settings, the weight buckets and link, the staleness bound, versions per
segment, the loader's look-ahead, the importance-sampling correction of a stale sample worked
by hand, where the workers' GPUs are, and the trainer side of real worker processes around a
fake engine (``fake_workers.FakeWorkerEngine``: started in a chosen order, stalled on cue).
vLLM in each worker is tested through ``lit-rag fit`` in
tests/rollout/test_rollout_workers_cli.py."""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import time
from collections import deque
from types import SimpleNamespace

import pytest
import torch
from helpers import token_trajectory, train_batch

from lit_rag.contracts.episodes import EpisodeLoop, Generate, start_episodes
from lit_rag.data.datamodule import ResumableLoader
from lit_rag.errors import InputError
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.rollout.base import Generation, Placement, RolloutEngine, SamplingParams
from lit_rag.rollout.workers.messages import Job, Stop
from lit_rag.rollout.workers.pool import (
    RolloutSettings,
    WorkerFault,
    WorkerPool,
    _split,
    child_environ,
    end_process,
    environment,
    payload,
    worker_gpus,
)
from lit_rag.rollout.workers.process import VersionedEngine, WorkerProcess
from lit_rag.rollout.workers.scheduler import RolloutScheduler
from lit_rag.rollout.workers.transport import WeightLink, buckets, listen, unpack
from lit_rag.types import Example, RewardBreakdown


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"stale": "keep"}, "stale 'keep' is not known; allowed: regenerate, drop"),
        ({"on_fault": "ignore"}, "allowed: restart, stop"),
        ({"workers": -1}, "must be >= 0"),
        ({"prefetch": -2}, "prefetch must be >= 0 or null"),
        ({"backend": "mpi"}, "allowed: auto, gloo, nccl"),
        ({"job_timeout_s": 0}, "job_timeout_s must be > 0 or null, got 0"),
        (
            {"max_staleness": 1, "prefetch": 2},
            "prefetch 2 is above max_staleness 1: every batch sent that far ahead would be "
            "regenerated; allowed: prefetch 0 to 1 or null",
        ),
    ],
)
def test_bad_settings_are_one_line(kwargs, words) -> None:
    with pytest.raises(InputError, match="model rollout: ") as info:
        RolloutSettings(**kwargs)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_prefetch_defaults_to_the_staleness_bound() -> None:
    assert RolloutSettings(max_staleness=2).ahead == 2
    assert RolloutSettings(max_staleness=3, prefetch=1).ahead == 1


def test_buckets_carry_every_tensor_exactly_within_the_size_limit() -> None:
    weights = [
        ("a", torch.randn(400, 5)),  # 4000 bytes in bf16; the limit is 4194 (0.004 MiB)
        ("b", torch.randn(7)),
        ("c", torch.arange(6, dtype=torch.int64).view(2, 3)),  # not floating: kept as it is
        ("d", torch.randn(10, 10)),  # 200 more bytes would pass the limit: the next bucket
    ]
    packed = list(buckets(weights, torch.bfloat16, bucket_mib=0.004))
    assert [[e[0] for e in entries] for entries, _ in packed] == [["a", "b", "c"], ["d"]]
    assert all(b.numel() <= 0.004 * 2**20 for _, b in packed)
    received = dict(kv for entries, bucket in packed for kv in unpack(entries, bucket.clone()))
    assert list(received) == ["a", "b", "c", "d"]
    for name, tensor in weights:
        expected = tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
        assert received[name].dtype == expected.dtype and torch.equal(received[name], expected)


def _receiver(port: int, sizes: list[int], out) -> None:
    link = WeightLink(port, is_trainer=False, timeout_s=30)
    out.put([link.receive(size).tolist() for size in sizes])


def _dies(port: int) -> None:
    WeightLink(port, is_trainer=False, timeout_s=30)
    os.kill(os.getpid(), signal.SIGKILL)


def test_weight_link_sends_buckets_and_reports_a_dead_worker() -> None:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    store = listen(30)
    child = context.Process(target=_receiver, args=(store.port, [3, 2], out))
    child.start()
    link = WeightLink(store.port, is_trainer=True, timeout_s=30, store=store)
    link.send(torch.tensor([1, 2, 3], dtype=torch.uint8), child.is_alive)
    link.send(torch.tensor([9, 8], dtype=torch.uint8), child.is_alive)
    assert out.get(timeout=30) == [[1, 2, 3], [9, 8]]
    child.join(timeout=30)
    # a worker that dies before the push: the trainer's send raises, it does not hang
    store = listen(30)
    child = context.Process(target=_dies, args=(store.port,))
    child.start()
    link = WeightLink(store.port, is_trainer=True, timeout_s=30, store=store)
    child.join(timeout=30)
    started = time.monotonic()
    with pytest.raises(ConnectionError):
        link.send(torch.zeros(1 << 20, dtype=torch.uint8), child.is_alive)
    assert time.monotonic() - started < 10


def test_split_keeps_examples_whole_and_in_order() -> None:
    assert [len(p) for p in _split(list(range(7)), 3)] == [3, 2, 2]
    assert sum(_split(list(range(7)), 3), []) == list(range(7))
    assert _split([1], 2) == [[1], []]


def test_batch_at_is_what_the_loader_serves() -> None:
    examples = [Example(id=str(i), question="?", answers=["a"]) for i in range(10)]
    loader = ResumableLoader(examples, batch_size=3, seed=4)
    served = [[e.id for e in b] for b in loader]
    ahead = [[e.id for e in loader.batch_at(0, i)] for i in range(len(loader))]
    assert ahead == served and loader.batch_at(0, len(loader)) is None


# ---- the staleness bound --------------------------------------------------------------------
def _rollout_with(settings: RolloutSettings, version: int, fresh_version: int):
    """A RolloutScheduler whose workers are at ``version`` and whose regenerated samples come
    from ``fresh_version`` (no process is started)."""
    rollout = RolloutScheduler.__new__(RolloutScheduler)
    rollout.settings = settings
    rollout.workers = SimpleNamespace(version=version)
    calls = []

    def regenerate(examples, params, group_size):
        calls.append([e.id for e in examples])
        out = []
        for g, example in enumerate(examples):
            for _ in range(group_size):
                t = token_trajectory(g, 2, example)
                t.versions = [(fresh_version, fresh_version)]
                out.append(t)
        return out

    rollout._rollout = regenerate
    return rollout, calls


def _trajectories(versions_per_group: list[list[tuple[int, int]]]):
    out = []
    for g, segments in enumerate(versions_per_group):
        example = Example(id=f"e{g}", question="?", answers=["a"])
        for _ in range(2):
            t = token_trajectory(g, 3, example)
            t.versions = list(segments)
            out.append(t)
    return out


def test_stale_groups_are_regenerated_from_the_current_weights_and_counted() -> None:
    # trainer at version 5, bound 1: group 1's first segment (version 3) is 2 behind
    rollout, calls = _rollout_with(RolloutSettings(workers=1, max_staleness=1), 5, 5)
    batch = _trajectories([[(4, 4)], [(3, 5)], [(5, 5)]])
    kept, metrics = rollout.bound(batch, 2, SamplingParams())
    assert calls == [["e1"]]
    assert [t.group for t in kept] == [0, 0, 1, 1, 2, 2]
    assert [t.versions[0][0] for t in kept] == [4, 4, 5, 5, 5, 5]
    assert metrics["rollout/stale_groups"] == 1 and metrics["rollout/stale_regenerated"] == 1
    assert metrics["rollout/staleness_max"] == 1 and metrics["rollout/staleness_mean"] == 1 / 3


def test_stale_groups_are_dropped_and_the_rest_renumbered() -> None:
    rollout, calls = _rollout_with(RolloutSettings(workers=1, stale="drop"), 5, 5)
    kept, metrics = rollout.bound(_trajectories([[(4, 5)], [(5, 5)]]), 2, SamplingParams())
    assert calls == [] and [t.example.id for t in kept] == ["e1", "e1"]
    assert [t.group for t in kept] == [0, 0] and metrics["rollout/stale_dropped"] == 1
    # every group too old: drop would leave nothing, so they are regenerated
    kept, metrics = rollout.bound(_trajectories([[(3, 3)], [(4, 4)]]), 2, SamplingParams())
    assert calls == [["e0", "e1"]] and metrics["rollout/stale_regenerated"] == 2
    assert metrics["rollout/staleness_max"] == 0


# ---- versions per segment (partial rollouts) -------------------------------------------------
class _Counting(RolloutEngine):
    """Answers every prompt with two tokens; the worker's version moves on at each collect."""

    def __init__(self, worker) -> None:
        self.worker, self.tokenizer = worker, SimpleNamespace(decode=lambda ids, **_: "xy")

    def generate(self, prompts, params):
        self.worker.version += 1  # new weights arrive while these requests run
        return [Generation(torch.tensor([7, 8]), torch.tensor([-0.5, -0.25]), "xy", True)] * len(
            prompts
        )


def test_each_segment_records_the_versions_it_was_sampled_under() -> None:
    worker = SimpleNamespace(version=3)
    engine = VersionedEngine(_Counting(worker), worker)
    example = Example(id="q", question="?", answers=["a"])
    prompts = SimpleNamespace(
        ids=[[1, 2]], texts=["p"], groups=[0, 0], example=lambda group, examples: examples[0]
    )
    episodes = start_episodes([example], prompts)
    params = SamplingParams(max_new_tokens=2)

    def turn(loop, e, gen):
        e.generated(gen)
        e.insert([9], "doc")
        return Generate("second", e.context, params) if len(e.turns) < 2 else None

    loop = EpisodeLoop(engine, params, None)
    done = loop.run(
        episodes,
        {
            "start": lambda loop, e, _: Generate("first", e.context, params),
            "first": turn,
            "second": turn,
        },
    )
    assert [e.versions for e in done] == [[(3, 4), (4, 5)], [(3, 4), (4, 5)]]


# ---- the importance-sampling correction of a stale sample, by hand ----------------------------
def test_a_stale_samples_correction_worked_by_hand() -> None:
    """One trajectory sampled one version ago: its first segment (2 tokens) under version 3, a
    retrieved document (1 token, masked), its second segment (1 token) under version 4 after the
    weights changed mid-episode; the trainer is at version 4 (staleness 1).

    The worker recorded each token's log-prob under the weights that drew it (mu):
    -1.2, -0.7, (doc), -0.3. The trainer's old log-probs (version 4, before this update):
    -0.9, -1.4, (doc), -0.3. GRPO with TIS cap C = 2, on the first pass (new = old, ratio 1):

        w_1 = min(e^(-0.9 + 1.2), 2) = e^0.3  = 1.3499
        w_2 = min(e^(-1.4 + 0.7), 2) = e^-0.7 = 0.4966
        w_4 = min(e^(-0.3 + 0.3), 2) = 1       (the segment sampled by the current weights)

    Advantage +1, token weights 1/3: loss = -(1.3499 + 0.4966 + 1) / 3 = -0.94883; the
    retrieved token contributes nothing.
    """
    trajectory = token_trajectory(0, 4)
    trajectory.loss_mask = torch.tensor([1, 1, 0, 1])
    trajectory.sampling_logprobs = torch.tensor([-1.2, -0.7, 0.0, -0.3])
    trajectory.versions = [(3, 3), (4, 4)]
    other = token_trajectory(0, 4)
    other.loss_mask = torch.tensor([1, 1, 0, 1])
    algo = GRPO(beta=0.0, importance_sampling_cap=2.0)
    rewards = RewardBreakdown(total=torch.tensor([1.0, 0.0]), components={})
    batch = algo.prepare([trajectory, other], rewards).batch
    assert torch.equal(batch.sampling_logprobs[0], torch.tensor([-1.2, -0.7, 0.0, -0.3]))
    old = torch.tensor([[-0.9, -1.4, 0.0, -0.3]])
    by_hand = train_batch(
        batch.completion_mask[:1].float(),
        logprobs=old.clone().requires_grad_(),
        old_logprobs=old,
        sampling_logprobs=batch.sampling_logprobs[:1],
        advantages=torch.tensor([1.0]),
        token_weights=torch.tensor([[1 / 3, 1 / 3, 0.0, 1 / 3]]),
        ref_logprobs=old,
    )
    out = algo.loss(by_hand)
    expected = -(torch.exp(torch.tensor(0.3)) + torch.exp(torch.tensor(-0.7)) + 1) / 3
    assert out.loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert out.loss.item() == pytest.approx(-0.94883, abs=1e-4)
    assert out.metrics["is_weight_capped_fraction"].item() == 0


# ---- where a rank's workers run --------------------------------------------------------------
@pytest.mark.parametrize(
    ("placement", "per_rank", "visible", "expected"),
    [
        # 8 GPUs, 4 training ranks, 1 worker each: rank r's worker on GPU 4 + r
        (Placement(2, 4, 2, 4), 1, [str(i) for i in range(8)], ["6"]),
        # the parent sees GPUs 4-7 only: rank 1 of 2 takes position 2 + 1 * 1 = 3 of them,
        # GPU 7 (not the parent's GPU 3)
        (Placement(1, 2, 1, 2), 1, ["4", "5", "6", "7"], ["7"]),
        # 1 training rank and 2 workers, visible 3,1,2: positions 1 + 0 * 2 + (0, 1) = 1 and 2
        (Placement(0, 1, 0, 1), 2, ["3", "1", "2"], ["1", "2"]),
        # global rank 5 is local rank 1 of 4 (second node): positions 4 + 1 * 2 + (0, 1) = 6, 7
        (Placement(5, 8, 1, 4), 2, [str(i) for i in range(12)], ["6", "7"]),
    ],
)
def test_workers_take_the_gpus_after_the_training_ranks(placement, per_rank, visible, expected):
    """GPU of local rank r's j-th worker: position local_world_size + r * per_rank + j of the
    GPUs the training process sees (its CUDA_VISIBLE_DEVICES, in that order)."""
    assert worker_gpus(placement, per_rank, visible) == expected


def test_too_few_visible_gpus_for_the_workers_is_one_line() -> None:
    # 2 training ranks + 2 x 1 workers need 4 GPUs; 3 are visible: 0 workers per rank fit
    with pytest.raises(InputError) as info:
        worker_gpus(Placement(1, 2, 1, 2), 1, ["0", "1", "2"])
    message = str(info.value)
    assert "need 4 GPUs on a node, 3 visible (0,1,2)" in message and "\n" not in message
    assert message.endswith("allowed: model.rollout.workers <= 0")


def test_a_worker_starts_with_its_gpu_set_and_the_trainer_keeps_its_environment(
    monkeypatch,
) -> None:
    """A worker's environment: the trainer's, with its GPU as CUDA_VISIBLE_DEVICES, set while
    the process starts (it inherits it then) and undone after."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    monkeypatch.delenv("LIT_RAG_UNSET_BEFORE", raising=False)
    assert child_environ(None) == {}
    with environment(child_environ("5") | {"LIT_RAG_UNSET_BEFORE": "1"}):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
        assert os.environ["LIT_RAG_UNSET_BEFORE"] == "1"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert "LIT_RAG_UNSET_BEFORE" not in os.environ


def test_between_engine_steps_a_worker_keeps_jobs_for_later_and_handles_the_rest() -> None:
    worker = WorkerProcess.__new__(WorkerProcess)
    worker.inbox, worker.pending, worker.stopping = queue.Queue(), deque(), False
    job = Job(0, [], 2, SamplingParams(), seed=0)
    worker.inbox.put(job)
    worker.inbox.put(Stop())
    worker.poll()
    assert list(worker.pending) == [job] and worker.stopping


# ---- restarts across resumes ----------------------------------------------------------------
def test_a_resumed_run_gets_its_whole_restart_budget_and_logs_the_total() -> None:
    workers = WorkerPool(RolloutSettings(workers=1, max_restarts=2), b"")
    workers.load_state_dict({"version": 7, "restarts": 2, "next_job": 30})
    assert workers.restarts == 0  # what max_restarts bounds: 2 restarts left in this run
    workers.restarts += 1  # one restart in the resumed run
    assert workers.total_restarts == 2 + 1 and workers.state_dict()["restarts"] == 3


# ---- real worker processes around a fake engine -----------------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny model's folder (what a worker reads its config from) and its tokenizer."""
    from helpers import tiny_model_folder

    from lit_rag.models.loading import ModelConfig, TinyConfig, load_tokenizer

    tiny = TinyConfig(hidden_size=32, num_layers=2, num_heads=2)
    folder = tiny_model_folder(tmp_path_factory.mktemp("served"), tiny)
    return folder, load_tokenizer(ModelConfig(tiny=tiny))


def _started(served, settings: RolloutSettings, engine) -> WorkerPool:
    """Rank 0 of 2 training processes (so no CPU core is pinned on a small machine) with
    ``settings.workers / 2`` workers, started on a one-layer model's weights."""
    from fake_workers import FakeWorkerEngine  # noqa: F401 (importable in the worker too)

    from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment

    folder, tokenizer = served
    workers = WorkerPool(settings, payload(SingleTurnEnvironment(), engine))
    workers.start(torch.nn.Linear(2, 2), tokenizer, folder, Placement(0, 2, 0, 2), seed=0)
    return workers


def _examples(n: int) -> list[Example]:
    return [Example(id=f"q{i}", question=f"question {i}?", answers=["a"]) for i in range(n)]


def test_two_workers_per_rank_start_whichever_is_ready_first(served, tmp_path) -> None:
    """Worker 1 says it is ready before worker 0 (``ready_after``): waiting for worker 0 reads
    worker 1's "ready" first, and worker 1 still starts. Then 3 examples over the 2 workers,
    2 and 1 (uneven), 2 samples each: 6 trajectories, groups 0 0 1 1 2 2 in order."""
    from fake_workers import FakeWorkerEngine

    settings = RolloutSettings(workers=4, timeout_s=30)
    workers = _started(served, settings, FakeWorkerEngine(ready_after=str(tmp_path)))
    try:
        assert [s.link is not None for s in workers.slots] == [True, True]
        ids = workers.submit(_examples(3), 2, SamplingParams(max_new_tokens=2), seed=0)
        assert len(ids) == 2  # one job per worker
        batch = workers.take(ids)
        assert [t.example.id for t in batch.trajectories] == ["q0", "q0", "q1", "q1", "q2", "q2"]
        assert [t.group for t in batch.trajectories] == [0, 0, 1, 1, 2, 2]
    finally:
        workers.close()


def test_a_stuck_worker_is_ended_and_restarted_with_its_job(served, tmp_path, capsys) -> None:
    """The engine stalls on its first job (``stall_once``); after job_timeout_s the worker is
    ended (its process is gone), started again and given the job, which then comes back."""
    from fake_workers import FakeWorkerEngine

    stall = tmp_path / "stall"
    stall.touch()
    settings = RolloutSettings(workers=2, job_timeout_s=2, timeout_s=60)
    workers = _started(served, settings, FakeWorkerEngine(stall_once=str(stall)))
    try:
        old = workers.slots[0].process.pid
        batch = workers.take(workers.submit(_examples(2), 2, SamplingParams(), seed=0))
        assert len(batch.trajectories) == 2 * 2 and not stall.exists()
        assert workers.restarts == 1 and workers.slots[0].process.pid != old
        assert not os.path.exists(f"/proc/{old}")  # ended and joined: no orphan, no zombie
        (line,) = [x for x in capsys.readouterr().err.splitlines() if "rollout worker" in x]
        assert line == (
            "lit-rag: rollout worker 0 is stuck (no job finished in job_timeout_s=2 s) at "
            "policy version 0; restarting it (1/3), 1 unfinished job(s) sent again"
        )
    finally:
        workers.close()


def _ignores_sigterm(ready) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    while True:
        time.sleep(1)


def test_end_process_kills_one_that_ignores_terminate() -> None:
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    process = context.Process(target=_ignores_sigterm, args=(ready,))
    process.start()
    assert ready.wait(60)
    end_process(process, grace_s=0.5)
    assert process.exitcode == -signal.SIGKILL and not os.path.exists(f"/proc/{process.pid}")


# ---- faults outside the step's own rollout stop every rank at one point ------------------------
class FakeWorkerPool:
    """Stands in for a rank's WorkerPool (no process): its ``fail_take``-th wait, or every
    push with ``fail_push``, raises the WorkerFault a failed worker raises."""

    def __init__(self, version: int, stale_by: int, fail_take: int = 0, fail_push: bool = False):
        self.version, self.stale_by = version, stale_by
        self.fail_take, self.fail_push = fail_take, fail_push
        self.started, self.total_restarts, self.takes = True, 0, 0
        self.jobs: dict[int, list[Example]] = {}

    def submit(self, examples, group_size, params, seed, share_rng=False):
        self.jobs[len(self.jobs)] = (examples, group_size)
        return [len(self.jobs) - 1]

    def take(self, ids):
        self.takes += 1
        if self.takes == self.fail_take:
            raise WorkerFault("rollout worker 0 failed at policy version 3: RuntimeError: boom")
        examples, group_size = self.jobs[ids[0]]
        trajectories = _trajectories([[(self.version - self.stale_by,) * 2]] * len(examples))
        return SimpleNamespace(trajectories=trajectories, wait_seconds=0.0, worker_seconds=0.0)

    def push(self, version):
        if self.fail_push:
            raise WorkerFault("rollout worker 0 died (exit code -9) at policy version 3")
        return 0.0


def _faulty_rollout(tmp_path, workers: FakeWorkerPool):
    """A RolloutScheduler of a one-process run at step 5 over ``workers``; the checkpoints it
    saves are listed in ``saved``."""
    saved = []
    trainer = SimpleNamespace(
        world_size=1, checkpoint_callback=None, default_root_dir=str(tmp_path), global_step=5,
        is_global_zero=True, should_stop=False, train_dataloader=None,
        save_checkpoint=lambda path: saved.append(os.path.basename(path)),
    )  # fmt: skip
    rollout = RolloutScheduler.__new__(RolloutScheduler)
    rollout.module = SimpleNamespace(trainer=trainer, _trainer=trainer, device=torch.device("cpu"))
    rollout.settings = RolloutSettings(workers=1, max_staleness=1)
    rollout.workers, rollout.seed, rollout._ahead = workers, 0, {}
    rollout.fault, rollout.stopped = None, False
    return rollout, trainer, saved


def test_a_fault_while_regenerating_stale_groups_stops_with_a_checkpoint(tmp_path) -> None:
    # samples 2 versions old, bound 1: the step regenerates them, and that wait (the 2nd) fails
    workers = FakeWorkerPool(version=3, stale_by=2, fail_take=2)
    rollout, trainer, saved = _faulty_rollout(tmp_path, workers)
    examples = _examples(2)
    trajectories, _ = rollout.train_batch(examples, 0, 2, SamplingParams())
    assert trajectories is None and workers.takes == 2
    assert saved == ["worker-fault-step=5.ckpt"] and trainer.should_stop


@pytest.mark.parametrize("where", ["validation", "refill"])
def test_a_fault_in_a_rollout_every_rank_makes_stops_once(tmp_path, where) -> None:
    """Validation and DAPO's refill roll out on every rank together: the fault is agreed on
    there; the calls after it (the rest of the validation, the refill's last rounds) return
    None at once, without another checkpoint."""
    workers = FakeWorkerPool(version=3, stale_by=0, fail_take=1)
    rollout, trainer, saved = _faulty_rollout(tmp_path, workers)
    group_size = None if where == "validation" else 2
    assert rollout.rollout(_examples(2), SamplingParams(), group_size) is None
    assert rollout.rollout(_examples(2), SamplingParams(), group_size) is None
    assert workers.takes == 1 and saved == ["worker-fault-step=5.ckpt"] and trainer.should_stop


def test_a_fault_while_pushing_a_checkpoints_weights_stops_at_the_next_step(tmp_path) -> None:
    workers = FakeWorkerPool(version=3, stale_by=0, fail_push=True)
    rollout, trainer, saved = _faulty_rollout(tmp_path, workers)
    rollout.resync()  # on_train_start after a checkpoint (or a curriculum) loaded weights
    assert rollout.fault is not None and saved == []
    trajectories, _ = rollout.train_batch(_examples(2), 0, 2, SamplingParams())
    assert trajectories is None and workers.takes == 0
    assert saved == ["worker-fault-step=5.ckpt"] and trainer.should_stop


# ---- what the training process opens ----------------------------------------------------------
class _OpenCounting(SingleTurnEnvironment):
    """Counts ``setup`` calls: where a retrieval environment opens its index."""

    opened = 0

    def setup(self) -> None:
        type(self).opened += 1


@pytest.mark.parametrize(("workers", "opened"), [(0, 1), (1, 0)])
def test_the_trainer_opens_the_environment_only_where_it_rolls_out(workers, opened) -> None:
    """Colocated, the policy module opens the environment (a missing index fails at once);
    with rollout workers each worker opens its own copy and the trainer's is never searched,
    so it never reads the index."""
    from fake_workers import FakeWorkerEngine
    from helpers import EvenTokenReward

    from lit_rag.models.loading import ModelConfig, TinyConfig
    from lit_rag.trainer.policy import PolicyModule

    _OpenCounting.opened = 0
    module = PolicyModule(
        policy=ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2)),
        environment=_OpenCounting(),
        reward=EvenTokenReward(),
        algorithm=GRPO(),
        engine=FakeWorkerEngine() if workers else None,
        rollout=RolloutSettings(workers=workers),
    )
    module.configure_model()
    assert _OpenCounting.opened == opened
    if module.workers is not None:
        module.workers.close()


# ---- the engine's mismatch is measured on fresh samples only ----------------------------------
def test_logprob_diff_leaves_out_samples_from_older_weights(tiny_policy) -> None:
    """Two groups of 2 samples, 3 tokens each: group 0 sampled by the weights being trained
    (staleness 0), group 1 one version earlier (staleness 1). The engine's log-probs are the
    trainer's own on group 0 (|diff| 0) and 5 below them on group 1 (|diff| 5, the weights'
    age, not the engine). Measured on group 0 only: mean 0, max 0 (both groups: mean 2.5)."""
    from lit_rag.trainer.phases import Clock
    from lit_rag.trainer.ranks import Ranks
    from lit_rag.trainer.update import Tally, Update, UpdateSettings

    model, tokenizer = tiny_policy
    hooks = SimpleNamespace(manual_backward=lambda loss: loss.backward())
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    settings = UpdateSettings(share_prefix=True, temperature=1.0, pad_id=pad)
    algorithm = GRPO(beta=0.0)
    trajectories = [token_trajectory(g, 3) for g in (0, 0, 1, 1)]
    for t in trajectories[2:]:
        t.staleness = 1
    rewards = RewardBreakdown(total=torch.tensor([1.0, 0.0, 1.0, 0.0]), components={})
    batch = algorithm.prepare(trajectories, rewards).batch
    update = Update(settings, algorithm, model, None, Ranks(), hooks)
    with torch.no_grad():
        own = update.logprobs(model, batch, batch.width)  # [4, 3]
    batch.sampling_logprobs = own - torch.tensor([[0.0], [0.0], [5.0], [5.0]])
    tally = Tally()
    plan = SimpleNamespace(batch=batch, width=batch.width, packs={})
    update._train_micro(plan, torch.arange(4), 1.0, 0, tally, Clock())
    metrics = tally.mismatch.metrics()
    assert metrics["rollout/logprob_diff_mean"].item() == pytest.approx(0.0, abs=1e-5)
    assert metrics["rollout/logprob_diff_max"].item() == pytest.approx(0.0, abs=1e-5)
    assert batch.staleness.tolist() == [0, 0, 1, 1]


def test_the_staleness_bound_marks_each_sample_with_its_age() -> None:
    rollout, _ = _rollout_with(RolloutSettings(workers=1, max_staleness=1), 5, 5)
    kept, _ = rollout.bound(_trajectories([[(4, 5)], [(5, 5)]]), 2, SamplingParams())
    assert [t.staleness for t in kept] == [1, 1, 0, 0]  # trainer at 5: 5 - 4, 5 - 5


def test_an_algorithm_without_an_importance_sampling_correction_is_told_in_one_line(capsys):
    """DPO reads no sampling log-probs: samples from older weights are older preference data,
    trained uncorrected; with max_staleness 1 the run says so once."""
    from fake_workers import FakeWorkerEngine

    from lit_rag.plugins.algorithms.dpo import DPO
    from lit_rag.rollout.workers.scheduler import rollout_scheduler

    module = SimpleNamespace(
        engine=FakeWorkerEngine(), algorithm=DPO(), environment=SingleTurnEnvironment()
    )
    rollout = rollout_scheduler(module, RolloutSettings(workers=1, max_staleness=1))
    rollout.close()
    (line,) = capsys.readouterr().out.splitlines()
    assert line == (
        "lit-rag: model.rollout lets samples be up to 1 version(s) old and algorithm DPO has no "
        "importance-sampling correction: it trains on them uncorrected (max_staleness: 0 keeps "
        "them on-policy)"
    )
