"""Detectors of the failure patterns RL runs for search agents are known for (docs/DESIGN.md,
"Run health"), read off the step metrics a run logs.

Each detector watches one series and fires once when its pattern starts (it re-arms after the
series has been clear for as many steps as it took to fire). It says what it saw and what the
field's users found helped. The patterns, with where they are reported:

- ``reward_collapse``: the moving reward (the mean of the last ``window`` = 5 steps) has lost
  more than ``threshold`` (a share, 0.5) of its best level so far (the highest mean of
  ``reference`` = 20 steps in a row), by more than ``margin`` = 6 times the noise that
  difference has on this run; it waits ``warmup`` = 20 steps. A sudden collapse fires a few
  steps after it starts, one spread over tens of steps when half the best level is gone, and a
  rising run's low, noisy first steps cannot fire (Search-R1 issues 88 and 92, ZeroSearch
  issue 23, ConvSearch-R1 issue 6);
- ``kl_blowup`` / ``logprob_gap_blowup``: the KL to the reference, or the trainer / engine
  log-prob gap, jumps above ``threshold`` times its median (over the last 1,000 steps) and
  above a floor (KL 0.5: a normal quickstart ends near 0.3; gap 0.5 nats: a normal one stays
  under 0.05). The gap leaves out what the sampler's top-p / top-k truncation explains
  (:class:`~lit_rag.trainer.phases.Mismatch`), so truncation alone never fires it;
- ``entropy_collapse``: the sampled tokens' entropy, as the mean of the last ``window`` = 5
  steps, falls below ``threshold`` times the mean of the first 5: the policy stops exploring;
- ``degenerate_text`` / ``non_ascii_text``: more than ``threshold`` of the sampled tokens'
  4-grams repeat (loops), or of the policy's characters are non-ASCII (gibberish, another
  language);
- ``no_variance``: fewer than ``threshold`` of the groups have reward variance, on the mean of
  the last (up to) ``window`` = 10 steps, for ``patience`` steps: GRPO learns nothing from the
  rest (a mean, because a step with few groups has none with variance by chance);
- ``truncation``: more than ``threshold`` of the episodes hit the token budget (default 0.9:
  the quickstart's tight budget truncates up to 0.88 of them while it learns);
- ``example_copying``: more than ``threshold`` of the answers are the prompt's worked
  example's (the ARENA HotpotQA CPU recipe's format gain was this);
- guards: ``hedging`` (answers listing several candidates), ``passage_copying`` (policy text
  copied verbatim from passages) and ``token_mismatch`` (trained tokens that are not the
  sampled ones);
- tool agents: ``template_mismatch`` (any episode whose trained text differs from the chat
  template's rendering), ``environment_failures`` (over 0.1 of the last 3 steps' episodes
  failed by the environment: they leave the loss, :mod:`lit_rag.trainer.failures`),
  ``tool_failures`` (over 0.1 of the last 5 steps' episodes failed by a dead tool server or a
  timeout), ``tool_errors`` (over half the calls fail, three steps in a row) and
  ``judge_failures`` (over 0.1 of the last 3 steps' verdicts failed). A healthy run's rare
  failures (a timeout now and then) stay under them.

:func:`detectors` builds them with a recipe's thresholds; each is a plain object over a list
of values, so a test runs it over a recorded metric series.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from itertools import pairwise

#: values a detector keeps: a spike is judged against the median of the last ``KEEP`` steps
KEEP = 1000
#: ``drop``: the steps whose step-to-step changes measure a reward's noise
NOISE = 100


@dataclass
class Detector:
    """One pattern on one metric series.

    Args:
        name: The detector's name (a recipe's ``disabled`` / ``stop_on`` / ``thresholds`` key).
        metric: The step metric it reads.
        rule: ``above`` / ``below`` (the mean of the last ``window`` values against
            ``threshold``), ``drop`` (reward collapse: a share of the best level lost),
            ``spike`` (a jump over the running median), ``fall`` (below a fraction of the first
            steps' mean).
        threshold: The rule's threshold (``drop``, ``fall``: a share between 0 and 1).
        what: What it means, in a few words (the line it prints starts with it).
        advice: What the field's users found helped.
        patience: Consecutive steps the rule must hold before it fires.
        floor: ``spike``: the value must also exceed this; ``fall``: the first steps' mean
            must exceed it (a series that starts at 0 cannot fall).
        window: Steps in the moving mean the rule judges (the last ones, this step's
            included; fewer while fewer are in); ``fall``: also steps in the first mean.
        reference: ``drop``: steps in each mean the best level is the highest of.
        warmup: ``drop``: steps before it can fire.
        margin: ``drop``: how many times its noise the loss must also exceed.
    """

    name: str
    metric: str
    rule: str
    threshold: float
    what: str
    advice: str
    patience: int = 1
    floor: float = 0.0
    window: int = 1
    reference: int = 20
    warmup: int = 20
    margin: float = 6.0
    history: list[float] = field(default_factory=list, repr=False)
    start: list[float] = field(default_factory=list, repr=False)
    best: float | None = None
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

    def _last(self, value: float, n: int) -> list[float]:
        """The last ``n`` values, ``value`` (this step's) included; fewer while fewer are in."""
        return [*self.history[max(0, len(self.history) - n + 1) :], value]

    def _holds(self, value: float) -> bool:
        if self.rule == "drop":
            return self._dropped(value)
        if self.rule == "spike":
            return len(self.history) >= 1 and value > max(
                self.floor, self.threshold * statistics.median(self.history)
            )
        moving = statistics.fmean(self._last(value, self.window))
        if self.rule == "above":
            return moving > self.threshold
        if self.rule == "below":
            return moving < self.threshold
        # fall: the moving mean against the first ``window`` steps' mean, once both are in
        first = self.start
        start = statistics.fmean(first) if len(first) == self.window else 0.0
        return start > self.floor and moving < self.threshold * start

    def _dropped(self, value: float) -> bool:
        """``drop``: the mean of the last ``window`` values below the best mean of
        ``reference`` values in a row so far by more than ``threshold`` of that best and by
        more than ``margin`` times the noise of that difference; never in the first ``warmup``
        steps. Updates the best."""
        if len(self.history) + 1 >= self.reference:
            level = statistics.fmean(self._last(value, self.reference))
            self.best = level if self.best is None else max(self.best, level)
        if len(self.history) + 1 < self.warmup or self.best is None:
            return False
        loss = self.best - statistics.fmean(self._last(value, self.window))
        # the noise of the steps before the ones judged, so a collapse does not raise its own bar
        before = self.history[: len(self.history) - self.window + 1][-NOISE:]
        # a mean of n steps spreads noise / sqrt(n); a difference of two means, the root of
        # the sum of their squares
        margin = self.margin * noise(before) * math.sqrt(1 / self.window + 1 / self.reference)
        return loss > max(self.threshold * abs(self.best), margin)


def noise(values: list[float]) -> float:
    """One step's noise (a standard deviation) read off the step-to-step changes of ``values``,
    so a trend does not count: a change between two steps with noise s has mean size
    2 s / sqrt(pi), so s is sqrt(pi) / 2 times the changes' mean size (0 for fewer than two).

    Example: ``noise([0.4, 0.44, 0.4, 0.44])`` is ``0.04 * sqrt(pi) / 2``, about 0.035.
    """
    changes = [abs(b - a) for a, b in pairwise(values)]
    return math.sqrt(math.pi) / 2 * statistics.fmean(changes) if changes else 0.0


_LOWER_LR = "lower the learning rate (a tenth), add warm-up steps"

#: name -> (metric, rule, default threshold, patience, floor, window, what, advice)
DEFAULTS: dict[str, tuple] = {
    "reward_collapse": (
        "reward/total",
        "drop",
        0.5,
        1,
        0.0,
        5,
        "reward collapse: the moving reward lost over half its best level, far beyond its noise",
        f"{_LOWER_LR}, start from the base model instead of an instruct one, or change the "
        "estimator (e.g. Dr.GRPO's, or a stabilized KL)",
    ),
    "kl_blowup": (
        "train/kl",
        "spike",
        10.0,
        1,
        0.5,
        1,
        "KL blow-up: the KL to the reference jumped over ten times its median",
        f"{_LOWER_LR}, raise the KL coefficient, or use fewer passes per batch",
    ),
    "logprob_gap_blowup": (
        "rollout/logprob_diff_mean",
        "spike",
        10.0,
        1,
        0.5,
        1,
        "log-prob gap blow-up: trainer and engine disagree on the sampled tokens beyond what "
        "the sampler's truncation explains",
        "check that both run the same precision and weights (engine sync), and turn GRPO's "
        "truncated importance-sampling correction on (importance_sampling_cap: 2)",
    ),
    "entropy_collapse": (
        "health/entropy",
        "fall",
        0.2,
        1,
        0.05,
        5,
        "entropy collapse: the sampled tokens' entropy fell below a fifth of its start",
        "raise the temperature, clip higher (DAPO's eps_high 0.28), or lower the learning rate",
    ),
    "degenerate_text": (
        "health/repeated_ngrams",
        "above",
        0.5,
        2,
        0.0,
        1,
        "degenerate text: most of the completions' token 4-grams repeat (loops)",
        f"{_LOWER_LR}, raise the KL coefficient, or restart from the last good checkpoint",
    ),
    "non_ascii_text": (
        "health/non_ascii",
        "above",
        0.2,
        2,
        0.0,
        1,
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
        10,
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
        1,
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
        1,
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
        1,
        "hedging: answers list several candidates",
        "set the reward's hedging to zero (or cap) so a committed answer pays more",
    ),
    "passage_copying": (
        "rollout/passage_copy_rate",
        "above",
        0.5,
        3,
        0.0,
        1,
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
        1,
        "token mismatch: the policy trains on tokens the engine did not sample",
        "an environment re-encoded the policy's text; train on the sampled token ids",
    ),
    "template_mismatch": (
        "rollout/template_mismatch",
        "above",
        0.0,
        1,
        0.0,
        1,
        "template mismatch: the tokens trained across tool turns are not what the chat "
        "template renders for the same conversation",
        "use the family's training template (environment chat_template: qwen3, llama3, ...) "
        "and read the episodes' meta['template_mismatches']",
    ),
    "environment_failures": (
        "rollout/environment_failed",
        "above",
        0.1,
        1,
        0.0,
        3,
        "environment failures: over a tenth of the episodes of the last 3 steps failed for "
        "the environment's fault (a dead tool server, tool timeouts, a judge with no verdict)",
        "check the tool servers, the retriever and the judge endpoint (and their timeouts); "
        "these episodes leave the loss (model.environment_failures: drop)",
    ),
    "tool_failures": (
        "rollout/failed",
        "above",
        0.1,
        1,
        0.0,
        5,
        "tool failures: over a tenth of the episodes of the last 5 steps failed because a tool's "
        "server is unavailable or its calls time out",
        "check the server (MCP servers reconnect on their own) and the tool's timeout_s; "
        "these episodes leave the loss meanwhile",
    ),
    "tool_errors": (
        "rollout/tool_error_rate",
        "above",
        0.5,
        3,
        0.0,
        1,
        "tool errors: over half the tool calls fail (malformed calls, unknown tools, bad "
        "arguments, errors, timeouts)",
        "read rollout/tool_errors/<kind>: malformed or bad_arguments mean the model does not "
        "follow the template's calling format (check environment parser); timeout or "
        "tool_error point at the tool",
    ),
    "judge_failures": (
        "reward/judge_failures",
        "above",
        0.1,
        1,
        0.0,
        3,
        "judge failures: over a tenth of the judge's verdicts of the last 3 steps failed",
        "check the judge endpoint; a reasoning judge needs max_tokens to finish its reasoning "
        "or chat_template_kwargs: {enable_thinking: false}",
    ),
}


def detectors(
    thresholds: dict[str, float] | None = None, disabled: list[str] | tuple[str, ...] = ()
) -> list[Detector]:
    """The detectors of :data:`DEFAULTS` with ``thresholds`` in place of the defaults, less the
    ones named in ``disabled``.

    Raises:
        ValueError: A name that is no detector's (one line naming the known ones), or a share
            (a ``drop`` or ``fall`` threshold) outside 0 to 1.
    """
    thresholds = dict(thresholds or {})
    unknown = sorted((set(thresholds) | set(disabled)) - set(DEFAULTS))
    if unknown:
        raise ValueError(
            f"health detector {', '.join(unknown)} is not known; known: {', '.join(DEFAULTS)}"
        )
    for name, value in thresholds.items():
        if DEFAULTS[name][1] in ("drop", "fall") and not 0 < value < 1:
            raise ValueError(
                f"health thresholds: {name} {value} is not a share; allowed: between 0 and 1 "
                f"(default {DEFAULTS[name][2]})"
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
