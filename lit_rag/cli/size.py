"""``lit-rag size``: how much memory a recipe needs per device, component by component.

    lit-rag size --config recipes/quickstart.yaml
    lit-rag size --config recipes/arena.yaml --devices 8 --memory 80GB
    lit-rag size --config recipes/eval_rar.yaml --devices 4 --model.micro_batch_size=4

Reads the recipe (and any ``--KEY=VALUE`` override, as ``lit-rag fit`` takes them) and the
model's config.json, never its weights; the arithmetic is :mod:`lit_rag.sizing.estimate`'s.
With ``--memory`` it also says whether the run fits and the largest micro-batch that does.
"""

from __future__ import annotations

import argparse
import re

from lit_rag.cli.help import COMMANDS
from lit_rag.errors import CommandParser, InputError

USAGE = (
    "lit-rag size --config RECIPE [--devices N] [--memory 80GB] [--prompt-tokens N] "
    "[--KEY=VALUE ...]"
)
#: ``lit-rag size --help``: the line ``lit-rag --help`` gives the command, then examples
DESCRIPTION = f"""\
{COMMANDS["size"]}

  lit-rag size --config recipes/quickstart.yaml
  lit-rag size --config recipes/arena.yaml --devices 8 --memory 80GB
  lit-rag size --config recipes/eval_rar.yaml --devices 4 --model.micro_batch_size=4

A row per component: policy weights, gradients, optimizer state, reference model,
activations and logits of one micro-batch, the rollout engine, the reward model, the
retrievers' encoders and indexes, and the process's fixed overhead. Nothing is loaded: the
model's numbers come from its config.json (or, for the models the paper recipes name, a
built-in table). Recipe overrides work as for lit-rag fit. 80GB, 80GiB and 80 all mean
80 x 2^30 bytes, as GPU makers count. docs/memory.md explains each row."""

_UNITS = {"": 2**30, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def build_parser() -> CommandParser:
    """The parser of ``lit-rag size`` (recipe overrides are what it leaves)."""
    parser = CommandParser(
        "size", USAGE, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", "-c", required=True, metavar="RECIPE", help="a recipe file")
    parser.add_argument(
        "--devices",
        metavar="N",
        help="processes (devices) in the run; default: the recipe's trainer.devices",
    )
    parser.add_argument(
        "--memory",
        metavar="SIZE",
        help="memory per device (80GB, 40GiB, 141): fit and largest micro-batch",
    )
    parser.add_argument(
        "--prompt-tokens",
        metavar="N",
        help="tokens of one prompt; default: typical of the recipe's environment",
    )
    return parser


def main(args: list[str]) -> None:
    """``lit-rag size``: see the module docstring."""
    from lit_rag.cli.recipe_args import load_recipe
    from lit_rag.sizing.estimate import estimate, largest_micro_batch
    from lit_rag.sizing.recipe import apply_overrides, plan

    options, overrides = build_parser().parse_known_args(args)
    devices = _whole(options.devices, "--devices")
    prompt_tokens = _whole(options.prompt_tokens, "--prompt-tokens")
    memory = parse_memory(options.memory) if options.memory is not None else None
    recipe = apply_overrides(load_recipe(options.config), overrides)
    try:
        sized = plan(recipe, devices, prompt_tokens)
    except InputError:
        raise
    except (TypeError, ValueError, AttributeError) as exc:  # a value of the wrong type
        raise InputError(
            f"size: {options.config}: a value the estimate cannot read ({exc})"
        ) from None
    result = estimate(sized.plan, memory)
    largest = largest_micro_batch(sized.plan, memory) if memory is not None else None
    print(render(options.config, sized, result, memory, largest, recipe))


def _whole(value: str | None, option: str) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise InputError(f"size: {option} must be a whole number >= 1, got '{value}'")
    return int(value)


def parse_memory(text: str) -> int:
    """``80GB``, ``80GiB``, ``80G``, ``80`` (GiB), ``512MB`` -> bytes (every unit binary).

    Raises:
        InputError: Not a size.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", text)
    if match is None or float(match.group(1)) <= 0:
        raise InputError(
            f"size: --memory '{text}' is not a memory size; give one like 80GB, 40GiB or 141"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def render(recipe_path, sized, result, memory, largest, recipe) -> str:
    """The table ``lit-rag size`` prints."""
    from lit_rag.sizing.estimate import micro_batch

    plan = sized.plan
    gpu = plan.on_gpu
    where = (
        f"{plan.devices} GPU{'s' if plan.devices > 1 else ''}"
        if gpu
        else (f"CPU, {plan.devices} process{'es' if plan.devices > 1 else ''}")
    )
    batch = micro_batch(plan)
    lines = [
        f"{recipe_path} on {where}: {plan.strategy}"
        + (" (offload)" if plan.offload else "")
        + f", {sized.precision}, "
        + (f"LoRA r={plan.lora_rank}" if plan.lora_rank else "full fine-tuning"),
        f"model: {plan.model.name}, {plan.model.parameters():,} weights, {plan.model.layers} "
        f"layers x {plan.model.hidden} hidden, vocabulary {plan.model.vocab:,} "
        f"(from {plan.model.source})",
        f"one step per device: {plan.prompts} prompts x {plan.group_size} samples, prompt "
        f"{plan.prompt_tokens:,} + completion {plan.completion_tokens:,} tokens; micro-batch "
        f"{batch.rows} row{'s' if batch.rows > 1 else ''}, {batch.tokens:,} positions",
    ]
    lines += [f"assumed: {line}" for line in sized.assumed]
    lines += ["", *_table(result.parts, gpu)]
    peak = f"{_size(result.total)}"
    lines += [
        "",
        f"total per {'device' if gpu else 'process'}: {peak} (always held + the largest phase)",
    ]
    if gpu:
        lines.append(f"host memory per process: {_size(result.host)}")
    if memory is not None:
        lines.append(_fits(result, memory, largest, recipe, plan))
    return "\n".join(lines)


def _table(parts, gpu: bool) -> list[str]:
    header = ("component", "when", "device" if gpu else "memory", "host" if gpu else "", "how")
    rows = [header]
    for part in parts:
        on_host = part.host and gpu
        rows.append(
            (
                part.name,
                part.phase,
                "" if on_host else _size(part.bytes),
                _size(part.bytes) if on_host else "",
                part.note,
            )
        )
    if not gpu:
        rows = [(r[0], r[1], r[2], r[4]) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _fits(result, memory: int, largest, recipe: dict, plan) -> str:
    verdict = "fits" if result.total <= memory else "does not fit"
    line = f"{verdict} in {_size(memory)} per {'device' if plan.on_gpu else 'process'}; "
    if largest is None:
        return line + _why_not(result, memory, plan)
    model = recipe.get("model") or {}
    keys = f"micro_batch_size: {largest.rows}, micro_batch_tokens: {largest.tokens}"
    if "micro_batch_tokens" in model and "micro_batch_size" not in model:
        keys = f"micro_batch_tokens: {largest.tokens} ({largest.rows} rows)"
    if largest.rows >= plan.prompts * plan.group_size:
        return line + f"largest micro-batch: all {largest.rows} rows of a step: {keys}"
    return line + f"largest micro-batch: {keys}"


def _why_not(result, memory: int, plan) -> str:
    """Why not even one row fits: vLLM's share below what it needs to start, or what is held
    besides the update alone over ``memory``."""
    for part in result.parts:
        if part.share and part.bytes < part.minimum:
            return (
                f"{part.name}'s share ({_size(part.bytes)}) is below what it needs to start "
                f"({_size(part.minimum)}: its weights and the KV cache of one sequence of "
                "max_model_len); raise gpu_memory_utilization or lower the engine's max_model_len"
            )
    held = sum(
        p.bytes for p in result.parts if p.phase == "always" and not (p.host and plan.on_gpu)
    )
    if held > memory:
        return f"what is held all the time ({_size(held)}) is already more"
    return "not even a micro-batch of one row fits"


def _size(n: int) -> str:
    if n == 0:
        return "-"
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.0f} MiB"
    return f"{n / 2**10:.0f} KiB"
