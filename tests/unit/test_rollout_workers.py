"""Rollout workers without a worker process: settings, the weight buckets and link, the
staleness bound, versions per segment, the loader's look-ahead and the importance-sampling
correction of a stale sample worked by hand. The real processes (vLLM in each worker, tiny
models) are tested through ``lit-rag fit`` in tests/integration/test_rollout_workers_cli.py."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from types import SimpleNamespace

import pytest
import torch
from helpers import token_trajectory, train_batch

from lit_rag.data.datamodule import ResumableLoader
from lit_rag.episodes import EpisodeLoop, Generate, start_episodes
from lit_rag.errors import InputError
from lit_rag.modules.disaggregated import WorkerRollout
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.rollout.base import Generation, RolloutEngine, SamplingParams
from lit_rag.rollout.transport import WeightLink, buckets, free_port, unpack
from lit_rag.rollout.worker import VersionedEngine
from lit_rag.rollout.workers import RolloutSettings, _split
from lit_rag.types import Example, RewardBreakdown


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"stale": "keep"}, "stale 'keep' is not known; allowed: regenerate, drop"),
        ({"on_fault": "ignore"}, "allowed: restart, stop"),
        ({"workers": -1}, "must be >= 0"),
        ({"prefetch": -2}, "prefetch must be >= 0 or null"),
        ({"backend": "mpi"}, "allowed: auto, gloo, nccl"),
    ],
)
def test_bad_settings_are_one_line(kwargs, words) -> None:
    with pytest.raises(InputError, match="model rollout: ") as info:
        RolloutSettings(**kwargs)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_prefetch_defaults_to_the_staleness_bound() -> None:
    assert RolloutSettings(max_staleness=2).ahead == 2
    assert RolloutSettings(max_staleness=0, prefetch=3).ahead == 3


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
    port = free_port()
    child = context.Process(target=_receiver, args=(port, [3, 2], out))
    child.start()
    link = WeightLink(port, is_trainer=True, timeout_s=30)
    link.send(torch.tensor([1, 2, 3], dtype=torch.uint8), child.is_alive)
    link.send(torch.tensor([9, 8], dtype=torch.uint8), child.is_alive)
    assert out.get(timeout=30) == [[1, 2, 3], [9, 8]]
    child.join(timeout=30)
    # a worker that dies before the push: the trainer's send raises, it does not hang
    port = free_port()
    child = context.Process(target=_dies, args=(port,))
    child.start()
    link = WeightLink(port, is_trainer=True, timeout_s=30)
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
    """A WorkerRollout whose workers are at ``version`` and whose regenerated samples come
    from ``fresh_version`` (no process is started)."""
    rollout = WorkerRollout.__new__(WorkerRollout)
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

    rollout.rollout = regenerate
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
