"""The tests' shared factories: a trajectory, a scripted engine, a character reward, the
pieces that the subprocess scripts in ``tests/scripts/`` share with the unit tests (packing's
trajectories and tiny policy, EVO-RAG's loop) and what a short real run shows it learned.
Tests import them as ``from kit import ...`` (``tests/`` is on ``sys.path``); a script puts
``tests/`` on its own ``sys.path`` first."""

from __future__ import annotations

import json
import random
import sys
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import EvenTokenReward, ScriptedPolicy
from lightning.pytorch import Callback

from lit_rag.api import Reward
from lit_rag.contracts.step import StepOutput
from lit_rag.models.loading import ModelConfig, TinyConfig
from lit_rag.rollout.base import Generation, RolloutEngine
from lit_rag.types import Example, Passage, RewardBreakdown, Step, Trajectory

__all__ = [
    "EVO_CORPUS",
    "TINY",
    "CharacterReward",
    "EvenTokenReward",
    "ScriptedPolicy",
    "Steering",
    "evo_rag_reward",
    "had_signal",
    "lora_moved",
    "multi_turn_trajectories",
    "packing_policy",
    "packing_trajectory",
    "single_turn_trajectories",
    "trajectory",
]

TINY = ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2))
"""A tiny random Llama (in-code tokenizer, no downloads)."""

#: a three-passage corpus (two hops: Orbel Mills -> Mira Tolvan -> Kessa -> Dorvale) for
#: the tool-agent tests
CORPUS = [
    Passage("p1", "Orbel Mills", "Orbel Mills is a paper company founded by Mira Tolvan."),
    Passage("p2", "Mira Tolvan", "Mira Tolvan is an engineer who was born in Kessa."),
    Passage("p3", "Kessa", "Kessa is a harbour town in the region of Dorvale."),
]


def trajectory(
    text: str = "",
    *,
    example: Example | None = None,
    answers: Sequence[str] = ("a",),
    group: int = 0,
    prompt: Sequence[int] = (),
    tokens: int | Iterable[int] = 0,
    logprob: float = 0.0,
    loss_mask: torch.Tensor | None = None,
    sampling_logprobs: torch.Tensor | None = None,
    steps: Iterable[Step] = (),
    **fields: Any,
) -> Trajectory:
    """A trajectory whose policy wrote ``text``.

    ``example`` defaults to one asking "?" with ``answers``. ``tokens`` is the completion: a
    count ``n`` (ids 1..n) or the ids themselves; by default there are none, for rewards that
    read only text, steps or a contract. Every completion token is the policy's (loss mask 1)
    with sampling log-prob ``logprob`` unless ``loss_mask`` / ``sampling_logprobs`` say
    otherwise. ``fields`` are the other :class:`Trajectory` fields (``contract``,
    ``truncated``, ``pieces``, ``prompt_text``, ...)."""
    if isinstance(tokens, int):
        completion = torch.arange(1, tokens + 1)
    else:
        completion = torch.tensor(list(tokens), dtype=torch.long)
    n = len(completion)
    return Trajectory(
        example=example or Example(id="q", question="?", answers=list(answers)),
        group=group,
        prompt_ids=torch.tensor(list(prompt), dtype=torch.long),
        completion_ids=completion,
        loss_mask=torch.ones(n) if loss_mask is None else loss_mask,
        sampling_logprobs=(
            torch.full((n,), float(logprob)) if sampling_logprobs is None else sampling_logprobs
        ),
        text=text,
        steps=list(steps),
        **fields,
    )


class CharacterReward(Reward):
    """Share of 'a' characters in the completion: varies between a random model's samples, so
    GRPO's advantages are not all 0 and a step moves the weights."""

    weights = {"a": 1.0}  # noqa: RUF012

    def __call__(self, trajectories):
        scores = torch.tensor([t.text.count("a") / max(1, len(t.text)) for t in trajectories])
        return RewardBreakdown(total=scores, components={"a": scores})


# Shared-prefix packing: the unit tests (tests/models/test_packing.py) and the FSDP script
# (tests/scripts/fsdp_packing.py) compute log-probs of the same trajectories.


def packing_policy(lora: bool = False, attn: str | None = None) -> torch.nn.Module:
    """A tiny policy in train mode, without activation checkpointing (the tests that want it
    enable it); with ``lora``, random adapters (B starts at 0, so A's gradient would be 0)."""
    from lit_rag.models.loading import LoraSettings, load_model

    config = ModelConfig(
        tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2, vocab_size=512, seed=3),
        lora=LoraSettings(r=4, alpha=8, dropout=0.0) if lora else None,
        gradient_checkpointing="none",
    )
    model = load_model(config).train()
    if attn is not None:
        model.config._attn_implementation = attn
    if lora:
        torch.manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.data.normal_(0, 0.1)
    return model


def packing_trajectory(
    prompt: list[int], completion: list[int], group: int, inserted: tuple[int, int] | None = None
) -> Trajectory:
    """A trajectory in prompt group ``group``; ``inserted`` (start, end) marks completion tokens
    the environment inserted (a multi-turn retrieval result: loss mask 0, log-prob 0)."""
    mask = torch.ones(len(completion))
    if inserted is not None:
        mask[inserted[0] : inserted[1]] = 0
    return trajectory(
        example=Example(id=str(group), question="q", answers=["a"]),
        group=group,
        prompt=prompt,
        tokens=completion,
        loss_mask=mask,
        sampling_logprobs=-torch.ones(len(completion)) * mask,
    )


def _random_ids(seed: int):
    g = torch.Generator().manual_seed(seed)
    return lambda n: torch.randint(5, 200, (n,), generator=g).tolist()


def single_turn_trajectories() -> list[Trajectory]:
    """Two groups with prompts of different lengths, completions of different lengths."""
    ids = _random_ids(0)
    p0, p1 = ids(11), ids(4)
    return [packing_trajectory(p0, ids(n), 0) for n in (5, 2, 7)] + [
        packing_trajectory(p1, ids(n), 1) for n in (3, 6, 1, 4)
    ]


def multi_turn_trajectories() -> list[Trajectory]:
    """Trajectories sharing their first prompt; completions with inserted tool tokens."""
    ids = _random_ids(1)
    prompt = ids(9)
    return [
        packing_trajectory(prompt, ids(14), 0, inserted=(4, 10)),
        packing_trajectory(prompt, ids(3), 0),
        packing_trajectory(prompt, ids(20), 0, inserted=(2, 12)),
    ]


# EVO-RAG's loop: the Lightning tests (tests/plugins/test_evo_rag_loop.py) and the DDP script
# (tests/scripts/ddp_evo_fit.py) train on the same corpus with the same steering engine.

EVO_CORPUS = [
    Passage("g1", "Orbel Mills", "Orbel Mills is a paper company founded by Mira Tolvan."),
    Passage("g2", "Mira Tolvan", "Mira Tolvan is an engineer who was born in Kessa."),
    Passage("n1", "Vell Works", "Vell Works makes boats in the city of Ardun."),
    Passage("n2", "Ardun", "Ardun is a port city on the Sel river."),
]
"""Two gold passages (the founder, then where she was born) and two distractors."""

EVO_ACTIONS = [
    "<search>Orbel Mills founder</search>",
    "<search>Mira Tolvan born</search>",
    "<search>boats Ardun</search>",
    "<answer>Kessa</answer>",
    "<answer>Ardun</answer>",
    "<refuse></refuse>",
    "<backtrack></backtrack>",
]


class Steering(RolloutEngine):
    """Picks a random action per prompt (seeded), so siblings differ in their returns: stands in
    for a tiny random model, which cannot write actions."""

    def __init__(self) -> None:
        self.rng = random.Random(0)

    def generate(self, prompts, params):
        out = []
        for _ in prompts:
            text = self.rng.choice(EVO_ACTIONS)
            ids = torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            out.append(Generation(ids, torch.zeros(len(ids)), text, True))
        return out


def evo_rag_reward():
    """EVO-RAG's reward (``t_max`` 4) with a stand-in for MiniLM: one direction per distinct
    query (cosine 1 for repeats, 0 otherwise)."""
    from lit_rag.plugins.rewards.evo_rag import EvoRagReward

    reward = EvoRagReward(t_max=4)
    reward._embed = lambda texts: torch.nn.functional.one_hot(
        torch.tensor([zlib.crc32(t.encode()) % 16 for t in texts]), 16
    ).float()
    return reward


# What a short LoRA run on a real model can show it learned, read from what the run leaves (the
# recipes' slow tests): a few steps rarely move a validation metric, but they show that the
# update reached the policy whenever the rewards gave it something to learn from.


def lora_moved(runs: Path) -> bool:
    """Whether the run's ``last.ckpt`` holds a non-zero LoRA ``B`` matrix: peft starts every
    ``lora_B`` at zero and AdamW leaves a zero tensor at zero until a gradient reaches it
    (decoupled weight decay of 0 is 0), so a non-zero one means an update moved the policy."""
    (last,) = runs.rglob("last.ckpt")
    state = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    b = [value for key, value in state.items() if ".lora_B." in key]
    assert b, f"{last} holds no LoRA B matrices"
    return any(bool(value.abs().sum() > 0) for value in b)


def had_signal(step: dict) -> bool:
    """Whether a training step (a metrics.csv row) had a group with reward variance: a GRPO group
    whose rewards are all equal has advantage 0, and the KL term has no gradient while the policy
    is the reference, so the policy moves exactly when some step had one."""
    return float(step["rollout/zero_variance_group_fraction"]) < 1.0


class Recorder(Callback):
    """Each training step's example ids, sampled texts, loss, reward, learning rate, optimizer
    steps and the KL beta its loss used: what a resumed run must reproduce."""

    def __init__(self):
        self.steps: list[dict] = []
        self.beta: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.beta = float(pl_module.algorithm.beta)  # the beta this step's loss uses

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = StepOutput.of(outputs)
        trajectories = step.trajectories
        self.steps.append(
            {
                "step": trainer.global_step,
                "ids": [ex.id for ex in batch],
                "texts": [t.text for t in trajectories],
                "loss": float(step.metrics["train/loss"]),
                "reward": float(step.metrics["reward/total"]),
                "lr": float(step.metrics["train/lr"]),
                "optimizer_steps": float(step.metrics.get("train/optimizer_steps", 1.0)),
                "beta": self.beta,
            }
        )


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path: Path):
    """A CLI test's process as a fresh ``lit-rag`` sees it: the plugin registry cleared, argv
    and the working folder its own (autouse in a module that imports it)."""
    from lit_rag import registry

    registry.clear_cache()
    monkeypatch.setattr(sys, "argv", ["lit-rag"])
    monkeypatch.chdir(tmp_path)
    yield
    registry.clear_cache()


def tool_call(name: str, **arguments) -> str:
    """A hermes tool call as a model writes it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class TurnScript(RolloutEngine):
    """A policy without a model for tool agents: ``turns[k]`` holds the samples of the k-th
    ``generate`` call, one per prompt, each a text (sampled as the tokenizer encodes it) or a
    list of ids (a non-canonical tokenization). The text it returns has no special tokens, as
    vLLM's and the hf engine's; ``prompts`` records each call's prompts."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.prompts = tokenizer, list(turns), []

    def generate(self, prompts, params):
        outputs = []
        self.prompts.append(prompts)
        for sample in self.turns.pop(0):
            ids = (
                sample
                if isinstance(sample, list)
                else self.tokenizer(sample, add_special_tokens=False)["input_ids"]
            )
            finished = len(ids) <= params.max_new_tokens
            ids = ids[: params.max_new_tokens]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            outputs.append(
                Generation(torch.tensor(ids), torch.full((len(ids),), -0.5), text, finished)
            )
        return outputs
