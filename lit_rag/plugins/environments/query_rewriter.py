"""EVO-RAG's query-rewriting agent (evo_rag.txt Sections 3.1-3.2, 3.4, Algorithm 1).

At each hop ``t`` the agent sees the state ``s_t = (q_<t, D_<t, A_<t)`` (the question, the
sub-queries it kept and their documents) and writes one action:

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
branch, for the step rewards) and ``meta["state"]`` naming the branching state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lit_rag.api import (
    Example,
    Generation,
    Passage,
    RetrievalEnvironment,
    Retriever,
    RolloutEngine,
    SamplingParams,
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
    """(action, argument) of the first complete action tag after any ``</think>``; ``("invalid", "")``
    when there is none. Never raises.

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


@dataclass
class _Episode:
    example_index: int
    kept: list[tuple[str, list[Passage]]] = field(default_factory=list)  # the state's sub-queries
    steps: list[Step] = field(default_factory=list)
    states: list[str] = field(default_factory=list)  # prompt text before each step
    state_ids: list[list[int]] = field(default_factory=list)  # its token ids
    actions: list[Generation] = field(default_factory=list)
    found: list[list[Passage]] = field(default_factory=list)  # documents of each step
    done: bool = False

    def copy_prefix(self, t: int) -> _Episode:
        """The episode as it was before step ``t`` (to branch from there)."""
        other = _Episode(self.example_index)
        other.steps = [Step(s.action, s.query, list(s.passage_ids), s.text) for s in self.steps[:t]]
        other.states, other.state_ids = list(self.states[:t]), list(self.state_ids[:t])
        other.actions, other.found = list(self.actions[:t]), list(self.found[:t])
        for s, passages in zip(other.steps, other.found):  # replay the kept state
            _apply(other, s, passages)
        return other


def _apply(e: _Episode, step: Step, passages: list[Passage]) -> None:
    if step.action == "search":
        e.kept.append((step.query or "", passages))
    elif step.action == "backtrack" and e.kept:
        e.kept.pop()


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
        assistant_prefix: Text that starts every action (parsed with it).
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
    ) -> None:
        if t_max < 1 or top_k < 1 or branch_states < 0:
            raise ValueError(f"environment t_max and top_k must be >= 1 and branch_states >= 0; got {t_max}, {top_k}, {branch_states}")
        self.retriever, self.top_k, self.t_max, self.branch_states = retriever, top_k, t_max, branch_states
        self.prompt, self.state_template = prompt, state_template
        self.use_chat_template, self.assistant_prefix = use_chat_template, assistant_prefix

    def build_prompt(self, example: Example, tokenizer) -> str:
        """The first state's prompt (no sub-queries yet); :meth:`state_prompt` gives the others."""
        return self.state_prompt(example, _Episode(0), tokenizer)

    def state_prompt(self, example: Example, e: _Episode, tokenizer) -> str:
        lines = []
        for i, (query, passages) in enumerate(e.kept):
            lines.append(f"Sub-query {i + 1}: {query}")
            lines += [f"  [{j + 1}] {p.title}: {p.text}" for j, p in enumerate(passages)] or ["  (no documents)"]
        history = "\n".join(lines) if lines else "(no sub-queries yet)"
        user = self.state_template.format(question=example.question, history=history)
        text = chat_prompt(tokenizer, self.prompt, user, self.use_chat_template)
        return (f"{self.prompt}\n\n{user}\n" if text is None else text) + self.assistant_prefix

    def _advance(self, episodes: list[_Episode], examples: list[Example], engine: RolloutEngine,
                 params: SamplingParams) -> None:
        """Step every live episode together until all have ended."""
        tok = engine.tokenizer
        while True:
            live = [e for e in episodes if not e.done and len(e.steps) < self.t_max]
            for e in episodes:
                if not e.done and len(e.steps) >= self.t_max:
                    e.done = True
            if not live:
                return
            prompts = [self.state_prompt(examples[e.example_index], e, tok) for e in live]
            prompt_ids = encode_prompts(tok, prompts)
            generations = engine.generate(prompt_ids, params)
            parsed = [parse_action(self.assistant_prefix + g.text) for g in generations]
            searches = [(e, arg) for e, (action, arg) in zip(live, parsed) if action == "search"]
            hits = self.retriever.search([q for _, q in searches], self.top_k) if searches else []
            found = {id(e): [h.passage for h in hs] for (e, _), hs in zip(searches, hits)}
            for e, prompt, ids, gen, (action, arg) in zip(live, prompts, prompt_ids, generations, parsed):
                passages = found.get(id(e), [])
                step = Step(action=action, query=arg if action == "search" else None,
                            passage_ids=[p.id for p in passages], text=arg if action == "answer" else gen.text)
                e.states.append(prompt)
                e.state_ids.append(ids)
                e.actions.append(gen)
                e.steps.append(step)
                e.found.append(passages)
                _apply(e, step, passages)
                e.done = action in ("answer", "refuse")

    def rollout(self, examples: list[Example], engine: RolloutEngine, group_size: int,
                params: SamplingParams) -> list[Trajectory]:
        main = [_Episode(i) for i in range(len(examples))]
        self._advance(main, examples, engine, params)
        out: list[Trajectory] = []
        branches: list[tuple[_Episode, int, list[_Episode]]] = []
        pending: list[_Episode] = []
        for e in main:
            visited = list(range(len(e.steps)))[: self.branch_states]
            for t in visited:
                siblings = [e.copy_prefix(t) for _ in range(group_size - 1)]
                branches.append((e, t, siblings))
                pending += siblings
        self._advance(pending, examples, engine, params)
        for e, t, siblings in branches:
            for member in [e, *siblings]:
                out.append(self._trajectory(member, t, examples, state=f"{e.example_index}:{t}"))
        if not branches:  # no branching: one trajectory per episode, its first action
            out = [self._trajectory(e, 0, examples, state=f"{e.example_index}:0") for e in main if e.steps]
        return out

    def validation_rollout(self, examples: list[Example], engine: RolloutEngine, params: SamplingParams) -> list[Trajectory]:
        episodes = [_Episode(i) for i in range(len(examples))]
        self._advance(episodes, examples, engine, params)
        return [self._trajectory(e, 0, examples, state=f"{e.example_index}:0") for e in episodes]

    def _trajectory(self, e: _Episode, t: int, examples: list[Example], state: str) -> Trajectory:
        """The sibling at step ``t``: the state's prompt and the action taken there."""
        if t < len(e.actions):
            prompt, prompt_ids, gen = e.states[t], e.state_ids[t], e.actions[t]
            ids, logprobs, finished = gen.token_ids, gen.logprobs, gen.finished
        else:  # an episode with no step (T_max = 0 is refused, so only a defensive default)
            prompt, prompt_ids, ids, logprobs, finished = "", [], [], [], True
        return self.trajectory(
            examples[e.example_index], e.example_index, prompt_ids, ids, logprobs,
            "\n".join(s.text for s in e.steps), steps=e.steps, truncated=not finished,
            prompt_text=prompt,
            meta={"state": state, "branch_step": t,
                  "passages": {p.id: p for found in e.found for p in found}},
        )

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
            "backtrack_rate": mean(sum(s.action == "backtrack" for s in t.steps) / n
                                   for t, n in zip(trajectories, n_steps)),
            "answered": mean(any(s.action == "answer" for s in t.steps) for t in trajectories),
        }
