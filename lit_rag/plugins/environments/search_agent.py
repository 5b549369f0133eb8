"""Multi-turn search agent: the policy calls the retriever mid-generation (Eval-RAR, Search-R1).

Eval-RAR, Algorithm 1 (Section 4.1), one episode per trajectory, all live trajectories of a
batch generating together:

1. **act**: generate until ``</search>``, ``</answer>`` or end of sequence (line 5-11);
2. a complete ``<search>q</search>`` -> retrieve the top-k documents for ``q`` and append
   ``<information>Doc 1(Title: ...) ...</information>`` (lines 13-16); then, when
   ``evaluate`` is on, **evaluate**: generate ``<evaluate>...</evaluate>`` (lines 17-18);
3. a complete ``<answer>...</answer>`` ends the episode (lines 19-20);
4. anything else appends "My action is wrong. Let me try again." (line 22);
5. every act counts one turn; at ``max_turns`` turns the episode ends (line 3).

After the last turn (``answer_after_max_turns``): Algorithm 1 returns the response once N steps
are spent (lines 3, 26), so an episode that used all its turns has no answer. Search-R1's
released loop (``search_r1/llm_agent/generation.py``, ``run_llm_loop``: "final LLM rollout"),
whose N = 4 the recipes take, asks every episode still going after ``max_turns`` turns for one
more generation whose search is not executed (``do_search=False``): an answer there counts.
Off by default (Algorithm 1); ``recipes/search_r1.yaml`` turns it on, as Search-R1's code ran.

Search-R1 (Jin et al., 2025), the paper's Table 2 baseline, is the same loop with
``evaluate=False``. Text the environment inserts (documents, the invalid-action message, the
optional ``evaluate_prefix``) goes into ``completion_ids`` with ``loss_mask`` 0: Section 4.2.4
("retrieval token masking"), so it is out of the policy loss and the KL.

Where the paper is silent, what we do:

- Stops: the act phase stops on ``</search>`` / ``</answer>`` / EOS (the issue text; Algorithm
  1 line 8 names the opening tags, which cannot end a query). The evaluate phase stops on
  ``</evaluate>``, ``</answer>`` or EOS; a complete answer written there ends the episode, a
  search written there is not executed. An answer written there still records the evaluation
  (lines 17-18: every search is followed by an evaluation step): an ``evaluate`` step with the
  text before the answer's opening tag, then the ``answer`` step.
- A search with an empty query is an invalid action (nothing to retrieve).
- A generation that hits ``max_new_tokens`` (per segment) without an action is an invalid
  action; hitting ``max_response_tokens`` (the whole completion, inserted tokens included)
  ends the episode with ``truncated=True``. Documents that do not fit are cut to the budget.
- Documents are written as in Search-R1: ``Doc i(Title: t) text`` one per line, each cut to
  ``max_document_tokens`` tokens when that is set. ``max_information_tokens`` cuts the whole
  inserted block instead, tags and all, as Search-R1's released loop does with
  ``max_obs_length`` (``search_r1/llm_agent/generation.py``, ``_process_next_obs``: the
  observation's token ids cut to the first ``max_obs_length``, so a long block loses its
  closing ``</information>``).
- The EOS token the policy emits stays in the completion (it is the policy's action and gets
  its gradient); the episode goes on after it as Algorithm 1 says.

Every trajectory hands on a :class:`SearchEpisode` (why it ended, the turns it took); the
rewards read the policy's own text (its ``steps``).
"""

from __future__ import annotations

import torch

from lit_rag.api import (
    ContextLimit,
    Episode,
    EpisodeLoop,
    Example,
    Generation,
    Piece,
    Request,
    RetrievalEnvironment,
    Retriever,
    RolloutEngine,
    SamplingParams,
    Search,
    SearchEpisode,
    Step,
    Trajectory,
    chat_prompt,
    extract_tag,
    final_answer,
    start_episodes,
)

#: Eval-RAR Appendix A.1 (verbatim, with its "Question: {question}" tail).
EVAL_RAR_PROMPT = (
    "You are a helpful assistant excel at answering questions with multi-turn search engine "
    "calling. To answer questions, you must first reason through the available information "
    "using <think> and </think>. If you identify missing knowledge, you may issue a search "
    "request using <search> query </search> at any time. The retrieval system will provide you "
    "with the three most relevant documents enclosed in <information> and </information>. After "
    "each search, you must conduct an evaluation, reviewing the question and the retrieved "
    "documents comprehensively to determine if the question can be answered. If the question "
    "can be answered, clearly cite the source content from the search documents that supports "
    "your answer. If the question cannot be answered, specify what information is missing: "
    "entity information, relational information, or specific time/location details. Provide "
    "your evaluation using <evaluate> and </evaluate>. You may send multiple search requests "
    "if needed. Once you have sufficient information, provide a concise final answer using "
    "<answer> and </answer>. For example, <answer> Donald Trump </answer>. Question: {question}"
)

#: Search-R1's prompt (Jin et al., 2025, Table 1): the Eval-RAR prompt without the evaluation.
SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: {question}"
)

#: Algorithm 1, line 22.
INVALID_ACTION_MESSAGE = "\nMy action is wrong. Let me try again.\n"

DOCUMENT_TEMPLATE = "Doc {index}(Title: {title}) {text}"

#: ``Step.action`` values this environment records.
#: ``unanswered``: the answer-only generation after the last turn wrote no complete answer.
ACTIONS = ("search", "evaluate", "answer", "invalid", "truncated", "unanswered")


class SearchAgentEnvironment(RetrievalEnvironment):
    """Search-then-evaluate agent (Eval-RAR Algorithm 1) or search agent (Search-R1).

    Args:
        retriever: The search engine (any registered retriever with its index).
        top_k: Documents per search (the paper: 3).
        max_turns: N of Algorithm 1: at most this many actions (searches or invalid actions).
        max_response_tokens: Budget of the whole completion, inserted tokens included.
        max_document_tokens: Cut each retrieved document to this many tokens (None = whole).
        max_information_tokens: Cut the whole inserted ``<information>`` block to this many
            tokens (Search-R1's ``max_obs_length``; None = whole).
        evaluate: Ask for ``<evaluate>...</evaluate>`` after each search (Eval-RAR); False is
            Search-R1.
        evaluate_prefix: Text inserted (masked) before the evaluation, e.g. ``"<evaluate>"``;
            empty by default (the paper lets the policy write the tag).
        prompt_template: The instruction with ``{question}``; default Appendix A.1 when
            ``evaluate`` is on, Search-R1's prompt when it is off.
        use_chat_template: Send the prompt as a user message through the chat template
            (Instruct models); False writes it as raw text (Base models).
        chat_template_kwargs: Keyword arguments of the chat template, e.g.
            ``{"enable_thinking": false}`` (Qwen3 thinks by default).
        assistant_prefix: Text that starts the response (part of the prompt). Off by default.
        document_template: One document, with ``{index}`` (from 1), ``{title}``, ``{text}``.
        invalid_action_message: Appended after an invalid action (Algorithm 1, line 22).
        answer_tag: Tag whose content is the final answer.
        answer_after_max_turns: After ``max_turns`` turns, one more generation in which a
            complete answer counts and a search is not executed (Search-R1's released loop);
            False ends the episode there (Algorithm 1). See the module docstring.
        answer_prefix: Text inserted (masked) before that answer-only generation, e.g.
            ``"<answer>"``, so a small model's last generation is an answer; empty by default
            (Search-R1 lets the policy write the tag). Needs ``answer_after_max_turns``.
    """

    def __init__(
        self,
        retriever: Retriever,
        top_k: int = 3,
        max_turns: int = 4,
        max_response_tokens: int = 1024,
        max_document_tokens: int | None = None,
        max_information_tokens: int | None = None,
        evaluate: bool = True,
        evaluate_prefix: str = "",
        prompt_template: str | None = None,
        use_chat_template: bool = True,
        assistant_prefix: str = "",
        document_template: str = DOCUMENT_TEMPLATE,
        invalid_action_message: str = INVALID_ACTION_MESSAGE,
        answer_tag: str = "answer",
        answer_after_max_turns: bool = False,
        chat_template_kwargs: dict | None = None,
        answer_prefix: str = "",
    ) -> None:
        if prompt_template is None:
            prompt_template = EVAL_RAR_PROMPT if evaluate else SEARCH_R1_PROMPT
        self.retriever = retriever
        self.top_k, self.max_turns = top_k, max_turns
        self.max_response_tokens = max_response_tokens
        self.max_document_tokens = max_document_tokens
        self.max_information_tokens = max_information_tokens
        self.evaluate, self.evaluate_prefix = evaluate, evaluate_prefix
        self.prompt_template = prompt_template
        self.use_chat_template = use_chat_template
        self.assistant_prefix = assistant_prefix
        self.document_template = document_template
        self.invalid_action_message = invalid_action_message
        self.answer_tag = answer_tag
        self.answer_after_max_turns = answer_after_max_turns
        self.answer_prefix = answer_prefix
        self.chat_template_kwargs = chat_template_kwargs
        self._check_settings()

    def _check_settings(self) -> None:
        """The templates' fields, the budgets and the answer prefix (one error naming the key)."""
        if self.answer_prefix and not self.answer_after_max_turns:
            raise ValueError(
                "environment answer_prefix is inserted before the answer-only generation after "
                "the last turn; set answer_after_max_turns: true with it, or leave it empty"
            )
        if "{question}" not in self.prompt_template:
            raise ValueError(
                f"environment prompt_template must contain {{question}}: {self.prompt_template!r}"
            )
        if "{text}" not in self.document_template:
            raise ValueError(
                f"environment document_template must contain {{text}}: {self.document_template!r}"
            )
        for name, value in (
            ("top_k", self.top_k),
            ("max_turns", self.max_turns),
            ("max_response_tokens", self.max_response_tokens),
        ):
            if value < 1:
                raise ValueError(f"environment {name} must be >= 1, got {value}")
        for name, value in (
            ("max_document_tokens", self.max_document_tokens),
            ("max_information_tokens", self.max_information_tokens),
        ):
            if value is not None and value < 1:
                raise ValueError(f"environment {name} must be >= 1 or null (no cut), got {value}")

    # ---- prompt ----------------------------------------------------------------------------
    def build_prompt(self, example: Example, tokenizer) -> str:
        """Appendix A.1 with the question; through the chat template unless disabled."""
        user = self.prompt_template.format(question=example.question)
        text = chat_prompt(tokenizer, "", user, self.use_chat_template, self.chat_template_kwargs)
        return (user if text is None else text) + self.assistant_prefix

    def format_information(self, hits: list, tokenizer) -> str:
        docs = []
        for i, hit in enumerate(hits):
            text = hit.passage.text
            if self.max_document_tokens is not None:
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                if len(ids) > self.max_document_tokens:
                    text = tokenizer.decode(ids[: self.max_document_tokens])
            docs.append(
                self.document_template.format(index=i + 1, title=hit.passage.title, text=text)
            )
        return "\n\n<information>" + "\n".join(docs) + "</information>\n\n"

    # ---- rollout (Algorithm 1): one handler per state ---------------------------------------
    def rollout(
        self,
        examples: list[Example],
        engine: RolloutEngine,
        group_size: int,
        params: SamplingParams,
    ) -> list[Trajectory]:
        """Run every episode to its end; ``params.stop`` is replaced by the phase's stops.

        The episodes run through the :class:`~lit_rag.api.EpisodeLoop`: each moves on as soon
        as its own segment is back (``submit`` / ``collect``), so on an engine that batches
        continuously no episode waits for the slowest of its turn. The queries of the segments
        that came back together are retrieved in one batched call.
        """
        prompts = self.prompts(
            examples, engine.tokenizer, group_size, ContextLimit.of(engine, params)
        )
        loop = EpisodeLoop(engine, params, self.retriever)
        handlers = {
            "start": self._start,
            "act": self._acted,  # lines 5-12, 22-24
            "retrieved": self._retrieved,  # lines 14-16
            "evaluate": self._evaluated,  # lines 17-18
            "final": self._answered_last,  # Search-R1's answer-only generation
        }
        episodes = loop.run(start_episodes(examples, prompts), handlers)  # [B*G]
        return [self._trajectory(e) for e in episodes]

    def _start(self, loop: EpisodeLoop, e: Episode, _: None) -> Request:
        e.meta["turns"] = 0  # actions taken (searches and invalid actions)
        return self._act(loop, e)

    def _act(self, loop: EpisodeLoop, e: Episode) -> Request:
        """Ask for the next action (lines 3-4), unless the turn budget is spent; then, with
        ``answer_after_max_turns``, for the one answer-only generation (Search-R1)."""
        if e.meta["turns"] < self.max_turns:
            return self._segment(loop, e, "act", ["</search>", "</answer>"])
        if self.answer_after_max_turns:  # the "final" state always ends the episode
            if self.answer_prefix:
                self._insert(loop, e, self.answer_prefix)
                if e.done:
                    return None
            return self._segment(loop, e, "final", ["</search>", "</answer>"])
        e.end("max_turns")
        return None

    def _answered_last(self, loop: EpisodeLoop, e: Episode, gen: Generation) -> Request:
        """The generation after the last turn: an answer counts, nothing else is executed."""
        if not self._accept(e, gen):
            return None
        text = gen.text if len(e.steps) else self.assistant_prefix + gen.text
        if self.answer_prefix:
            text = self.answer_prefix + gen.text
        if _last_action(text, ("search", "answer")) == "answer":
            e.steps.append(Step(action="answer", text=text))
            e.end("answer")
            return None
        e.steps.append(Step(action="unanswered", text=text))
        e.end("max_turns")
        return None

    def _acted(self, loop: EpisodeLoop, e: Episode, gen: Generation) -> Request:
        """An action came back (lines 5-12, 22-24): a search is retrieved, an answer ends the
        episode, anything else is an invalid action."""
        if not self._accept(e, gen):
            return None
        # the assistant prefix is the start of the first action
        text = gen.text if len(e.steps) else self.assistant_prefix + gen.text
        action = _last_action(text, ("search", "answer"))
        if action == "answer":
            e.steps.append(Step(action="answer", text=text))
            e.end("answer")
            return None
        e.meta["turns"] += 1  # line 24
        query = extract_tag(text, "search") if action == "search" else None
        if query:
            e.steps.append(Step(action="search", query=query, text=text))
            return Search("retrieved", [query], self.top_k)
        e.steps.append(Step(action="invalid", text=text))  # line 22
        self._insert(loop, e, self.invalid_action_message)
        return None if e.done else self._act(loop, e)

    def _retrieved(self, loop: EpisodeLoop, e: Episode, hits: list[list]) -> Request:
        """Insert the documents, then ask for the evaluation (Eval-RAR) or the next action."""
        e.steps[-1].passage_ids = [h.passage.id for h in hits[0]]
        self._insert(
            loop,
            e,
            self.format_information(hits[0], loop.tokenizer),
            limit=self.max_information_tokens,
        )
        if e.done:
            return None
        if not self.evaluate:
            return self._act(loop, e)
        if self.evaluate_prefix:
            self._insert(loop, e, self.evaluate_prefix)
            if e.done:
                return None
        return self._segment(loop, e, "evaluate", ["</evaluate>", "</answer>"])

    def _evaluated(self, loop: EpisodeLoop, e: Episode, gen: Generation) -> Request:
        """The evaluation came back (lines 17-18); an answer written in it ends the episode,
        after the evaluation it closes (the text before the answer's opening tag)."""
        if not self._accept(e, gen):
            return None
        text = self.evaluate_prefix + gen.text
        if _last_action(text, ("evaluate", "answer")) == "answer":
            cut = text.rfind("<answer>", 0, text.rfind("</answer>"))
            e.steps.append(Step(action="evaluate", text=text[:cut]))
            e.steps.append(Step(action="answer", text=text[cut:]))
            e.end("answer")
            return None
        e.steps.append(Step(action="evaluate", text=text))
        return self._act(loop, e)

    def _segment(self, loop: EpisodeLoop, e: Episode, state: str, stops: list[str]) -> Request:
        """The episode's next segment, at most what is left of its token budget."""
        return loop.segment(e, state, self.max_response_tokens, stops)

    def _accept(self, e: Episode, gen: Generation) -> bool:
        """Append a segment; False when it used up the token budget (the episode ends)."""
        e.generated(gen)
        if len(e.ids) >= self.max_response_tokens and not gen.finished:
            e.steps.append(Step(action="truncated", text=gen.text))
            e.end("max_response_tokens", truncated=True)
            return False
        return True

    def _insert(self, loop: EpisodeLoop, e: Episode, text: str, limit: int | None = None) -> None:
        """Append environment text (masked), its first ``limit`` tokens when that is set, cut to
        the episode's remaining budget."""
        ids = loop.encode(text)
        if limit is not None and len(ids) > limit:
            ids = ids[:limit]
            text = loop.tokenizer.decode(ids)
        left = self.max_response_tokens - len(e.ids)
        if len(ids) >= left:
            kept = ids[: max(left, 0)]
            e.insert(kept, loop.tokenizer.decode(kept) if len(kept) < len(ids) else text)
            e.end("max_response_tokens", truncated=True)
            return
        e.insert(ids, text)

    def _trajectory(self, e: Episode) -> Trajectory:
        if not e.stop_reason:
            e.end("max_turns")
        trajectory = self.trajectory(
            e.example,
            e.group,
            e.prompt_ids,
            e.ids,
            e.logprobs,
            self.assistant_prefix + e.text,
            loss_mask=e.mask,
            prompt_text=e.prompt_text,
            steps=e.steps,
            truncated=e.truncated,
            pieces=[Piece(self.assistant_prefix, inserted=True), *e.pieces],
            sampled=e.sampled,
            versions=e.versions,
        )
        trajectory.contract = SearchEpisode(e.stop_reason, e.meta["turns"])
        return trajectory

    # ---- answers and metrics ---------------------------------------------------------------
    def extract_answer(self, trajectory: Trajectory) -> str:
        """The last complete answer the policy wrote (never text from retrieved documents)."""
        return final_answer(trajectory, self.answer_tag) or ""

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, torch.Tensor]:
        """Per-trajectory means: turns, valid searches, evaluations, invalid actions, answered,
        response length (all completion tokens, inserted ones included)."""
        if not trajectories:
            return {}

        def mean(values) -> torch.Tensor:
            return torch.tensor([float(v) for v in values]).mean()

        def count(t, action):
            return sum(1 for s in t.steps if s.action == action)

        def turns(t: Trajectory) -> int:
            episode = SearchEpisode.find(t, "environment search_agent (metrics)")
            return count(t, "search") + count(t, "invalid") if episode is None else episode.turns

        return {
            "turns": mean(turns(t) for t in trajectories),
            "valid_searches": mean(count(t, "search") for t in trajectories),
            "evaluations": mean(count(t, "evaluate") for t in trajectories),
            "invalid_actions": mean(count(t, "invalid") for t in trajectories),
            "answered": mean(final_answer(t) is not None for t in trajectories),
            "response_length": mean(t.completion_ids.numel() for t in trajectories),
        }


def _last_action(text: str, tags: tuple[str, ...]) -> str | None:
    """Which of ``tags`` closes last in ``text`` (the one generation stopped on), or None.

    A tag counts only as a complete pair (an opening tag before its closing tag).
    """
    best, where = None, -1
    for tag in tags:
        close = text.rfind(f"</{tag}>")
        if close > where and text.rfind(f"<{tag}>", 0, close) >= 0:
            best, where = tag, close
    return best
