"""benchmarks/async_sim.py: the schedule's bounds, the rollout device model, the cost fit, and the
report of the cluster and --check paths, on run folders written in the test."""

import csv
import importlib.util
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "async_sim.py"


def _load():
    if str(SCRIPT.parent) not in sys.path:  # its helper, benchmarks/_bench.py, as when run there
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("benchmarks_async_sim", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


sim = _load()


def write_run(folder: Path, rows: list[dict], generations: list[list[str]] = ()) -> Path:
    """A CSVLogger-like run folder: one metrics row a step, a validation-only row at the end
    (which the reader must skip), and one sampled episode per item of ``generations``."""
    folder.mkdir(parents=True)
    columns = sorted({k for r in rows for k in r} | {"step", "val/em"})
    with (folder / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows({"step": i, **r} for i, r in enumerate(rows))
        writer.writerow({"step": len(rows) - 1, "val/em": 0.5})
    with (folder / "rollouts.jsonl").open("w") as f:
        for texts in generations:
            segments = []
            for text in texts:  # a generation, then a retrieved document inserted after it
                segments += [
                    {"text": text, "inserted": False},
                    {"text": "doc " * 50, "inserted": True},
                ]
            f.write(json.dumps({"step": 1, "segments": segments}) + "\n")
    return folder


# ---- the schedule ------------------------------------------------------------------------------
def test_one_step_off_with_free_updates_steps_at_the_rollout_time():
    # update and sync cost nothing: the trainer takes each batch the moment it is ready, and the
    # rollout devices start the next one at once, so every step lasts its batch's rollout
    rollout = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])
    zeros = np.zeros(len(rollout))
    t = sim.simulate(rollout, zeros, zeros, staleness=1)
    np.testing.assert_allclose(t.step_s, rollout)
    # after the first step, it waits on the rollout alone, never on itself
    assert t.wait_s == pytest.approx(rollout[1:].mean())


def test_colocated_steps_are_rollout_plus_update_plus_sync():
    rollout, update = np.array([3.0, 1.0, 4.0, 1.0]), np.array([2.0, 7.0, 1.0, 8.0])
    sync = np.full(4, 0.5)
    t = sim.simulate(rollout, update, sync, staleness=0)
    np.testing.assert_allclose(t.step_s, rollout + update + sync)  # 5.5, 8.5, 5.5, 9.5
    assert t.staleness == 0.0


@pytest.mark.parametrize(("rollout", "update", "expected"), [(3.0, 2.0, 3.5), (2.0, 3.0, 3.5)])
def test_one_step_off_steady_state_is_the_slower_side_plus_the_push(rollout, update, expected):
    # push 0.5 s: the trainer's period is update + push; the rollout's is rollout + the push that
    # pauses it; so the step is max(3 + 0.5, 2 + 0.5) = 3.5 and max(2 + 0.5, 3 + 0.5) = 3.5,
    # against 3 + 2 + 0.5 = 5.5 in turn
    n = 20
    durations = np.full(n, rollout), np.full(n, update), np.full(n, 0.5)
    assert sim.simulate(*durations, staleness=1).mean_step_s == pytest.approx(expected)
    assert sim.simulate(*durations, staleness=0).mean_step_s == pytest.approx(5.5)


@pytest.mark.parametrize("seed", range(20))
def test_async_steps_are_bounded_by_overlap_and_by_the_sequential_sum(seed):
    rng = np.random.default_rng(seed)
    n = 40
    rollout = rng.uniform(0.1, 5.0, n) * rng.uniform(0.2, 3.0)
    update = rng.uniform(0.1, 5.0, n) * rng.uniform(0.2, 3.0)
    sync = np.full(n, rng.uniform(0.0, 2.0))
    one = sim.simulate(rollout, update, sync, staleness=1).mean_step_s
    after_first = slice(1, None)  # mean_step_s leaves out the first step (pipeline fill)
    floor = max(rollout[after_first].mean(), (update + sync)[after_first].mean())
    assert floor - 1e-9 <= one <= (rollout + update + sync)[after_first].mean() + 1e-9
    for k in (2, 4):
        assert sim.simulate(rollout, update, sync, staleness=k).mean_step_s <= one + 1e-9


def test_a_push_pauses_a_rollout_in_flight():
    # 4 s of work from t=0, pushes over [1, 2) and [6, 7): paused 1 s, done at 5 (before 6)
    assert sim._with_pauses(0.0, 4.0, [(1.0, 2.0), (6.0, 7.0)]) == 5.0
    # starting inside a push waits for its end: 2 + 4 = 6, then the push at 6 is not reached
    assert sim._with_pauses(1.5, 4.0, [(1.0, 2.0), (6.0, 7.0)]) == 6.0


# ---- the modelled rollout device --------------------------------------------------------------
def model(tokens, generations, a=1.0, b=0.01, c=0.5) -> "sim.CostModel":
    rollout = sim.Fit("rollout_s", ["1", "tokens", "generations"], [a, b, c], 0.0, 1.0, 1)
    update = sim.Fit("update_s", ["trained"], [0.001], 0.0, 1.0, 1)
    arrays = np.array(tokens, dtype=float), np.array(generations, dtype=float)
    return sim.CostModel(rollout, update, 0.0, 0.0, len(tokens), *arrays, 100.0, [])


def test_a_rollout_device_waits_for_its_longest_episode():
    m = model(tokens=[100, 100, 100, 1000], generations=[1, 1, 1, 3])
    idx = np.arange(4)
    # saturation 1: batched work 1 + (0.01 x 1300 + 0.5 x 6) = 1 + 16 = 17 s on one device
    assert sim.rollout_times(m, sim.Cluster(1, 1, 4), idx, 1)[0] == pytest.approx(17.0)
    # saturation 4: the long episode alone takes 4 x 0.01 x 1000 + 0.5 x 3 = 41.5 > 16
    slow = sim.Cluster(1, 1, 4, saturation=4.0)
    assert sim.rollout_times(m, slow, idx, 1)[0] == pytest.approx(42.5)
    # two devices: [100, 100] -> 1 + 2 + 1 = 4 s; [100, 1000] -> 1 + 11 + 2 = 14 s
    np.testing.assert_allclose(sim.rollout_times(m, sim.Cluster(2, 2, 4), idx, 2), [4.0, 14.0])
    # more devices than episodes: the spare ones are idle
    np.testing.assert_allclose(sim.rollout_times(m, sim.Cluster(6, 6, 4), idx[:2], 6)[2:], 0.0)


# ---- the cost fit ------------------------------------------------------------------------------
def log_step_times(rows: list[dict], seconds: list[float]) -> None:
    """``time/step_s`` as lit_rag/trainer/policy.py logs it: step i's duration on row i + 1."""
    for row, step_s in zip(rows[1:], seconds[:-1], strict=True):
        row["time/step_s"] = step_s


def synthetic_rows(n: int, seed: int = 0, overhead: float = 0.0, worker: bool = False) -> list:
    """Steps of 8 episodes with known costs: rollout = 0.5 + 0.01 x tokens + 0.2 x generations,
    update = 1 + 0.002 x trained (+ a 0.3 s weight sync inside ``time/update_s``), run in turn:
    step = rollout + update + sync + ``overhead``."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        tokens, turns, trained = rng.uniform(400, 1600), rng.uniform(1, 3), rng.uniform(2e3, 6e3)
        rollout = 0.5 + 0.01 * tokens + 0.2 * 8 * turns
        row = {
            "tokens/generated": tokens,
            "rollout/completion_length": tokens / 8,
            "rollout/turns": turns,
            "tokens/trained": trained,
            "time/rollout_s": 0.05 if worker else rollout,  # a worker run: the trainer's wait
            "time/update_s": 1.0 + 0.002 * trained + 0.3,
        }
        sync = {"time/weight_push_s": 0.3, "time/worker_rollout_s": rollout} if worker else {}
        rows.append(row | (sync or {"time/weight_sync_s": 0.3}))
    log_step_times(rows, [_rollout(r) + r["time/update_s"] + overhead for r in rows])
    return rows


def _rollout(row: dict) -> float:
    return row.get("time/worker_rollout_s", row["time/rollout_s"])


def test_the_fit_recovers_known_costs(tmp_path):
    rows = synthetic_rows(12)
    mean_turns = np.mean([r["rollout/turns"] for r in rows[1:]])
    # samples with 2 generations each; make the fitted steps' mean turns 2 so the shift is 0
    # and generations = 8 x rollout/turns exactly
    for r in rows:
        r["rollout/turns"] += 2.0 - mean_turns
        r["time/rollout_s"] = 0.5 + 0.01 * r["tokens/generated"] + 0.2 * 8 * r["rollout/turns"]
    log_step_times(rows, [r["time/rollout_s"] + r["time/update_s"] + 0.25 for r in rows])
    run = sim.read_run(write_run(tmp_path / "run", rows, [["a" * 300, "b" * 100]] * 6))
    m = sim.fit_costs(run, skip=1)
    assert m.rollout.get("1") == pytest.approx(0.5, abs=1e-6)
    assert m.rollout.get("tokens") == pytest.approx(0.01, rel=1e-6)
    assert m.rollout.get("generations") == pytest.approx(0.2, rel=1e-6)
    assert m.update.get("1") == pytest.approx(1.0, abs=1e-6)
    assert m.update.get("trained") == pytest.approx(0.002, rel=1e-6)
    assert m.rollout.rms < 1e-6 and m.update.n == 11  # the warm-up step left out
    assert m.sync_s == pytest.approx(0.3)
    assert m.overhead_s == pytest.approx(0.25)  # step_s - rollout - update - sync
    assert m.episodes_per_step == 8
    # characters -> tokens: the samples' mean equals the run's generated tokens per episode
    per_episode = np.mean([r["tokens/generated"] / 8 for r in rows[1:]])
    assert m.tokens.mean() == pytest.approx(per_episode)
    assert set(m.generations) == {2.0}


def test_the_fit_never_returns_a_negative_cost():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    fit = sim.nnls_fit("y", 0.5 * x - 0.2, {"x": x})  # plain least squares: intercept -0.2
    assert fit.names == ["x"] and fit.coef[0] > 0
    assert all(c >= 0 for c in sim.nnls_fit("y", 3.0 - x, {"x": x}).coef)


# ---- the reports -------------------------------------------------------------------------------
def test_the_cluster_report_prints_a_reproducing_command(tmp_path, capsys):
    episodes = [["x" * 200], ["x" * 200, "y" * 400], ["z" * 100]] * 2
    run = write_run(tmp_path / "run", synthetic_rows(6), episodes)
    args = [str(run), "--gpus", "4", "--rollout-gpus", "2", "--staleness", "1", "2"]
    assert sim.main([*args, "--steps", "20", "--group-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "fit: rollout_s = " in out and "RMS residual" in out
    for mode in ("colocated", "k=1 (one-step-off)", "k=2", "(best split)"):
        assert mode in out
    command = next(line for line in out.splitlines() if line.startswith("- command: "))
    argv = shlex.split(command.removeprefix("- command: "))[2:]
    assert "--prompts-per-step" in argv and argv[argv.index("--prompts-per-step") + 1] == "2"
    assert sim.main(argv) == 0
    # the same table, seed and all (the provenance block under it has its own date)
    assert table(capsys.readouterr().out) == table(out)
    assert "- lit-rag: " in out and "- machine: " in out


def table(out: str) -> str:
    """A report without its provenance block (the lines from ``- date:`` on)."""
    return out.split("\n- date: ")[0]


def check_runs(tmp_path: Path, k1_slowdown: float = 1.0) -> list[str]:
    """Three runs of the --check setup whose k=1 steps take ``k1_slowdown`` x the schedule's."""
    episodes = [["x" * 200, "y" * 100]] * 4
    colocated = write_run(tmp_path / "colocated", synthetic_rows(8, seed=1), episodes)
    k0 = write_run(tmp_path / "k0", synthetic_rows(8, seed=2, overhead=0.1, worker=True), episodes)
    k1_rows = synthetic_rows(8, seed=3, worker=True)
    for r in k1_rows:  # trainer-bound (update 51-61 s > rollout 6-22 s): update + sync + 0.1
        r["tokens/trained"] += 25e3
        r["time/update_s"] = 1.0 + 0.002 * r["tokens/trained"] + 0.3
        r["rollout/staleness_mean"], r["time/wait_s"] = 1.0, 0.0
    log_step_times(k1_rows, [(r["time/update_s"] + 0.1) * k1_slowdown for r in k1_rows])
    return [str(colocated), str(k0), str(write_run(tmp_path / "k1", k1_rows, episodes))]


def test_check_prints_predicted_against_measured(tmp_path, capsys):
    assert sim.main(["--check", *check_runs(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "rollout seconds = time/worker_rollout_s" in out
    # the synthetic runs follow the model exactly: k=0's step = rollout + update + 0.3 s push
    # + 0.1 s overhead; k=1's = update + push + overhead (the trainer never waits)
    for name in ("colocated", "k=0", "k=1"):
        line = next(x for x in out.splitlines() if x.startswith(f"{name} "))
        measured, predicted, error, verdict, how = line.split()[1:]
        assert float(predicted) == pytest.approx(float(measured), rel=1e-3), line
        assert (verdict, how) == ("PASS", "time/step_s")
    assert "k=1 staleness: measured 1.00, predicted 1.00" in out
    assert "k=1 trainer wait: measured 0.000 s, predicted 0.000 s" in out
    assert "CHECK PASS: all within 20%" in out


def test_check_says_fail_and_still_exits_zero(tmp_path, capsys):
    # measured k=1 steps 1.5x the model's: error = 1 / 1.5 - 1 = -33% -> FAIL
    assert sim.main(["--check", *check_runs(tmp_path, k1_slowdown=1.5)]) == 0
    out = capsys.readouterr().out
    assert "-33.3%  FAIL" in out
    assert "CHECK FAIL: k=1 off by more than 20%" in out


def test_a_run_with_too_few_steps_names_the_folder(tmp_path):
    run = write_run(tmp_path / "short", synthetic_rows(1))
    with pytest.raises(SystemExit, match="short: 0 training steps after --warmup 1; need 2"):
        sim.fit_costs(sim.read_run(run), skip=1)
