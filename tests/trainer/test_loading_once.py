"""An FSDP run reads the policy once: the first rank loads the weights (and copies the
reference), the others build the model empty on the meta device and receive the first rank's
weights as FSDP shards them (``sync_module_states``, as verl's workers do). Before, every rank
loaded the whole model and copied it for the reference before sharding: two whole copies per
rank, about 256 GB of host memory for an 8B policy on 8 ranks.

``lit-rag fit`` on two FSDP ranks with a 42M-parameter random model in fp32 (168 MB; its frozen
reference as much again): the second rank holds half of each once sharded, the first held both
whole before. Measured peaks when training starts (Intel Xeon with AMX, 2 cores): 1,080 MB and
950 MB; before, 1,062 MB and 1,065 MB (the second rank loaded and copied the model too). The
test asks for a gap over half a whole copy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]
LIT_RAG = str(Path(sys.executable).with_name("lit-rag"))
WIDTH, LAYERS = 1024, 4  # 4 x (4 x 1024^2 + 3 x 1024 x 2048) + a small tied vocabulary: 42M


def test_the_second_fsdp_rank_never_holds_the_whole_model(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "tests" / "scripts"),
        "OMP_NUM_THREADS": "1",
        "RECORD_DIR": str(tmp_path),
    }
    args = [
        "fit", "--config", str(ROOT / "recipes" / "tiny.yaml"),
        "--trainer.devices=2", "--trainer.strategy=fsdp", "--trainer.max_steps=1",
        "--trainer.limit_val_batches=0", f"--trainer.logger.init_args.save_dir={tmp_path}",
        f"--model.policy.tiny.hidden_size={WIDTH}", f"--model.policy.tiny.num_layers={LAYERS}",
        "--model.policy.tiny.num_heads=8", "--model.engine=global_batch.PromptScripted",
        "--trainer.callbacks+=global_batch.RecordPeak",
    ]  # fmt: skip
    done = subprocess.run(
        [LIT_RAG, *args], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    peaks = [json.loads((tmp_path / f"peak{r}.json").read_text())["max_rss_kib"] for r in (0, 1)]
    from lit_rag.models.loading import TinyConfig
    from lit_rag.models.tiny import build_tiny_model

    model = build_tiny_model(TinyConfig(hidden_size=WIDTH, num_layers=LAYERS, num_heads=8))
    whole_kib = sum(p.numel() * 4 for p in model.parameters()) / 1024  # fp32
    # the first rank held the policy and its reference whole; the second, their halves
    assert peaks[0] - peaks[1] > whole_kib / 2, (peaks, whole_kib)
