"""The worked plugin packages of the docs' "Writing plugins" pages, each installed as its own
package and named by its registered name in ``recipes/tiny_worked_plugins.yaml``: the
environment ``closed_book`` (``plugins/lit-rag-closed-book``), the algorithm ``reinforce_loo``
(``plugins/lit-rag-reinforce-loo``) and the engine ``lagged`` (``plugins/lit-rag-lagged-engine``).

``lit-rag fit`` runs the recipe as a user would, in a subprocess, for its 2 steps on the tiny
random model, and the code the docs' pages (``docs/plugins/``) show is checked against the
files. Skipped when a package is not installed, except in CI (``CI`` set), which installs them
(``bash scripts/install.sh dev``): there it must run.
"""

from __future__ import annotations

import ast
import csv
import importlib
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import require_package

from lit_rag import registry

pytestmark = pytest.mark.subprocess

#: module -> (plugin kind, registered name, distribution = folder under plugins/)
PACKAGES = {
    "lit_rag_closed_book": ("environment", "closed_book", "lit-rag-closed-book"),
    "lit_rag_reinforce_loo": ("algorithm", "reinforce_loo", "lit-rag-reinforce-loo"),
    "lit_rag_lagged_engine": ("engine", "lagged", "lit-rag-lagged-engine"),
}
for _module, (_, _, _folder) in PACKAGES.items():
    require_package(_module, f"pip install --no-deps -e plugins/{_folder}")

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "tiny_worked_plugins.yaml"
LIT_RAG = str(Path(sys.executable).with_name("lit-rag"))
#: a fenced block of the docs that opens with a ``# plugins/...`` or ``# recipes/...`` comment
#: shows that file; ``# (...)`` lines separate excerpts
SHOWN = re.compile(r"^```\w+\n# ((?:plugins|recipes)/\S+)\n(.*?)^```", re.S | re.M)


def lit_rag_imports(package: Path) -> set[str]:
    """Every ``lit_rag`` module the package's source imports."""
    found = set()
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        found |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return {m for m in found if m.split(".")[0] == "lit_rag"}


def test_each_plugin_is_its_packages_and_imports_only_the_public_api() -> None:
    registry.clear_cache()
    for module, (kind, name, distribution) in PACKAGES.items():
        assert registry.available(kind)[name].package == distribution
        package = Path(importlib.import_module(module).__file__).parent
        assert package.parent == ROOT / "plugins" / distribution  # the worked copy, editable
        assert lit_rag_imports(package) == {"lit_rag.api"}, module


def test_the_recipe_fits_through_the_cli(tmp_path: Path) -> None:
    """2 steps: rewards, the algorithm's loss and KL, the environment's metrics and the
    engine's lag logged at each; the engine's state in the checkpoint."""
    done = subprocess.run(
        [
            LIT_RAG,
            "fit",
            "--config",
            str(RECIPE),
            f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.enable_checkpointing=true",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "closed_book + f1 + reinforce_loo, engine lagged" in done.stdout + done.stderr
    (metrics,) = tmp_path.rglob("metrics.csv")
    with metrics.open(newline="") as f:
        steps = [row for row in csv.DictReader(f) if row.get("reward/total")]
    assert [int(row["step"]) for row in steps] == [0, 1]
    for row in steps:
        assert 0.0 <= float(row["reward/f1"]) <= 1.0
        for key in ("reward/total", "train/loss", "train/kl", "train/kl_sequence"):
            assert math.isfinite(float(row[key])), key  # reinforce_loo's loss and KL
        assert 0.0 <= float(row["rollout/answer_rate"]) <= 1.0  # closed_book's metrics
        assert float(row["rollout/advantage_abs_mean"]) >= 0.0  # reinforce_loo's
    # sync_every 2: step 0 samples the weights it trains, step 1 those of one step before
    assert [float(row["engine/policy_lag"]) for row in steps] == [0.0, 1.0]
    (checkpoint,) = tmp_path.rglob("*.ckpt")
    stored = torch.load(checkpoint, map_location="cpu", weights_only=False)["lit_rag"]
    assert stored["engine"] == {"updates": 2}  # the lagged engine's state_dict


def test_the_pages_show_the_code_as_it_is() -> None:
    """Every file excerpt on the "Writing plugins" pages is the file's text, verbatim."""
    shown = {}
    for page in sorted((ROOT / "docs" / "plugins").glob("*.md")):
        for path, body in SHOWN.findall(page.read_text(encoding="utf-8")):
            source = (ROOT / path).read_text(encoding="utf-8")
            for excerpt in re.split(r"^# \(\.\.\.\)\n", body, flags=re.M):
                assert excerpt.strip("\n") in source, (
                    f"docs/plugins/{page.name} shows {path}:\n{excerpt}"
                )
            shown[page.name] = shown.get(page.name, 0) + 1
    kinds = ["reward.md", "algorithm.md", "environment.md", "retriever.md", "engine.md"]
    assert all(shown.get(page, 0) >= 2 for page in kinds), shown
