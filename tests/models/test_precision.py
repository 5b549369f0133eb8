"""``trainer.precision: auto`` and the engines' ``dtype: native`` (lit_rag.models.precision):
bf16 only where the device computes it natively, resolved before the CLI parses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lit_rag.cli.commands import build_cli, resolve_args
from lit_rag.models import precision

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=[True, False], ids=["native-bf16", "no-bf16"])
def native(request, monkeypatch) -> bool:
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: request.param)
    return request.param


def test_auto_is_bf16_mixed_only_where_the_cpu_does_bf16(native) -> None:
    assert precision.resolve_precision("auto", "cpu") == ("bf16-mixed" if native else "32-true")
    assert precision.resolve_dtype("native", "cpu") == ("bfloat16" if native else "float32")


def test_explicit_values_pass_through(native) -> None:
    for value in ("bf16-mixed", "32-true", "16-mixed", 32, None):
        assert precision.resolve_precision(value, "cpu") == value
    for value in ("auto", "bfloat16", "float32"):
        assert precision.resolve_dtype(value, "cpu") == value


def test_the_real_cpu_check_answers() -> None:
    assert isinstance(precision.cpu_has_native_bf16(), bool)


def test_recipe_auto_is_rewritten_before_parsing(native, tmp_path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump({"trainer": {"accelerator": "cpu", "precision": "auto"}}), encoding="utf-8"
    )
    out = resolve_args(["fit", "--config", str(recipe)])
    assert yaml.safe_load(out[2])["trainer"]["precision"] == ("bf16-mixed" if native else "32-true")
    assert (
        resolve_args(["--trainer.precision=auto"])[-1]
        == f"--trainer.precision={'bf16-mixed' if native else '32-true'}"
    )
    # an override of the accelerator is what decides: a GPU without CUDA here is not bf16
    out = resolve_args(
        ["--config", str(recipe), "--trainer.accelerator", "gpu", "--trainer.precision", "auto"]
    )
    assert out[-1] == ("bf16-mixed" if precision.has_native_bf16("gpu") else "32-true")


def test_quickstart_builds_with_this_machines_precision(native) -> None:
    built = build_cli(["--config", str(REPO / "recipes/quickstart.yaml")], run=False)
    assert built.trainer.precision == ("bf16-mixed" if native else "32-true")
    engine = built.model.engine
    engine.model_path = "/weights"  # what vLLM would load (the policy is not loaded here)
    assert engine.dtype == "native"
    assert engine.llm_kwargs()["dtype"] == ("bfloat16" if native else "float32")
