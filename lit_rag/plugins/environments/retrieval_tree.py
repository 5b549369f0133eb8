"""Retrieval-tree steering (R2AG, r2ag.md Sections 2.2-2.4, Algorithm 1, Appendix B).

A reasoning-augmented retrieval tree (RRT, Definition 2.1) is rooted at the question. At each
expansion the steering model reads the question and the evidence kept so far and writes

    <think> ... </think>
    <base-Q> single-hop query </base-Q>            (or "stop retrieval")
    <predicted-Q> anticipated next-hop query </predicted-Q>   (or "none")

(Appendix B.2 output format, G.1 prompt). Every query retrieves its top-``k`` documents
(``k = 1`` in training, Section 2.2 "Hit@top-1"); each query-retrieval pair is a new vertex.

Training (:meth:`RetrievalTreeEnvironment.rollout`) runs one expansion per sample: the
context is the example (the root, no evidence) or a pruned tree from an earlier iteration
(``example.meta["r2ag"]``). :meth:`next_contexts` implements the progressive iterative
training of Algorithm 1 (the RR-Forest): a sample whose tree is not complete (all gold
retrieved *and* "stop retrieval" issued) is pruned bottom-up to the branches that hit gold,
and the pruned tree, with the gold documents found so far as its evidence, is a new context
for the next iteration (``data.forest: true`` with the ``ProgressiveForest`` callback).

Validation (:meth:`validation_rollout`) is inference: each question's tree is expanded until
"stop retrieval" or ``max_iterations`` expansions, then a reader answers from the retrieved
documents; the trajectories carry the ranked retrieved ids (Recall, Full-Recall, K, mAP:
Table 1) and the seconds spent retrieving and generating (Table 4). At each expansion only the
top-``t`` of the ``x`` branches the model wrote are retrieved and kept (Section 2.2, Remark 2.3:
the "top-t/x constraint" keeps the top-t candidates "for further expansion"; Appendix C.2
evaluates ``t = M`` and ``t = M/2``, ``M`` the dataset's maximum hops; Table 1's rows are
Table A.6's ``t = M/2`` ones): ``val_top_t``. The order the model wrote its queries in is
the ranking (the reward's AP trains it to put accurate branches first). ``val_predicted_queries:
false`` is R2AG_base (Table 1, Section 3.2, D.2): only base queries retrieve.

Where the paper is silent, what we do:

- The user part of the prompt: ``Question: ...`` then the evidences numbered from 1 (the G.1
  prompt says the model is "provided with a user question and evidences").
- Queries are read after the last ``</think>`` (text inside the reasoning is thinking, not
  action); without a ``<think>`` block the whole output is read (the reward is 0 then).
- At most ``max_queries`` base and ``max_queries`` predicted queries per expansion.
- Pruned contexts are deduplicated per question by their set of gold documents (two samples
  that found the same gold give the same context).
- Inference's ``t`` applies to base and to predicted queries each (C.2 gives one ``t``; the
  reward's AP has one per kind, B.2). ``t`` depends on the dataset, so ``val_top_t`` has no
  paper default: None keeps every branch (no selection), ``recipes/r2ag.yaml`` sets ``t = M/2``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from lit_rag.api import (
    Example,
    Passage,
    RetrievalEnvironment,
    Retriever,
    RolloutEngine,
    SamplingParams,
    Step,
    Trajectory,
    encode_prompts,
    extract_tag,
    normalize_answer,
    tag_blocks,
)

#: R2AG Appendix G.1 (verbatim).
R2AG_PROMPT = (
    "#Decomposition#\n"
    "Task: You will be provided with a user question and evidences that may help to answer the "
    "question. Decompose the complex user question into single-hop retrievable sub-questions "
    "following these rules:\n"
    "Steps:\n"
    "1. Base Questions (<base-Q>):\n"
    "- Decompose the current-hop question directly from user question, taking the evidences for "
    'reference (if the user question is "A → B → C", and evidences cover "A", then decompose '
    'into "B". Note do not repeat questions already answered by the provided evidences).\n'
    "- Each must target a single fact (WHO/WHEN/WHERE/etc.)\n"
    '- If evidences already answer the user question, respond with "stop retrieval" as the base '
    "question.\n\n"
    "2. Predicted Questions (<predicted-Q>):\n"
    "- Forecast next-hop questions based on the base questions only if you have knowledge to any "
    "base questions\n"
    "- If you have no knowledge to predict further questions, or evidences already answers the "
    'user question, respond with "none" as the predicted question.\n\n'
    "Keep your thinking process useful and brief.\n\n"
    "Wrap reasoning process inside: <think></think>.\n"
    'Wrap each of the base questions (or "stop retrieval") inside: <base-Q></base-Q>.\n'
    'Wrap each of the predicted question (or "none") inside: <predicted-Q></predicted-Q>'
)

USER_TEMPLATE = "Question: {question}\nEvidences:\n{evidences}"
EVIDENCE_TEMPLATE = "[{index}] {title}: {text}"
NO_EVIDENCE = "none"

#: The reader of validation (QA after retrieval): question and retrieved documents in, answer out.
READER_PROMPT = (
    "Answer the question using the documents. Reply with the answer only, inside <answer> and "
    "</answer>.\n\nDocuments:\n{documents}\n\nQuestion: {question}"
)

STOP = "stop retrieval"
NONE = "none"


@dataclass
class Expansion:
    """What one output of the steering model asks for (parsed, never raises)."""

    think: bool = False
    base: list[str] = field(default_factory=list)
    predicted: list[str] = field(default_factory=list)
    stop: bool = False
    segments: int = 0  # <base-Q> / <predicted-Q> blocks after a <think> block


def parse_expansion(text: str, max_queries: int = 8) -> Expansion:
    """Read ``<think>``, ``<base-Q>`` and ``<predicted-Q>`` from a steering output.

    Example:
        >>> e = parse_expansion("<think>A then B</think><base-Q>who founded A?</base-Q>"
        ...                     "<predicted-Q>none</predicted-Q>")
        >>> e.think, e.base, e.predicted, e.stop, e.segments
        (True, ['who founded A?'], [], False, 2)
    """
    out = Expansion()
    think_end = text.rfind("</think>")
    out.think = think_end >= 0 and extract_tag(text, "think") is not None
    tail = text[think_end + len("</think>") :] if out.think else text
    for block in tag_blocks(tail, "base-Q"):
        if normalize_answer(block) == STOP:
            out.stop = True
        elif block and len(out.base) < max_queries:
            out.base.append(block)
    for block in tag_blocks(tail, "predicted-Q"):
        if normalize_answer(block) != NONE and block and len(out.predicted) < max_queries:
            out.predicted.append(block)
    if out.think:
        out.segments = len(tag_blocks(tail, "base-Q")) + len(tag_blocks(tail, "predicted-Q"))
    return out


def select_branches(
    expansion: Expansion, top_t: int | None, predicted: bool = True
) -> tuple[list[str], list[str]]:
    """Inference's top-t/x selection (Remark 2.3, Appendix C.2): the first ``top_t`` base and the
    first ``top_t`` predicted queries, in the order written (None: all); no predicted queries when
    ``predicted`` is False (R2AG_base).

    Example:
        >>> e = Expansion(base=["b1", "b2", "b3"], predicted=["p1", "p2"])
        >>> select_branches(e, 2), select_branches(e, 2, predicted=False), select_branches(e, None)
        ((['b1', 'b2'], ['p1', 'p2']), (['b1', 'b2'], []), (['b1', 'b2', 'b3'], ['p1', 'p2']))
    """
    base = expansion.base if top_t is None else expansion.base[:top_t]
    kept = expansion.predicted if top_t is None else expansion.predicted[:top_t]
    return list(base), (list(kept) if predicted else [])


def tree_state(example: Example) -> dict:
    """The RRT context of an example: ``depth``, ``retrieved`` ids and ``tree`` vertices.

    A plain example is a root: depth 0, nothing retrieved, no evidence.
    """
    state = example.meta.get("r2ag")
    if state is None:
        return {"depth": 0, "retrieved": [], "tree": []}
    return state


class RetrievalTreeEnvironment(RetrievalEnvironment):
    """R2AG's retrieval-steering environment (training expansions and inference trees).

    Args:
        retriever: The search engine (any registered retriever with its index).
        top_k: Documents per query in training (the paper: 1).
        val_top_k: Documents per query in inference (the paper evaluates 1 and 2).
        val_top_t: Inference's top-t/x: base (and predicted) branches kept per expansion, the
            first ``t`` written (C.2: ``t = M`` or ``M/2``, ``M`` the dataset's maximum hops);
            None keeps every branch.
        val_predicted_queries: Retrieve with predicted queries in inference; False is the
            R2AG_base variant (base queries only, Table 1).
        max_iterations: L_MAX-I, expansions per tree (the paper: 5).
        max_queries: Most base (and most predicted) queries read from one output.
        prompt: The instruction (Appendix G.1), sent as the system message.
        user_template: The user message with ``{question}`` and ``{evidences}``.
        evidence_template: One evidence, with ``{index}``, ``{title}``, ``{text}``.
        use_chat_template: Send system + user through the chat template; False writes raw text.
        reader_prompt: Validation's QA prompt, with ``{documents}`` and ``{question}``;
            empty skips QA (retrieval metrics only).
        reader_max_new_tokens: Token budget of the reader's answer.
        assistant_prefix: Text that starts every steering output (part of the prompt; parsed
            as the start of the output). Off by default; small models need ``"<think>"``.
        example: A worked input and output appended to the instruction after "Example:". Off
            by default (the paper's prompt has none); small models need one.
    """

    grows_forest = True  # next_contexts: Algorithm 1's RR-Forest

    def __init__(
        self,
        retriever: Retriever,
        top_k: int = 1,
        val_top_k: int = 1,
        val_top_t: int | None = None,
        val_predicted_queries: bool = True,
        max_iterations: int = 5,
        max_queries: int = 8,
        prompt: str = R2AG_PROMPT,
        user_template: str = USER_TEMPLATE,
        evidence_template: str = EVIDENCE_TEMPLATE,
        use_chat_template: bool = True,
        reader_prompt: str = READER_PROMPT,
        reader_max_new_tokens: int = 32,
        assistant_prefix: str = "",
        example: str = "",
    ) -> None:
        for name, value in (
            ("top_k", top_k),
            ("val_top_k", val_top_k),
            ("max_iterations", max_iterations),
            ("max_queries", max_queries),
        ):
            if value < 1:
                raise ValueError(f"environment {name} must be >= 1, got {value}")
        if val_top_t is not None and val_top_t < 1:
            raise ValueError(
                f"environment val_top_t must be >= 1 or null (keep every branch), got {val_top_t}"
            )
        missing = [f for f in ("{question}", "{evidences}") if f not in user_template]
        if missing:
            raise ValueError(
                f"environment user_template must contain {', '.join(missing)}: {user_template!r}"
            )
        if reader_prompt and not all(f in reader_prompt for f in ("{documents}", "{question}")):
            raise ValueError(
                f"environment reader_prompt must contain {{documents}} and {{question}}: {reader_prompt!r}"
            )
        self.retriever = retriever
        self.top_k, self.val_top_k = top_k, val_top_k
        self.val_top_t, self.val_predicted_queries = val_top_t, val_predicted_queries
        self.max_iterations, self.max_queries = max_iterations, max_queries
        self.prompt, self.user_template, self.evidence_template = (
            prompt,
            user_template,
            evidence_template,
        )
        self.use_chat_template = use_chat_template
        self.reader_prompt, self.reader_max_new_tokens = reader_prompt, reader_max_new_tokens
        self.assistant_prefix = assistant_prefix
        self.example = example

    # ---- prompts ---------------------------------------------------------------------------
    def format_evidence(self, passages: list[Passage]) -> str:
        if not passages:
            return NO_EVIDENCE
        return "\n".join(
            self.evidence_template.format(index=i + 1, title=p.title, text=p.text)
            for i, p in enumerate(passages)
        )

    def build_prompt(
        self, example: Example, tokenizer, evidence: list[Passage] | None = None
    ) -> str:
        """G.1 prompt with the question and the evidence (the example's references by default)."""
        passages = example.references if evidence is None else evidence
        if tree_state(example)["depth"] == 0 and evidence is None:
            passages = []  # a root has no evidence (dataset references are not retrieval)
        user = self.user_template.format(
            question=example.question, evidences=self.format_evidence(passages)
        )
        system = f"{self.prompt}\n\nExample:\n{self.example}" if self.example else self.prompt
        return self.chat(tokenizer, system, user) + self.assistant_prefix

    # ---- training: one expansion per sample ------------------------------------------------
    def rollout(
        self,
        examples: list[Example],
        engine: RolloutEngine,
        group_size: int,
        params: SamplingParams,
    ) -> list[Trajectory]:
        prompts = self.prompts(examples, engine.tokenizer, group_size)
        generations = engine.generate(prompts.repeated, params)
        parsed = [
            parse_expansion(self.assistant_prefix + g.text, self.max_queries) for g in generations
        ]
        hits = self._search([p.base + p.predicted for p in parsed], self.top_k)
        trajectories = []
        for group, gen, exp, found in zip(prompts.groups, generations, parsed, hits):
            example = examples[group]
            state = tree_state(example)
            steps = [
                Step(action=kind, query=q, passage_ids=[h.passage.id for h in hs])
                for kind, q, hs in zip(
                    ["base"] * len(exp.base) + ["predicted"] * len(exp.predicted),
                    exp.base + exp.predicted,
                    found,
                )
            ]
            if exp.stop:
                steps.append(Step(action="stop"))
            passages = {h.passage.id: h.passage for hs in found for h in hs}
            trajectories.append(
                self.trajectory(
                    example,
                    group,
                    prompts.ids[group],
                    gen.token_ids,
                    gen.logprobs,
                    self.assistant_prefix + gen.text,
                    steps=steps,
                    truncated=not gen.finished,
                    prompt_text=prompts.texts[group],
                    meta={
                        "depth": state["depth"],
                        "prior": list(state["retrieved"]),
                        "think": exp.think,
                        "stop": exp.stop,
                        "segments": exp.segments,
                        "passages": passages,
                    },
                )
            )
        return trajectories

    def _search(self, queries_per_row: list[list[str]], k: int) -> list[list[list]]:
        """One batched retriever call for every query of every row; hits regrouped by row."""
        flat = [q for qs in queries_per_row for q in qs]
        results = self.retriever.search(flat, k) if flat else []
        out, pos = [], 0
        for qs in queries_per_row:
            out.append(results[pos : pos + len(qs)])
            pos += len(qs)
        return out

    # ---- the RR-Forest (Algorithm 1): pruned trees re-enter the pool -----------------------
    def next_contexts(self, trajectories: list[Trajectory]) -> list[Example]:
        """Pruned trees of this step's samples that are not finished, one per distinct set of
        gold documents found per question, for the next iteration (empty past L_MAX-I)."""
        out: dict[tuple[str, frozenset], Example] = {}
        for t in trajectories:
            depth = int(t.meta.get("depth", 0)) + 1
            gold = set(t.example.gold_ids)
            prior = list(t.meta.get("prior", []))
            retrieved = prior + [pid for s in t.steps for pid in s.passage_ids if pid not in prior]
            found = [pid for pid in dict.fromkeys(retrieved) if pid in gold]
            complete = gold <= set(retrieved) and bool(t.meta.get("stop"))
            if complete or depth >= self.max_iterations or not gold:
                continue
            key = (t.example.id, frozenset(found))
            if key in out:
                continue
            state = tree_state(t.example)
            passages = dict(t.meta.get("passages", {}))
            passages.update({p.id: p for p in t.example.references})
            # bottom-up pruning: keep only vertices whose retrieval brought gold
            tree = list(state["tree"]) + [
                {
                    "query": s.query,
                    "kind": s.action,
                    "passage_ids": [p for p in s.passage_ids if p in gold],
                    "depth": depth,
                }
                for s in t.steps
                if s.action in ("base", "predicted") and any(p in gold for p in s.passage_ids)
            ]
            out[key] = Example(
                id=t.example.id,
                question=t.example.question,
                answers=list(t.example.answers),
                references=[passages[pid] for pid in found if pid in passages],
                gold_ids=list(t.example.gold_ids),
                meta={
                    **{k: v for k, v in t.example.meta.items() if k != "r2ag"},
                    "r2ag": {"depth": depth, "retrieved": found, "tree": tree},
                },
            )
        return list(out.values())

    # ---- inference: whole trees, then the reader -------------------------------------------
    def validation_rollout(
        self, examples: list[Example], engine: RolloutEngine, params: SamplingParams
    ) -> list[Trajectory]:
        """Expand each question's tree to the end (top-t/x branches per expansion), then answer
        from what it retrieved."""
        tok = engine.tokenizer
        n = len(examples)
        evidence: list[dict[str, Passage]] = [{} for _ in range(n)]  # insertion order = rank
        steps: list[list[Step]] = [[] for _ in range(n)]
        iterations, dropped = [0] * n, [0] * n
        live = list(range(n))
        retrieval_s = 0.0
        texts = [""] * n
        for _ in range(self.max_iterations):
            if not live:
                break
            started = time.perf_counter()
            prompts = encode_prompts(
                tok, [self.build_prompt(examples[i], tok, list(evidence[i].values())) for i in live]
            )
            generations = engine.generate(prompts, params)
            parsed = [
                parse_expansion(self.assistant_prefix + g.text, self.max_queries)
                for g in generations
            ]
            kept = [select_branches(p, self.val_top_t, self.val_predicted_queries) for p in parsed]
            hits = self._search([b + p for b, p in kept], self.val_top_k)
            still = []
            for i, gen, exp, (base, predicted), found in zip(live, generations, parsed, kept, hits):
                iterations[i] += 1
                dropped[i] += len(exp.base) + len(exp.predicted) - len(base) - len(predicted)
                texts[i] += self.assistant_prefix + gen.text + "\n"
                for kind, q, hs in zip(
                    ["base"] * len(base) + ["predicted"] * len(predicted), base + predicted, found
                ):
                    steps[i].append(
                        Step(action=kind, query=q, passage_ids=[h.passage.id for h in hs])
                    )
                    for h in hs:
                        evidence[i].setdefault(h.passage.id, h.passage)
                if exp.stop:
                    steps[i].append(Step(action="stop"))
                elif base or predicted:
                    still.append(i)
            live = still
            retrieval_s += time.perf_counter() - started
        started = time.perf_counter()
        answers = self._read(examples, [list(e.values()) for e in evidence], engine)
        generation_s = time.perf_counter() - started
        out = []
        for i, ex in enumerate(examples):
            ids, lp, text, finished = answers[i]
            out.append(
                self.trajectory(
                    ex,
                    i,
                    [],  # the trees' prompts are many; the reader's answer is the completion
                    ids,
                    lp,
                    text,
                    steps=steps[i],
                    truncated=not finished,
                    prompt_text=texts[i],
                    meta={
                        "depth": 0,
                        "prior": [],
                        "ranked": list(evidence[i]),
                        "iterations": iterations[i],
                        "dropped_branches": dropped[i],
                        "retrieval_s": retrieval_s / n,
                        "generation_s": generation_s / n,
                        "stop": any(s.action == "stop" for s in steps[i]),
                        "think": True,
                        "segments": 0,
                    },
                )
            )
        return out

    def _read(self, examples: list[Example], documents: list[list[Passage]], engine: RolloutEngine):
        empty = (torch.zeros(0, dtype=torch.long), torch.zeros(0), "", True)
        if not self.reader_prompt:
            return [empty] * len(examples)
        tok = engine.tokenizer
        texts = []
        for ex, docs in zip(examples, documents):
            listing = (
                "\n".join(f"[{j + 1}] {p.title}: {p.text}" for j, p in enumerate(docs))
                or NO_EVIDENCE
            )
            user = self.reader_prompt.format(documents=listing, question=ex.question)
            texts.append(self.chat(tok, "", user))
        prompts = encode_prompts(tok, texts)
        params = SamplingParams(
            max_new_tokens=self.reader_max_new_tokens, temperature=0.0, stop=["</answer>"]
        )
        return [
            (g.token_ids, g.logprobs, g.text, g.finished) for g in engine.generate(prompts, params)
        ]

    def extract_answer(self, trajectory: Trajectory) -> str:
        answer = extract_tag(trajectory.text, "answer")
        return answer if answer is not None else trajectory.text.strip()

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, torch.Tensor]:
        """Training: queries, stop rate, format. Inference: Recall, Full-Recall, K (``avg_k``),
        mAP, iterations and seconds per query (Tables 1 and 4), and the branches the top-t/x
        selection dropped per query."""
        from lit_rag.api import average_precision

        if not trajectories:
            return {}

        def mean(values) -> torch.Tensor:
            return torch.tensor([float(v) for v in values]).mean()

        if "ranked" in trajectories[0].meta:
            rows = [(t.meta["ranked"], t.example.gold_ids) for t in trajectories]
            return {
                "recall": mean(len(set(r) & set(g)) / len(g) if g else 0.0 for r, g in rows),
                "full_recall": mean(bool(g) and set(g) <= set(r) for r, g in rows),
                "avg_k": mean(len(r) for r, _ in rows),
                "map": mean(average_precision(r, g) for r, g in rows),
                "iterations": mean(t.meta["iterations"] for t in trajectories),
                "dropped_branches": mean(t.meta.get("dropped_branches", 0) for t in trajectories),
                "retrieval_s_per_query": mean(t.meta["retrieval_s"] for t in trajectories),
                "generation_s_per_query": mean(t.meta["generation_s"] for t in trajectories),
            }
        return {
            "base_queries": mean(sum(s.action == "base" for s in t.steps) for t in trajectories),
            "predicted_queries": mean(
                sum(s.action == "predicted" for s in t.steps) for t in trajectories
            ),
            "stop_rate": mean(bool(t.meta.get("stop")) for t in trajectories),
            "think_rate": mean(bool(t.meta.get("think")) for t in trajectories),
            "depth": mean(t.meta.get("depth", 0) for t in trajectories),
        }
