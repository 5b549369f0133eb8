"""R2AG: retrieval-tree expansion, pruning, the Top-Survivor reward, inference trees (no model).

Hand-built corpus with a known 2-hop gold chain: "Where was the founder of Orbel Mills born?"
needs g1 (Orbel Mills -> Mira Tolvan) and g2 (Mira Tolvan -> Kessa).
"""

import pytest
from kit import ScriptedPolicy, trajectory

from lit_rag import registry
from lit_rag.api import R2AGEpisode, R2AGTree, TreeVertex
from lit_rag.plugins.environments.retrieval_tree import (
    R2AG_PROMPT,
    Expansion,
    RetrievalTreeEnvironment,
    parse_expansion,
    select_branches,
    tree_state,
)
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.plugins.rewards.r2ag import R2AGReward, top_t_ap
from lit_rag.rollout.base import SamplingParams
from lit_rag.types import Example, Passage, Step

CORPUS = [
    Passage("g1", "Orbel Mills", "Orbel Mills is a paper company founded by Mira Tolvan."),
    Passage("g2", "Mira Tolvan", "Mira Tolvan is an engineer who was born in Kessa."),
    Passage("n1", "Kessa", "Kessa is a harbour town in the region of Dorvale."),
    Passage("n2", "Vell Works", "Vell Works makes boats in the city of Ardun."),
]
CORPUS_BY_ID = {p.id: p for p in CORPUS}
EX = Example(
    id="q1",
    question="Where was the founder of Orbel Mills born?",
    answers=["Kessa"],
    gold_ids=["g1", "g2"],
)
FIRST = (
    "<think>first find the founder</think><base-Q>who founded Orbel Mills</base-Q>"
    "<predicted-Q>where was Mira Tolvan born</predicted-Q>"
)


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
        True,
        ["who founded Orbel Mills"],
        ["where was Mira Tolvan born"],
        False,
        2,
    )
    e = parse_expansion(
        "<think>done</think><base-Q> Stop Retrieval. </base-Q><predicted-Q>none</predicted-Q>"
    )
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


def traj(steps, prior=(), stop=False, think=True, segments=1, truncated=False, example=EX):
    return trajectory(
        example=example,
        steps=steps,
        truncated=truncated,
        contract=R2AGEpisode(depth=1, prior=list(prior), think=think, stop=stop, segments=segments),
    )


def test_reward_terms_and_zeroing():
    r = R2AGReward()
    # repeated gold earns Multi-Hit once; the prior gold earns none; AP credits g2 once
    t = traj([Step("base", "a", ["g2"]), Step("base", "b", ["g2"])], prior=["g1"], segments=2)
    c = r([t]).components
    assert float(c["multi_hit"][0]) == 1.0  # g2 once
    # rank 1 hits g2, rank 2 repeats it (a miss): (1/1) / 2 = 0.5
    assert float(c["ap"][0]) == pytest.approx((1 / 1) / 2)
    # literal 1{r_u in g} (ap_hits="any"): both branches count, (1/1 + 2/2) / 2 = 1.0
    assert float(R2AGReward(ap_hits="any")([t]).components["ap"][0]) == pytest.approx(1.0)
    # all gold + stop: Joint-Hit; R = 0.2 * 0 + 0.3 * 1 + 0.2 * 0 + 0.01 = 0.31
    t = traj([Step("stop")], prior=["g1", "g2"], stop=True)
    assert float(r([t]).total[0]) == pytest.approx(0.31)
    # stop before all gold is retrieved: 0 (B.2), even with a hit this step
    t = traj([Step("base", "a", ["g2"]), Step("stop")], prior=[], stop=True)
    assert float(r([t]).total[0]) == 0.0 and float(r([t]).components["zeroed"][0]) == 1.0
    # stop in the same step that completes the gold set: allowed, Joint-Hit; g2 is new gold
    # (Multi-Hit 1), AP = (1/1) / 2 = 0.5, one format segment 0.01:
    # R = 0.2 * 1 + 0.3 * 1 + 0.2 * 0.5 + 0.01 = 0.61
    t = traj([Step("base", "a", ["g2"]), Step("stop")], prior=["g1"], stop=True)
    assert float(r([t]).components["joint_hit"][0]) == 1.0
    assert float(r([t]).total[0]) == pytest.approx(0.61)
    # no <think>, or truncated: 0
    assert float(r([traj([Step("base", "a", ["g1"])], think=False)]).total[0]) == 0.0
    assert float(r([traj([Step("base", "a", ["g1"])], truncated=True)]).total[0]) == 0.0
    # format is capped at 0.02
    assert float(r([traj([], segments=5)]).components["format"][0]) == pytest.approx(0.02)


THREE = Example(id="q3", question="?", answers=["x"], gold_ids=["g1", "g2", "g3"])


def traj3(steps, prior=(), segments=4):
    return traj(steps, prior=prior, segments=segments, example=THREE)


def test_ap_credits_each_gold_document_once():
    """Gold {g1, g2, g3}, g1 known from an earlier step; four base branches
    (t = 4), each retrieving its top-1 document."""
    repeat = traj3([Step("base", q, ["g1"]) for q in "abcd"], prior=["g1"])  # re-find g1 four times
    new_one = traj3(
        [Step("base", "a", ["g2"])] + [Step("base", q, [f"n{q}"]) for q in "bcd"], prior=["g1"]
    )

    # Literal 1{r_u in g} (ap_hits="any"), the old behaviour:
    #   repeat:  AP = (1/1 + 2/2 + 3/3 + 4/4) / 3 = 4/3 = 1.33 (> 1);  MH = 0
    #            R  = 0.2 * 0 + 0.2 * 4/3 + 0.02 (4 segments, capped) = 0.28667
    #   new one: AP = (1/1) / 3 = 1/3;  MH = 1
    #            R  = 0.2 * 1 + 0.2 * 1/3 + 0.02 = 0.28667  -- the same total
    old = R2AGReward(ap_hits="any")([repeat, new_one])
    assert old.components["ap"].tolist() == pytest.approx([4 / 3, 1 / 3])
    assert old.total.tolist() == pytest.approx([0.28667, 0.28667], abs=1e-5)

    # Default (ap_hits="new"): a gold document credited before (prior or an earlier branch) is a
    # miss.
    #   repeat:  AP = 0 (g1 is known; every branch is a miss);  R = 0.2 * 0 + 0.2 * 0 + 0.02 = 0.02
    #   new one: AP = (1/1) / 3 = 1/3;  R = 0.2 * 1 + 0.2 * 1/3 + 0.02 = 0.28667
    out = R2AGReward()([repeat, new_one])
    assert out.components["ap"].tolist() == pytest.approx([0.0, 1 / 3])
    assert out.components["multi_hit"].tolist() == [0.0, 1.0]
    assert out.total.tolist() == pytest.approx([0.02, 0.28667], abs=1e-5)

    # Base and predicted share the record: predicted re-finding base's g2 is a miss, so
    # R_AP^b + R_AP^p = (1/1)/3 + 0 = 1/3 (literal: 1/3 + 1/3).  Every gold found at ranks 1-3
    # (prior empty): (1/1 + 2/2 + 3/3) / 3 = 1.0, the most AP can be.
    both = traj3([Step("base", "a", ["g2"]), Step("predicted", "p", ["g2"])])
    assert float(R2AGReward()([both]).components["ap"][0]) == pytest.approx(1 / 3)
    assert float(R2AGReward(ap_hits="any")([both]).components["ap"][0]) == pytest.approx(2 / 3)
    full = traj3(
        [Step("base", q, [g]) for q, g in zip("abc", ["g1", "g2", "g3"], strict=True)]
        + [Step("predicted", "p", ["g1"])]
    )
    assert float(R2AGReward()([full]).components["ap"][0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="ap_hits must be one of new, any; got 'all'"):
        R2AGReward(ap_hits="all")


def test_pruning_keeps_gold_branches_and_dedupes(tiny_policy, retriever):
    _, tok = tiny_policy
    env = RetrievalTreeEnvironment(retriever, top_k=1, max_iterations=5)
    outputs = [
        "<think>t</think><base-Q>who founded Orbel Mills</base-Q>"
        "<base-Q>boats Ardun</base-Q>",  # g1 + noise
        "<think>t</think><base-Q>paper company Orbel Mills founder</base-Q>",  # g1 again
        "<think>t</think><base-Q>boats</base-Q>",  # noise only
        FIRST + "<base-Q>stop retrieval</base-Q>",  # all gold + stop: complete
    ]
    trajectories, _ = expand(env, tok, outputs)
    contexts = env.next_contexts(trajectories)
    by_found = {tuple(c.contract.retrieved): c for c in contexts}
    # g1-only twice -> one context; root-only; complete -> none
    assert set(by_found) == {("g1",), ()}
    pruned = by_found[("g1",)]
    assert [p.id for p in pruned.references] == ["g1"]
    assert pruned.contract.depth == 1
    assert pruned.contract.tree == [TreeVertex("who founded Orbel Mills", "base", ["g1"], 1)]
    assert by_found[()].references == []  # root only: no accurate branch
    # the next expansion reads the kept evidence and scores against it
    (t,), engine = expand(
        env,
        tok,
        ["<think>now the birthplace</think><base-Q>Mira Tolvan born</base-Q>"],
        example=pruned,
    )
    assert "[1] Orbel Mills: Orbel Mills is a paper company" in engine.prompts[0][0]
    assert t.contract.prior == ["g1"] and t.steps[0].passage_ids == ["g2"]
    assert float(R2AGReward()([t]).components["multi_hit"][0]) == 1.0
    # past L_MAX-I nothing re-enters the pool
    deep = Example(**{**pruned.__dict__, "contract": R2AGTree(depth=4, retrieved=["g1"])})
    (t,), _ = expand(env, tok, ["<think>x</think><base-Q>boats</base-Q>"], example=deep)
    assert env.next_contexts([t]) == []
    assert tree_state(EX) == R2AGTree(depth=0, retrieved=[], tree=[])


def test_inference_expands_until_stop_then_reads(tiny_policy, retriever):
    _, tok = tiny_policy
    env = RetrievalTreeEnvironment(retriever, val_top_k=1, max_iterations=5)
    other = Example(
        id="q2", question="What does Vell Works make?", answers=["boats"], gold_ids=["n2"]
    )
    calls = [
        [
            "<think>a</think><base-Q>who founded Orbel Mills</base-Q>",
            "<think>b</think><base-Q>Vell Works make</base-Q>",
        ],
        [
            "<think>c</think><base-Q>Mira Tolvan born</base-Q>",
            "<think>d</think><base-Q>stop retrieval</base-Q>",
        ],
        ["<think>e</think><base-Q>stop retrieval</base-Q>"],
        ["<answer>Kessa</answer>", "<answer>ships</answer>"],  # the reader
    ]
    engine = ScriptedPolicy(tok, calls)
    trajectories = env.validation_rollout(
        [EX, other], engine, SamplingParams(max_new_tokens=512, temperature=0)
    )
    trees = [t.contract.inference for t in trajectories]
    assert [tree.ranked for tree in trees] == [["g1", "g2"], ["n2"]]
    assert [tree.iterations for tree in trees] == [3, 2]
    # the second expansion reads the first's document
    assert "[1] Orbel Mills" in engine.prompts[1][0]
    assert [env.extract_answer(t) for t in trajectories] == ["Kessa", "ships"]
    m = env.metrics(trajectories)
    assert float(m["recall"]) == 1.0 and float(m["full_recall"]) == 1.0
    assert float(m["avg_k"]) == 1.5 and float(m["map"]) == 1.0
    assert float(m["retrieval_s_per_query"]) > 0 and float(m["generation_s_per_query"]) > 0


def test_select_branches_keeps_the_first_t_of_each_kind():
    e = Expansion(base=["b1", "b2", "b3"], predicted=["p1", "p2"])
    assert select_branches(e, None) == (["b1", "b2", "b3"], ["p1", "p2"])  # no selection
    assert select_branches(e, 1) == (["b1"], ["p1"])
    assert select_branches(e, 2) == (["b1", "b2"], ["p1", "p2"])
    assert select_branches(e, 4) == (["b1", "b2", "b3"], ["p1", "p2"])  # t > x keeps all x
    assert select_branches(e, 2, predicted=False) == (["b1", "b2"], [])  # R2AG_base
    assert select_branches(Expansion(), 2) == ([], [])


# Root output with x = 3 base and 2 predicted branches; BM25 top-1 of each query, in the order
# written: b1 "who founded Orbel Mills" -> g1, b2 "boats Ardun" -> n2, b3 "Kessa harbour town"
# -> n1; p1 "Mira Tolvan born" -> g2, p2 "Vell Works boats" -> n2 (already retrieved by b2).
WIDE = (
    "<think>a</think><base-Q>who founded Orbel Mills</base-Q><base-Q>boats Ardun</base-Q>"
    "<base-Q>Kessa harbour town</base-Q><predicted-Q>Mira Tolvan born</predicted-Q>"
    "<predicted-Q>Vell Works boats</predicted-Q>"
)


@pytest.mark.parametrize(
    ("top_t", "predicted", "ranked", "dropped", "ap"),
    [
        # every branch: g1 n2 n1 g2 (p2's n2 is a repeat), K = 4; AP = (1/1 + 2/4) / 2 = 0.75
        (None, True, ["g1", "n2", "n1", "g2"], 0, 0.75),
        # t = 1: b1, p1 -> g1 g2, K = 2; AP = (1/1 + 2/2) / 2 = 1.0; b2 b3 p2 dropped
        (1, True, ["g1", "g2"], 3, 1.0),
        # t = 2: b1 b2, p1 p2 -> g1 n2 g2 (n2 once), K = 3; AP = (1/1 + 2/3) / 2 = 5/6; b3 dropped
        (2, True, ["g1", "n2", "g2"], 1, 5 / 6),
        # t = 2, R2AG_base: b1 b2 -> g1 n2, K = 2; AP = (1/1) / 2 = 0.5; b3 p1 p2 dropped
        (2, False, ["g1", "n2"], 3, 0.5),
    ],
)
def test_inference_top_t_selection_and_base_variant(
    tiny_policy, retriever, top_t, predicted, ranked, dropped, ap
):
    _, tok = tiny_policy
    env = RetrievalTreeEnvironment(
        retriever, val_top_t=top_t, val_predicted_queries=predicted, reader_prompt=""
    )
    engine = ScriptedPolicy(tok, [[WIDE], ["<think>b</think><base-Q>stop retrieval</base-Q>"]])
    (t,) = env.validation_rollout([EX], engine, SamplingParams(max_new_tokens=512, temperature=0))
    assert t.contract.inference.ranked == ranked and t.contract.inference.iterations == 2
    # the second expansion reads only the documents of the kept branches
    second = engine.prompts[1][0]
    assert all(f"[{j + 1}] {CORPUS_BY_ID[pid].title}:" in second for j, pid in enumerate(ranked))
    assert ("Kessa is a harbour town" in second) == ("n1" in ranked)
    m = env.metrics([t])
    assert float(m["avg_k"]) == len(ranked) and float(m["map"]) == pytest.approx(ap)
    assert float(m["dropped_branches"]) == dropped
    assert float(m["recall"]) == len({"g1", "g2"} & set(ranked)) / 2


def test_registered_and_bad_settings(retriever):
    assert registry.resolve("environment", "retrieval_tree") is RetrievalTreeEnvironment
    assert registry.resolve("reward", "r2ag") is R2AGReward
    with pytest.raises(ValueError, match="max_iterations must be >= 1"):
        RetrievalTreeEnvironment(retriever, max_iterations=0)
    with pytest.raises(ValueError, match="val_top_t must be >= 1 or null"):
        RetrievalTreeEnvironment(retriever, val_top_t=0)
    with pytest.raises(ValueError, match="user_template must contain"):
        RetrievalTreeEnvironment(retriever, user_template="{question}")


#: A chat template that thinks by default, as Qwen3's does: ``enable_thinking=False`` writes an
#: empty think block after the assistant header, anything else lets the model think.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


class ThinkingModel(ScriptedPolicy):
    """Behaves like a model whose template thinks by default: the steering step stops at once;
    the reader thinks for ~300 tokens before its answer unless the prompt closed an empty
    think block."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, [])

    def generate(self, prompts, params):
        texts = []
        for ids in prompts:
            prompt = self.tokenizer.decode(ids)
            if "Answer the question using the documents" not in prompt:
                texts.append("<think>a</think><base-Q>stop retrieval</base-Q>")
            elif prompt.endswith("</think>\n\n"):
                texts.append("<answer>Kessa</answer>")
            else:
                texts.append(
                    "<think>"
                    + "let me read the documents again " * 50
                    + "</think><answer>Kessa</answer>"
                )
        self.calls = [texts]
        return super().generate(prompts, params)


def test_reader_still_answers_under_a_thinking_template(tiny_policy, retriever):
    """A 32-token greedy reader under a template that thinks by default spends
    its budget thinking (no answer); C.2's reader (temperature 0.6, top-p 0.9, 4096 tokens, the
    paper recipe's) finishes thinking and answers; so does a short reader with thinking off."""
    _, tok = tiny_policy
    tok.chat_template = THINKING_TEMPLATE
    params = SamplingParams(max_new_tokens=64, temperature=0.0)

    def read(**settings) -> tuple[str, object]:
        env = RetrievalTreeEnvironment(retriever, **settings)
        engine = ThinkingModel(tok)
        (t,) = env.validation_rollout([EX], engine, params)
        return env.extract_answer(t), engine.log[-1][1]

    answer, _ = read(reader_max_new_tokens=32)
    assert "Kessa" not in answer  # cut inside the thinking
    answer, reader = read(reader_max_new_tokens=4096, reader_temperature=0.6, reader_top_p=0.9)
    assert answer == "Kessa"
    assert (reader.temperature, reader.top_p, reader.max_new_tokens) == (0.6, 0.9, 4096)
    answer, _ = read(reader_max_new_tokens=32, chat_template_kwargs={"enable_thinking": False})
    assert answer == "Kessa"
    with pytest.raises(ValueError, match="reader_top_p in"):
        RetrievalTreeEnvironment(retriever, reader_top_p=0.0)
