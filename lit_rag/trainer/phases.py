"""What a training step measures besides its losses: the time of each of its phases and of each
named part of the update, the trainer / engine log-prob mismatch, the process's memory, and a
rollout's rewards and lengths (used by ``PolicyModule``)."""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator

import torch

from lit_rag.types import RewardBreakdown, Trajectory


def device_events(device: torch.device | None) -> bool:
    """Whether a clock on ``device`` times with the device's events: CUDA kernels run after the
    host queues them, so a host clock would time the queueing. Elsewhere the host's clock."""
    return device is not None and torch.device(device).type == "cuda"


class Clock:
    """Seconds spent in each named part of the update (``time/<part>_s``), summed over its
    micro-batches and optimizer steps: ``with clock("time/forward_s"): ...``.

    On a GPU (:func:`device_events`) each part is a pair of CUDA events recorded on the stream,
    and :meth:`metrics` waits for the device once and reads them: no synchronisation inside the
    step, and the times are the device's, not the host's queueing. ``event`` and
    ``synchronize`` stand in for ``torch.cuda.Event`` and ``torch.cuda.synchronize``."""

    def __init__(self, device: torch.device | None = None, event=None, synchronize=None) -> None:
        self.seconds: dict[str, float] = {}
        self.pending: dict[str, list] = {}
        self.event = event
        if self.event is None and device_events(device):
            self.event = lambda: torch.cuda.Event(enable_timing=True)
            synchronize = synchronize or torch.cuda.synchronize
        self.synchronize = synchronize

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.event is not None:
            start = self.event()
            start.record()
            try:
                yield
            finally:
                end = self.event()
                end.record()
                self.pending.setdefault(name, []).append((start, end))
            return
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def metrics(self) -> dict[str, torch.Tensor]:
        if self.pending:
            if self.synchronize is not None:
                self.synchronize()  # once: every recorded event has happened
            for name, pairs in self.pending.items():
                spent = sum(start.elapsed_time(end) for start, end in pairs) / 1000.0  # ms
                self.seconds[name] = self.seconds.get(name, 0.0) + spent
            self.pending.clear()
        return {name: torch.tensor(seconds) for name, seconds in self.seconds.items()}


#: The phases of a training step, in order, each logged as ``time/<phase>_s``: the rollout
#: (generation; with rollout workers, the wait for their batch), the reward, the algorithm's
#: training batch (with DAPO's refill, its extra rollouts), the update, the weight sync to the
#: engine or the workers, and the health signals.
PHASES = ("rollout", "reward", "prepare", "update", "sync", "health")


class Phases:
    """Seconds spent in each phase of a training step (:data:`PHASES`):
    ``with phases.time("reward"): ...``."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.clock = Clock(device)

    def time(self, phase: str) -> contextlib.AbstractContextManager[None]:
        if phase not in PHASES:
            raise ValueError(f"unknown step phase '{phase}'; allowed: {', '.join(PHASES)}")
        return self.clock(f"time/{phase}_s")

    def metrics(self) -> dict[str, torch.Tensor]:
        return self.clock.metrics()


class Mismatch:
    """How far the engine's sampling log-probs are from the trainer's own for the same weights:
    mean and max over the completion tokens of a step (``rollout/logprob_diff_mean`` / ``_max``,
    nats), counting only the part of each token's gap the sampler's truncation cannot explain.

    The two sides score different distributions when sampling truncates. The engine reports the
    log-prob under the distribution it drew from (after temperature, top-k and top-p: vLLM's
    ``processed_logprobs``, the ``hf`` engine's processed scores); the trainer, the full softmax
    at the temperature. Top-p keeps the smallest set of tokens whose mass ``Z`` is at least
    ``top_p`` and renormalizes it (vLLM and transformers alike), so a kept token's engine
    log-prob is its full one minus ``log Z``: ``d = log pi_trainer - log pi_engine`` is
    ``log Z + numerics``, with ``log Z`` in ``[log top_p, 0]``. A gap inside that interval may be
    truncation alone; the metric counts each token's distance to it,
    ``max(d, 0) + max(log top_p - d, 0)``, which without truncation (``top_p`` 1, ``top_k`` 0, or
    greedy) is ``|d|``. Top-k bounds ``Z`` by nothing, so with ``top_k`` only ``max(d, 0)``
    counts (the side truncation never produces).

    Example, a 4-token vocabulary with probabilities 0.5 / 0.3 / 0.15 / 0.05 and top-p 0.8: the
    sampler keeps the first two and renormalizes them to 0.625 / 0.375, so at equal weights
    token 0 has ``d = log 0.5 - log 0.625 = log 0.8 = -0.223``: ``|d|`` would count 0.223 nats
    of truncation as mismatch; its distance to ``[log 0.8, 0]`` is 0.

    Args:
        temperature: The training sampling's temperature (0: greedy, which truncates nothing).
        top_p: Its nucleus mass (1: off).
        top_k: Its top-k cut-off (0: off).
    """

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0) -> None:
        greedy = temperature <= 0
        # log Z, the truncation's share of d, lies in [self.low, 0]
        self.low = 0.0 if greedy or top_p >= 1.0 else math.log(top_p)
        if top_k > 0 and not greedy:
            self.low = -math.inf
        # sums on the device of the log-probs, read once in metrics(): no host sync per call
        self.total: torch.Tensor | None = None
        self.count: torch.Tensor | None = None
        self.max: torch.Tensor | None = None

    def add(self, trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor) -> None:
        device = trainer.device
        keep = mask.detach().to(device) > 0
        d = trainer.detach().float() - engine.to(device).float()
        gap = d.clamp(min=0.0) + (self.low - d).clamp(min=0.0)  # distance to [low, 0]
        gap = torch.where(keep, gap, torch.zeros_like(gap))  # padding: whatever its values
        total, count, top = gap.sum(), keep.sum().float(), gap.max() if gap.numel() else gap.sum()
        if self.total is None:
            self.total, self.count, self.max = total, count, top
        else:
            self.total, self.count = self.total + total, self.count + count
            self.max = torch.maximum(self.max, top)

    def metrics(self) -> dict[str, torch.Tensor]:
        if self.count is None or not float(self.count):
            return {}
        return {
            "rollout/logprob_diff_mean": self.total / self.count,
            "rollout/logprob_diff_max": self.max,
        }


def memory_metrics(device: torch.device) -> dict[str, torch.Tensor]:
    """Peak and current resident memory of this process and, on CUDA, peak allocated GPU memory
    (GiB). A peak that rises while the current RSS after each step stays flat is a larger
    micro-batch or allocator fragmentation, not a leak."""
    import resource

    metrics = {
        "mem/peak_rss_gib": torch.tensor(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
    }
    try:
        with open("/proc/self/statm") as statm:  # Linux; elsewhere the peak alone
            metrics["mem/rss_gib"] = torch.tensor(
                int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
            )
    except OSError:
        pass
    if device.type == "cuda":
        metrics["mem/peak_gpu_gib"] = torch.tensor(torch.cuda.max_memory_allocated(device) / 2**30)
    return metrics


def rollout_metrics(
    trajectories: list[Trajectory],
    rewards: RewardBreakdown,
    prefix: str,
    environment,
    reward=None,
) -> dict:
    """Mean reward (total and per component; a step-level reward's return), completion length,
    truncated fraction and the environment's own metrics of a rollout."""
    lengths = torch.tensor([float(t.num_generated) for t in trajectories])

    def per_trajectory(values: torch.Tensor) -> torch.Tensor:  # step-level [N, T]: the return
        return values.float().sum(-1) if values.dim() == 2 else values.float()

    metrics = {f"{prefix}/total": per_trajectory(rewards.total).mean()}
    for name, values in rewards.components.items():
        metrics[f"{prefix}/{name}"] = per_trajectory(values).mean()
    head = prefix.split("/")[0] if prefix.startswith("val") else "rollout"
    metrics[f"{head}/completion_length"] = lengths.mean()
    metrics[f"{head}/truncated_fraction"] = torch.tensor(
        [float(t.truncated) for t in trajectories]
    ).mean()
    for name, value in environment.metrics(trajectories).items():
        metrics[f"{head}/{name}"] = value
    for name, value in reward_metrics(reward).items():  # a reward's own signals (a judge's)
        metrics[f"{head}/{name}"] = value
    return metrics


def reward_metrics(reward) -> dict:
    """What a reward measured of its last call beyond its components (``Reward.metrics``:
    an LLM judge's failures and score distribution); none for a reward without it."""
    metrics = getattr(reward, "metrics", None)
    return dict(metrics()) if callable(metrics) else {}
