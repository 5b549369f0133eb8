"""Health signals of a training step (docs/DESIGN.md, "Run health"): what a rollout says about
how the run is going before the reward curve does.

:func:`health_metrics` reads a step's trajectories and rewards and returns, as step metrics:

- ``health/searches_mean``, ``health/searches_std``: queries issued per episode and their
  spread (multi-step environments); ``health/repeated_query_rate``: the share of an episode's
  queries that repeat an earlier one (case and spaces ignored);
- ``health/answered``: the share of episodes with an answer; ``health/invalid_actions``:
  invalid actions per episode;
- ``health/think_words``: words inside ``<think>`` blocks per episode;
- ``health/groups_with_variance``: the share of prompt groups whose samples' rewards differ
  (a group without it carries no gradient in GRPO);
- ``health/entropy``: the mean of -log p of the sampled tokens under the engine (a one-sample
  estimate of the per-token entropy: E[-log p(x)] = H);
- ``health/non_ascii``: the share of the policy's characters outside ASCII;
  ``health/repeated_ngrams``: the share of an episode's sampled-token 4-grams that occur
  earlier in it (loops of words, or of one character);
- guards (``lit_rag.health.guards``), each a share of all the step's samples:
  ``rollout/example_copy_rate`` (the answer is the prompt's worked example's, not the gold
  one), ``rollout/passage_copy_rate`` (12 words in a row copied from a retrieved or given
  passage), ``rollout/hedged_answers`` (the answer lists more candidates than the gold), and
  ``rollout/token_mismatch`` (trained tokens that are not what the engine sampled; must be 0).

Completion length, truncation, KL, the trainer / engine log-prob gap and the reward per
component are logged by the step already (``lit_rag/trainer/phases.py``). Everything here reads
only the policy's own text (``Trajectory.policy_text``) and never raises on what a model wrote.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from lit_rag.health.guards import copied_span, copies_example, hedged
from lit_rag.text import tag_blocks
from lit_rag.types import RewardBreakdown, Trajectory


def _mean(values: list[float]) -> torch.Tensor:
    return torch.tensor(sum(values) / len(values) if values else 0.0)


def _queries(t: Trajectory) -> list[str]:
    return [" ".join(s.query.lower().split()) for s in t.steps if s.query]


def search_signals(trajectories: list[Trajectory]) -> dict[str, torch.Tensor]:
    """Queries per episode (mean, spread) and the repeated-query rate; none for an environment
    without steps."""
    if not any(t.steps for t in trajectories):
        return {}
    counts = torch.tensor([float(len(_queries(t))) for t in trajectories])
    repeats = [1.0 - len(set(q)) / len(q) for q in (_queries(t) for t in trajectories) if q]
    return {
        "health/searches_mean": counts.mean(),
        "health/searches_std": counts.std(unbiased=False),
        "health/repeated_query_rate": _mean(repeats),
        "health/invalid_actions": _mean(
            [float(sum(s.action == "invalid" for s in t.steps)) for t in trajectories]
        ),
    }


def groups_with_variance(trajectories: list[Trajectory], rewards: RewardBreakdown) -> float:
    """The share of prompt groups whose samples' rewards (a step-level reward's return) are not
    all equal."""
    total = rewards.total.float()
    per = total.sum(-1) if total.dim() == 2 else total  # [N]
    groups: dict[int, list[float]] = defaultdict(list)
    for t, r in zip(trajectories, per.tolist(), strict=True):
        groups[t.group].append(r)
    if not groups:
        return 0.0
    return sum(max(v) - min(v) > 1e-6 for v in groups.values()) / len(groups)


def entropy(trajectories: list[Trajectory]) -> float:
    """Mean -log p of the sampled tokens (loss mask 1) under the engine's sampling log-probs."""
    total, count = 0.0, 0
    for t in trajectories:
        keep = t.loss_mask.bool()
        total -= float(t.sampling_logprobs[keep].float().sum())
        count += int(keep.sum())
    return total / count if count else 0.0


def repeated_ngrams(items: Sequence, n: int = 4) -> float:
    """The share of ``items``' ``n``-grams (a completion's sampled token ids) that occurred
    earlier in it: loops of words and of single characters ("2222...") alike."""
    grams = [tuple(items[i : i + n]) for i in range(len(items) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def non_ascii(texts: list[str]) -> float:
    """The share of the characters of ``texts`` outside ASCII."""
    chars = sum(len(t) for t in texts)
    return sum(sum(ord(c) > 127 for c in t) for t in texts) / chars if chars else 0.0


def _sources(t: Trajectory) -> list[str]:
    """The passages the policy saw: the ones the environment inserted and the example's given
    references."""
    return [t.inserted_text, *(p.text for p in t.example.references)]


def guard_signals(trajectories: list[Trajectory], answers: list[str]) -> dict[str, torch.Tensor]:
    """The reward-integrity guards' rates (module doc), each over all of the step's
    trajectories (a trajectory without an answer copies and hedges nothing), so a step where
    few samples answer cannot read as a high rate."""
    pairs = list(zip(trajectories, answers, strict=True))
    return {
        "rollout/example_copy_rate": _mean(
            [float(copies_example(a, t.prompt_text, t.example.answers)) for t, a in pairs]
        ),
        "rollout/passage_copy_rate": _mean(
            [float(copied_span(t.policy_text, _sources(t))) for t in trajectories]
        ),
        "rollout/hedged_answers": _mean([float(hedged(a, t.example.answers)) for t, a in pairs]),
        "rollout/token_mismatch": torch.tensor(float(sum(t.token_mismatch for t in trajectories))),
    }


def health_metrics(
    trajectories: list[Trajectory], rewards: RewardBreakdown, environment
) -> dict[str, torch.Tensor]:
    """Every health signal of a step (module doc); ``environment.extract_answer`` gives each
    trajectory's answer."""
    if not trajectories:
        return {}
    texts = [t.policy_text for t in trajectories]
    answers = [environment.extract_answer(t) or "" for t in trajectories]
    metrics = {
        "health/answered": _mean([float(bool(a.strip())) for a in answers]),
        "health/think_words": _mean(
            [float(sum(len(b.split()) for b in tag_blocks(x, "think"))) for x in texts]
        ),
        "health/groups_with_variance": torch.tensor(groups_with_variance(trajectories, rewards)),
        "health/entropy": torch.tensor(entropy(trajectories)),
        "health/non_ascii": torch.tensor(non_ascii(texts)),
        "health/repeated_ngrams": _mean(
            [repeated_ngrams(t.completion_ids[t.loss_mask.bool()].tolist()) for t in trajectories]
        ),
    }
    metrics.update(search_signals(trajectories))
    metrics.update(guard_signals(trajectories, answers))
    return metrics
