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
(``example.contract``, an :class:`R2AGTree`). :meth:`next_contexts` implements the progressive
iterative training of Algorithm 1 (the RR-Forest): a sample whose tree is not complete (all gold
retrieved *and* "stop retrieval" issued) is pruned bottom-up to the branches that hit gold,
and the pruned tree, with the gold documents found so far as its evidence, is a new context
for the next iteration (``data.forest: true`` with the ``ProgressiveForest`` callback).

Validation (:meth:`validation_rollout`) is inference: each question's tree is expanded until
"stop retrieval" or ``max_iterations`` expansions, then a reader answers from the retrieved
documents; the trajectories carry the ranked retrieved ids (Recall, Full-Recall, K, mAP:
Table 1) and the seconds spent retrieving and generating (Table 4). Every trajectory hands the
reward an :class:`R2AGEpisode` (``retrieval_tree_contracts.py``). At each expansion only the
top-``t`` of the ``x`` branches the model wrote are retrieved and kept (Section 2.2, Remark 2.3:
the "top-t/x constraint" keeps the top-t candidates "for further expansion"; Appendix C.2
evaluates ``t = M`` and ``t = M/2``, ``M`` the dataset's maximum hops; Table 1's rows are
Table A.6's ``t = M/2`` ones): ``val_top_t``. The order the model wrote its queries in is
the ranking (the reward's AP trains it to put accurate branches first). ``val_predicted_queries:
false`` is R2AG_base (Table 1, Section 3.2, D.2): only base queries retrieve.

Both rollouts run through the episode loop (``lit_rag/contracts/episodes.py``): in inference
each tree expands again as soon as its last expansion's documents are back; the reader starts once
every
tree is done, so Table 4's two times (retrieval, generation) stay apart.

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
    ContextLimit,
    Episode,
    EpisodeLoop,
    Example,
    Generate,
    Generation,
    Passage,
    Piece,
    R2AGEpisode,
    R2AGInference,
    R2AGTree,
    Request,
    RetrievalEnvironment,
    Retriever,
    RolloutEngine,
    SamplingParams,
    Search,
    Step,
    Trajectory,
    TreeVertex,
    check_context_overflow,
    encode_prompts,
    extract_tag,
    fit_passages,
    normalize_answer,
    start_episodes,
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


def tree_state(example: Example) -> R2AGTree:
    """The RRT context of an example: its :class:`R2AGTree`; a plain example is the root (depth
    0, nothing retrieved, no evidence)."""
    return R2AGTree.find(example, "environment retrieval_tree") or R2AGTree()


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
        chat_template_kwargs: Keyword arguments of the chat template, e.g.
            ``{"enable_thinking": false}`` (Qwen3 thinks by default).
        context_overflow: A prompt that, with the token budget, does not fit the engine's
            context window: ``drop`` the last (lowest-ranked) references until it fits,
            ``cut`` (drop, then cut the next reference to the room left) or ``error``; a
            question too long alone is always an error naming the example.
        reader_prompt: Validation's QA prompt, with ``{documents}`` and ``{question}``;
            empty skips QA (retrieval metrics only).
        reader_max_new_tokens: Token budget of the reader's answer (thinking included: a
            reader whose chat template thinks needs room to finish thinking, C.2's 4096).
        reader_temperature: The reader's sampling temperature (0: greedy). The paper's
            inference samples at 0.6 (C.2).
        reader_top_p: The reader's nucleus (C.2: 0.9).
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
        chat_template_kwargs: dict | None = None,
        reader_temperature: float = 0.0,
        reader_top_p: float = 1.0,
        context_overflow: str = "drop",
    ) -> None:
        self.retriever = retriever
        self.top_k, self.val_top_k = top_k, val_top_k
        self.val_top_t, self.val_predicted_queries = val_top_t, val_predicted_queries
        self.max_iterations, self.max_queries = max_iterations, max_queries
        self.prompt, self.user_template = prompt, user_template
        self.evidence_template, self.use_chat_template = evidence_template, use_chat_template
        self.reader_prompt, self.reader_max_new_tokens = reader_prompt, reader_max_new_tokens
        self.reader_temperature, self.reader_top_p = reader_temperature, reader_top_p
        self.chat_template_kwargs = chat_template_kwargs
        self.assistant_prefix = assistant_prefix
        self.example = example
        self._check_settings()
        self.context_overflow = check_context_overflow(context_overflow)

    def _check_settings(self) -> None:
        """Counts, the reader's sampling and the templates' fields (one error naming the key)."""
        for name, value in (
            ("top_k", self.top_k),
            ("val_top_k", self.val_top_k),
            ("max_iterations", self.max_iterations),
            ("max_queries", self.max_queries),
        ):
            if value < 1:
                raise ValueError(f"environment {name} must be >= 1, got {value}")
        tokens, temperature, top_p = (
            self.reader_max_new_tokens,
            self.reader_temperature,
            self.reader_top_p,
        )
        if tokens < 1 or temperature < 0 or not 0 < top_p <= 1:
            raise ValueError(
                "environment reader_max_new_tokens must be >= 1, reader_temperature >= 0 and "
                f"reader_top_p in (0, 1]; got {tokens}, {temperature}, {top_p}"
            )
        if self.val_top_t is not None and self.val_top_t < 1:
            raise ValueError(
                "environment val_top_t must be >= 1 or null (keep every branch), "
                f"got {self.val_top_t}"
            )
        missing = [f for f in ("{question}", "{evidences}") if f not in self.user_template]
        if missing:
            raise ValueError(
                f"environment user_template must contain {', '.join(missing)}: "
                f"{self.user_template!r}"
            )
        reader = self.reader_prompt
        if reader and not all(f in reader for f in ("{documents}", "{question}")):
            raise ValueError(
                f"environment reader_prompt must contain {{documents}} and {{question}}: {reader!r}"
            )

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
        if tree_state(example).depth == 0 and evidence is None:
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
        """One expansion per sample: generate, then retrieve the top-``top_k`` of every query."""
        prompts = self.prompts(
            examples, engine.tokenizer, group_size, ContextLimit.of(engine, params)
        )
        loop = EpisodeLoop(engine, params, self.retriever)
        handlers = {
            "start": lambda loop, e, _: Generate(
                "expanded", e.prompt_ids, loop.params, e.prompt_text
            ),
            "expanded": lambda loop, e, gen: Search("retrieved", self._queries(e, gen), self.top_k),
            "retrieved": self._expanded,
        }
        episodes = loop.run(start_episodes(examples, prompts), handlers)  # [B*G]
        return [self._expansion_trajectory(e) for e in episodes]

    def _parse(self, gen: Generation) -> Expansion:
        return parse_expansion(self.assistant_prefix + gen.text, self.max_queries)

    def _queries(self, e: Episode, gen: Generation) -> list[str]:
        exp = self._parse(gen)
        return exp.base + exp.predicted

    def _expanded(self, loop: EpisodeLoop, e: Episode, hits: list[list]) -> Request:
        """Each query with its retrieved documents is a new vertex (a step); "stop retrieval"
        is a ``stop`` step."""
        exp = self._parse(e.turns[-1].generation)
        kinds = ["base"] * len(exp.base) + ["predicted"] * len(exp.predicted)
        for kind, q, hs in zip(kinds, exp.base + exp.predicted, hits, strict=True):
            e.steps.append(Step(action=kind, query=q, passage_ids=e.retrieved(hs)))
        if exp.stop:
            e.steps.append(Step(action="stop"))
        return None

    def _expansion_trajectory(self, e: Episode) -> Trajectory:
        gen = e.turns[-1].generation
        exp, state = self._parse(gen), tree_state(e.example)
        trajectory = self.trajectory(
            e.example,
            e.group,
            e.prompt_ids,
            gen.token_ids,
            gen.logprobs,
            self.assistant_prefix + gen.text,
            steps=e.steps,
            truncated=not gen.finished,
            prompt_text=e.prompt_text,
            versions=[gen.versions],
        )
        trajectory.contract = R2AGEpisode(
            depth=state.depth,
            prior=list(state.retrieved),
            think=exp.think,
            stop=exp.stop,
            segments=exp.segments,
            passages=dict(e.passages),
        )
        return trajectory

    # ---- the RR-Forest (Algorithm 1): pruned trees re-enter the pool -----------------------
    def next_contexts(self, trajectories: list[Trajectory]) -> list[Example]:
        """Pruned trees of this step's samples that are not finished, one per distinct set of
        gold documents found per question, for the next iteration (empty past L_MAX-I)."""
        out: dict[tuple[str, frozenset], Example] = {}
        for t in trajectories:
            episode = R2AGEpisode.of(t, "environment retrieval_tree (next_contexts)")
            depth = episode.depth + 1
            gold = set(t.example.gold_ids)
            prior = list(episode.prior)
            retrieved = prior + [pid for s in t.steps for pid in s.passage_ids if pid not in prior]
            found = [pid for pid in dict.fromkeys(retrieved) if pid in gold]
            complete = gold <= set(retrieved) and episode.stop
            if complete or depth >= self.max_iterations or not gold:
                continue
            key = (t.example.id, frozenset(found))
            if key in out:
                continue
            passages = dict(episode.passages)
            passages.update({p.id: p for p in t.example.references})
            # bottom-up pruning: keep only vertices whose retrieval brought gold
            tree = list(tree_state(t.example).tree) + [
                TreeVertex(s.query or "", s.action, [p for p in s.passage_ids if p in gold], depth)
                for s in t.steps
                if s.action in ("base", "predicted") and any(p in gold for p in s.passage_ids)
            ]
            out[key] = Example(
                id=t.example.id,
                question=t.example.question,
                answers=list(t.example.answers),
                references=[passages[pid] for pid in found if pid in passages],
                gold_ids=list(t.example.gold_ids),
                meta=dict(t.example.meta),
                contract=R2AGTree(depth=depth, retrieved=found, tree=tree),
            )
        return list(out.values())

    # ---- inference: whole trees, then the reader -------------------------------------------
    def validation_rollout(
        self, examples: list[Example], engine: RolloutEngine, params: SamplingParams
    ) -> list[Trajectory]:
        """Expand each question's tree to the end (top-t/x branches per expansion), then answer
        from what it retrieved.

        Each tree expands as soon as its last expansion's documents are back; the reader
        starts once every tree is done, so the two times of Table 4 stay apart.
        """
        loop = EpisodeLoop(engine, params, self.retriever)
        meta = {"iterations": 0, "dropped": 0}
        trees = [Episode(ex, i, [], meta=dict(meta)) for i, ex in enumerate(examples)]
        started = time.perf_counter()
        loop.run(trees, {"start": self._expand, "expanded": self._select, "retrieved": self._grown})
        retrieval_s = time.perf_counter() - started
        started = time.perf_counter()
        answers = self._read(trees, engine)
        generation_s = time.perf_counter() - started
        n = len(examples)
        out = []
        for e, (ids, lp, text, finished) in zip(trees, answers, strict=True):
            # the trees' prompts are many; the reader's answer is the completion
            trajectory = self.trajectory(
                e.example,
                e.group,
                [],
                ids,
                lp,
                text,
                steps=e.steps,
                truncated=not finished,
                prompt_text=e.text,
            )
            inference = R2AGInference(
                ranked=list(e.passages),
                iterations=e.meta["iterations"],
                dropped_branches=e.meta["dropped"],
                retrieval_s=retrieval_s / n,
                generation_s=generation_s / n,
            )
            stop = any(s.action == "stop" for s in e.steps)
            # a whole tree: the reward's format terms do not apply (think, no segments)
            trajectory.contract = R2AGEpisode(0, [], True, stop, 0, inference=inference)
            out.append(trajectory)
        return out

    def _expand(self, loop: EpisodeLoop, e: Episode, _: object = None) -> Request:
        """Ask for the next expansion from the evidence so far, up to L_MAX-I of them."""
        if e.meta["iterations"] >= self.max_iterations:
            return None
        prompt = self.build_prompt(e.example, loop.tokenizer, list(e.passages.values()))
        return Generate(
            "expanded", encode_prompts(loop.tokenizer, [prompt])[0], loop.params, prompt
        )

    def _branches(self, gen: Generation) -> tuple[Expansion, list[str], list[str]]:
        """The expansion and the base and predicted queries its top-t/x selection keeps."""
        exp = self._parse(gen)
        base, predicted = select_branches(exp, self.val_top_t, self.val_predicted_queries)
        return exp, base, predicted

    def _select(self, loop: EpisodeLoop, e: Episode, gen: Generation) -> Request:
        """An expansion came back: retrieve for the branches the top-t/x selection keeps."""
        exp, base, predicted = self._branches(gen)
        e.meta["iterations"] += 1
        e.meta["dropped"] += len(exp.base) + len(exp.predicted) - len(base) - len(predicted)
        e.pieces.append(Piece(self.assistant_prefix + gen.text + "\n"))
        return Search("retrieved", base + predicted, self.val_top_k)

    def _grown(self, loop: EpisodeLoop, e: Episode, hits: list[list]) -> Request:
        """The kept branches are new vertices, their documents the evidence (in rank order);
        the tree grows until "stop retrieval" or an expansion without queries."""
        exp, base, predicted = self._branches(e.turns[-1].generation)
        kinds = ["base"] * len(base) + ["predicted"] * len(predicted)
        for kind, q, hs in zip(kinds, base + predicted, hits, strict=True):
            e.steps.append(Step(action=kind, query=q, passage_ids=e.retrieved(hs)))
        if exp.stop:
            e.steps.append(Step(action="stop"))
            return None
        return self._expand(loop, e) if base or predicted else None

    def _read(self, trees: list[Episode], engine: RolloutEngine) -> list[tuple]:
        """The reader's answer of each tree from its retrieved documents (``reader_*``
        sampling, stopping at ``</answer>``): ``(ids, logprobs, text, finished)``."""
        empty = (torch.zeros(0, dtype=torch.long), torch.zeros(0), "", True)
        if not self.reader_prompt:
            return [empty] * len(trees)
        params = SamplingParams(
            max_new_tokens=self.reader_max_new_tokens,
            temperature=self.reader_temperature,
            top_p=self.reader_top_p,
            stop=["</answer>"],
        )
        loop = EpisodeLoop(engine, params)
        readers = [Episode(e.example, e.group, [], passages=e.passages) for e in trees]
        loop.run(readers, {"start": self._ask_reader, "answered": lambda loop, e, gen: None})
        return [
            (g.token_ids, g.logprobs, g.text, g.finished)
            for g in (e.turns[-1].generation for e in readers)
        ]

    def _ask_reader(self, loop: EpisodeLoop, e: Episode, _: object = None) -> Request:
        """The reader's prompt over the tree's documents in the order retrieved; the last ones
        are left out (``context_overflow``) when they would not fit the engine's context window
        with the reader's budget."""
        documents = list(e.passages.values())
        if loop.window is not None and self.context_overflow != "error":
            room = loop.window - loop.params.max_new_tokens
            fitted = fit_passages(
                documents,
                lambda kept: self._reader_prompt(e, kept, loop)[1],
                room,
                self.context_overflow,
            )
            if fitted is not None:  # else the loop stops with the example's lengths
                e.meta["documents_dropped"] = len(documents) - len(fitted)
                documents = fitted
        prompt, ids = self._reader_prompt(e, documents, loop)
        return Generate("answered", ids, loop.params, prompt)

    def _reader_prompt(
        self, e: Episode, documents: list[Passage], loop: EpisodeLoop
    ) -> tuple[str, list[int]]:
        listing = (
            "\n".join(f"[{j + 1}] {p.title}: {p.text}" for j, p in enumerate(documents))
            or NO_EVIDENCE
        )
        user = self.reader_prompt.format(documents=listing, question=e.example.question)
        prompt = self.chat(loop.tokenizer, "", user)
        return prompt, encode_prompts(loop.tokenizer, [prompt])[0]

    def extract_answer(self, trajectory: Trajectory) -> str:
        episode = R2AGEpisode.find(trajectory, "environment retrieval_tree (extract_answer)")
        if episode is not None and episode.inference is None:  # an expansion: it never answers
            return ""
        answer = extract_tag(trajectory.text, "answer")
        return answer if answer is not None else trajectory.text.strip()

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, torch.Tensor]:
        """Training: queries, stop rate, format. Inference: Recall, Full-Recall, K (``avg_k``),
        mAP, iterations and seconds per query (Tables 1 and 4), and the branches the top-t/x
        selection dropped per query."""
        from lit_rag.api import average_precision

        if not trajectories:
            return {}
        episodes = [R2AGEpisode.of(t, "environment retrieval_tree (metrics)") for t in trajectories]

        def mean(values) -> torch.Tensor:
            return torch.tensor([float(v) for v in values]).mean()

        if episodes[0].inference is not None:
            trees = [e.inference for e in episodes if e.inference is not None]
            rows = [
                (tree.ranked, t.example.gold_ids)
                for tree, t in zip(trees, trajectories, strict=True)
            ]
            return {
                "recall": mean(len(set(r) & set(g)) / len(g) if g else 0.0 for r, g in rows),
                "full_recall": mean(bool(g) and set(g) <= set(r) for r, g in rows),
                "avg_k": mean(len(r) for r, _ in rows),
                "map": mean(average_precision(r, g) for r, g in rows),
                "iterations": mean(tree.iterations for tree in trees),
                "dropped_branches": mean(tree.dropped_branches for tree in trees),
                "retrieval_s_per_query": mean(tree.retrieval_s for tree in trees),
                "generation_s_per_query": mean(tree.generation_s for tree in trees),
            }
        return {
            "base_queries": mean(sum(s.action == "base" for s in t.steps) for t in trajectories),
            "predicted_queries": mean(
                sum(s.action == "predicted" for s in t.steps) for t in trajectories
            ),
            "stop_rate": mean(e.stop for e in episodes),
            "think_rate": mean(e.think for e in episodes),
            "depth": mean(e.depth for e in episodes),
        }
