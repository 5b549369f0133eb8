"""``lit-rag size``: the table it prints for a recipe, and one line for what it cannot size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lit_rag.cli.commands import main
from lit_rag.cli.size import parse_memory

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
TINY = str(RECIPES / "tiny.yaml")


def size(capsys, *args: str) -> str:
    main(["size", *args])
    return capsys.readouterr().out


def test_prints_the_table_for_the_tiny_recipe(capsys):
    out = size(capsys, "--config", TINY)
    assert out.startswith(f"{TINY} on CPU, 1 process: single, 32-true, full fine-tuning")
    assert "from the recipe's tiny model" in out
    for row in (
        "policy weights",
        "gradients",
        "optimizer state",
        "reference model",
        "activations",
        "logits",
        "rollout KV cache",
        "Python + torch runtime",
    ):
        assert f"\n{row} " in out, row
    assert "\ntotal per process: " in out


def test_memory_gives_the_largest_micro_batch(capsys):
    out = size(capsys, "--config", TINY, "--memory", "2GB", "--model.micro_batch_size=2")
    assert "fits in 2.00 GiB per process; largest micro-batch: all 4 rows of a step: " in out


def test_a_paper_recipe_on_eight_gpus_without_its_weights(capsys):
    out = size(
        capsys, "--config", str(RECIPES / "arena.yaml"), "--devices", "8", "--memory", "80GB"
    )
    assert "on 8 GPUs: deepspeed_stage_2, bf16-mixed, full fine-tuning" in out
    assert "Qwen2.5-7B-Instruct" in out and "lit-rag's table of paper models" in out
    assert "\nvLLM " in out and "32.00 GiB" in out  # gpu_memory_utilization 0.4 of 80 GiB
    assert "per device; largest micro-batch: " in out and "micro_batch_tokens: " in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80GB", 80 * 2**30), ("40GiB", 40 * 2**30), ("141", 141 * 2**30), ("512MB", 2**29)],
)
def test_memory_sizes(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--config", "no/such/recipe.yaml"], "recipe 'no/such/recipe.yaml' does not exist"),
        (["--config", TINY, "--devices", "0"], "--devices must be a whole number >= 1, got '0'"),
        (["--config", TINY, "--devices", "two"], "--devices must be a whole number >= 1"),
        (["--config", TINY, "--memory", "lots"], "--memory 'lots' is not a memory size"),
        (["--devices", "2"], "the following arguments are required: --config"),
    ],
)
def test_bad_input_is_one_line(args, fragment, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["size", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2
    assert len(err) == 1 and err[0].startswith("lit-rag: error: ") and fragment in err[0], err


@pytest.mark.subprocess
def test_the_console_command_prints_one_line_for_an_unknown_recipe(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "lit_rag", "size", "--config", "missing.yaml", "--devices", "8"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2
    assert run.stderr.splitlines() == ["lit-rag: error: recipe 'missing.yaml' does not exist"], (
        run.stderr
    )
