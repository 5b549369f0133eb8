"""EVO-RAG's query-rewriting agent (evo_rag.txt Sections 3.1-3.2, 3.4, Algorithm 1).

At each hop ``t`` the agent sees the state ``s_t = (q_<t, D_<t, A_<t)`` (Section 3.2: the
sub-queries it kept, their documents, and "any intermediate answers and rationales": the
reasoning the agent wrote inside ``<think></think>`` before each kept sub-query; an ANSWER ends
the episode, so no answer is intermediate) and the question, and writes one action:

    <search>sub-query</search>   SEARCH: retrieve top-k documents for the sub-query
    <backtrack></backtrack>      BACKTRACK: drop the last kept sub-query and its documents
    <answer>text</answer>        ANSWER: final answer, ends the episode
    <refuse></refuse>            REFUSE: declare the question unanswerable, ends the episode

anything else is an invalid step (it costs a step and changes nothing); ``T_max`` steps end the
episode. Each step's prompt is rebuilt from the state, so BACKTRACK really returns to the
previous state (the dropped documents are no longer shown).

Preferences (Section 3.3-3.4): the main episode of each question is rolled out, then at up to
``branch_states`` of its visited states ``group_size - 1`` alternative actions are sampled and
each branch is rolled forward to its end; the main path's action is the remaining sibling.
Every sibling is one :class:`Trajectory` whose prompt is the shared state and whose completion
is the action taken there (what DPO compares), with ``steps`` = the whole episode (prefix and
branch, for the step rewards) and an :class:`EvoRagBranch` (``Trajectory.contract``) naming the
branching state and the step taken there, with the retrieved documents' text.

Episodes run through the episode loop (``lit_rag/contracts/episodes.py``): one handler per
state (act, then the step's retrieval, then the step applied), each episode's next action submitted
as soon
as its last one is applied. The siblings at a state start as soon as the main episode reaches
it (the siblings at ``s_0`` with the main episode itself), not after every main episode is
over: a rollout's first segments then fill the batch (a question's main episode alone would
run one sequence per question). For the same seed the sampled tokens therefore differ from
those of the phase-by-phase order (main episodes first, then siblings) on every engine; a
policy whose output depends only on its prompt gives the same trajectories either way (tested).
"""

from __future__ import annotations

import torch

from lit_rag.api import (
    Episode,
    EpisodeLoop,
    EvoRagBranch,
    Example,
    Generate,
    Generation,
    Passage,
    Request,
    RetrievalEnvironment,
    Retriever,
    RolloutEngine,
    SamplingParams,
    Search,
    Step,
    Trajectory,
    chat_prompt,
    encode_prompts,
    extract_tag,
)

QUERY_REWRITER_PROMPT = (
    "Answer the question by searching step by step. Each step, write exactly one action:\n"
    "<search>a short sub-query</search> to retrieve documents;\n"
    "<backtrack></backtrack> to drop your last sub-query and its documents;\n"
    "<answer>the answer</answer> when the documents answer the question;\n"
    "<refuse></refuse> when the question cannot be answered.\n"
    "You may think first inside <think></think>."
)
STATE_TEMPLATE = "Question: {question}\n{history}"
ACTIONS = ("search", "backtrack", "answer", "refuse")


def parse_action(text: str) -> tuple[str, str]:
    """(action, argument) of the first complete action tag after any ``</think>``;
    ``("invalid", "")`` when there is none. Never raises.

    Example:
        >>> parse_action("<think>hop 1</think><search> Orbel Mills founder </search>")
        ('search', 'Orbel Mills founder')
    """
    end = text.rfind("</think>")
    tail = text[end + len("</think>") :] if end >= 0 else text
    best, where = ("invalid", ""), len(tail) + 1
    for action in ACTIONS:
        start = tail.find(f"<{action}>")
        if 0 <= start < where and tail.find(f"</{action}>", start) >= 0:
            content = extract_tag(tail[start:], action) or ""
            if action == "search" and not content:
                continue
            best, where = (action, content), start
    return best


def kept_state(
    steps: list[Step], passages: dict[str, Passage], prefix: str = ""
) -> list[tuple[str, list[Passage], str]]:
    """The sub-queries the state after ``steps`` keeps, each with its documents and the
    rationale written before it (the last ``<think>`` block of the step's text, ``prefix`` + text:
    A_<t of Section 3.2; ``""`` when there is none): SEARCH adds one, BACKTRACK drops the last
    with its rationale (Section 3.1); ``passages`` maps the steps' ids to passages.

    Example:
        >>> p = Passage("g1", "Orbel Mills", "founded by Mira Tolvan")
        >>> steps = [Step("search", "a", ["g1"], "<think>hop 1</think><search>a</search>"),
        ...          Step("search", "b", []), Step("backtrack")]
        >>> kept_state(steps, {"g1": p}) == [("a", [p], "hop 1")]
        True
    """
    kept: list[tuple[str, list[Passage], str]] = []
    for step in steps:
        if step.action == "search":
            rationale = extract_tag(prefix + (step.text or ""), "think") or ""
            kept.append((step.query or "", [passages[pid] for pid in step.passage_ids], rationale))
        elif step.action == "backtrack" and kept:
            kept.pop()
    return kept


def branch(e: Episode, t: int) -> Episode:
    """A new episode at ``e``'s state before step ``t`` (a sibling branches there)."""
    steps = [Step(s.action, s.query, list(s.passage_ids), s.text) for s in e.steps[:t]]
    other = Episode(e.example, e.group, [], steps=steps, turns=list(e.turns[:t]))
    other.passages = {pid: e.passages[pid] for s in steps for pid in s.passage_ids}
    return other


class QueryRewriterEnvironment(RetrievalEnvironment):
    """SEARCH / BACKTRACK / ANSWER / REFUSE agent with sibling branches for preferences.

    Args:
        retriever: The search engine.
        top_k: Documents per sub-query.
        t_max: T_max, steps per episode (the paper: 20).
        branch_states: Visited states of the main episode to branch from (0: none).
        prompt: Instruction, sent as the system message.
        state_template: The user message, with ``{question}`` and ``{history}``.
        use_chat_template: Through the tokenizer's chat template; False writes raw text.
        chat_template_kwargs: Keyword arguments of the chat template, e.g.
            ``{"enable_thinking": false}`` (Qwen3 thinks by default).
        assistant_prefix: Text that starts every action (parsed with it).
        state_rationales: Show each kept sub-query's rationale in the state (A_<t, Section
            3.2); False shows sub-queries and documents only.
    """

    def __init__(
        self,
        retriever: Retriever,
        top_k: int = 3,
        t_max: int = 20,
        branch_states: int = 2,
        prompt: str = QUERY_REWRITER_PROMPT,
        state_template: str = STATE_TEMPLATE,
        use_chat_template: bool = True,
        assistant_prefix: str = "",
        state_rationales: bool = True,
        chat_template_kwargs: dict | None = None,
    ) -> None:
        if t_max < 1 or top_k < 1 or branch_states < 0:
            raise ValueError(
                "environment t_max and top_k must be >= 1 and branch_states >= 0; "
                f"got {t_max}, {top_k}, {branch_states}"
            )
        self.retriever, self.top_k, self.t_max, self.branch_states = (
            retriever,
            top_k,
            t_max,
            branch_states,
        )
        self.prompt, self.state_template = prompt, state_template
        self.use_chat_template, self.assistant_prefix = use_chat_template, assistant_prefix
        self.state_rationales, self.chat_template_kwargs = state_rationales, chat_template_kwargs

    def build_prompt(self, example: Example, tokenizer) -> str:
        """The first state's prompt (no sub-queries yet); :meth:`state_prompt` gives the others."""
        return self.state_prompt(example, [], tokenizer)

    def state_prompt(
        self, example: Example, kept: list[tuple[str, list[Passage], str]], tokenizer
    ) -> str:
        """The prompt of state ``s_t``: the question and the kept sub-queries, each after its
        rationale (``state_rationales``) and with its documents."""
        lines = []
        for i, (query, passages, rationale) in enumerate(kept):
            if rationale and self.state_rationales:
                lines.append(f"Thought {i + 1}: {rationale}")
            lines.append(f"Sub-query {i + 1}: {query}")
            lines += [f"  [{j + 1}] {p.title}: {p.text}" for j, p in enumerate(passages)] or [
                "  (no documents)"
            ]
        history = "\n".join(lines) if lines else "(no sub-queries yet)"
        user = self.state_template.format(question=example.question, history=history)
        text = chat_prompt(
            tokenizer, self.prompt, user, self.use_chat_template, self.chat_template_kwargs
        )
        return (f"{self.prompt}\n\n{user}\n" if text is None else text) + self.assistant_prefix

    # ---- the episode: one handler per state -----------------------------------------------
    def _advance(
        self,
        episodes: list[Episode],
        engine: RolloutEngine,
        params: SamplingParams,
        siblings: int = 0,
    ) -> None:
        """Run the episodes to their end through the episode loop; with ``siblings`` > 0 each
        one is a main episode that starts that many siblings at each of its first
        ``branch_states`` states when it reaches them (kept in ``meta["branches"]``).

        Each step's action goes through a search (none for actions other than SEARCH) before
        it is applied, so the steps of the actions that came back together are applied in the
        order they came back, after one batched retrieval: on the default ``collect`` the
        episodes step exactly as when every live episode generated together.
        """
        for e in episodes:
            e.meta["siblings"], e.meta["branches"] = siblings, []
        loop = EpisodeLoop(engine, params, self.retriever)
        loop.run(episodes, {"start": self._act, "act": self._acted, "retrieved": self._step})

    def _act(self, loop: EpisodeLoop, e: Episode, _: object = None) -> Request:
        """Ask for the action at the episode's state, unless ``T_max`` steps are spent; a main
        episode starts its siblings at this state first (Section 3.4)."""
        t = len(e.steps)
        if t >= self.t_max:
            e.end("t_max")
            return None
        if "siblings" in e.meta and t < self.branch_states:  # a main episode (siblings: none)
            siblings = [branch(e, t) for _ in range(e.meta["siblings"])]
            e.meta["branches"].append((t, siblings))
            loop.start(siblings)
        kept = kept_state(e.steps, e.passages, self.assistant_prefix)
        prompt = self.state_prompt(e.example, kept, loop.tokenizer)
        return Generate("act", encode_prompts(loop.tokenizer, [prompt])[0], loop.params, prompt)

    def _acted(self, loop: EpisodeLoop, e: Episode, gen: Generation) -> Request:
        """An action came back: a SEARCH retrieves its sub-query's documents first."""
        action, arg = parse_action(self.assistant_prefix + gen.text)
        return Search("retrieved", [arg] if action == "search" else [], self.top_k)

    def _step(self, loop: EpisodeLoop, e: Episode, hits: list[list]) -> Request:
        """Apply the action (Section 3.1): ANSWER and REFUSE end the episode."""
        gen = e.turns[-1].generation
        action, arg = parse_action(self.assistant_prefix + gen.text)
        passage_ids = e.retrieved(hits[0]) if hits else []
        e.steps.append(
            Step(
                action=action,
                query=arg if action == "search" else None,
                passage_ids=passage_ids,
                text=arg if action == "answer" else gen.text,
            )
        )
        if action in ("answer", "refuse"):
            e.end(action)
            return None
        return self._act(loop, e)

    def rollout(
        self,
        examples: list[Example],
        engine: RolloutEngine,
        group_size: int,
        params: SamplingParams,
    ) -> list[Trajectory]:
        """The main episode of each question and ``group_size - 1`` siblings at each of its
        first ``branch_states`` visited states, each rolled forward to its end (Section 3.4).

        A state's siblings start as soon as the main episode reaches it (see the module
        docstring); all run through one episode loop.
        """
        main = [Episode(ex, i, []) for i, ex in enumerate(examples)]
        self._advance(main, engine, params, siblings=group_size - 1)
        branches = [(e, t, siblings) for e in main for t, siblings in e.meta["branches"]]
        out = [
            self._trajectory(member, t, state=f"{e.group}:{t}")
            for e, t, siblings in branches
            for member in [e, *siblings]
        ]
        if not branches:  # no branching: one trajectory per episode, its first action
            out = [self._trajectory(e, 0, state=f"{e.group}:0") for e in main if e.steps]
        return out

    def validation_rollout(
        self, examples: list[Example], engine: RolloutEngine, params: SamplingParams
    ) -> list[Trajectory]:
        episodes = [Episode(ex, i, []) for i, ex in enumerate(examples)]
        self._advance(episodes, engine, params)
        return [self._trajectory(e, 0, state=f"{e.group}:0") for e in episodes]

    def _trajectory(self, e: Episode, t: int, state: str) -> Trajectory:
        """The sibling at step ``t``: the state's prompt and the action taken there."""
        if t < len(e.turns):
            turn = e.turns[t]
            prompt, prompt_ids, gen = turn.prompt_text, turn.prompt_ids, turn.generation
            ids, logprobs, finished = gen.token_ids, gen.logprobs, gen.finished
            versions = [gen.versions]
        else:  # an episode with no step (T_max = 0 is refused, so only a defensive default)
            prompt, prompt_ids, ids, logprobs, finished = "", [], [], [], True
            versions = []
        trajectory = self.trajectory(
            e.example,
            e.group,
            prompt_ids,
            ids,
            logprobs,
            "\n".join(s.text for s in e.steps),
            steps=e.steps,
            truncated=not finished,
            prompt_text=prompt,
            sampled=[list(ids)],
            versions=versions,
        )
        trajectory.contract = EvoRagBranch(state, t, dict(e.passages))
        return trajectory

    def extract_answer(self, trajectory: Trajectory) -> str:
        answers = [s.text for s in trajectory.steps if s.action == "answer"]
        return answers[-1] if answers else ""

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, torch.Tensor]:
        """Per episode: steps, duplicate-query rate, refusal rate, back-track rate (Section 4)."""
        if not trajectories:
            return {}

        def mean(values) -> torch.Tensor:
            return torch.tensor([float(v) for v in values]).mean()

        def duplicate_rate(t: Trajectory) -> float:
            queries = [(s.query or "").strip().lower() for s in t.steps if s.action == "search"]
            return (len(queries) - len(set(queries))) / len(queries) if queries else 0.0

        n_steps = [max(1, len(t.steps)) for t in trajectories]
        return {
            "steps": mean(len(t.steps) for t in trajectories),
            "duplicate_query_rate": mean(duplicate_rate(t) for t in trajectories),
            "refusal_rate": mean(any(s.action == "refuse" for s in t.steps) for t in trajectories),
            "backtrack_rate": mean(
                sum(s.action == "backtrack" for s in t.steps) / n
                for t, n in zip(trajectories, n_steps, strict=True)
            ),
            "answered": mean(any(s.action == "answer" for s in t.steps) for t in trajectories),
        }
