"""The episode loop (lit_rag/contracts/episodes.py): every multi-turn environment rolls out
through it.

A fake policy whose output depends on its prompt alone (a crc32 of the prompt's ids picks one
of a few texts) gives the same trajectories whatever order its requests run and finish in. Run
through the engine's default ``collect`` (every queued segment in one ``generate`` call per
sampling setting, in submission order: the phase-by-phase loop the environments ran before)
and through an engine that finishes the latest submissions first, two at a time, each built-in
multi-turn environment must give the same trajectories, loss masks and steps.
"""

import zlib
from dataclasses import replace

import pytest
import torch

from lit_rag.api import Episode, EpisodeLoop, Generate, Search, start_episodes
from lit_rag.contracts.environment import Prompts
from lit_rag.plugins.environments.query_rewriter import QueryRewriterEnvironment, branch
from lit_rag.plugins.environments.retrieval_tree import RetrievalTreeEnvironment
from lit_rag.plugins.environments.search_agent import SearchAgentEnvironment
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.rollout.base import Generation, RolloutEngine, SamplingParams
from lit_rag.types import Example, Passage

CORPUS = [
    Passage("g1", "Orbel Mills", "Orbel Mills is a paper company founded by Mira Tolvan."),
    Passage("g2", "Mira Tolvan", "Mira Tolvan is an engineer who was born in Kessa."),
    Passage("n1", "Kessa", "Kessa is a harbour town in the region of Dorvale."),
    Passage("n2", "Vell Works", "Vell Works makes boats in the city of Ardun."),
]
EXAMPLES = [
    Example(
        id="q1",
        question="Where was the founder of Orbel Mills born?",
        answers=["Kessa"],
        gold_ids=["g1", "g2"],
    ),
    Example(id="q2", question="Which region is Kessa in?", answers=["Dorvale"], gold_ids=["n1"]),
    Example(id="q3", question="What does Vell Works make?", answers=["boats"], gold_ids=["n2"]),
    Example(id="q4", question="Who founded Orbel Mills?", answers=["Mira Tolvan"], gold_ids=["g1"]),
]
SEARCH_TEXTS = [
    "<search>Orbel Mills founder</search>",
    "<think>hop</think><search>Mira Tolvan born</search>",
    "<evaluate>founded by Mira Tolvan</evaluate>",
    "<evaluate>Kessa is in Dorvale</evaluate><answer>Dorvale</answer>",
    "<answer>Kessa</answer>",
    "not sure yet",
    "<search>Kessa region</search>",
    "<think>" + "a long thought " * 12,
]
REWRITE_TEXTS = [
    "<search>Orbel Mills founder</search>",
    "<search>Mira Tolvan born</search>",
    "<backtrack></backtrack>",
    "<answer>Kessa</answer>",
    "<refuse></refuse>",
    "hmm",
    "<search>boats Ardun</search>",
]
TREE_TEXTS = [
    (
        "<think>a</think><base-Q>who founded Orbel Mills</base-Q>"
        "<predicted-Q>Mira Tolvan born</predicted-Q>"
    ),
    "<think>b</think><base-Q>Kessa harbour region</base-Q>",
    "<think>c</think><base-Q>stop retrieval</base-Q>",
    "<think>d</think><base-Q>Vell Works boats</base-Q><base-Q>Ardun city</base-Q>",
    "no think <base-Q>Orbel</base-Q>",
    "<answer>Kessa</answer>",
]


class KeyedPolicy(RolloutEngine):
    """A fake policy (no model): the output depends on the prompt alone. A crc32 of the prompt's
    ids picks one of ``texts``; the text is cut after its first stop string and to the budget
    (then unfinished); every token's log-prob is -(1 + crc % 5) / 8, so a segment's log-probs
    name the prompt it answered. Runs through the default ``collect``: in submission order."""

    def __init__(self, tokenizer, texts: list[str]) -> None:
        self.tokenizer, self.texts, self.calls = tokenizer, texts, 0

    def generate(self, prompts, params):
        self.calls += 1
        return [self.one(p, params) for p in prompts]

    def one(self, prompt: list[int], params: SamplingParams) -> Generation:
        key = zlib.crc32(repr([int(t) for t in prompt]).encode())
        text = self.texts[key % len(self.texts)]
        ends = [text.find(s) + len(s) for s in params.stop if s in text]
        text = text[: min(ends)] if ends else text
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        finished = len(ids) <= params.max_new_tokens
        ids = ids[: params.max_new_tokens]
        logprobs = torch.full((len(ids),), -(1 + key % 5) / 8)
        return Generation(
            torch.tensor(ids, dtype=torch.long), logprobs, self.tokenizer.decode(ids), finished
        )


class OutOfOrderPolicy(KeyedPolicy):
    """:class:`KeyedPolicy` finishing the latest submissions first: each ``collect`` returns the
    last two requests still out, newest first. ``overtaken`` counts results returned while an
    older request was still out; ``moved_on`` counts segments submitted while requests of an
    earlier collect were still out (an episode that did not wait for the slowest of its turn)."""

    def __init__(self, tokenizer, texts: list[str]) -> None:
        super().__init__(tokenizer, texts)
        self.out: list[tuple[int, list[int], SamplingParams]] = []
        self.tickets = self.collects = self.overtaken = self.moved_on = 0

    def submit(self, prompt, params):
        self.tickets += 1
        if self.collects and self.out:
            self.moved_on += 1
        self.out.append((self.tickets, list(prompt), params))
        return self.tickets

    def collect(self):
        self.collects += 1
        batch, self.out = self.out[-2:][::-1], self.out[:-2]
        self.overtaken += len(batch) if self.out else 0
        return [(ticket, self.one(prompt, params)) for ticket, prompt, params in batch]


@pytest.fixture(scope="module")
def retriever():
    r = BM25Retriever(stopwords="en")
    r.build(CORPUS)
    return r


def untimed(contract):
    """The contract without R2AG inference's wall-clock seconds (they differ run to run)."""
    if getattr(contract, "inference", None) is None:
        return contract
    return replace(contract, inference=replace(contract.inference, retrieval_s=0, generation_s=0))


def assert_same(phased, loose):
    assert len(phased) == len(loose) > 0
    for a, b in zip(phased, loose, strict=True):
        assert (a.example.id, a.group, a.text, a.prompt_text, a.truncated) == (
            b.example.id,
            b.group,
            b.text,
            b.prompt_text,
            b.truncated,
        )
        for name in ("prompt_ids", "completion_ids", "loss_mask", "sampling_logprobs"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert a.steps == b.steps and a.meta == b.meta
        assert untimed(a.contract) == untimed(b.contract)


def both(tok, texts, run):
    """``run(engine)`` on the in-order engine and on the out-of-order one."""
    phased, loose = KeyedPolicy(tok, texts), OutOfOrderPolicy(tok, texts)
    return run(phased), run(loose), phased, loose


@pytest.mark.parametrize(
    "settings",
    [
        {"max_turns": 3},
        {"max_turns": 2, "evaluate": False, "answer_after_max_turns": True},
        {"max_turns": 3, "evaluate_prefix": "<evaluate>", "max_response_tokens": 150, "top_k": 1},
    ],
)
def test_search_agent_out_of_order_equals_phase_by_phase(tiny_policy, retriever, settings):
    _, tok = tiny_policy
    env = SearchAgentEnvironment(retriever, **settings)
    params = SamplingParams(max_new_tokens=48, temperature=0.7)
    phased, loose, _, engine = both(
        tok, SEARCH_TEXTS, lambda e: env.rollout(EXAMPLES, e, 2, params)
    )
    assert_same(phased, loose)
    assert {s.action for t in phased for s in t.steps} >= {"search", "answer"}
    assert any(t.loss_mask.min() == 0 for t in phased)  # documents or messages were inserted
    assert engine.overtaken > 0 and engine.moved_on > 0


def main_then_siblings(env: QueryRewriterEnvironment, examples, engine, group_size: int, params):
    """EVO-RAG's rollout phase by phase, as it ran before the siblings started early: every
    main episode to its end, then the siblings at their visited states, then theirs."""
    main = [Episode(ex, i, []) for i, ex in enumerate(examples)]
    env._advance(main, engine, params)
    branches, pending = [], []
    for e in main:
        for t in range(min(len(e.steps), env.branch_states)):
            siblings = [branch(e, t) for _ in range(group_size - 1)]
            branches.append((e, t, siblings))
            pending += siblings
    env._advance(pending, engine, params)
    return [
        env._trajectory(member, t, state=f"{e.group}:{t}")
        for e, t, siblings in branches
        for member in [e, *siblings]
    ]


def test_query_rewriter_out_of_order_equals_phase_by_phase(tiny_policy, retriever):
    _, tok = tiny_policy
    env = QueryRewriterEnvironment(retriever, top_k=1, t_max=4, branch_states=2)
    params = SamplingParams(max_new_tokens=48, temperature=0.7)
    phased, loose, in_order, engine = both(
        tok, REWRITE_TEXTS, lambda e: env.rollout(EXAMPLES, e, 3, params)
    )
    assert_same(phased, loose)
    # siblings started at their state as the main episode reaches it give what the phases gave
    assert_same(
        main_then_siblings(env, EXAMPLES, KeyedPolicy(tok, REWRITE_TEXTS), 3, params), phased
    )
    # ... in fewer generate calls: the first call holds every main episode and its siblings at s_0
    reference = KeyedPolicy(tok, REWRITE_TEXTS)
    main_then_siblings(env, EXAMPLES, reference, 3, params)
    assert in_order.calls < reference.calls
    assert {s.action for t in phased for s in t.steps} >= {"search", "invalid"}
    assert engine.overtaken > 0 and engine.moved_on > 0
    phased, loose, _, _ = both(
        tok, REWRITE_TEXTS, lambda e: env.validation_rollout(EXAMPLES, e, params)
    )
    assert_same(phased, loose)


def test_retrieval_tree_out_of_order_equals_phase_by_phase(tiny_policy, retriever):
    _, tok = tiny_policy
    env = RetrievalTreeEnvironment(retriever, top_k=1, val_top_t=1, max_iterations=3)
    params = SamplingParams(max_new_tokens=96, temperature=0.7)
    phased, loose, in_order, _ = both(
        tok, TREE_TEXTS, lambda e: env.rollout(EXAMPLES, e, 2, params)
    )
    assert_same(phased, loose)
    assert in_order.calls == 1  # one expansion per sample: one generate call, as before
    assert env.next_contexts(phased) == env.next_contexts(loose)
    phased, loose, _, engine = both(
        tok, TREE_TEXTS, lambda e: env.validation_rollout(EXAMPLES, e, params)
    )
    assert_same(phased, loose)
    assert max(t.contract.inference.iterations for t in phased) > 1 and engine.moved_on > 0


def test_a_new_environment_writes_handlers_only(tiny_policy, retriever):
    """Two states: search the question, then answer after the inserted documents (loss mask 0)."""
    _, tok = tiny_policy

    def query(loop, e, _):
        return Search("answer", [e.example.question], 1)

    def answer(loop, e, hits):
        (title,) = [e.passages[pid].title for pid in e.retrieved(hits[0])]
        e.insert(loop.encode(f"[{title}]"), f"[{title}]")
        return Generate("done_answering", e.context, loop.params)

    def done(loop, e, gen):
        e.generated(gen)
        e.end("answer")

    prompts = Prompts(texts=["a", "b"], ids=[[1, 2], [3]], group_size=1)
    loop = EpisodeLoop(
        OutOfOrderPolicy(tok, ["<answer>x</answer>"]), SamplingParams(max_new_tokens=8), retriever
    )
    a, b = loop.run(
        start_episodes(EXAMPLES[:2], prompts),
        {"start": query, "answer": answer, "done_answering": done},
    )
    assert a.done and a.stop_reason == "answer" and a.passages and a.text.startswith("[")
    inserted = len(loop.encode(a.pieces[0].text))
    assert a.mask == [0] * inserted + [1] * (len(a.ids) - inserted)
    assert len(a.turns) == 1 and a.turns[0].prompt_ids == a.prompt_ids + a.ids[:inserted]
    assert b.prompt_ids == [3] and b.group == 1


def test_loop_errors_name_the_state(tiny_policy):
    _, tok = tiny_policy
    engine = KeyedPolicy(tok, ["x"])
    e = Episode(EXAMPLES[0], 0, [1])
    with pytest.raises(KeyError, match="episode state 'start' has no handler; handlers: go"):
        EpisodeLoop(engine, SamplingParams()).run([e], {"go": lambda *_: None})
    with pytest.raises(TypeError, match="handler of state 'start' returned 'x'"):
        EpisodeLoop(engine, SamplingParams()).run(
            [Episode(EXAMPLES[0], 0, [1])], {"start": lambda *_: "x"}
        )

    class Silent(KeyedPolicy):
        def collect(self):
            return []

    with pytest.raises(RuntimeError, match="collected nothing with 1 segments submitted"):
        EpisodeLoop(Silent(tok, ["x"]), SamplingParams()).run(
            [Episode(EXAMPLES[0], 0, [1])],
            {"start": lambda loop, e, _: Generate("s", [1], loop.params)},
        )
