"""The checks to run on a first GPU before renting more: one line each, PASS / FAIL / SKIP with
its figure, on one GPU in a few minutes. Each is a path the CPU tests cannot take (fp32 master
weights under CUDA's bf16, FSDP's CPU offload, faiss-gpu, NCCL, the CUDA allocator's peak).

    python scripts/gpu_checks.py               # every check (bash scripts/gpu_smoke.sh checks)
    python scripts/gpu_checks.py masters peak  # some of them
    python scripts/gpu_checks.py --device cpu masters peak   # the CPU's side of two of them

Exit status 1 when a check fails, 0 otherwise (a SKIP says why it could not run here).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIT_RAG = str(Path(sys.executable).with_name("lit-rag"))
TINY = ROOT / "recipes" / "tiny.yaml"


class Skip(Exception):
    """A check that cannot run here, and why."""


def _env(**extra: str) -> dict:
    path = os.pathsep.join(filter(None, [str(ROOT / "tests" / "scripts"), str(ROOT / "tests")]))
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def _fit(out: Path, device: str, *args: str) -> None:
    accelerator = "gpu" if device == "cuda" else "cpu"
    command = [
        LIT_RAG, "fit", "--config", str(TINY), f"--trainer.accelerator={accelerator}",
        "--trainer.devices=1", "--trainer.limit_val_batches=0",
        f"--trainer.logger.init_args.save_dir={out}", *args,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=600)
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
        raise AssertionError(f"lit-rag fit exited {done.returncode}: {last[0][:160]}")


def check_masters(device: str) -> str:
    """A recipe that loads bf16 under bf16-mixed: fp32 weights and AdamW states in the
    checkpoint, and one step at lr 1e-6 moves almost every weight it has a gradient for."""
    import torch
    from test_master_weights import _moved_share  # tests/trainer

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        _fit(
            out, device, "--model.engine=global_batch.PromptScripted",
            "--model.sampling.max_new_tokens=64", "--model.policy.dtype=bfloat16",
            "--trainer.precision=bf16-mixed", "--model.optimizer.lr=1.0e-6",
            "--trainer.max_steps=1", "--trainer.enable_checkpointing=true",
        )  # fmt: skip
        (path,) = glob.glob(str(out / "tiny" / "version_0" / "checkpoints" / "*.ckpt"))
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    weights = {str(v.dtype) for v in checkpoint["state_dict"].values()}
    states = {
        str(t.dtype)
        for s in checkpoint["optimizer_states"][0]["state"].values()
        for t in (s["exp_avg"], s["exp_avg_sq"])
    }
    moved = _moved_share(checkpoint)
    figure = f"weights {sorted(weights)}, AdamW {sorted(states)}, moved {moved:.1%} at lr 1e-6"
    assert weights == states == {"torch.float32"} and moved > 0.95, figure
    return figure


def check_offload(device: str) -> str:
    """FSDP with CPU offload accumulates a step's micro-batches as FSDP without offload does."""
    if device != "cuda":
        raise Skip("FSDP's CPU offload needs a GPU")
    test = (
        "tests/trainer/test_global_batch.py::test_fsdp_cpu_offload_accumulates_as_without_offload"
    )
    return _pytest(test, "-m", "gpu")


def check_index(device: str) -> str:
    """A dense index placed on the last GPU by ``index_device: gpu`` lands there whole and
    searches as on the host."""
    import faiss
    import numpy as np
    import torch

    from lit_rag.plugins.retrievers.index_placement import GPU, place_index

    if device != "cuda" or not hasattr(faiss, "StandardGpuResources"):
        raise Skip("needs faiss-gpu and a GPU (pip install 'lit-rag[gpu]')")
    vectors = np.random.default_rng(0).random((100_000, 768), dtype=np.float32)  # 293 MiB
    host = faiss.IndexFlatIP(768)
    host.add(vectors)
    count = GPU.count()
    last = count - 1  # as the last local rank of count
    free = [GPU.free(i) for i in range(count)]
    placement = place_index("gpu", "flat", vectors.nbytes, free, last, count)
    before = torch.cuda.mem_get_info(last)[0]
    placed = GPU.place(host, placement)
    used = before - torch.cuda.mem_get_info(last)[0]
    same = (placed.search(vectors[:5], 3)[1] == host.search(vectors[:5], 3)[1]).all()
    figure = f"{placement.label} ({placement.reason}); {used / 2**20:.0f} MiB on GPU {last}"
    assert placement.devices == (last,) and used >= vectors.nbytes and same, figure
    return figure


def check_link(device: str) -> str:
    """A rollout worker killed in the middle of a weight push over NCCL: the push ends in the
    one-line stop within its deadline, not NCCL's watchdog."""
    import torch

    if device != "cuda" or torch.cuda.device_count() < 2:
        raise Skip("needs 2 GPUs, one for the trainer and one for its worker (gloo: tests/rollout)")
    return _pytest("tests/rollout/test_weight_link_faults.py", "-k", "nccl")


def check_peak(device: str) -> str:
    """The sharded path's log-prob pass (the head chunked inside the model's own forward) at
    Qwen's 151,936-token vocabulary, 4,096 completion tokens, forward and backward: its peak
    over the pass's start (whole logits: 2.5 GB in fp32, 9.3 GB peak measured on CPU)."""
    if device != "cuda":
        raise Skip("the CPU's peak: tests/trainer/test_logprob_memory.py")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_rag.models.packing import pack
    from lit_rag.trainer.logprobs import packed_logprobs

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=151_936, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).to(device).train()
    ids = torch.randint(0, 151_936, (8, 16 + 512), device=device)
    packed = pack(ids, torch.ones_like(ids), 512)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    values = packed_logprobs(model, packed, chunk_tokens=512, through_forward=True, split=False)
    values.sum().backward()
    peak_gb = (torch.cuda.max_memory_allocated() - start) / 1e9
    figure = f"{peak_gb:.2f} GB over the pass's start (bound 2.0)"
    assert peak_gb < 2.0, figure
    return figure


def check_mismatch(device: str) -> str:
    """vLLM's top-p log-probs compared like with like: ``rollout/logprob_diff_*`` near 0."""
    if device != "cuda":
        raise Skip("runs on the CPU in the tests (-m vllm)")
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise Skip(f"vLLM is not installed ({exc})") from None
    return _pytest("tests/plugins/test_vllm_top_p.py", "-m", "vllm")


def check_update(device: str) -> str:
    """The update's GPU paths: the fused log-prob head under bf16 autocast on CUDA against the
    checkpointed chunks it replaced (values and gradients), and the step clock's CUDA events
    against the host's clock around a synchronised matmul."""
    if device != "cuda":
        raise Skip("on the CPU: tests/trainer/test_head.py, tests/trainer/test_flops.py")
    import torch
    from test_head import checkpointed, run

    from lit_rag.trainer.head import head_logprobs
    from lit_rag.trainer.phases import Clock

    torch.manual_seed(0)
    head = torch.nn.Linear(256, 32_000, bias=False, device=device)
    hidden = torch.randn(1_000, 256, device=device)
    targets = torch.randint(0, 32_000, (1_000,), device=device)
    weights = torch.randn(1_000, device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ours, our_grads = run(head_logprobs, head, hidden, targets, weights, chunk_tokens=256)
        theirs, their_grads = run(checkpointed, head, hidden, targets, weights, chunk=256,
                                  temperature=1.0, softcap=None)  # fmt: skip
    value_gap = float((ours - theirs).abs().max())
    grad_gap = max(  # relative to each gradient's largest element (bf16 rounds at ~4e-3)
        float((a - b).abs().max() / b.abs().max())
        for a, b in zip(our_grads, their_grads, strict=True)
    )
    assert value_gap < 1e-2 and grad_gap < 2e-2, f"values {value_gap:.1e}, grads {grad_gap:.1e}"
    clock, x = Clock(torch.device(device)), torch.randn(4_096, 4_096, device=device)
    torch.cuda.synchronize()
    started = time.perf_counter()
    with clock("time/matmul_s"):
        for _ in range(20):
            x = x @ x / 64.0
    torch.cuda.synchronize()
    host_s, device_s = time.perf_counter() - started, float(clock.metrics()["time/matmul_s"])
    assert 0.5 * host_s < device_s <= 1.05 * host_s, f"events {device_s:.3f} s, host {host_s:.3f} s"
    clocked = f"clock {device_s:.3f} s of {host_s:.3f} s"
    return f"head: values {value_gap:.1e}, grads {grad_gap:.1e}; {clocked}"


def _pytest(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=600,
    )  # fmt: skip
    summary = (done.stdout.strip().splitlines() or ["no output"])[-1]
    assert done.returncode == 0 and " passed" in summary and "skipped" not in summary, summary
    return summary


CHECKS: dict[str, Callable[[str], str]] = {
    "masters": check_masters,
    "offload": check_offload,
    "index": check_index,
    "link": check_link,
    "peak": check_peak,
    "mismatch": check_mismatch,
    "update": check_update,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checks", nargs="*", choices=[[], *CHECKS], metavar="CHECK")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args(argv)
    tests = ROOT / "tests"
    sys.path[:0] = [str(tests / "trainer"), str(tests / "scripts"), str(tests)]
    failed = 0
    for name in args.checks or list(CHECKS):
        started = time.monotonic()
        try:
            with contextlib.redirect_stdout(sys.stderr):
                figure = CHECKS[name](args.device)
            verdict = "PASS"
        except Skip as why:
            verdict, figure = "SKIP", str(why)
        except Exception as exc:  # noqa: BLE001 (every failure is one line of the table)
            verdict, figure = "FAIL", f"{type(exc).__name__}: {str(exc)[:200]}"
            failed += 1
        seconds = time.monotonic() - started
        print(f"{verdict} {name:<9} {seconds:6.1f} s  {figure}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
