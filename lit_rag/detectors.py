"""Detectors of the failure patterns RL runs for search agents are known for (docs/DESIGN.md,
"Run health"), read off the step metrics a run logs.

Each detector watches one series and fires once when its pattern starts (it re-arms after the
series has been clear for as many steps as it took to fire). It says what it saw and what the
field's users found helped. The patterns, with where they are reported:

- ``reward_collapse``: the moving reward (the mean of the last ``window`` steps) falls below
  the steps before it by more than ``threshold`` times their spread and by more than half
  their mean: a sudden collapse a few hundred steps in (Search-R1 issues 88 and 92, ZeroSearch
  issue 23, ConvSearch-R1 issue 6);
- ``kl_blowup`` / ``logprob_gap_blowup``: the KL to the reference, or the trainer / engine
  log-prob gap, jumps above ``threshold`` times its median (over the last 1,000 steps) and
  above a floor (KL 0.5: a normal quickstart ends near 0.3; gap 0.5 nats: a normal one stays
  under 0.05);
- ``entropy_collapse``: the sampled tokens' entropy falls below ``threshold`` times its
  first steps' mean: the policy stops exploring;
- ``degenerate_text`` / ``non_ascii_text``: more than ``threshold`` of the sampled tokens'
  4-grams repeat (loops), or of the policy's characters are non-ASCII (gibberish, another
  language);
- ``no_variance``: fewer than ``threshold`` of the groups have reward variance, for
  ``patience`` steps: GRPO learns nothing from the rest;
- ``truncation``: more than ``threshold`` of the episodes hit the token budget (default 0.9:
  the quickstart's tight budget truncates up to 0.88 of them while it learns);
- ``example_copying``: more than ``threshold`` of the answers are the prompt's worked
  example's (the ARENA HotpotQA CPU recipe's format gain was this);
- guards: ``hedging`` (answers listing several candidates), ``passage_copying`` (policy text
  copied verbatim from passages) and ``token_mismatch`` (trained tokens that are not the
  sampled ones).

:func:`detectors` builds them with a recipe's thresholds; each is a plain object over a list
of values, so a test runs it over a recorded metric series.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

#: values a detector keeps: a spike is judged against the median of the last ``KEEP`` steps
KEEP = 1000


@dataclass
class Detector:
    """One pattern on one metric series.

    Args:
        name: The detector's name (a recipe's ``disabled`` / ``stop_on`` / ``thresholds`` key).
        metric: The step metric it reads.
        rule: ``above`` / ``below`` (the value against ``threshold``), ``drop`` (reward
            collapse), ``spike`` (a jump over the running median), ``fall`` (below a
            fraction of the first steps' mean).
        threshold: The rule's threshold.
        what: What it means, in a few words (the line it prints starts with it).
        advice: What the field's users found helped.
        patience: Consecutive steps the rule must hold before it fires.
        floor: ``spike``: the value must also exceed this; ``fall``: the first steps' mean
            must exceed it (a series that starts at 0 cannot fall).
        window: ``drop``: steps in the moving mean; ``fall``: steps in the first mean.
    """

    name: str
    metric: str
    rule: str
    threshold: float
    what: str
    advice: str
    patience: int = 1
    floor: float = 0.0
    window: int = 2
    history: list[float] = field(default_factory=list, repr=False)
    start: list[float] = field(default_factory=list, repr=False)
    held: int = 0
    clear: int = 0
    fired: bool = False

    def update(self, value: float | None) -> str | None:
        """Add one step's value (None or NaN: the step did not log it); the line to print when
        the pattern starts at this step, else None."""
        if value is None or math.isnan(value):
            return None
        holds = self._holds(value)
        self.history = [*self.history[-(KEEP - 1) :], value]
        if len(self.start) < self.window:
            self.start.append(value)
        self.held, self.clear = (self.held + 1, 0) if holds else (0, self.clear + 1)
        if self.fired and self.clear >= self.patience:
            self.fired = False  # clear as long as it took to fire: re-armed
        if holds and self.held >= self.patience and not self.fired:
            self.fired = True
            return f"{self.what} ({self.metric} {value:.4g}); {self.advice}"
        return None

    def _holds(self, value: float) -> bool:
        if self.rule == "above":
            return value > self.threshold
        if self.rule == "below":
            return value < self.threshold
        if self.rule == "spike":
            return len(self.history) >= 1 and value > max(
                self.floor, self.threshold * statistics.median(self.history)
            )
        if self.rule == "fall":
            first = self.start
            start = sum(first) / len(first) if len(first) == self.window else 0.0
            return start > self.floor and value < self.threshold * start
        return self._dropped(value)

    def _dropped(self, value: float) -> bool:
        """``drop``: the moving mean of the last ``window`` values (this one included) below
        the up-to-10 values before them by ``threshold`` spreads and half their mean."""
        recent = [*self.history[-(self.window - 1) :], value] if self.window > 1 else [value]
        before = self.history[: len(self.history) - (len(recent) - 1)][-10:]
        if len(before) < 3:
            return False
        mean, spread = statistics.fmean(before), statistics.pstdev(before)
        moving = statistics.fmean(recent)
        return mean - moving > max(self.threshold * spread, 0.5 * abs(mean), 1e-9)


_LOWER_LR = "lower the learning rate (a tenth), add warm-up steps"

#: name -> (metric, rule, default threshold, patience, floor, window, what, advice)
DEFAULTS: dict[str, tuple] = {
    "reward_collapse": (
        "reward/total",
        "drop",
        3.0,
        1,
        0.0,
        2,
        "reward collapse: the moving reward fell far below its recent spread",
        f"{_LOWER_LR}, start from the base model instead of an instruct one, or change the "
        "estimator (e.g. Dr.GRPO's, or a stabilized KL)",
    ),
    "kl_blowup": (
        "train/kl",
        "spike",
        10.0,
        1,
        0.5,
        2,
        "KL blow-up: the KL to the reference jumped over ten times its median",
        f"{_LOWER_LR}, raise the KL coefficient, or use fewer passes per batch",
    ),
    "logprob_gap_blowup": (
        "rollout/logprob_diff_mean",
        "spike",
        10.0,
        1,
        0.5,
        2,
        "log-prob gap blow-up: trainer and engine disagree on the sampled tokens",
        "check that both run the same precision and weights (engine sync), and keep the "
        "truncated importance-sampling correction on",
    ),
    "entropy_collapse": (
        "health/entropy",
        "fall",
        0.2,
        2,
        0.05,
        3,
        "entropy collapse: the sampled tokens' entropy fell below a fifth of its start",
        "raise the temperature, clip higher (DAPO's eps_high 0.28), or lower the learning rate",
    ),
    "degenerate_text": (
        "health/repeated_ngrams",
        "above",
        0.5,
        2,
        0.0,
        2,
        "degenerate text: most of the completions' token 4-grams repeat (loops)",
        f"{_LOWER_LR}, raise the KL coefficient, or restart from the last good checkpoint",
    ),
    "non_ascii_text": (
        "health/non_ascii",
        "above",
        0.2,
        2,
        0.0,
        2,
        "degenerate text: a fifth of the policy's characters are outside ASCII "
        "(gibberish or another language)",
        f"{_LOWER_LR}, raise the KL coefficient, or restart from the last good checkpoint",
    ),
    "no_variance": (
        "health/groups_with_variance",
        "below",
        0.25,
        3,
        0.0,
        2,
        "groups without reward variance dominate: most groups carry no gradient",
        "use questions nearer the model's level, a larger group, DAPO's dynamic sampling, or "
        "reshape the reward (benchmarks/reward_base_rate.py)",
    ),
    "truncation": (
        "rollout/truncated_fraction",
        "above",
        0.9,
        3,
        0.0,
        2,
        "truncation dominates: most episodes hit the token budget",
        "raise max_new_tokens (or max_response_tokens), lower max_turns, or penalize overlong "
        "outputs",
    ),
    "example_copying": (
        "rollout/example_copy_rate",
        "above",
        0.5,
        2,
        0.0,
        2,
        "example copying: most samples answer with the prompt's worked example's answer",
        "vary the worked example (environment example_outputs) or drop it, and check the "
        "format reward does not pay a copy",
    ),
    "hedging": (
        "rollout/hedged_answers",
        "above",
        0.2,
        2,
        0.0,
        2,
        "hedging: answers list several candidates",
        "set the reward's hedging to zero (or cap) so a committed answer pays more",
    ),
    "passage_copying": (
        "rollout/passage_copy_rate",
        "above",
        0.5,
        3,
        0.0,
        2,
        "passage copying: completions repeat 12 or more words of a passage verbatim",
        "read the rollouts: if the reward should not pay copied text, score it on the "
        "policy's own words",
    ),
    "token_mismatch": (
        "rollout/token_mismatch",
        "above",
        0.0,
        1,
        0.0,
        2,
        "token mismatch: the policy trains on tokens the engine did not sample",
        "an environment re-encoded the policy's text; train on the sampled token ids",
    ),
}


def detectors(
    thresholds: dict[str, float] | None = None, disabled: list[str] | tuple[str, ...] = ()
) -> list[Detector]:
    """The detectors of :data:`DEFAULTS` with ``thresholds`` in place of the defaults, less the
    ones named in ``disabled``.

    Raises:
        ValueError: A name that is no detector's (one line naming the known ones).
    """
    thresholds = dict(thresholds or {})
    unknown = sorted((set(thresholds) | set(disabled)) - set(DEFAULTS))
    if unknown:
        raise ValueError(
            f"health detector {', '.join(unknown)} is not known; known: {', '.join(DEFAULTS)}"
        )
    out = []
    for name, (metric, rule, threshold, patience, floor, window, what, advice) in DEFAULTS.items():
        if name not in disabled:
            out.append(
                Detector(
                    name,
                    metric,
                    rule,
                    float(thresholds.get(name, threshold)),
                    what,
                    advice,
                    patience,
                    floor,
                    window,
                )
            )
    return out


def scan(series: dict[str, list[float]], chosen: list[Detector] | None = None) -> list[tuple]:
    """Every detector over recorded series (metric -> one value per step, NaN where a step did
    not log it): ``(step index, detector name, line)`` for each time one fires."""
    fired = []
    for d in detectors() if chosen is None else chosen:
        for step, value in enumerate(series.get(d.metric, [])):
            line = d.update(value)
            if line is not None:
                fired.append((step, d.name, line))
    return sorted(fired)
