"""FAKE engine and environment for rollout-worker tests: what a real vLLM in a worker process
cannot be made to do on cue. They start in a chosen order, stall, fail on one training rank at
one call, or hand back samples that look older than they are; the worker process, its queues,
the weight link and the trainer side around them are the real ones. Recipes name them as
``--model.engine=fake_workers.FakeWorkerEngine`` (``tests/`` on ``PYTHONPATH``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
from lit_rag.rollout.base import Generation, RolloutEngine


class FakeWorkerEngine(RolloutEngine):
    """Answers every prompt with the tokens ``[7, 8]`` (log-probs -0.5), in a worker process.

    Args:
        ready_after: A folder: the worker whose seed is even waits, before it is ready, until
            the one with the next odd seed has said it is ready (a file there), so the second
            worker's "ready" arrives first.
        stall_once: A file: while it exists a ``generate`` removes it and never returns (a
            stalled engine); the restarted worker finds it gone.
        fail_rank: The training rank (``LOCAL_RANK``) whose worker fails ...
        fail_at_call: ... at this ``generate`` call (1 is the first; 0: never) ...
        fail_greedy: ... or at its first greedy (validation) call.
    """

    serves_pushed_weights = True

    def __init__(
        self,
        ready_after: str = "",
        stall_once: str = "",
        fail_rank: int = -1,
        fail_at_call: int = 0,
        fail_greedy: bool = False,
    ) -> None:
        self.ready_after, self.stall_once = ready_after, stall_once
        self.fail_rank, self.fail_at_call, self.fail_greedy = fail_rank, fail_at_call, fail_greedy
        self.seed: int | None = None  # the worker sets it: base seed + rank's offset + index
        self.calls = self.pushes = 0

    def serve(self, tokenizer: object, model_path: str, config: object) -> None:
        self.tokenizer = tokenizer
        if not self.ready_after:
            return
        folder = Path(self.ready_after)
        if self.seed % 2:
            (folder / f"ready-{self.seed}").touch()
            return
        while not (folder / f"ready-{self.seed + 1}").exists():
            time.sleep(0.05)
        time.sleep(1.0)  # the other worker puts its "ready" on the queue meanwhile

    def weight_dtype(self) -> torch.dtype:
        return torch.float32

    def receive_weights(self, weights) -> None:
        list(weights)
        self.pushes += 1

    def generate(self, prompts, params) -> list[Generation]:
        self.calls += 1
        if int(os.environ.get("LOCAL_RANK", "0")) == self.fail_rank and (
            self.calls == self.fail_at_call or (self.fail_greedy and params.temperature == 0)
        ):
            raise RuntimeError(f"fake engine fault at call {self.calls}")
        if self.stall_once and os.path.exists(self.stall_once):
            os.remove(self.stall_once)
            time.sleep(3600)
        return [
            Generation(torch.tensor([7, 8]), torch.tensor([-0.5, -0.5]), "xy", True)
            for _ in prompts
        ]


class FakeStaleEnvironment(SingleTurnEnvironment):
    """The single-turn environment whose samples claim to be ``stale_by`` versions older than
    the weights that drew them, so the trainer finds them past its staleness bound."""

    def __init__(self, stale_by: int = 0) -> None:
        super().__init__()
        self.stale_by = stale_by

    def rollout(self, examples, engine, group_size, params):
        trajectories = super().rollout(examples, engine, group_size, params)
        for t in trajectories:
            t.versions = [(first - self.stale_by, last) for first, last in t.versions]
        return trajectories
