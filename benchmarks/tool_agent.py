"""The tool agent against the tag-protocol search agent: same questions, model, engine, retriever.

Both roll out the recipe's questions on one engine: the ``tool_agent`` of the recipe (chat-template
function calling: tool schemas in the system message, calls as JSON, results as tool messages),
and Search-R1's ``search_agent`` (``<search>`` / ``<information>`` / ``<answer>`` tags, no
evaluation step) over the recipe's retriever with the same top-k, turns and token budgets. Per
protocol, one table row:

- wall seconds of the rollout, and per generated token (what a step's rollout costs);
- prompt tokens per episode (the tool schemas make the tool agent's longer);
- prefill per generated token: the context tokens every segment submits to the engine, summed,
  per token it generates (a multi-turn episode re-submits its whole context each turn; with
  prefix caching the engine computes only the new part);
- the tool agent's rendering overhead: the seconds spent rendering the conversation through the
  chat template and checking it against a full re-rendering (``check_rendering``), and their
  share of the rollout.

    python benchmarks/tool_agent.py --config recipes/tool_agent_quickstart.yaml --prompts 8
    python benchmarks/tool_agent.py --quick      # 4 prompts x 2 samples (flags given win)

The rollout runs at the recipe's ``trainer.precision`` as ``lit-rag fit`` resolves it (``auto``:
bf16 autocast where the CPU computes bf16 natively, else fp32; ``--trainer.precision=32-true``
forces one) and the engine at its ``dtype``. Measure alone (no other heavy process on the
machine): figures go to docs/performance.md, with the date, commit, machine, library versions and
command printed under the table (``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import _bench
import torch

from lit_rag.cli.commands import build_cli
from lit_rag.models.precision import resolve_dtype

#: --quick: fewer questions and samples, the same two rows
QUICK = {"prompts": 4, "group_size": 2}


class Counted:
    """Counts what an engine is asked to prefill: the context of every submitted segment."""

    def __init__(self, engine) -> None:
        self.engine, self.prompt_tokens, self.segments = engine, 0, 0
        self._submit = engine.submit

    def submit(self, prompt, params):
        self.prompt_tokens += len(prompt)
        self.segments += 1
        return self._submit(prompt, params)

    @contextmanager
    def installed(self):
        self.engine.submit = self.submit
        try:
            yield self
        finally:
            del self.engine.submit


@contextmanager
def timed(obj, names: list[str], spent: list[float]):
    """Add the wall time of ``obj``'s methods ``names`` to ``spent[0]`` while inside."""
    originals = {name: getattr(obj, name) for name in names}

    def wrap(function):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started

        return run

    for name, function in originals.items():
        setattr(obj, name, wrap(function))
    try:
        yield
    finally:
        for name in originals:
            delattr(obj, name)


def tag_agent(tool_env):
    """Search-R1's search agent with the tool agent's retriever, top-k, turns and budgets."""
    from lit_rag.plugins.environments.search_agent import SearchAgentEnvironment

    search = tool_env.toolbox.tools["search"]
    return SearchAgentEnvironment(
        retriever=tool_env.retriever,
        top_k=search.top_k,
        max_turns=tool_env.max_turns - 1,  # its searches; the last turn answers (below)
        max_response_tokens=tool_env.max_response_tokens,
        max_information_tokens=tool_env.max_result_tokens,
        evaluate=False,
        answer_after_max_turns=True,
    )


def measure(name: str, environment, module, examples, group: int) -> dict:
    module.environment = environment
    engine = module.engine
    spent = [0.0]
    names = ["render", "_check"] if hasattr(environment, "render") else []
    with Counted(engine).installed() as counted, timed(environment, names, spent):
        started = time.perf_counter()
        trajectories = module.rollout(examples, module.sampling, group)
        seconds = time.perf_counter() - started
    generated = sum(int(t.loss_mask.sum()) for t in trajectories)
    answered = sum(bool(environment.extract_answer(t)) for t in trajectories)
    return {
        "protocol": name,
        "episodes": len(trajectories),
        "seconds": seconds,
        "generated": generated,
        "ms_per_token": 1000 * seconds / max(generated, 1),
        "prompt": sum(t.prompt_ids.numel() for t in trajectories) / len(trajectories),
        "prefill_per_token": counted.prompt_tokens / max(generated, 1),
        "segments": counted.segments / len(trajectories),
        "answered": answered / len(trajectories),
        "render_s": spent[0] if names else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Other options go to lit-rag's CLI, e.g. --trainer.precision=32-true.",
    )
    parser.add_argument("--config", default="recipes/tool_agent_quickstart.yaml")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=None)
    args, extra = _bench.parse_args(parser, QUICK, argv, known=True)
    cli = build_cli(["--config", args.config, *extra], run=False)
    module, data = cli.model, cli.datamodule
    module.configure_model()
    data.setup("fit")
    examples = data.train_examples()[: args.prompts]
    group = args.group_size or module.group_size
    tool_env = module.environment
    tool_env.setup()
    bf16 = "bf16" in str(cli.trainer.precision)
    rows = []
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        module.rollout(examples[:1], module.sampling, 1)  # warm-up: engine start, first compile
        for name, environment in (("tool calling", tool_env), ("tags", tag_agent(tool_env))):
            torch.manual_seed(0)
            rows.append(measure(name, environment, module, examples, group))
    tool_env.close()
    engine = type(module.engine).__name__
    dtype = getattr(module.engine, "dtype", None)
    dtype = f" (dtype {dtype}: {resolve_dtype(dtype, None)})" if isinstance(dtype, str) else ""
    print(
        f"{args.config}: engine {engine}{dtype}, precision {cli.trainer.precision}, "
        f"{torch.get_num_threads()} threads; "
        f"{args.prompts} prompts x {group} samples"
    )
    header = (
        f"{'protocol':<14}{'rollout s':>10}{'gen tok':>9}{'ms/tok':>8}{'prompt':>8}"
        f"{'prefill/tok':>12}{'segments':>9}{'answered':>9}{'render s':>10}{'render %':>9}"
    )
    print(header)
    for r in rows:
        render = "-" if r["render_s"] is None else f"{r['render_s']:.2f}"
        share = "-" if r["render_s"] is None else f"{100 * r['render_s'] / r['seconds']:.1f}"
        print(
            f"{r['protocol']:<14}{r['seconds']:>10.1f}{r['generated']:>9}{r['ms_per_token']:>8.1f}"
            f"{r['prompt']:>8.0f}{r['prefill_per_token']:>12.1f}{r['segments']:>9.2f}"
            f"{r['answered']:>9.2f}{render:>10}{share:>9}"
        )
    _bench.print_provenance(__file__, argv, libraries=("bm25s",))


if __name__ == "__main__":
    main()
