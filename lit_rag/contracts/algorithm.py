"""Algorithm contract (docs/DESIGN.md step 4): trajectories + rewards -> a typed batch;
log-probs -> loss.

An :class:`Algorithm` never generates text and imports nothing from Lightning (docs/STYLE.md 1). Its
:meth:`~Algorithm.prepare` returns a :class:`Prepared` (a :class:`TrainBatch` and metrics); the
policy module adds the log-probs it computes (``ref_logprobs``, ``old_logprobs``,
``logprobs``) to micro-batches of it and hands each to :meth:`~Algorithm.loss`.

GRPO-family algorithms choose two small registered functions by name (docs/STYLE.md 13, after verl's
``register_adv_est`` / ``register_policy_loss`` in ``verl/trainer/ppo/core_algos.py``):

- an advantage estimator, :data:`AdvantageFn`: ``(rewards [N], groups [N], scale_rewards) -> [N]``,
  registered under the entry-point group ``lit_rag.advantages``;
- a policy loss, :data:`PolicyLossFn`: ``(logprobs, old_logprobs, advantages, mask, config) ->
  TokenLoss`` (a ``[B, C]`` per-token loss and metrics), registered under
  ``lit_rag.policy_losses``. The algorithm weights and sums the per-token loss (its
  aggregation), adds its KL term and any importance-sampling correction.

Optional capabilities are declared here, with defaults, instead of being probed with getattr:
``row_group`` (rows a micro-batch keeps together), ``dynamic_sampling_rounds`` with
:meth:`~Algorithm.informative_groups` (refilling), ``kl_coef`` (a KL controller may adapt it),
``wants_scorer`` / ``scorer`` (pair selection by a reward model), ``corrects_stale_samples``
with :meth:`~Algorithm.accept_stale_samples` (samples from older weights, rollout workers ahead
of the trainer), and ``state_dict`` / ``load_state_dict`` (the checkpoint carries them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from lit_rag.rollout.base import Placement
from lit_rag.types import RewardBreakdown, Trajectory


@dataclass
class LossOutput:
    """What an algorithm's loss returns.

    Args:
        loss: Scalar to backpropagate.
        metrics: Detached scalars to log (name -> value).
    """

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class TokenLoss:
    """What a policy loss function returns.

    Args:
        per_token: ``[B, C]`` loss of each completion token (any value where ``mask`` is 0:
            the algorithm's token weights are 0 there).
        metrics: Detached scalars to log (name -> value), means over the micro-batch.
    """

    per_token: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class PolicyLossConfig:
    """Settings a policy loss reads.

    Args:
        epsilon_low: Lower clip range (ratio >= 1 - epsilon_low).
        epsilon_high: Upper clip range (ratio <= 1 + epsilon_high).
        options: Further keyword settings of a third-party loss, from the recipe's
            ``policy_loss_args``.
    """

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    options: dict = field(default_factory=dict)


#: ``(rewards [N], groups [N] (prompt group ids), scale_rewards) -> advantages [N]``
AdvantageFn = Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor]
#: ``(logprobs [B, C] with grad, old_logprobs [B, C], advantages [B], mask [B, C], config)
#: -> TokenLoss``
PolicyLossFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, PolicyLossConfig], TokenLoss
]

#: per-row tensor fields of a TrainBatch (first dimension N)
_ROW_FIELDS = (
    "input_ids",
    "attention_mask",
    "completion_mask",
    "sampling_logprobs",
    "advantages",
    "token_weights",
    "ref_logprobs",
    "old_logprobs",
    "logprobs",
    "staleness",
)


@dataclass
class TrainBatch:
    """The rows an algorithm trains on: prompts left-padded, completions right-padded, so every
    completion starts at column ``P`` (see :func:`collate`).

    Args:
        input_ids: ``[N, P + C]`` prompt and completion tokens.
        attention_mask: ``[N, P + C]`` 1 on real tokens.
        completion_mask: ``[N, C]`` 1 on tokens in the loss (the policy's own; 0 on padding and
            on text the environment inserted).
        sampling_logprobs: ``[N, C]`` log-probs under the engine that sampled.
        advantages: ``[N]`` per-row advantage (GRPO family).
        token_weights: ``[N, C]`` aggregation weights; the loss is ``sum(per_token * weights)``
            over the batch, so micro-batches add up.
        ref_logprobs: ``[N, C]`` under the reference model (set by the policy module when the
            algorithm ``needs_reference``).
        old_logprobs: ``[N, C]`` under the policy that sampled, before any update (set by the
            policy module; with ``mu`` = 1 the detached ``logprobs``).
        logprobs: ``[N, C]`` under the current policy, with grad (set per micro-batch).
        extra: The algorithm's own per-row tensors (first dimension N), sliced with the rest.
        staleness: ``[N]`` policy versions each row's sampling weights lag the trained ones
            (``Trajectory.staleness``); None: all 0.
        mini_batches: ``(rows, loss scale)`` per optimizer step of one pass; ``None``: the
            whole batch in one step, scale 1.
        normalizer: The count the batch's loss is a mean over on this rank: tokens for a token
            mean (DAPO's), rows for a sequence mean, pairs for DPO, 1 for a plain sum. A
            mini-batch's own count is ``normalizer / scale``. With several ranks the policy
            module replaces each count by its sum over the ranks, so the loss is the mean over
            the global batch (every rank's rows weighted alike) rather than a mean of the
            ranks' means; ``None``: each rank's mean as it is.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    advantages: torch.Tensor | None = None
    token_weights: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    mini_batches: list[tuple[torch.Tensor, float]] | None = None
    staleness: torch.Tensor | None = None
    normalizer: float | None = None

    @property
    def size(self) -> int:
        """Number of rows N."""
        return int(self.input_ids.shape[0])

    @property
    def width(self) -> int:
        """Completion columns C."""
        return int(self.completion_mask.shape[1])

    def on_policy_rows(self) -> list[int]:
        """The rows sampled wholly by the weights being trained (staleness 0): where the
        engine's log-probs measure the engine, not the age of the weights that sampled."""
        if self.staleness is None:
            return list(range(self.size))
        return (self.staleness == 0).nonzero().flatten().tolist()

    def rows(self, index: torch.Tensor) -> TrainBatch:
        """The rows ``index`` (an index tensor) of every per-row tensor; no mini-batch plan."""
        sliced = {
            name: getattr(self, name)[index]
            for name in _ROW_FIELDS
            if getattr(self, name) is not None
        }
        return TrainBatch(**sliced, extra={k: v[index] for k, v in self.extra.items()})

    def to(self, device: torch.device | str) -> TrainBatch:
        """Every tensor moved to ``device``."""
        moved = {
            name: getattr(self, name).to(device)
            for name in _ROW_FIELDS
            if getattr(self, name) is not None
        }
        return replace(self, **moved, extra={k: v.to(device) for k, v in self.extra.items()})


@dataclass
class Prepared:
    """What :meth:`Algorithm.prepare` returns.

    Args:
        batch: The rows to train on; ``None`` when this step has nothing to learn from (every
            group filtered, DPO still collecting pairs): no optimizer step then.
        metrics: Scalars to log as ``rollout/<name>``.
    """

    batch: TrainBatch | None
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Rows to train on (0 without a batch)."""
        return 0 if self.batch is None else self.batch.size


def collate(trajectories: list, pad_id: int = 0) -> TrainBatch:
    """Left-pad prompts and right-pad completions so all completions start at one column.

    ``trajectories`` are :class:`~lit_rag.types.Trajectory` objects or anything with their
    ``prompt_ids``, ``completion_ids``, ``loss_mask`` and ``sampling_logprobs`` (DPO's stored rows).
    """
    n = len(trajectories)
    prompt_width = max(int(t.prompt_ids.numel()) for t in trajectories)
    completion_width = max(1, max(int(t.completion_ids.numel()) for t in trajectories))
    input_ids = torch.full((n, prompt_width + completion_width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    completion_mask = torch.zeros((n, completion_width), dtype=torch.float32)
    sampling = torch.zeros((n, completion_width), dtype=torch.float32)
    staleness = torch.tensor([int(getattr(t, "staleness", 0)) for t in trajectories])
    for row, t in enumerate(trajectories):
        p, c = int(t.prompt_ids.numel()), int(t.completion_ids.numel())
        input_ids[row, prompt_width - p : prompt_width] = t.prompt_ids
        input_ids[row, prompt_width : prompt_width + c] = t.completion_ids
        attention[row, prompt_width - p : prompt_width + c] = 1
        completion_mask[row, :c] = t.loss_mask.float()
        sampling[row, :c] = t.sampling_logprobs.float()
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        completion_mask=completion_mask,
        sampling_logprobs=sampling,
        staleness=staleness,
    )


class Algorithm(ABC):
    """Turns a rollout batch into training rows and computes the policy loss.

    Attributes:
        mu: Optimization passes over each rollout batch (GRPO's mu).
        steps_per_pass: Optimizer steps per pass when the algorithm knows their number in
            advance (GRPO's ``mini_batches``; 1 otherwise): the learning-rate plan counts ``mu x
            steps_per_pass`` steps per rollout batch, and with more than one optimizer step per
            batch the policy module computes pi_old before the first.
        needs_reference: Whether reference log-probs must be computed for the batch.
        row_group: Consecutive rows that one micro-batch keeps together (DPO: chosen and
            rejected, 2).
        dynamic_sampling_rounds: Most rounds of extra prompts the policy module samples to
            refill groups without reward variance (0: no refilling); it counts them with
            :meth:`informative_groups` and passes ``max_groups`` to :meth:`prepare`.
        wants_scorer: Whether the algorithm ranks samples by a learned scorer, which a
            callback then sets as ``scorer`` (``trajectories -> [N]`` scores).
        placement: This process's rank among the run's ranks (:meth:`place`): an algorithm
            whose batch setting counts over all ranks divides it (DPO's ``max_pairs``).
        corrects_stale_samples: Whether the loss corrects a sample drawn by older weights
            (rollout workers ahead of the trainer) by truncated importance sampling over the
            sampling log-probs (GRPO's ``importance_sampling_cap``); False: such a sample
            trains as if on-policy (DPO's, whose loss reads no sampling log-probs), and the
            run says so. :meth:`accept_stale_samples` turns the correction on.
    """

    mu: int = 1
    steps_per_pass: int = 1
    needs_reference: bool = True
    row_group: int = 1
    dynamic_sampling_rounds: int = 0
    wants_scorer: bool = False
    scorer: Callable[[list[Trajectory]], torch.Tensor] | None = None
    placement: Placement = Placement()
    corrects_stale_samples: bool = False

    def place(self, placement: Placement) -> None:
        """Tell the algorithm which rank of how many runs it (the policy module does, before
        training); one process by default."""
        self.placement = placement

    @abstractmethod
    def prepare(
        self,
        trajectories: list[Trajectory],
        rewards: RewardBreakdown,
        max_groups: int | None = None,
    ) -> Prepared:
        """Advantages (or pairs), filtering, padding; ``max_groups``: keep at most that many
        informative groups (dynamic sampling)."""

    @abstractmethod
    def loss(self, batch: TrainBatch) -> LossOutput:
        """Loss of one micro-batch: ``batch.logprobs`` ``[B, C]`` has grad; the rest is what
        :meth:`prepare` produced, sliced to the micro-batch, plus the policy module's log-probs."""

    def accept_stale_samples(self, default_cap: float) -> bool:
        """The run will train on samples up to some versions old (rollout workers ahead of the
        trainer): an algorithm that ``corrects_stale_samples`` but whose recipe set no
        importance-sampling cap takes ``default_cap`` and returns True (the run says so).
        Default: nothing to change, False."""
        return False

    def informative_groups(self, trajectories: list[Trajectory], rewards: RewardBreakdown) -> int:
        """Groups that carry a gradient (default: all of them)."""
        return len({t.group for t in trajectories})

    @property
    def kl_coef(self) -> float | None:
        """The KL penalty's coefficient, which a KL controller may adapt; ``None``: no KL term."""
        return None

    @kl_coef.setter
    def kl_coef(self, value: float) -> None:
        raise AttributeError(f"{type(self).__name__} has no KL coefficient to set")

    def state_dict(self) -> dict:
        """State a resumed run needs (plain types and tensors); the checkpoint carries it."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 (optional hook)
        """Restore :meth:`state_dict`'s output."""
