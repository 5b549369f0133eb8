"""One episode loop for every multi-turn environment (docs/DESIGN.md step 2; docs/STYLE.md 16).

A multi-turn episode is a state machine. An :class:`Episode` is the record of one trajectory
being rolled out (its prompt, the completion so far with its loss mask and sampling log-probs,
its steps, the passages it retrieved) and the ``state`` it waits in. An environment writes one
handler per state; :class:`EpisodeLoop` keeps every live episode's next request in flight and
hands each result to the handler of the state its episode waits in. The shape is verl's agent
loop (``verl/experimental/agent_loop/tool_agent_loop.py``: ``AgentState`` and one
``_handle_*_state`` per state), without coroutines: a handler returns what the episode needs
next instead of awaiting it.

A handler is ``handler(loop, episode, result) -> Generate | Search | None``; ``result`` is the
:class:`~lit_rag.rollout.base.Generation` of a :class:`Generate`, the hits of a
:class:`Search` (one list per query) or ``None`` in the first state (``"start"``). It updates
the record (:meth:`Episode.generated` for policy tokens, :meth:`Episode.insert` for text the
environment adds: loss mask 0) and returns:

- :class:`Generate`: the episode's next segment goes to the engine at once (``submit``); the
  loop ``collect``\\ s whatever finished, so on an engine that batches continuously (``vllm``)
  no episode waits for the slowest of its turn;
- :class:`Search`: a retrieval. The searches asked for while the loop handles one batch of
  finished segments are one batched retriever call (one per ``k``), after which their handlers
  run in the order the searches were asked for;
- :class:`CallTools`: tool calls (a tool agent). Those asked for while the loop handles one
  batch of finished segments start together, concurrently, on the loop's
  :class:`~lit_rag.tools.ToolBox` (a batched tool's calls of every episode as one batch);
  what the loop does while they run is its ``overlap`` (below);
- ``None``: the episode is over (``done``).

Example, an agent that searches once and then answers::

    class OneSearch(RetrievalEnvironment):
        def rollout(self, examples, engine, group_size, params):
            prompts = self.prompts(examples, engine.tokenizer, group_size)
            loop = EpisodeLoop(engine, params, self.retriever)
            episodes = loop.run(start_episodes(examples, prompts), {
                "start": lambda loop, e, _: Generate("query", e.context, loop.params),
                "query": lambda loop, e, gen: e.generated(gen) or Search("read", [gen.text], 3),
                "read": self.read,  # inserts the documents, returns Generate("answer", ...)
                "answer": lambda loop, e, gen: e.generated(gen),  # None: done
            })
            return [self.trajectory(e.example, e.group, e.prompt_ids, e.ids, e.logprobs,
                                    e.text, loss_mask=e.mask) for e in episodes]

Order. The engine's default ``collect`` runs what was submitted since the last call, in
submission order, as one ``generate`` per sampling setting; the loop submits in the order the
handlers run, so an environment whose handlers all end in a :class:`Search` (an empty one
where nothing is retrieved) steps its episodes exactly as a phase-by-phase loop that
generates every live episode together would.

Tool calls and generation (``overlap``). Without overlap the loop waits for the tool calls
asked for in one batch and runs their handlers in the order asked before it collects again:
with the default ``collect`` an episode back from its tools joins the next ``generate`` of the
others, so the tool agent (whose live episodes are all at one phase) steps exactly as a
phase-by-phase loop. With overlap the calls run in the background while the loop keeps
collecting other episodes' segments; an episode's handler runs as soon as all its calls are
back (those back together in the order asked, after the segments collected meanwhile), and
the loop waits for the tools only when no segment is in flight. That is verl's agent loop,
where each trajectory awaits its own tool calls while the server generates the others', and
what an engine that batches continuously (``vllm``) wants; with the default ``collect`` it
would split one ``generate`` into two whenever tools are quicker than a segment, so
``overlap=None`` (the default) turns it on only for an engine that declares
``batches_continuously``.
Either way the calls are the same, and an engine whose samples depend on their prompt alone
gives the same trajectories.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lit_rag.contracts.environment import ContextLimit
from lit_rag.rollout.base import Generation, RolloutEngine, SamplingParams
from lit_rag.types import Example, Passage, Piece, Step

START = "start"
DONE = "done"


@dataclass
class Generate:
    """Request: sample ``prompt``'s next segment, then run ``state``'s handler on it.

    Args:
        state: The state the episode waits in (its handler gets the generation).
        prompt: Token ids the engine continues (:attr:`Episode.context` to continue the episode).
        params: Sampling settings of the segment.
        prompt_text: The prompt as text, kept in :attr:`Turn.prompt_text` (optional).
    """

    state: str
    prompt: list[int]
    params: SamplingParams
    prompt_text: str = ""


@dataclass
class Search:
    """Request: retrieve the top ``k`` passages of each query, then run ``state``'s handler on
    the hits (one list per query, ``[]`` for no queries).

    Args:
        state: The state the episode waits in.
        queries: Queries to retrieve for; empty: no retrieval, the handler still runs after
            this batch's retrieval, in order.
        k: Passages per query.
    """

    state: str
    queries: list[str]
    k: int = 1


@dataclass
class CallTools:
    """Request: run ``calls`` with the loop's tools, then run ``state``'s handler on their
    results (one :class:`~lit_rag.tools.ToolResult` per call, in order).

    Args:
        state: The state the episode waits in.
        calls: :class:`~lit_rag.tools.ToolCall`\\ s; a ``ToolResult`` in a call's place (a call
            that did not parse) is passed through as its result.
    """

    state: str
    calls: list


#: What a handler returns: the episode's next request, or None when it is over.
Request = Generate | Search | CallTools | None


@dataclass
class Turn:
    """One generation of an episode and the prompt it answered."""

    prompt_text: str
    prompt_ids: list[int]
    generation: Generation


@dataclass
class Episode:
    """One trajectory being rolled out: the record every handler reads and updates.

    Args:
        example: The example the episode answers.
        group: Its group (the example's index in the batch).
        prompt_ids: The first prompt, ``[P]``.
        prompt_text: The first prompt as text.
        state: The state the episode waits in (``"start"`` before its first handler runs,
            ``"done"`` once a handler returned ``None``).
        ids: The completion so far, ``[C]``: generated tokens and inserted ones.
        mask: ``[C]``, 1 at generated tokens, 0 at inserted ones (the loss mask).
        logprobs: ``[C]`` sampling log-probs, 0 at inserted tokens.
        pieces: The completion's text, one :class:`~lit_rag.types.Piece` per segment or
            insertion (who wrote it).
        steps: The episode's actions.
        turns: Every generation with the prompt it answered, in order.
        passages: Every passage retrieved, by id, in the order first retrieved.
        truncated: A generation or insertion hit the token budget, or the context filled the
            engine's context window.
        stop_reason: Why the episode ended (the environment's words).
        meta: Anything else the environment records (its trajectory's ``meta``).
    """

    example: Example
    group: int
    prompt_ids: list[int]
    prompt_text: str = ""
    state: str = START
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    passages: dict[str, Passage] = field(default_factory=dict)
    truncated: bool = False
    stop_reason: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.state == DONE

    @property
    def context(self) -> list[int]:
        """Prompt and completion so far: what the engine continues."""
        return self.prompt_ids + self.ids

    @property
    def text(self) -> str:
        """The completion's text so far."""
        return "".join(p.text for p in self.pieces)

    @property
    def sampled(self) -> list[list[int]]:
        """The token ids the engine sampled, one list per generation, in order."""
        return [turn.generation.token_ids.tolist() for turn in self.turns]

    @property
    def versions(self) -> list[tuple[int, int] | None]:
        """Each generation's policy versions (:attr:`Generation.versions`), in order."""
        return [turn.generation.versions for turn in self.turns]

    def generated(self, generation: Generation) -> None:
        """Append a generated segment (loss mask 1, its sampling log-probs)."""
        ids = generation.token_ids.tolist()
        self.ids.extend(ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(generation.logprobs.tolist())
        self.pieces.append(Piece(generation.text))

    def insert(self, ids: Sequence[int], text: str) -> None:
        """Append environment text (documents, a message): loss mask 0, log-prob 0."""
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.pieces.append(Piece(text, inserted=True))

    def end(self, reason: str, truncated: bool = False) -> None:
        """End the episode now, saying why (its handler then returns None)."""
        self.state, self.stop_reason = DONE, reason
        self.truncated = self.truncated or truncated

    def retrieved(self, hits: list) -> list[str]:
        """Keep the passages of ``hits`` (retriever ``Hit``\\ s); their ids in rank order."""
        for hit in hits:
            self.passages.setdefault(hit.passage.id, hit.passage)
        return [hit.passage.id for hit in hits]


def start_episodes(examples: list[Example], prompts) -> list[Episode]:
    """One episode per row of ``prompts`` (an :class:`~lit_rag.contracts.environment.Prompts`):
    example ``r // group_size``'s prompt (and the example as that prompt shows it: references left
    out
    to fit the context), rows of one group next to each other."""
    return [
        Episode(
            prompts.example(group, examples), group, list(prompts.ids[group]), prompts.texts[group]
        )
        for group in prompts.groups
    ]


Handler = Callable[["EpisodeLoop", Episode, Any], Request]


class EpisodeLoop:
    """Runs episodes to their end through the engine's ``submit`` / ``collect``.

    Args:
        engine: The rollout engine (its ``tokenizer`` is :attr:`tokenizer`).
        params: The rollout's sampling settings; handlers derive each segment's from them.
        retriever: What :class:`Search` requests query (None: no handler may search).
        tools: What :class:`CallTools` requests call (a :class:`~lit_rag.tools.ToolBox`).
        overlap: Keep collecting other episodes' segments while tool calls run (module doc);
            None: the tools' own setting (``ToolBox.overlap``), else on where the engine
            batches continuously (its ``batches_continuously``).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        params: SamplingParams,
        retriever: Any = None,
        tools: Any = None,
        overlap: bool | None = None,
    ) -> None:
        self.engine, self.params, self.retriever, self.tools = engine, params, retriever, tools
        self.tokenizer = engine.tokenizer
        #: the engine's context window: a segment never asks for more than it leaves
        self.window = engine.context_window()
        if overlap is None:
            overlap = None if tools is None else tools.overlap
        #: tool calls run while the engine generates (module doc)
        self.overlap = engine.batches_continuously if overlap is None else overlap
        #: seconds :meth:`run` waited for tool calls with no segment in flight
        self.tool_wait_s = 0.0
        self._cache: dict[str, list[int]] = {}
        self._waiting: dict[int, tuple[Episode, Generate]] = {}
        self._searches: list[tuple[Episode, Search]] = []
        self._calls: list[tuple[Episode, CallTools]] = []
        self._running: list[tuple[Episode, concurrent.futures.Future]] = []
        self._started: list[Episode] = []

    def encode(self, text: str) -> list[int]:
        """Token ids of environment text, tokenized once per distinct string."""
        if text not in self._cache:
            self._cache[text] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self._cache[text]

    def segment(
        self, e: Episode, state: str, budget: int, stop: list[str] | None = None
    ) -> Generate | None:
        """The episode's next segment with the loop's sampling settings, ``stop`` in place of
        theirs (None keeps them), at most what is left of ``budget`` completion tokens; None,
        and the episode ended as truncated (``max_response_tokens``), when nothing is left."""
        left = budget - len(e.ids)
        if left <= 0:
            e.end("max_response_tokens", truncated=True)
            return None
        p = self.params
        params = SamplingParams(
            max_new_tokens=min(p.max_new_tokens, left),
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            stop=list(p.stop) if stop is None else stop,
        )
        return Generate(state, e.context, params)

    def run(self, episodes: list[Episode], handlers: dict[str, Handler]) -> list[Episode]:
        """Dispatch every episode's current state (``"start"`` for a new one) with no result,
        then keep collecting and dispatching until no episode waits for a segment or its tool
        calls; returns ``episodes``."""
        self._handlers = handlers
        for e in episodes:
            if not e.done:
                self._dispatch(e, None)
        self._search()
        while self._waiting or self._running:
            if self._waiting:
                self._collect()
                self._search()
            self._calls_back(wait=not self._waiting)
            self._search()
        return episodes

    def _collect(self) -> None:
        """Collect finished segments from the engine and dispatch each."""
        finished = self.engine.collect()
        if not finished:
            raise RuntimeError(
                f"the engine collected nothing with {len(self._waiting)} segments submitted"
            )
        for ticket, generation in finished:
            e, request = self._waiting.pop(ticket)
            e.turns.append(Turn(request.prompt_text, request.prompt, generation))
            self._dispatch(e, generation)

    def start(self, episodes: list[Episode]) -> None:
        """Start more episodes while the loop runs (from a handler): each one's current state
        is dispatched right after the request of the handler that started them, and their
        requests join the others'. ``run`` returns only the episodes it was given; the caller
        keeps the ones it started (e.g. EVO-RAG's sibling branches, started at a main
        episode's state as soon as it is reached)."""
        self._started.extend(e for e in episodes if not e.done)

    def _dispatch(self, e: Episode, result: Any) -> None:
        """Run the handler of ``e.state`` on ``result`` and act on the request it returns."""
        handler = self._handlers.get(e.state)
        if handler is None:
            raise KeyError(
                f"episode state {e.state!r} has no handler; handlers: {', '.join(self._handlers)}"
            )
        request = handler(self, e, result)
        if request is not None and e.done:
            raise ValueError(
                f"a handler ended its episode ({e.stop_reason!r}) and returned {request!r}"
            )
        if request is None:
            e.state = DONE
        elif isinstance(request, Generate):
            request = self._within_window(e, request)
            if request is not None:
                e.state = request.state
                self._waiting[self.engine.submit(request.prompt, request.params)] = (e, request)
        elif isinstance(request, Search):
            e.state = request.state
            self._searches.append((e, request))
        elif isinstance(request, CallTools):
            e.state = request.state
            self._calls.append((e, request))
        else:
            raise TypeError(
                f"handler of state {e.state!r} returned {request!r}; "
                "expected Generate, Search, CallTools or None"
            )
        started, self._started = self._started, []
        for other in started:  # episodes the handler started (``start``)
            self._dispatch(other, None)

    def _within_window(self, e: Episode, request: Generate) -> Generate | None:
        """``request`` with its budget cut to the room the engine's context window leaves
        after its prompt; None, and the episode ended as truncated, when there is none.

        Raises:
            InputError: The episode's first prompt does not fit with its budget (one line
                naming the example and the lengths).
        """
        if (
            self.window is None
            or len(request.prompt) + request.params.max_new_tokens <= self.window
        ):
            return request
        if not e.turns and not e.ids:  # the first prompt: nothing of the episode can go
            limit = ContextLimit(self.window, request.params.max_new_tokens)
            raise limit.too_long(e.example.id, len(request.prompt), what="first ")
        room = self.window - len(request.prompt)
        if room < 1:
            e.end(f"context full: {len(request.prompt)} tokens of {self.window}", truncated=True)
            return None
        return replace(request, params=replace(request.params, max_new_tokens=room))

    def _search(self) -> None:
        """The searches and tool calls asked for so far: one batched retriever call per ``k``,
        then each search's handler in the order asked; then every tool call started at once
        (without overlap: waited for, their handlers run in order); searches and calls those
        handlers ask for run next."""
        while self._searches or self._calls:
            self._run_searches()
            self._run_calls()

    def _run_calls(self) -> None:
        if not self._calls:
            return
        calls, self._calls = self._calls, []
        futures = self.tools.start([request.calls for _, request in calls])
        running = [(e, future) for (e, _), future in zip(calls, futures, strict=True)]
        if self.overlap:
            self._running.extend(running)
            return
        for e, future in running:
            self._dispatch(e, self._wait(future))

    def _calls_back(self, wait: bool) -> None:
        """Dispatch the episodes whose tool calls are all back, in the order asked; with
        ``wait``, first wait until one is."""
        if not self._running:
            return
        if wait:
            started = time.perf_counter()
            futures = [future for _, future in self._running]
            concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_COMPLETED)
            self.tool_wait_s += time.perf_counter() - started
        back: list[tuple[Episode, concurrent.futures.Future]] = []
        still: list[tuple[Episode, concurrent.futures.Future]] = []
        for item in self._running:  # one look at each: a call may finish meanwhile
            (back if item[1].done() else still).append(item)
        self._running = still
        for e, future in back:
            self._dispatch(e, future.result())

    def _wait(self, future: concurrent.futures.Future) -> list:
        """A tool call group's results, the time waited counted in :attr:`tool_wait_s`."""
        started = time.perf_counter()
        try:
            return future.result()
        finally:
            self.tool_wait_s += time.perf_counter() - started

    def _run_searches(self) -> None:
        if self._searches:
            searches, self._searches = self._searches, []
            results: dict[int, list] = {}
            for k in dict.fromkeys(s.k for _, s in searches):
                flat = [q for _, s in searches if s.k == k for q in s.queries]
                results[k] = list(self.retriever.search(flat, k)) if flat else []
            for e, s in searches:
                hits, results[s.k] = results[s.k][: len(s.queries)], results[s.k][len(s.queries) :]
                self._dispatch(e, hits)
