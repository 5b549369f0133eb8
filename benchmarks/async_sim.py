"""Step time of colocated vs disaggregated (k-step async) RL training on a modelled cluster,
replayed from the costs of a measured run.

Schedules: ``colocated``: every device rolls out its share of the batch, then every device
trains, then the weights sync (TRL's colocate). ``k=0``: ``--rollout-gpus`` devices roll out, the
rest train, in turn. ``k>=1`` (``--staleness``): batch j is generated once the weights of update
j-k-1 have arrived (k=1: one-step-off); the trainer takes batches in order; the push after each
update pauses the rollout devices for its duration (a rollout in flight resumes after it).

Costs, fitted on a Lightning CSVLogger run folder over its training steps after ``--warmup``:

- rollout seconds = a + b x generated tokens + c x generations (least squares, coefficients
  >= 0) on ``time/worker_rollout_s`` if logged, else ``time/rollout_s``. Generations = episodes
  (``tokens/generated`` / ``rollout/completion_length``) x generations per episode
  (``rollout/turns`` shifted to the samples' mean; constant, folded into a, when not logged).
- update seconds = u0 + u1 x trained tokens on ``time/update_s``. A run that logs the step's
  ``time/sync_s`` phase (lit_rag/trainer/phases.py) times the update alone; an older one timed
  it through the weight sync (``time/weight_sync_s``, a worker run's ``time/weight_push_s``),
  which is taken off (``--sync-outside-update``: it was not).
- weight push: the mean sync, or with ``--params``: ``--sync-latency-s`` + params x
  ``--bytes-per-param`` / ``--bandwidth-gbs``. Overhead: mean step time (``time/step_s``, which
  policy.py logs on the next step's row) minus the components, charged to the trainer.

Episodes are drawn (seeded) from ``rollouts.jsonl``: a sample's policy generations (its
non-inserted segments, else its completion), in tokens at the characters-per-token rate that
makes the samples' mean the run's generated tokens per episode. A rollout device takes
``(a + max(sum_e b tok_e + c gen_e, max_e S b tok_e + c gen_e)) / --rollout-speed`` for its
share: its work at batched throughput, or its longest episode's sequential latency, a lone
sequence costing ``S = --saturation`` times the batched cost per token (1: the measured device;
on a GPU, tens; benchmarks/rollout.py measures the ratio here). A batch is ready when its slowest
device is; training on T > 1 devices divides u1 by T x ``--dp-efficiency``.

    python benchmarks/async_sim.py RUN --gpus 8 --rollout-gpus 4 --staleness 1 2 4
    python benchmarks/async_sim.py RUN --gpus 64 --rollout-gpus 32 --prompts-per-step 64 \\
        --group-size 8 --rollout-speed 20 --train-speed 20 --saturation 32 --params 135M

``--check COLOCATED K0 K1`` validates on this machine with three runs of one recipe: colocated
(one process, 2 cores), worker mode with ``max_staleness`` 0 and 1 (a rollout worker on one
core, the trainer on the other). Costs are fitted on the k=0 run; each worker run's logged work
goes through them and its schedule; the colocated prediction sums its own logged parts. It
prints predicted vs measured mean step time (``time/step_s``, else the parts' sum, from step
``--warmup`` + 1 on), PASS within 20% or FAIL; exit status 0 either way.

    python benchmarks/async_sim.py --check RUN_COLOCATED RUN_K0 RUN_K1

It reads run folders and simulates in seconds: ``--quick``, which the other benchmarks take, is
accepted and changes nothing. Under the output: the date, commit, machine, library versions and
the command with every option spelled out (``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import re
import shlex
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

import _bench
import numpy as np

TOLERANCE = 0.20  # --check: PASS when |predicted - measured| <= 20% of measured


# ---- reading a run ------------------------------------------------------------------------------
@dataclass
class Run:
    """A run's training rows (validation rows lack ``time/rollout_s``) and sampled episodes."""

    path: Path
    rows: list[dict[str, float]]
    episodes: list[list[int]]  # characters of each policy generation
    config: str = ""

    def has(self, name: str) -> bool:
        return any(name in r for r in self.rows)

    def col(self, name: str, skip: int = 0) -> np.ndarray:
        """The column over the steps after the first ``skip``; NaN where empty."""
        return np.array([r.get(name, np.nan) for r in self.rows[skip:]], dtype=float)

    def config_int(self, key: str) -> int | None:
        found = re.search(rf"^\s+{key}:\s*(\d+)\s*$", self.config, re.MULTILINE)
        return int(found.group(1)) if found else None


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except (TypeError, ValueError):  # a row longer than the header holds a list
        return None


def _sampled_episodes(path: Path) -> list[list[int]]:
    episodes = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        segments = record.get("segments") or [{"text": record.get("completion", "")}]
        chars = [len(s.get("text", "")) for s in segments if not s.get("inserted")]
        if sum(chars) > 0:
            episodes.append(chars)
    return episodes


def read_run(path: str | Path) -> Run:
    """Read ``metrics.csv`` (required), ``rollouts.jsonl`` and ``config.yaml`` (optional)."""
    path = Path(path)
    with (path / "metrics.csv").open(newline="") as f:
        rows = [
            {k: x for k, v in r.items() if (x := _number(v)) is not None} for r in csv.DictReader(f)
        ]
    rows = sorted((r for r in rows if "time/rollout_s" in r), key=lambda r: r.get("step", 0.0))
    text = (path / "config.yaml").read_text() if (path / "config.yaml").exists() else ""
    return Run(path, rows, _sampled_episodes(path / "rollouts.jsonl"), text)


# ---- fitting the costs --------------------------------------------------------------------------
@dataclass
class Fit:
    """``target = sum(coef x column)`` (column ``1``: the constant), and its residual."""

    target: str
    names: list[str]
    coef: list[float]
    rms: float
    mean: float
    n: int

    def get(self, name: str) -> float:
        return dict(zip(self.names, self.coef, strict=True)).get(name, 0.0)

    def __call__(self, **columns: np.ndarray) -> np.ndarray:
        n = len(next(iter(columns.values())))
        return sum((self.get(k) * v for k, v in columns.items()), np.full(n, self.get("1")))

    def describe(self) -> str:
        pairs = zip(self.names, self.coef, strict=True)
        terms = " + ".join(f"{c:.4g}" + ("" if n == "1" else f" x {n}") for n, c in pairs)
        fit = f"RMS residual {self.rms:.3g} s = {self.rms / (self.mean or 1):.0%} of the mean"
        return f"{self.target} = {terms or 0}   ({fit} {self.mean:.3g} s, {self.n} steps)"


def nnls_fit(target: str, y: np.ndarray, columns: dict[str, np.ndarray]) -> Fit:
    """Least squares of ``y`` on a constant and ``columns`` with every coefficient >= 0 (the
    best subset whose plain solution is non-negative: the NNLS solution). A column that does not
    vary is left out (its cost folds into the constant)."""
    keep = np.isfinite(y) & np.all([np.isfinite(v) for v in columns.values()] or [True], axis=0)
    y = y[keep]
    cols = {"1": np.ones(len(y))}
    cols.update({n: v[keep] for n, v in columns.items() if np.ptp(v[keep]) > 1e-9 * abs(v).max()})
    best = Fit(target, [], [], float(np.sqrt(np.mean(y**2))), float(y.mean()), len(y))
    for size in range(1, len(cols) + 1):
        for names in itertools.combinations(cols, size):
            x = np.column_stack([cols[n] for n in names])
            coef = np.linalg.lstsq(x, y, rcond=None)[0]
            rms = float(np.sqrt(np.mean((x @ coef - y) ** 2)))
            if (coef >= 0).all() and rms < best.rms - 1e-12:
                best = Fit(target, list(names), [float(c) for c in coef], rms, best.mean, len(y))
    return best


@dataclass
class Workload:
    """Per-step work of a run and the times it took, over the steps after the warm-up."""

    episodes: np.ndarray  # [S] episodes per step
    tokens: np.ndarray  # [S] generated tokens
    generations: np.ndarray  # [S] episodes x generations per episode
    trained: np.ndarray  # [S] trained tokens
    rollout_s: np.ndarray  # [S]
    update_s: np.ndarray  # [S] weight sync excluded
    sync_s: np.ndarray  # [S] 0 where not logged
    step_s: np.ndarray  # [S] NaN where not logged
    notes: list[str]


def workload(run: Run, skip: int, sync_outside_update: bool = False) -> Workload:
    """A run's per-step work and times; ``notes`` says where each came from."""
    if len(run.rows) - skip < 2:
        steps = max(0, len(run.rows) - skip)
        raise SystemExit(f"{run.path}: {steps} training steps after --warmup {skip}; need 2")
    tokens = run.col("tokens/generated", skip)
    if run.has("rollout/completion_length"):
        episodes = np.round(tokens / run.col("rollout/completion_length", skip))
        notes = ["episodes per step = tokens/generated / rollout/completion_length"]
    else:
        per_step = (run.config_int("batch_size") or 1) * (run.config_int("group_size") or 1)
        episodes = np.full(len(tokens), float(per_step))
        notes = [f"episodes per step = {per_step} (config.yaml's batch_size x group_size)"]
    sampled = float(np.mean([len(e) for e in run.episodes])) if run.episodes else 1.0
    per_episode = np.full(len(tokens), sampled)
    if run.has("rollout/turns"):
        shift = sampled - np.nanmean(run.col("rollout/turns", skip))
        per_episode = run.col("rollout/turns", skip) + shift
        notes.append(f"generations per episode = rollout/turns {shift:+.2f} (mean {sampled:.2f})")
    else:
        notes.append(f"generations per episode = {sampled:.2f} (the sampled episodes' mean)")
    column = "time/worker_rollout_s" if run.has("time/worker_rollout_s") else "time/rollout_s"
    notes.append(f"rollout seconds = {column}")
    sync = sum(np.nan_to_num(run.col(f"time/weight_{k}_s", skip)) for k in ("sync", "push"))
    outside = sync_outside_update or run.has("time/sync_s")  # the sync is a phase of its own
    update = run.col("time/update_s", skip) - (0.0 if outside else sync)
    step = np.append(run.col("time/step_s", skip + 1), np.nan)  # on the next step's row
    trained = run.col("tokens/trained", skip)
    gens, rollout = episodes * per_episode, run.col(column, skip)
    return Workload(episodes, tokens, gens, trained, rollout, update, sync, step, notes)


@dataclass
class CostModel:
    rollout: Fit  # seconds per device and batch ~ 1, tokens, generations
    update: Fit  # seconds ~ 1, trained
    sync_s: float
    overhead_s: float  # trainer side, per step
    episodes_per_step: float
    tokens: np.ndarray  # [P] generated tokens of each replayable episode
    generations: np.ndarray  # [P] its generations
    context_tokens: float  # trained tokens per episode besides its generated ones
    notes: list[str]


def fit_costs(run: Run, skip: int = 1, sync_outside_update: bool = False) -> CostModel:
    """Fit a run's rollout, update, sync and overhead costs (see the module docstring)."""
    w = workload(run, skip, sync_outside_update)
    rollout = nnls_fit("rollout_s", w.rollout_s, {"tokens": w.tokens, "generations": w.generations})
    update = nnls_fit("update_s (sync excluded)", w.update_s, {"trained": w.trained})
    rest = w.step_s - w.rollout_s - w.update_s - w.sync_s
    overhead = float(np.nanmean(rest)) if np.isfinite(rest).any() else 0.0
    per_episode = float(np.nanmean(w.tokens / w.episodes))
    notes = [*w.notes, f"steps fitted: {len(w.tokens)} (the first {skip} left out as warm-up)"]
    if run.episodes:
        rate = float(np.mean([sum(e) for e in run.episodes])) / per_episode
        rate_is = "their mean characters / the run's tokens/generated per episode"
        notes.append(f"{len(run.episodes)} sampled episodes; {rate:.2f} chars a token ({rate_is})")
        tokens = np.array([sum(e) / rate for e in run.episodes])
        generations = np.array([float(len(e)) for e in run.episodes])
    else:
        notes.append("no rollouts.jsonl: every episode has the mean length (no long tail)")
        tokens = np.array([per_episode])
        generations = np.array([float(np.nanmean(w.generations / w.episodes))])
    context = float(np.nanmean((w.trained - w.tokens) / w.episodes))
    notes.append(f"trained tokens of an episode = {context:.0f} (prompt, inserted) + generated")
    sync, episodes = float(np.mean(w.sync_s)), float(np.nanmean(w.episodes))
    return CostModel(rollout, update, sync, overhead, episodes, tokens, generations, context, notes)


# ---- the schedule -------------------------------------------------------------------------------
@dataclass
class Timeline:
    step_s: np.ndarray  # [N] from one trainer step's start to the next's
    rollout_util: float  # mean rollout device busy / wall time
    trainer_util: float  # update time / wall time
    staleness: float  # mean updates between a batch's weights and the update that uses it
    wait_s: float  # mean seconds the trainer waited for a batch, after the first step

    @property
    def mean_step_s(self) -> float:  # after the first step, which fills the pipeline
        return float(np.mean(self.step_s[1:] if len(self.step_s) > 1 else self.step_s))


def _with_pauses(start: float, work: float, pushes: list[tuple[float, float]]) -> float:
    """End of ``work`` seconds of rollout begun at ``start``, paused during each push."""
    t, left = start, work
    for begin, end in pushes:
        if begin >= t + left:
            break
        if end > t:  # a push under way or starting before the work is done
            left -= max(0.0, begin - t)
            t = end
    return t + left


def simulate(rollout, update, sync, staleness: int, busy=None) -> Timeline:
    """Per-step durations through the schedule: batch j starts once the rollout devices are
    free and weights version j - staleness is pushed; update j once batch j is ready and the
    trainer free; its push pauses any rollout in flight. ``staleness=0`` on shared devices is
    colocated. ``busy``: mean rollout device busy seconds per step (default ``rollout``)."""
    n = len(rollout)
    pushes: list[tuple[float, float]] = []
    pushed = [0.0]  # pushed[v]: when weights version v (after update v-1) reached the rollout
    pool_free = trainer_free = waited = 0.0
    starts, lags = [], []
    for j in range(n):
        start = max(pool_free, pushed[max(0, j - staleness)])
        lags.append(j - (bisect_right(pushed, start) - 1))
        pool_free = _with_pauses(start, rollout[j], pushes)
        starts.append(trainer_free)
        begin = max(trainer_free, pool_free)
        waited += (begin - trainer_free) if j else 0.0  # the first step fills the pipeline
        trainer_free = begin + update[j] + sync[j]
        pushes.append((begin + update[j], trainer_free))
        pushed.append(trainer_free)
    wall, busy = trainer_free, rollout if busy is None else busy  # utilisations: busy / wall
    utils = float(np.sum(busy)) / wall, float(np.sum(update)) / wall
    after_first = float(np.mean(lags[1:] or lags)), waited / max(n - 1, 1)
    return Timeline(np.diff([*starts, wall]), *utils, *after_first)


# ---- the modelled cluster -----------------------------------------------------------------------
@dataclass
class Cluster:
    gpus: int
    rollout_gpus: int
    episodes: int
    rollout_speed: float = 1.0
    train_speed: float = 1.0
    dp_efficiency: float = 1.0
    saturation: float = 1.0
    push_s: float = 0.0  # weight push to the rollout devices
    colocated_sync_s: float = 0.0


def rollout_times(m: CostModel, c: Cluster, idx: np.ndarray, devices: int) -> np.ndarray:
    """[devices] seconds each rollout device takes for its even share of the episodes ``idx``."""
    b, g = m.rollout.get("tokens"), m.rollout.get("generations")
    work = b * m.tokens[idx] + g * m.generations[idx]  # [E] at batched throughput
    alone = c.saturation * b * m.tokens[idx] + g * m.generations[idx]  # [E] sequential latency
    sizes = len(idx) // devices + (np.arange(devices) < len(idx) % devices)  # [devices]
    used = sizes > 0  # empty shares are the last ones
    first = (np.cumsum(sizes) - sizes)[used]
    times = np.zeros(devices)
    longest = np.maximum(np.add.reduceat(work, first), np.maximum.reduceat(alone, first))
    times[used] = (m.rollout.get("1") + longest) / c.rollout_speed
    return times


def update_s(m: CostModel, c: Cluster, trained: float, devices: int) -> float:
    """Seconds of one update on ``devices`` data-parallel devices, with the trainer overhead."""
    speedup = devices * c.dp_efficiency if devices > 1 else 1.0
    seconds = m.update.get("1") + m.update.get("trained") * trained / speedup
    return seconds / c.train_speed + m.overhead_s


def run_schedule(
    m: CostModel, c: Cluster, batches: list, rollout_gpus: int, k: int | None
) -> Timeline:
    """``k=None``: colocated on all devices; else ``rollout_gpus`` roll out, the rest train."""
    rollers = c.gpus if k is None else rollout_gpus
    trainers = c.gpus if k is None else c.gpus - rollout_gpus
    slowest, busy, update = [], [], []
    for idx in batches:
        times = rollout_times(m, c, idx, rollers)
        slowest.append(times.max())
        busy.append(times.mean())
        trained = float(np.sum(m.tokens[idx]) + m.context_tokens * len(idx))
        update.append(update_s(m, c, trained, trainers))
    sync = np.full(len(batches), c.colocated_sync_s if k is None else c.push_s)
    return simulate(slowest, update, sync, k or 0, busy)


def compare(m: CostModel, c: Cluster, ks: list[int], steps: int, seed: int) -> list[tuple]:
    """(mode, timeline) for colocated and each staleness bound, on the same sampled batches, and
    the best of a few rollout/training splits of the devices for the smallest bound k >= 1."""
    rng = np.random.default_rng(seed)
    batches = [rng.integers(len(m.tokens), size=c.episodes) for _ in range(steps)]
    rows = [("colocated", run_schedule(m, c, batches, c.gpus, None))]
    for k in ks:
        name = f"k={k}" + (" (one-step-off)" if k == 1 else "")
        rows.append((name, run_schedule(m, c, batches, c.rollout_gpus, k)))
    splits = sorted({max(1, min(c.gpus - 1, round(c.gpus * f / 8))) for f in range(1, 8)})
    k = min([k for k in ks if k >= 1] or ks)
    best = min(splits, key=lambda r: run_schedule(m, c, batches, r, k).mean_step_s)
    name = f"k={k}, {best}+{c.gpus - best} (best split)"
    return [*rows, (name, run_schedule(m, c, batches, best, k))]


HEADER = ("mode", "step s", "samples/s", "rollout util", "trainer util", "staleness", "speed-up")


def print_table(rows: list[tuple], episodes: int) -> None:
    line = "{:<26} {:>8} {:>9} {:>12} {:>12} {:>9} {:>8}".format
    print(line(*HEADER))
    for mode, t in rows:
        step, util = t.mean_step_s, (f"{t.rollout_util:.0%}", f"{t.trainer_util:.0%}")
        cells = f"{step:.3f}", f"{episodes / step:.3f}", *util, f"{t.staleness:.2f}"
        print(line(mode, *cells, f"{rows[0][1].mean_step_s / step:.2f}x"))


def print_model(run: Run, m: CostModel) -> None:
    print(f"== measured run: {run.path}")
    for note in m.notes:
        print(f"  - {note}")
    q, g = np.percentile(m.tokens, [50, 90, 100]), m.generations
    tokens = f"p50 {q[0]:.0f}, p90 {q[1]:.0f}, max {q[2]:.0f}"
    print(f"  - episodes: tokens {tokens}; generations mean {g.mean():.2f}, max {g.max():.0f}")
    for fit in (m.rollout, m.update):
        print(f"  fit: {fit.describe()}")
    print(f"  weight sync: {m.sync_s:.3f} s (mean); trainer overhead: {m.overhead_s:.3f} s/step")


def command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The command line with every option spelled out."""
    parts = ["python", "benchmarks/async_sim.py", args.run]
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if action.dest in ("help", "run", "check") or value is None or value is False:
            continue
        parts.append(action.option_strings[-1])
        if value is not True:
            parts.extend(str(v) for v in (value if isinstance(value, list) else [value]))
    return shlex.join(parts)


def make_cluster(args: argparse.Namespace, run: Run, m: CostModel) -> Cluster:
    """The modelled cluster from the options; fills the defaults taken from the run into args."""
    if not 0 < args.rollout_gpus < args.gpus:
        allowed = f"1..{args.gpus - 1} with --gpus {args.gpus}"
        raise SystemExit(f"--rollout-gpus must be in {allowed}; got {args.rollout_gpus}")
    args.group_size = args.group_size or run.config_int("group_size") or 1
    measured = max(1, round(m.episodes_per_step / args.group_size))
    args.prompts_per_step = args.prompts_per_step or measured
    push = m.sync_s
    if args.params:
        scale = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}.get(args.params[-1:].upper())  # 1.5B
        params = float(args.params[:-1]) * scale if scale else float(args.params)
        push = args.sync_latency_s + params * args.bytes_per_param / (args.bandwidth_gbs * 1e9)
    colocated = push if args.colocated_sync_s is None else args.colocated_sync_s
    episodes = args.prompts_per_step * args.group_size
    speeds = args.rollout_speed, args.train_speed, args.dp_efficiency, args.saturation
    return Cluster(args.gpus, args.rollout_gpus, episodes, *speeds, push, colocated)


def assumptions(args: argparse.Namespace, c: Cluster) -> list[str]:
    how = " (the measured mean)"
    if args.params:
        how = f" = {args.sync_latency_s:g} s + {args.params} x {args.bytes_per_param:g} B"
        how += f" / {args.bandwidth_gbs:g} GB/s"
    return [
        f"measured run: one device; a modelled one rolls out {c.rollout_speed:g}x, trains "
        f"{c.train_speed:g}x as fast; episodes split evenly, the slowest device sets the pace",
        f"a lone sequence decodes at {c.saturation:g}x the batched cost per token (--saturation)",
        f"training on T>1 devices divides the per-token update cost by T x {c.dp_efficiency:g}",
        f"weight push {c.push_s:.3f} s{how}; colocated sync {c.colocated_sync_s:.3f} s",
        "a push pauses the rollout devices; the trainer overhead is added to every update",
    ]


def run_cluster(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    run = read_run(args.run)
    m = fit_costs(run, args.warmup, args.sync_outside_update)
    c = make_cluster(args, run, m)
    print_model(run, m)
    split = f"{c.rollout_gpus} rollout + {c.gpus - c.rollout_gpus} training"
    batch = f"{args.prompts_per_step} prompts x {args.group_size} = {c.episodes} episodes a step"
    print(f"== modelled cluster: {c.gpus} devices ({split} when disaggregated); {batch}")
    for line in assumptions(args, c):
        print(f"  - {line}")
    print_table(compare(m, c, args.staleness, args.steps, args.seed), c.episodes)


def replay(m: CostModel, w: Workload, staleness: int) -> Timeline:
    """A worker-mode run's logged workload through ``m``'s costs and the schedule."""
    rollout = m.rollout(tokens=w.tokens, generations=w.generations)
    update = m.update(trained=w.trained) + m.overhead_s
    return simulate(rollout, update, np.full(len(w.tokens), m.sync_s), staleness)


def _same_steps(w: Workload, t: Timeline) -> tuple[float, float, str]:
    """Mean measured and predicted step time over the same steps: after the replay's first (it
    fills the pipeline), where one was logged (policy.py logs none for the last)."""
    logged = np.isfinite(w.step_s[1:]).any()
    steps = w.step_s if logged else w.rollout_s + w.update_s + w.sync_s
    same = np.isfinite(steps) & (np.arange(len(steps)) >= 1)
    how = "time/step_s" if logged else "rollout + update + sync"
    return float(np.mean(steps[same])), float(np.mean(t.step_s[same])), how


def check(colocated: str, k0: str, k1: str, warmup: int = 1, outside: bool = False) -> list:
    """Predicted vs measured mean step time of the three runs; prints them, returns the rows
    (name, measured, predicted, relative error, verdict)."""
    runs = [read_run(p) for p in (colocated, k0, k1)]
    loads = [workload(r, warmup, outside) for r in runs]
    m = fit_costs(runs[1], warmup, outside)
    print_model(runs[1], m)
    c = loads[0]
    predicted = [simulate(c.rollout_s, c.update_s, c.sync_s, 0)]
    predicted += [replay(m, loads[1], 0), replay(m, loads[2], 1)]
    print("== --check: colocated: its logged parts; k=0, k=1: the k=0 fit on their logged work")
    print(f"{'run':<10} {'measured s':>10} {'predicted s':>11} {'error':>7}  verdict  measured as")
    rows = []
    for name, w, t in zip(("colocated", "k=0", "k=1"), loads, predicted, strict=True):
        measured, guess, how = _same_steps(w, t)
        error = (guess - measured) / measured
        verdict = "PASS" if abs(error) <= TOLERANCE else "FAIL"
        rows.append((name, measured, guess, error, verdict))
        print(f"{name:<10} {measured:>10.3f} {guess:>11.3f} {error:>+7.1%}  {verdict:<7}  {how}")
    if runs[2].has("rollout/staleness_mean"):
        lag = np.nanmean(runs[2].col("rollout/staleness_mean", warmup + 1))
        print(f"k=1 staleness: measured {lag:.2f}, predicted {predicted[2].staleness:.2f}")
    if runs[2].has("time/wait_s"):
        wait = np.nanmean(runs[2].col("time/wait_s", warmup + 1))
        print(f"k=1 trainer wait: measured {wait:.3f} s, predicted {predicted[2].wait_s:.3f} s")
    prior = replay(m, loads[1], 1).mean_step_s
    print(f"k=1 predicted from the k=0 run alone (its workload, no k=1 logs): {prior:.3f} s")
    print(f"speed-up of k=1 over colocated: measured {rows[0][1] / rows[2][1]:.2f}x, ", end="")
    print(f"predicted {rows[0][2] / rows[2][2]:.2f}x")
    fails = [r[0] for r in rows if r[4] == "FAIL"]
    verdict = f"{', '.join(fails)} off by more than" if fails else "all within"
    print(f"CHECK {'FAIL' if fails else 'PASS'}: {verdict} {TOLERANCE:.0%}")
    return rows


OPTIONS = [  # flag, type, default, help
    ("--gpus", int, 8, "devices in the modelled cluster"),
    ("--rollout-gpus", int, 4, "of them, rolling out in the disaggregated modes"),
    ("--prompts-per-step", int, None, "default: the measured episodes per step / group size"),
    ("--group-size", int, None, "default: config.yaml's group_size, else 1"),
    ("--rollout-speed", float, 1.0, "modelled over measured device generation speed"),
    ("--train-speed", float, 1.0, "modelled over measured device training speed"),
    ("--dp-efficiency", float, 0.9, "data-parallel efficiency of training on T>1 devices"),
    ("--saturation", float, 1.0, "a lone sequence's cost per token over the batched cost"),
    ("--params", str, None, "model parameters (1.5B, 135M): push = latency + bytes / bandwidth"),
    ("--bytes-per-param", float, 2.0, "bytes pushed per parameter"),
    ("--bandwidth-gbs", float, 10.0, "trainer -> rollout devices, GB/s"),
    ("--sync-latency-s", float, 0.1, "fixed cost of a push, seconds"),
    ("--colocated-sync-s", float, None, "colocated weight sync, seconds (default: the push)"),
    ("--steps", int, 200, "simulated steps"),
    ("--seed", int, 0, "seed of the episode draws"),
    ("--warmup", int, 1, "first training steps left out of the fits and the measured means"),
]


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")[0]
    p = argparse.ArgumentParser(description=doc, epilog="See the module docstring.")
    p.add_argument("run", nargs="?", help="measured run folder (metrics.csv, rollouts.jsonl)")
    p.add_argument("--check", nargs=3, metavar=("COLOCATED", "K0", "K1"), help="validate")
    for flag, kind, default, text in OPTIONS:
        p.add_argument(flag, type=kind, default=default, help=text)
    bounds = {"type": int, "nargs": "+", "choices": range(17), "metavar": "K"}
    p.add_argument("--staleness", **bounds, default=[1, 2, 4], help="bounds k, 0..16")
    p.add_argument("--sync-outside-update", action="store_true", help="update_s excludes sync")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = _bench.parse_args(parser, {}, argv, note="already quick (it reads files)")
    if args.check:
        check(*args.check, args.warmup, args.sync_outside_update)
        _bench.print_provenance(__file__, argv)
    elif args.run:
        run_cluster(parser, args)
        _bench.print_provenance(__file__, command=command(parser, args))
    else:
        parser.error("give a run folder, or --check COLOCATED K0 K1")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
