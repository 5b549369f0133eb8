"""R2AG: retrieval-tree expansion, pruning, the Top-Survivor reward, inference trees (no model).

Hand-built corpus with a known 2-hop gold chain: "Where was the founder of Orbel Mills born?"
needs g1 (Orbel Mills -> Mira Tolvan) and g2 (Mira Tolvan -> Kessa).
"""

import pytest
import torch

from lit_rag import registry
from lit_rag.plugins.environments.retrieval_tree import (
    R2AG_PROMPT,
    RetrievalTreeEnvironment,
    parse_expansion,
    tree_state,
)
from lit_rag.plugins.rewards.r2ag import R2AGReward, top_t_ap
from lit_rag.retrieval.bm25 import BM25Retriever
from lit_rag.rollout.base import SamplingParams
from lit_rag.types import Example, Passage, Step, Trajectory

from helpers import ScriptedPolicy

CORPUS = [
    Passage("g1", "Orbel Mills", "Orbel Mills is a paper company founded by Mira Tolvan."),
    Passage("g2", "Mira Tolvan", "Mira Tolvan is an engineer who was born in Kessa."),
    Passage("n1", "Kessa", "Kessa is a harbour town in the region of Dorvale."),
    Passage("n2", "Vell Works", "Vell Works makes boats in the city of Ardun."),
]
EX = Example(id="q1", question="Where was the founder of Orbel Mills born?", answers=["Kessa"],
             gold_ids=["g1", "g2"])
FIRST = ("<think>first find the founder</think><base-Q>who founded Orbel Mills</base-Q>"
         "<predicted-Q>where was Mira Tolvan born</predicted-Q>")


@pytest.fixture(scope="module")
def retriever():
    r = BM25Retriever(stopwords="en")
    r.build(CORPUS)
    return r


def expand(env, tok, outputs, example=EX):
    engine = ScriptedPolicy(tok, [outputs])
    return env.rollout([example], engine, len(outputs), SamplingParams(max_new_tokens=512)), engine


def test_parse_expansion():
    e = parse_expansion(FIRST)
    assert (e.think, e.base, e.predicted, e.stop, e.segments) == (
        True, ["who founded Orbel Mills"], ["where was Mira Tolvan born"], False, 2)
    e = parse_expansion("<think>done</think><base-Q> Stop Retrieval. </base-Q><predicted-Q>none</predicted-Q>")
    assert e.stop and e.base == [] and e.predicted == [] and e.segments == 2
    # queries quoted inside the reasoning are not actions; no think block: all text is read
    e = parse_expansion("<think>maybe <base-Q>x</base-Q></think>")
    assert e.think and e.base == [] and e.segments == 0
    e = parse_expansion("<base-Q>a</base-Q><base-Q>b</base-Q>", max_queries=1)
    assert not e.think and e.base == ["a"] and e.segments == 0
    assert parse_expansion("<<base-Q></think>").base == []  # never raises


def test_root_expansion_retrieves_top1_per_query_and_scores_eq5(tiny_policy, retriever):
    _, tok = tiny_policy
    env = RetrievalTreeEnvironment(retriever, top_k=1)
    (t,), engine = expand(env, tok, [FIRST])
    assert R2AG_PROMPT in engine.prompts[0][0] and "Evidences:\nnone" in engine.prompts[0][0]
    assert [(s.action, s.passage_ids) for s in t.steps] == [("base", ["g1"]), ("predicted", ["g2"])]
    out = R2AGReward()([t])
    c = {k: round(float(v[0]), 6) for k, v in out.components.items()}
    # MH = 1 (base: g1 new) + 1.25 * 1 (predicted: g2 new) = 2.25
    # AP = base (1/2)(1/1) + predicted (1/2)(1/1) = 1.0;  JH = 0 (no stop);  format = 2 x 0.01
    assert c == {"multi_hit": 2.25, "joint_hit": 0.0, "ap": 1.0, "format": 0.02, "zeroed": 0.0}
    # R = 0.2 * 2.25 + 0.3 * 0 + 0.2 * 1.0 + 0.02 = 0.67
    assert float(out.total[0]) == pytest.approx(0.67)


def test_ap_with_gold_at_various_ranks():
    gold = {"g1", "g2"}
    # branches x, g1, x, g2 with t = 4: (1/2) * (1/2 + 2/4) = 0.5
    assert top_t_ap([["x"], ["g1"], ["y"], ["g2"]], gold, 4) == pytest.approx(0.5)
    # t = 2 sees only x, g1: (1/2) * (1/2) = 0.25
    assert top_t_ap([["x"], ["g1"], ["y"], ["g2"]], gold, 2) == pytest.approx(0.25)
    # gold first and second: (1/2) * (1/1 + 2/2) = 1.0
    assert top_t_ap([["g1"], ["g2"], ["x"]], gold, 4) == pytest.approx(1.0)
    assert top_t_ap([], gold, 4) == 0.0 and top_t_ap([["g1"]], set(), 4) == 0.0


def traj(steps, prior=(), stop=False, think=True, segments=1, truncated=False):
    empty = torch.zeros(0, dtype=torch.long)
    return Trajectory(EX, 0, empty, empty, empty, empty.float(), "", steps=steps, truncated=truncated,
                      meta={"prior": list(prior), "stop": stop, "think": think, "segments": segments, "depth": 1})


def test_reward_terms_and_zeroing():
    r = R2AGReward()
    # repeated gold earns Multi-Hit once; the prior gold earns none; AP counts gold branches
    t = traj([Step("base", "a", ["g2"]), Step("base", "b", ["g2"])], prior=["g1"], segments=2)
    c = r([t]).components
    assert float(c["multi_hit"][0]) == 1.0  # g2 once
    assert float(c["ap"][0]) == pytest.approx((1 / 1 + 2 / 2) / 2)
    # all gold + stop: Joint-Hit; R = 0.2 * 0 + 0.3 * 1 + 0.2 * 0 + 0.01 = 0.31
    t = traj([Step("stop")], prior=["g1", "g2"], stop=True)
    assert float(r([t]).total[0]) == pytest.approx(0.31)
    # stop before all gold is retrieved: 0 (B.2), even with a hit this step
    t = traj([Step("base", "a", ["g2"]), Step("stop")], prior=[], stop=True)
    assert float(r([t]).total[0]) == 0.0 and float(r([t]).components["zeroed"][0]) == 1.0
    # stop in the same step that completes the gold set: allowed, Joint-Hit
    t = traj([Step("base", "a", ["g2"]), Step("stop")], prior=["g1"], stop=True)
    assert float(r([t]).components["joint_hit"][0]) == 1.0 and float(r([t]).total[0]) > 0.3
    # no <think>, or truncated: 0
    assert float(r([traj([Step("base", "a", ["g1"])], think=False)]).total[0]) == 0.0
    assert float(r([traj([Step("base", "a", ["g1"])], truncated=True)]).total[0]) == 0.0
    # format is capped at 0.02
    assert float(r([traj([], segments=5)]).components["format"][0]) == pytest.approx(0.02)


def test_pruning_keeps_gold_branches_and_dedupes(tiny_policy, retriever):
    _, tok = tiny_policy
    env = RetrievalTreeEnvironment(retriever, top_k=1, max_iterations=5)
    outputs = [
        "<think>t</think><base-Q>who founded Orbel Mills</base-Q><base-Q>boats Ardun</base-Q>",  # g1 + noise
        "<think>t</think><base-Q>paper company Orbel Mills founder</base-Q>",                   # g1 again
        "<think>t</think><base-Q>boats</base-Q>",                                               # noise only
        FIRST + "<base-Q>stop retrieval</base-Q>",                      # all gold + stop: complete
    ]
    trajectories, _ = expand(env, tok, outputs)
    contexts = env.next_contexts(trajectories)
    by_found = {tuple(c.meta["r2ag"]["retrieved"]): c for c in contexts}
    assert set(by_found) == {("g1",), ()}  # g1-only twice -> one context; root-only; complete -> none
    pruned = by_found[("g1",)]
    assert [p.id for p in pruned.references] == ["g1"]
    assert pruned.meta["r2ag"]["depth"] == 1
    assert pruned.meta["r2ag"]["tree"] == [
        {"query": "who founded Orbel Mills", "kind": "base", "passage_ids": ["g1"], "depth": 1}]
    assert by_found[()].references == []  # root only: no accurate branch
    # the next expansion reads the kept evidence and scores against it
    (t,), engine = expand(env, tok, ["<think>now the birthplace</think><base-Q>Mira Tolvan born</base-Q>"],
                          example=pruned)
    assert "[1] Orbel Mills: Orbel Mills is a paper company" in engine.prompts[0][0]
    assert t.meta["prior"] == ["g1"] and t.steps[0].passage_ids == ["g2"]
    assert float(R2AGReward()([t]).components["multi_hit"][0]) == 1.0
    # past L_MAX-I nothing re-enters the pool
    deep = Example(**{**pruned.__dict__, "meta": {"r2ag": {"depth": 4, "retrieved": ["g1"], "tree": []}}})
    (t,), _ = expand(env, tok, ["<think>x</think><base-Q>boats</base-Q>"], example=deep)
    assert env.next_contexts([t]) == []
    assert tree_state(EX) == {"depth": 0, "retrieved": [], "tree": []}


def test_inference_expands_until_stop_then_reads(tiny_policy, retriever):
    _, tok = tiny_policy
    env = RetrievalTreeEnvironment(retriever, val_top_k=1, max_iterations=5)
    other = Example(id="q2", question="What does Vell Works make?", answers=["boats"], gold_ids=["n2"])
    calls = [
        ["<think>a</think><base-Q>who founded Orbel Mills</base-Q>",
         "<think>b</think><base-Q>Vell Works make</base-Q>"],
        ["<think>c</think><base-Q>Mira Tolvan born</base-Q>",
         "<think>d</think><base-Q>stop retrieval</base-Q>"],
        ["<think>e</think><base-Q>stop retrieval</base-Q>"],
        ["<answer>Kessa</answer>", "<answer>ships</answer>"],  # the reader
    ]
    engine = ScriptedPolicy(tok, calls)
    trajectories = env.validation_rollout([EX, other], engine, SamplingParams(max_new_tokens=512, temperature=0))
    assert [t.meta["ranked"] for t in trajectories] == [["g1", "g2"], ["n2"]]
    assert [t.meta["iterations"] for t in trajectories] == [3, 2]
    assert "[1] Orbel Mills" in engine.prompts[1][0]  # the second expansion reads the first's document
    assert [env.extract_answer(t) for t in trajectories] == ["Kessa", "ships"]
    m = env.metrics(trajectories)
    assert float(m["recall"]) == 1.0 and float(m["full_recall"]) == 1.0
    assert float(m["avg_k"]) == 1.5 and float(m["map"]) == 1.0
    assert float(m["retrieval_s_per_query"]) > 0 and float(m["generation_s_per_query"]) > 0


def test_registered_and_bad_settings(retriever):
    assert registry.resolve("environment", "retrieval_tree") is RetrievalTreeEnvironment
    assert registry.resolve("reward", "r2ag") is R2AGReward
    with pytest.raises(ValueError, match="max_iterations must be >= 1"):
        RetrievalTreeEnvironment(retriever, max_iterations=0)
    with pytest.raises(ValueError, match="user_template must contain"):
        RetrievalTreeEnvironment(retriever, user_template="{question}")
