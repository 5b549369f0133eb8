"""Two processes on the gloo backend (CPU), with DDP and with FSDP (full and LoRA): prompts are
sharded across ranks, groups stay on one rank, the logged reward and KL are the means over both
ranks, the KL monitor stops both ranks at the same step, and the checkpoint is written
(``ddp_fit.py`` runs the fit; ~15 s each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.subprocess]

SCRIPT = Path(__file__).parents[1] / "scripts" / "ddp_fit.py"


@pytest.fixture(scope="module", params=["ddp", "fsdp", "fsdp-lora"])
def run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), request.param],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return request.param, out


@pytest.fixture(scope="module")
def ranks(run):
    _, out = run
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_the_checkpoint_holds_the_trained_weights(run):
    import torch

    kind, out = run
    state = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)[
        "state_dict"
    ]
    names = set(state)
    if kind.endswith("lora"):  # adapters only, under their unwrapped names
        assert (
            names
            and all("lora_" in n for n in names)
            and not any("_fsdp_wrapped_module" in n for n in names)
        )
    else:
        assert "model.model.embed_tokens.weight" in names and len(names) > 10


def test_each_rank_sees_different_prompts_and_whole_groups(ranks):
    seen = [{e for row in rows for e in row["examples"]} for rows in ranks]
    assert seen[0] and seen[1] and not seen[0] & seen[1]  # sharded, no prompt on both ranks
    for rows in ranks:
        for row in rows:
            # every prompt's G = 3 samples are on this rank, in one group of its own
            assert set(Counter(row["examples"]).values()) == {3}
            by_group = {}
            for example, group in zip(row["examples"], row["groups"], strict=True):
                by_group.setdefault(group, set()).add(example)
            assert all(len(v) == 1 for v in by_group.values())


def test_logged_reward_and_kl_are_the_mean_over_ranks(ranks):
    first, second = ranks
    assert len(first) == len(second) >= 2
    for a, b in zip(first, second, strict=True):
        assert a["step"] == b["step"]
        expected = (a["local_reward"] + b["local_reward"]) / 2
        assert a["logged_reward"] == pytest.approx(expected, rel=1e-5)
        assert b["logged_reward"] == pytest.approx(expected, rel=1e-5)
        if a["local_kl"] is not None:
            kl = (a["local_kl"] + b["local_kl"]) / 2
            assert a["logged_kl"] == pytest.approx(kl, rel=1e-5, abs=1e-9)
            mean, peak = a["global_kl"]
            assert mean == pytest.approx(kl, rel=1e-5, abs=1e-9)
            assert peak == pytest.approx(max(a["local_kl"], b["local_kl"]), rel=1e-5, abs=1e-9)
            assert b["global_kl"] == a["global_kl"]


def test_the_kl_monitor_stops_both_ranks_at_the_same_step(ranks):
    first, second = ranks
    stops = [[row["step"] for row in rows if row["should_stop"]] for rows in ranks]
    assert stops[0] and stops[0] == stops[1]
    assert first[-1]["step"] == second[-1]["step"] == stops[0][0]  # both ended there
    assert first[-1]["global_kl"][1] > 1e-6
