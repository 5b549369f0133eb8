"""What a trainer rank and its rollout workers say to each other over their queues.

Each message is a small frozen dataclass (picklable: defined at module level); the receiver
dispatches on its type.

- to a worker (its inbox): a :class:`Job`; a weight push, :class:`Push` then one
  :class:`Bucket` per piece sent over the weight link and :class:`PushEnd`; :class:`Stop`;
- from a worker (the rank's outbox): :class:`Ready`, :class:`Finished` (a :class:`Done`,
  pickled), :class:`Failed`.
"""

from __future__ import annotations

from dataclasses import dataclass

from lit_rag.rollout.base import SamplingParams
from lit_rag.types import Example, Trajectory


@dataclass(frozen=True)
class Job:
    """A batch of examples to roll out: ``group_size`` samples each, or a validation rollout
    (``group_size`` None). ``rng``: the trainer's random states to sample from (and hand back),
    else the worker seeds its generators from ``seed``."""

    id: int
    examples: list[Example]
    group_size: int | None
    params: SamplingParams
    seed: int
    rng: dict | None = None


@dataclass
class Done:
    """A finished job: its trajectories, the worker's seconds on it and its random states
    after it (when the job brought the trainer's)."""

    job: int
    trajectories: list[Trajectory]
    seconds: float
    rng: dict | None = None


@dataclass(frozen=True)
class Push:
    """The trainer's weights follow, as policy ``version``: buckets until :class:`PushEnd`."""

    version: int


@dataclass(frozen=True)
class Bucket:
    """One piece of a push: the tensors it holds (``entries``, as
    :func:`~lit_rag.rollout.workers.transport.unpack` reads them) and its ``size`` in bytes,
    which arrive over the weight link."""

    entries: list
    size: int


@dataclass(frozen=True)
class PushEnd:
    """The push's last bucket was sent."""


@dataclass(frozen=True)
class Stop:
    """Finish the job at hand, if any, and exit."""


@dataclass(frozen=True)
class Ready:
    """Worker ``worker`` started its engine, which holds weights in ``dtype`` (``torch.``
    less); it opens its side of the weight link next."""

    worker: int
    dtype: str


@dataclass(frozen=True)
class Finished:
    """Worker ``worker`` finished a job: ``done`` is its :class:`Done`, pickled by value (a
    tensor shared through a file descriptor is lost if the worker dies before the trainer
    reads it)."""

    worker: int
    done: bytes


@dataclass(frozen=True)
class Failed:
    """Worker ``worker`` raised: the exception as one line (its type, message and where)."""

    worker: int
    error: str
