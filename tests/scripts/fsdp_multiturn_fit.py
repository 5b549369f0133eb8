"""A two-process FSDP fit on CPU (gloo) of the multi-turn search agent whose ranks take
different numbers of turns; run by ``test_fsdp_multiturn.py``.

    python tests/scripts/fsdp_multiturn_fit.py OUT_DIR [gather | per_layer]

Under FSDP each rank holds a shard of the policy. Rank 0's episodes answer at once (one
generation each); rank 1's search three times, evaluating after each search, then answer (seven
generations). ``gather`` (the hf engine's default) gathers the full weights once per rollout and
generates without collectives; ``per_layer`` gathers each layer at each decoding step, so every
generation is a collective, and rank 0, done after one, leaves rank 1 waiting (the hang).

The engine is :class:`RankScripted`: the real ``hf`` engine on the real FSDP policy (every
forward and its collectives happen as in a run), whose sampled text is then replaced by a
script chosen by the rank, since a random tiny model would not search on cue. Each rank writes
``OUT_DIR/rank<r>.json``: per step, the turns, searches and generation calls of its episodes.
"""

from __future__ import annotations

import json
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch import Callback

sys.path.insert(0, str(Path(__file__).parent))
from cpu_strategies import CPUFSDP, QUIET_TRAINER  # lit-rag's CPU FSDP strategy

from lit_rag.api import Reward
from lit_rag.contracts.step import StepOutput
from lit_rag.data.datamodule import QADataModule
from lit_rag.models.loading import ModelConfig, TinyConfig
from lit_rag.plugins.algorithms.grpo import GRPO
from lit_rag.plugins.engines.hf import HFEngine
from lit_rag.plugins.environments.search_agent import SearchAgentEnvironment
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.rollout.base import Generation, SamplingParams
from lit_rag.trainer.optimizer import OptimizerSettings
from lit_rag.trainer.policy import PolicyModule
from lit_rag.types import Passage, RewardBreakdown

warnings.filterwarnings("ignore")

SEARCHES_ON_RANK_1 = 3


class RankScripted(HFEngine):
    """The hf engine, then each completion's text replaced by the rank's script (see above)."""

    generate_calls = 0

    def generate(self, prompts, params):
        real = super().generate(prompts, params)  # the FSDP forward passes, collectives and all
        self.generate_calls += 1
        rank = dist.get_rank()
        return [
            self._scripted(self.tokenizer.decode(p), rank, g)
            for p, g in zip(prompts, real, strict=True)
        ]

    def _scripted(self, prompt: str, rank: int, real: Generation) -> Generation:
        return scripted(self.tokenizer, prompt, rank)


def scripted(tokenizer, prompt: str, rank: int, variant: int = 0) -> Generation:
    """The rank's next segment for an episode whose context is ``prompt``: rank 0 answers at
    once; rank 1 searches three times, evaluating after each search, then answers. ``variant``
    1 answers in other words (samples of a group then differ)."""
    searches = prompt.count("<search>") - 1  # the instruction names the tag once
    if prompt.endswith("</information>\n\n"):
        text = "<evaluate>missing: the birthplace</evaluate>"
    elif rank == 0 or searches >= SEARCHES_ON_RANK_1:
        text = "<answer>the harbour town Kessa</answer>" if variant else "<answer>Kessa</answer>"
    else:
        text = "<search>Tolvan born</search>"
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    return Generation(ids, torch.full((len(ids),), -0.5), tokenizer.decode(ids), True)


def two_passages_retriever() -> BM25Retriever:
    """A BM25 index of the two passages the scripted episodes search."""
    retriever = BM25Retriever(stopwords="en")
    retriever.build(
        [
            Passage("p1", "Mira Tolvan", "Mira Tolvan is an engineer who was born in Kessa."),
            Passage("p2", "Kessa", "Kessa is a harbour town in the region of Dorvale."),
        ]
    )
    return retriever


class Constant(Reward):
    def __call__(self, trajectories):
        total = torch.ones(len(trajectories))
        return RewardBreakdown(total=total, components={"one": total})


class Recorder(Callback):
    def __init__(self) -> None:
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        trajectories = StepOutput.of(outputs).trajectories
        self.rows.append(
            {
                "step": trainer.global_step,
                "turns": [t.contract.turns for t in trajectories],
                "searches": [sum(s.action == "search" for s in t.steps) for t in trajectories],
                "answered": [t.contract.stop_reason == "answer" for t in trajectories],
                "generate_calls": pl_module.engine.generate_calls,
            }
        )


def main(out: Path, kind: str) -> None:
    L.seed_everything(0)
    retriever = two_passages_retriever()
    module = PolicyModule(
        policy=ModelConfig(tiny=TinyConfig(hidden_size=32, num_layers=2, num_heads=2)),
        environment=SearchAgentEnvironment(
            retriever, top_k=1, max_turns=4, max_response_tokens=512
        ),
        reward=Constant(),
        algorithm=GRPO(beta=0.1),
        engine=RankScripted(fsdp_generation=kind),
        group_size=2,
        sampling=SamplingParams(max_new_tokens=24),
        micro_batch_size=2,
        optimizer=OptimizerSettings(lr=1e-3),
    )
    data = QADataModule(num_train=8, num_val=2, batch_size=1, hops=[2], num_distractors=0)
    recorder = Recorder()
    strategy = CPUFSDP(process_group_backend="gloo", timeout=timedelta(seconds=60))
    trainer = L.Trainer(
        strategy=strategy,
        devices=2,
        max_steps=2,
        callbacks=[recorder],
        enable_checkpointing=False,
        **QUIET_TRAINER,
    )
    trainer.fit(module, datamodule=data)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(recorder.rows))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "gather")
