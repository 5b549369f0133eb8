"""Test helpers shared by several test modules (``tests/`` is on ``sys.path`` under pytest)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lit_rag.api import Reward, TrainBatch
from lit_rag.rollout.base import Generation, RolloutEngine


class ScriptedPolicy(RolloutEngine):
    """A policy without a model: ``calls[k]`` holds the texts of the k-th ``generate`` call, one
    per prompt in order. Honours ``max_new_tokens`` (cut, reported unfinished); every token's
    log-prob is -0.25. ``log`` records each call's decoded prompts and sampling parameters."""

    def __init__(self, tokenizer, calls):
        self.tokenizer, self.calls, self.log = tokenizer, list(calls), []

    @property
    def prompts(self) -> list[list[str]]:
        return [prompts for prompts, _ in self.log]

    def generate(self, prompts, params):
        assert self.calls, "the environment asked for more generations than scripted"
        texts = self.calls.pop(0)
        assert len(texts) == len(prompts), (texts, len(prompts))
        self.log.append(([self.tokenizer.decode(p) for p in prompts], params))
        out = []
        for text in texts:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            finished = len(ids) <= params.max_new_tokens
            ids = ids[: params.max_new_tokens]
            out.append(
                Generation(
                    torch.tensor(ids, dtype=torch.long),
                    torch.full((len(ids),), -0.25),
                    self.tokenizer.decode(ids),
                    finished,
                )
            )
        return out


def require_package(module: str, install: str) -> None:
    """Skip the calling test module when ``module`` is missing, except in CI, which must have
    installed it (there a missing package is an error, never a silent skip)."""
    if importlib.util.find_spec(module) is not None:
        return
    if os.environ.get("CI"):
        raise RuntimeError(f"CI must install {module} ({install})")
    pytest.skip(f"{module} is not installed: {install}", allow_module_level=True)


def require_executable(path: str, install: str) -> str:
    """``path`` when it is an executable file; else skip the calling test module, except in CI,
    which must have installed it (there a missing program is an error, never a silent skip)."""
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    if os.environ.get("CI"):
        raise RuntimeError(f"CI must install {path} ({install})")
    pytest.skip(f"{path} is not installed: {install}", allow_module_level=True)


def shared_data_dir() -> Path:
    """``../shared/data`` (real dataset samples that ship beside the repo, not in it).

    Skips the caller where it is absent (a user's clone), except in CI, which runs with
    ``../shared`` beside the clone: there its absence is an error, never a silent skip.
    """
    path = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    if path.is_dir():
        return path
    if os.environ.get("CI"):
        raise RuntimeError(f"CI runs with ../shared beside the clone, but {path} is absent")
    pytest.skip(
        "../shared/data is absent (it ships beside the repo, not in it): tests on real "
        "samples skipped"
    )


def pretend_cuda(devices: int = 1):
    """A context in which torch and Lightning report ``devices`` CUDA GPUs, so a Trainer with a
    GPU-only strategy (FSDP, DeepSpeed) can be built on a CPU machine. Building only: nothing may
    run on the pretended devices."""
    import contextlib
    from unittest import mock

    from lightning.pytorch.accelerators import CUDAAccelerator

    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch("torch.cuda.is_available", lambda: True))
    stack.enter_context(mock.patch("torch.cuda.device_count", lambda: devices))
    stack.enter_context(
        mock.patch("lightning.fabric.accelerators.cuda.num_cuda_devices", lambda: devices)
    )
    stack.enter_context(
        mock.patch.object(CUDAAccelerator, "is_available", staticmethod(lambda: True))
    )
    return stack


class EvenTokenReward(Reward):
    """Test reward: the fraction of even token ids a trajectory generated. Random samples
    differ in it, so GRPO groups have reward variance and every step moves the weights.
    Named in recipes by its dotted path ``helpers.EvenTokenReward`` (tests/ is on sys.path)."""

    def __init__(self) -> None:
        self.weights = {}

    def __call__(self, trajectories):
        from lit_rag.types import RewardBreakdown

        total = torch.tensor(
            [
                float((t.completion_ids[t.loss_mask > 0] % 2 == 0).float().mean())
                if t.num_generated
                else 0.0
                for t in trajectories
            ]
        )
        return RewardBreakdown(total=total, components={"even": total.clone()})


def train_batch(completion_mask: torch.Tensor, **fields) -> TrainBatch:
    """A :class:`TrainBatch` for loss tests: the given per-row tensors, zero prompt/completion ids
    (a loss never reads them), engine log-probs 0 unless given."""
    n, width = completion_mask.shape
    fields.setdefault("sampling_logprobs", torch.zeros(n, width))
    return TrainBatch(
        input_ids=torch.zeros(n, width + 1, dtype=torch.long),
        attention_mask=torch.ones(n, width + 1, dtype=torch.long),
        completion_mask=completion_mask,
        **fields,
    )


def token_trajectory(group: int, n_tokens: int, example: object = None) -> object:
    """A trajectory of ``n_tokens`` generated tokens (ids 1..n, sampling log-prob -1 each) in
    prompt group ``group``, for algorithm tests; the example asks "?" and answers "a"."""
    from lit_rag.types import Example, Trajectory

    return Trajectory(
        example=example or Example(id="q", question="?", answers=["a"]),
        group=group,
        prompt_ids=torch.tensor([5, 6]),
        completion_ids=torch.arange(1, n_tokens + 1),
        loss_mask=torch.ones(n_tokens),
        sampling_logprobs=torch.full((n_tokens,), -1.0),
        text="",
    )


def tiny_bert_folder(folder, words: list[str], max_positions: int = 64) -> str:
    """A 1-layer, 16-wide random BERT over ``words`` saved as a plain HF folder (no download),
    a dense-retrieval encoder for index tests; ``folder`` must not exist yet or be empty."""
    from transformers import BertConfig, BertModel, BertTokenizer

    folder.mkdir(exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words]))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=4 + len(words),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=max_positions,
    )
    BertModel(config).save_pretrained(folder)
    BertTokenizer(str(folder / "vocab.txt")).save_pretrained(folder)
    return str(folder)


def tiny_model_folder(folder, tiny) -> str:
    """A tiny random model (``TinyConfig``) and its in-code tokenizer saved as a Hugging Face
    folder (what vLLM and ``from_pretrained`` load)."""
    from lit_rag.models.loading import ModelConfig, load_model, load_tokenizer

    config = ModelConfig(tiny=tiny)
    load_model(config).save_pretrained(folder)
    load_tokenizer(config).save_pretrained(folder)
    return str(folder)


def one_line_error(args: list[str], capsys) -> str:
    """Run the real CLI in-process; return its single stderr line (exit 2, no traceback)."""
    from lit_rag.cli.commands import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert info.value.code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("lit-rag: error: "), err
    return lines[0]


def assert_finite_metrics(
    rows: list[dict],
    prefixes: tuple[str, ...] = ("reward/", "train/", "val/", "rollout/", "time/", "mem/", "perf/"),
) -> int:
    """Every non-empty value of a ``metrics.csv`` whose column starts with one of ``prefixes`` is
    a finite number (no NaN, no inf, nothing unparsable); returns how many were checked."""
    import math

    checked = 0
    for row in rows:
        for key, value in row.items():
            if value == "" or not key.startswith(prefixes):
                continue
            number = float(value)
            assert math.isfinite(number), f"{key} = {value} in step {row.get('step')}"
            checked += 1
    assert checked, "no metric values to check"
    return checked


def start_index_server(args: list[str]) -> tuple[subprocess.Popen, str]:
    """Run ``lit-rag index serve ARGS --port 0``; wait (at most 60 s) for its "serving" line."""
    process = subprocess.Popen(
        [sys.executable, "-m", "lit_rag", "index", "serve", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 60
    line = process.stdout.readline()  # blocks until the server prints or exits
    if not line.startswith("serving ") or time.monotonic() > deadline:
        process.kill()
        pytest.fail(f"server did not start: {line!r} {process.stderr.read()[-2000:]}")
    return process, line.split(" at ")[-1].strip()


def stop_index_server(process: subprocess.Popen, how: signal.Signals) -> tuple[int, str, str]:
    """Send ``how``; the exit status, the rest of stdout and stderr."""
    process.send_signal(how)
    out, err = process.communicate(timeout=30)
    return process.returncode, out, err


#: ``lit-rag`` overrides per engine for a tiny model folder: ``hf``, or the real vLLM CPU build
#: in fp32, eager, with a small KV cache
TINY_ENGINES = {
    "hf": [],
    "vllm": [
        "--model.engine=vllm",
        "--model.engine.init_args.dtype=float32",
        "--model.engine.init_args.enforce_eager=true",
        "--model.engine.init_args.kv_cache_gib=0.25",
    ],
}


def tiny_folder(folder: Path, window: int | None = None) -> str:
    """A tiny random model saved as a Hugging Face folder (hidden 64, 2 layers, 2 heads: a head
    count vLLM's tensor parallel 2 divides); ``window`` sets its ``max_position_embeddings``."""
    from lit_rag.models.loading import ModelConfig, TinyConfig, load_model, load_tokenizer

    config = ModelConfig(tiny=TinyConfig(hidden_size=64, num_layers=2, num_heads=2))
    model = load_model(config)
    if window is not None:
        model.config.max_position_embeddings = window
    model.save_pretrained(folder)
    load_tokenizer(config).save_pretrained(folder)
    return str(folder)


class AnswerBook(RolloutEngine):
    """An engine that answers from a book: the completion for a prompt is
    ``<answer>BOOK[question]</answer>`` for the first question of ``book`` found in the decoded
    prompt (``<answer></answer>`` when none is), so a test knows every metric by hand.
    Recipes name it as ``engine: {class_path: helpers.AnswerBook, init_args: {book: {...}}}``."""

    def __init__(self, book: dict[str, str]):
        self.book = dict(book)

    def generate(self, prompts, params):
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt)
            answer = next((a for q, a in self.book.items() if q in text), "")
            completion = f"<answer>{answer}</answer>"
            ids = torch.tensor(
                self.tokenizer(completion, add_special_tokens=False)["input_ids"], dtype=torch.long
            )
            out.append(Generation(ids, torch.full((len(ids),), -0.5), completion, True))
        return out


#: EVO-RAG's Table 1 as printed (evo_rag.txt Section 3.6): component -> (start, mid, end)
EVO_RAG_TABLE_1 = {
    "retrieval": (2.0, 1.0, 0.5),  # Retrieval Bonus (beta)
    "action": (1.5, 0.8, 0.4),  # Retrieval Action Penalty (lambda)
    "overlap": (0.1, 0.5, 1.2),  # Subquery Overlap Penalty (gamma)
    "backtrack": (0.3, 0.5, 1.0),  # Backtrack Penalty (delta)
    "refusal": (0.5, 0.5, 0.5),  # Refusal Reward (rho)
    "step": (0.02, 0.05, 0.10),  # Step Penalty (eta)
    "answer": (0.05, 0.10, 1.00),  # Answer Correctness (kappa)
}


def lightning_logs_to_this_stderr() -> None:
    """Point Lightning's StreamHandlers at this test's ``sys.stderr``: Lightning binds them to
    the ``sys.stderr`` of the moment it is imported, under pytest an earlier test's (closed)
    capture, which prints "--- Logging error ---" plus a traceback into this test's stderr."""
    import logging

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(
                handler, logging.FileHandler
            ):
                handler.stream = sys.stderr  # not setStream: it flushes the closed stream


def mount_unavailable(reason: str) -> None:
    """Skip where a test cannot mount the filesystem it needs; in CI (root) that is an error."""
    if os.environ.get("CI"):
        pytest.fail(f"CI runs as root and must mount the test's tmpfs: {reason}")
    pytest.skip(reason)


def one_step_fit(root: Path) -> list[str]:
    """``lit-rag fit`` arguments: the tiny recipe for one step, checkpointing under ``root``."""
    return [
        "fit",
        "--config",
        str(Path(__file__).resolve().parents[1] / "recipes" / "tiny.yaml"),
        "--model.engine=hf",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=true",
        f"--trainer.default_root_dir={root}",
        "--trainer.max_steps=1",
    ]


def lit_rag_command() -> list[str]:
    """The ``lit-rag`` console script of this environment (``python -m lit_rag`` without it)."""
    script = Path(sys.executable).with_name("lit-rag")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "lit_rag"]
