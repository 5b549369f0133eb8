"""Every benchmark takes ``--quick`` (flags given win over its sizes) and prints the provenance
block under its table; a benchmark's ``--precision auto`` is what ``precision: auto`` picks.
The quick runs themselves take minutes: benchmarks/_bench.py's logic is tested here, and one
benchmark that reads a file (reward_trend) runs whole."""

from __future__ import annotations

import argparse
import ast
import csv
import importlib.util
import sys
from pathlib import Path

import pytest

from lit_rag.models.precision import resolve_dtype, resolve_precision

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def load(name: str):
    """A script of benchmarks/ as a module, its helper found beside it as when run there."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = load("_bench")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    return p


QUICK = {"prompts": 2, "new_tokens": 16, "sizes": [500, 2000]}


def test_quick_sets_the_sizes_and_flags_given_win():
    plain = bench.parse_args(parser(), QUICK, [])
    assert (plain.quick, plain.prompts, plain.new_tokens, plain.sizes) == (
        False,
        8,
        64,
        [10_000, 100_000],
    )
    quick = bench.parse_args(parser(), QUICK, ["--quick"])
    assert (quick.prompts, quick.new_tokens, quick.sizes) == (2, 16, [500, 2000])
    # the order does not matter: a flag given keeps its value, the rest are quick's
    for argv in (["--quick", "--prompts", "5"], ["--prompts", "5", "--quick"]):
        given = bench.parse_args(parser(), QUICK, argv)
        assert (given.prompts, given.new_tokens, given.sizes) == (5, 16, [500, 2000])
    given = bench.parse_args(parser(), QUICK, ["--quick", "--sizes", "100", "300"])
    assert given.sizes == [100, 300]


def test_quick_passes_the_rest_to_the_cli_of_benchmarks_that_take_it():
    args, rest = bench.parse_args(
        parser(), QUICK, ["--quick", "--trainer.precision=32-true"], known=True
    )
    assert (args.prompts, rest) == (2, ["--trainer.precision=32-true"])


def test_quick_help_lists_what_it_sets():
    text = bench.quick_help(QUICK)
    assert "--prompts 2, --new-tokens 16, --sizes 500 2000" in text and "flags you give win" in text
    assert "already quick" in bench.quick_help({}, note="already quick (it reads one file)")


def test_auto_precision_is_what_recipes_get_on_this_machine():
    assert bench.resolve_precision("auto") == resolve_precision("auto", "cpu")
    assert bench.resolve_dtype("auto") == resolve_dtype("native", "cpu")
    assert (bench.resolve_precision("bf16"), bench.resolve_dtype("bf16")) == (
        "bf16-mixed",
        "bfloat16",
    )
    assert (bench.resolve_precision("fp32"), bench.resolve_dtype("fp32")) == ("32-true", "float32")


def test_auto_precision_is_fp32_where_bf16_is_emulated(monkeypatch):
    # a CPU without AVX-512 BF16 or AMX (most laptops): bf16 would be emulated, several times
    # slower, so a benchmark runs what `lit-rag fit` runs there, fp32
    from lit_rag.models import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert (bench.resolve_precision("auto"), bench.resolve_dtype("auto")) == ("32-true", "float32")
    assert bench.resolve_precision("bf16") == "bf16-mixed"  # forced, for a comparison


def test_the_command_shows_the_script_from_the_repository_and_its_flags():
    line = bench.command_line(str(BENCHMARKS / "rollout.py"), ["--quick", "--prompts", "5"])
    assert line == "python benchmarks/rollout.py --quick --prompts 5"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_takes_quick_and_prints_its_provenance(script: Path):
    calls = {
        f"{node.func.value.id}.{node.func.attr}"
        for node in ast.walk(ast.parse(script.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
    }
    assert {"_bench.parse_args", "_bench.print_provenance"} <= calls
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    assert "--quick" in doc, f"{script.name}: its docstring says nothing of --quick"
    assert "platform.processor" not in script.read_text()  # the machine: lit_rag.machine


def test_reward_trend_quick_prints_its_table_and_provenance(tmp_path, capsys):
    metrics = tmp_path / "metrics.csv"
    with metrics.open("w", newline="") as f:
        writer = csv.DictWriter(f, ["step", "reward/total", "reward/format", "train/kl", "val/em"])
        writer.writeheader()
        # 10 steps: the first fifth (steps 0-1) has total 0 and 1, mean 0.5; the last (8-9) 8, 9
        writer.writerows({"step": i, "reward/total": i, "reward/format": 1, "train/kl": 0.1}
                         for i in range(10))  # fmt: skip
    load("reward_trend").main([str(metrics), "--quick"])
    out = capsys.readouterr().out
    assert "10 steps; first fifth = steps 0-1, last fifth = steps 8-9" in out
    assert next(line for line in out.splitlines() if line.startswith("reward/total")).split() == [
        "reward/total",
        "0.500",
        "8.500",
    ]
    block = out.split("\n- date: ")[1].splitlines()
    assert [line.split(":")[0] for line in block[1:]] == [
        "- lit-rag",
        "- machine",
        "- gpu",
        "- libraries",
        "- command",
    ]
    assert block[-1] == f"- command: python benchmarks/reward_trend.py {metrics} --quick"
