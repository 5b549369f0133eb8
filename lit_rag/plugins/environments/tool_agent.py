"""A tool-calling agent: the chat template's own function calling, token-exact across tool turns.

The conversation is OpenAI-style messages. The tools' JSON schemas go to the chat template
(``apply_chat_template(messages, tools=...)``), the model's calls are read by the template
family's parser (``hermes``: ``<tool_call>`` JSON, Qwen2.5 / Hermes; ``llama3``: Llama 3.1's
JSON calls; or a recipe's own), every call of a turn runs concurrently (and with the calls of
every other episode that reached a tool turn in the same batch of finished segments), and the
results come back as ``tool`` messages. This is the interface verl's agent loop
(``verl/experimental/agent_loop/tool_agent_loop.py``), TRL's ``tools``, SkyRL, AReaL and
verifiers train through; Search-R1's setting (Jin et al., 2025: search, then answer) is the
default tool set ``search`` + ``answer``.

Token-exact turns (what TRL 5224 / verl 6719 got wrong). The engine continues the token ids it
sampled, never a re-encoding of their text:

- the trained tokens are the engine's sampled ids (loss mask 1, their sampling log-probs);
- a tool turn's tokens are the difference of two renderings of the conversation: the one
  ending with the assistant message and the one ending with the tool messages and the next
  assistant header (``add_generation_prompt``), plus what the template writes after the
  sampled text of the assistant message (ChatML's newline after ``<|im_end|>``); they get
  loss mask 0 and log-prob 0;
- after each tool turn the ids so far are checked against a full re-rendering of the messages,
  tokenized, until the first difference: an episode where they differ is counted
  (``rollout/template_mismatch``, the share of episodes; the turn, the tokens that differ from
  there on and both texts in ``meta["template_mismatches"]``) and trained as sampled, never
  replaced.
  A mismatch means what the model saw in training is not what a re-rendering (an inference
  server's) would show it: a tokenizer that merges across the boundary, a template that
  rewrites history (Qwen3 drops past ``<think>`` blocks).

Failures never crash an episode: a call that does not parse (``malformed``), names no tool
(``unknown_tool``), has arguments its schema refuses (``bad_arguments``), fails
(``tool_error``) or runs past its timeout (``timeout``) becomes an error message in the tool
turn and a count (``rollout/tool_errors/<kind>``); a tool server that dies (``server_died``)
fails the episode (no answer, :attr:`ToolEpisode.failed`) or, with ``on_server_death: stop``,
stops the run with one line. Budgets per episode: assistant turns, tool calls, tokens of tool
output (a call past a budget gets an error message, counted as ``budget``), and the whole
response.
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from dataclasses import replace
from typing import Any

import torch

from lit_rag.api import (
    ENVIRONMENT_ERRORS,
    TOOL_ERRORS,
    CallTools,
    ContextLimit,
    Environment,
    Episode,
    EpisodeLoop,
    Example,
    Generation,
    InputError,
    McpServer,
    Request,
    Retriever,
    RolloutEngine,
    SamplingParams,
    Step,
    ToolBox,
    ToolEpisode,
    ToolResult,
    Trajectory,
    build_tools,
    choose_tool_template,
    connect_mcp,
    extract_tag,
    start_episodes,
    template_opening,
    template_prefix_problem,
    template_turn_end,
    tool_call_parser,
    tool_chat_template,
)

DEFAULT_SYSTEM_PROMPT = (
    "Answer the user's question. Search for the facts you need with the search tool, then "
    "call the answer tool with a short answer (a name, a place, a number)."
)

#: What an episode does when a tool's server dies: ``fail_episode`` (no answer, the run goes
#: on) or ``stop`` (the run stops with one line).
ON_SERVER_DEATH = ("fail_episode", "stop")


class ToolAgentEnvironment(Environment):
    """A chat agent with tools (module doc).

    Args:
        tools: The tools, each a registered tool name or dotted path (``search``, ``fetch``,
            ``answer``, a package's), or ``{name: ..., init_args: {...}}``.
        retriever: The retriever the built-in ``search`` and ``fetch`` use.
        mcp_servers: MCP servers whose tools join these (:class:`~lit_rag.api.McpServer`).
        system_prompt: The system message ("" for none).
        prompt_template: The user message, with ``{question}``.
        chat_template: None: the tokenizer's own (it must render ``tools``) when it preserves
            prefixes, else its family's training template (one line says so; a template
            neither fixes stops the run with one line); ``own``: the tokenizer's own as it is;
            a name (:mod:`lit_rag.tools.templates`: ``hermes`` and ``llama3`` for models
            whose template shows no tools, the training templates ``qwen3``, ``llama3.1``,
            ``mistral``); or a path to a Jinja file.
        parser: How calls are read: ``auto`` (the template family's: ``hermes`` for Qwen and
            ChatML, ``llama3``, ``mistral``), ``hermes``, ``llama3``, ``mistral`` or a dotted
            path to a function.
        max_turns: Assistant turns per episode.
        max_calls: Tool calls the model may write per episode, well-formed or not (calls past
            it get an error message and do not run).
        max_tool_tokens: Tokens of tool output per episode (results past it get an error).
        max_result_tokens: One result is cut to this many tokens (None: whole); error
            messages are never cut.
        max_response_tokens: The whole completion, tool turns included.
        answer_tool: The tool whose call ends the episode; its ``answer`` argument is the answer.
        answer_tag: Without an answer call, read the answer from this tag of the last
            message (e.g. ``answer``); None: the last message's text is the answer.
        check_rendering: Check each tool turn against a full re-rendering (module doc).
        on_server_death: :data:`ON_SERVER_DEATH`, for a tool that does not say (an MCP
            server's ``on_death`` does).
        chat_template_kwargs: Keyword arguments of the chat template.
        assistant_prefix: Text that starts the first assistant turn (part of the prompt, not
            trained), e.g. the start of a search call for a small model that writes none.
        batch_tool_calls: The calls of a batched tool (the built-in ``search``) that episodes
            make together go out as one call (one retriever search for all their queries).
        overlap_tools: Keep generating other episodes' turns while tool calls run; None: where
            the engine batches continuously (vLLM), not with the ``hf`` engine.
    """

    def __init__(
        self,
        tools: list[str | dict] | None = None,
        retriever: Retriever | None = None,
        mcp_servers: list[McpServer] | None = None,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        prompt_template: str = "{question}",
        chat_template: str | None = None,
        parser: str = "auto",
        max_turns: int = 4,
        max_calls: int = 8,
        max_tool_tokens: int = 1024,
        max_result_tokens: int | None = 256,
        max_response_tokens: int = 1024,
        answer_tool: str = "answer",
        answer_tag: str | None = None,
        check_rendering: bool = True,
        on_server_death: str = "fail_episode",
        chat_template_kwargs: dict | None = None,
        assistant_prefix: str = "",
        batch_tool_calls: bool = True,
        overlap_tools: bool | None = None,
    ) -> None:
        self.tool_specs = ["search", "answer"] if tools is None else list(tools)
        self.retriever = retriever
        self.mcp_servers = list(mcp_servers or [])
        self.system_prompt, self.prompt_template = system_prompt, prompt_template
        if chat_template not in (None, "own"):
            tool_chat_template(chat_template)  # a name or file that is neither: one line now
        self.chat_template = chat_template
        self.parser = parser
        self.parse = None if parser == "auto" else tool_call_parser(parser)
        self.max_turns, self.max_calls = max_turns, max_calls
        self.max_tool_tokens, self.max_result_tokens = max_tool_tokens, max_result_tokens
        self.max_response_tokens = max_response_tokens
        self.answer_tool, self.answer_tag = answer_tool, answer_tag
        self.check_rendering = check_rendering
        self.on_server_death = on_server_death
        self.chat_template_kwargs = chat_template_kwargs
        self.assistant_prefix = assistant_prefix
        self.batch_tool_calls, self.overlap_tools = batch_tool_calls, overlap_tools
        self._check_settings()
        self._toolbox: ToolBox | None = None
        self._dead: set[str] = set()  # tools whose server was reported dead
        self._template: tuple[int, Any] | None = None  # (id(tokenizer), Choice)

    def _check_settings(self) -> None:
        if "{question}" not in self.prompt_template:
            raise ValueError(
                f"environment prompt_template must contain {{question}}: {self.prompt_template!r}"
            )
        if self.on_server_death not in ON_SERVER_DEATH:
            raise ValueError(
                f"environment on_server_death: got {self.on_server_death!r}; allowed: "
                f"{', '.join(ON_SERVER_DEATH)}"
            )
        for name in ("max_turns", "max_calls", "max_tool_tokens", "max_response_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"environment {name} must be >= 1, got {getattr(self, name)}")
        if self.max_result_tokens is not None and self.max_result_tokens < 1:
            raise ValueError(
                f"environment max_result_tokens must be >= 1 or null, got {self.max_result_tokens}"
            )

    # ---- tools -----------------------------------------------------------------------------
    @property
    def toolbox(self) -> ToolBox:
        """The agent's tools, built (and the MCP servers connected) on first use."""
        if self._toolbox is None:
            box = ToolBox(
                build_tools(self.tool_specs, retriever=self.retriever),
                batch=self.batch_tool_calls,
                overlap=self.overlap_tools,
            )
            if self.mcp_servers:
                servers = [
                    s if isinstance(s, McpServer) else McpServer(**s) for s in self.mcp_servers
                ]
                try:
                    box.add(connect_mcp(servers, box))
                except (RuntimeError, ValueError) as exc:
                    box.close()
                    raise InputError(f"environment tool_agent: {exc}") from None
            self._toolbox = box
        return self._toolbox

    def setup(self) -> None:
        """Build the tools, connect the MCP servers and open the retriever's index now, so a
        missing one fails before the first rollout."""
        if self.retriever is not None:
            self.retriever.search(["lit-rag index check"], 1)
        _ = self.toolbox

    def close(self) -> None:
        """Stop the tools (MCP servers' sessions, the tools' event loop)."""
        if self._toolbox is not None:
            self._toolbox.close()
            self._toolbox = None

    def __getstate__(self) -> dict:  # a copy for another process opens its own tools
        return {**self.__dict__, "_toolbox": None, "_template": None}

    # ---- rendering -------------------------------------------------------------------------
    def messages(self, example: Example) -> list[dict[str, Any]]:
        """The conversation's first messages: the system prompt and the question."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [
            *system,
            {"role": "user", "content": self.prompt_template.format(question=example.question)},
        ]

    def render(self, tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
        """The conversation as the chat template writes it, the tools' schemas included."""
        return self._render(
            tokenizer, self.template(tokenizer).template, messages, add_generation_prompt
        )

    def _render(self, tokenizer, template, messages: list[dict], generation: bool) -> str:
        if template is None and getattr(tokenizer, "chat_template", None) is None:
            raise InputError(
                "environment tool_agent needs a chat template: the tokenizer has none; set "
                "chat_template: hermes (or llama3, or a .jinja file)"
            )
        return tokenizer.apply_chat_template(
            messages,
            tools=self.toolbox.schemas(),
            chat_template=template,
            add_generation_prompt=generation,
            tokenize=False,
            **(self.chat_template_kwargs or {}),
        )

    def template(self, tokenizer):
        """The template this tokenizer's conversations render with, chosen once
        (:func:`~lit_rag.api.choose_tool_template`): the model's own when every rendering
        extends the previous one over a probe tool conversation, else its family's training
        template (one line on stderr), else one line stops the run."""
        if self._template is None or self._template[0] != id(tokenizer):
            _ = self.toolbox  # built first: the probe catches only the template's own errors
            system = [{"role": "system", "content": self.system_prompt or "Answer."}]
            probe = [*system, {"role": "user", "content": "Where was Mira Tolvan born?"}]

            def check(template) -> str:
                return template_prefix_problem(
                    lambda m, g: self._render(tokenizer, template, m, g), probe
                )

            try:
                choice = choose_tool_template(
                    self.chat_template, getattr(tokenizer, "chat_template", None), check
                )
            except ValueError as exc:
                raise InputError(str(exc)) from None
            if choice.note:
                print(choice.note, file=sys.stderr, flush=True)
            self._template = (id(tokenizer), choice)
        return self._template[1]

    def parser_for(self, tokenizer):
        """The parser of the model's calls (``auto``: the template family's)."""
        return self.parse or tool_call_parser(self.template(tokenizer).parser)

    def chosen_parser(self):
        """The parser of the calls once a template is chosen (``hermes`` before)."""
        if self.parse is not None:
            return self.parse
        return tool_call_parser(self._template[1].parser if self._template else "hermes")

    def opening(self, tokenizer, messages: list[dict]) -> str:
        """What the generation prompt writes after the assistant header (Qwen3's empty think
        block with thinking off); an assistant message starts with it so that its rendering
        repeats the prompt it was sampled from."""
        return template_opening(lambda m, g: self.render(tokenizer, m, g), messages) or ""

    def build_prompt(self, example: Example, tokenizer) -> str:
        rendered = self.render(tokenizer, self.messages(example), add_generation_prompt=True)
        return rendered + self.assistant_prefix

    # ---- rollout ---------------------------------------------------------------------------
    def rollout(
        self,
        examples: list[Example],
        engine: RolloutEngine,
        group_size: int,
        params: SamplingParams,
    ) -> list[Trajectory]:
        """Every episode to its end through the :class:`~lit_rag.api.EpisodeLoop` (tool calls
        are its :class:`~lit_rag.api.CallTools` requests)."""
        prompts = self.prompts(
            examples, engine.tokenizer, group_size, ContextLimit.of(engine, params)
        )
        loop = EpisodeLoop(engine, params, self.retriever, tools=self.toolbox)
        handlers = {"start": self._start, "assistant": self._assistant, "tools": self._results}
        episodes = loop.run(start_episodes(examples, prompts), handlers)
        return [self._trajectory(e) for e in episodes]

    def _start(self, loop: EpisodeLoop, e: Episode, _: None) -> Request:
        messages = self.messages(e.example)
        e.meta.update(
            messages=messages,
            rendered=e.prompt_text,  # the text of the ids so far, as the template wrote it
            opening=self.opening(loop.tokenizer, messages),
            turns=0,
            written=0,
            calls=Counter(),
            errors=Counter(),
            tool_tokens=0,
            answer=None,
            failed="",
            mismatch=0,
            retokenized=0,
            mismatches=[],
            checked=(0, 0),  # (our ids, the rendering's tokens) the last check covered
        )
        return self._next_turn(loop, e)

    def _next_turn(self, loop: EpisodeLoop, e: Episode) -> Request:
        if e.meta["turns"] >= self.max_turns:
            e.end("max_turns")
            return None
        return loop.segment(e, "assistant", self.max_response_tokens)

    def _assistant(self, loop: EpisodeLoop, e: Episode, gen: Generation) -> Request:
        """An assistant turn came back: no call ends the episode with the message as the
        answer; calls go to the tools, those past the call budget get an error."""
        e.generated(gen)
        e.meta["turns"] += 1
        written = turn_text(loop.tokenizer, gen.token_ids.tolist())
        first = self.assistant_prefix if e.meta["turns"] == 1 else ""
        text = e.meta["opening"] + first + written  # the message, as the template repeats it
        e.meta["messages"].append({"role": "assistant", "content": text})
        parsed = self.parser_for(loop.tokenizer)(text)
        if not gen.finished:  # cut by a token budget (the segment's or the response's)
            e.truncated = True
            whole = [c for c in parsed.calls if not isinstance(c, ToolResult)]
            if len(e.ids) >= self.max_response_tokens or not whole:
                e.steps.append(Step(action="truncated", text=text))
                e.meta["answer"] = self._written_answer(parsed)  # an answer call in full
                e.end("max_response_tokens", truncated=True)
                return None
            parsed.calls = whole  # the calls written in full run; the cut one does not
        if not parsed.calls:
            e.steps.append(Step(action="message", text=text))
            e.meta["answer"] = self._message_answer(parsed.content)
            e.end("message")
            return None
        e.steps.append(Step(action="tool_calls", text=text))
        allowed = max(self.max_calls - e.meta["written"], 0)  # every call written counts
        calls = [self._numbered(c, e.meta["written"] + i) for i, c in enumerate(parsed.calls)]
        e.meta["written"] += len(parsed.calls)
        spent = f"Error: the tool call budget ({self.max_calls} per episode) is spent; answer now"
        calls = calls[:allowed] + [
            ToolResult(c.call if isinstance(c, ToolResult) else c, spent, "budget")
            for c in calls[allowed:]
        ]
        for call in calls:
            if not isinstance(call, ToolResult) and call.name == "search":
                e.steps.append(Step(action="search", query=str(call.arguments.get("query", ""))))
        return CallTools("tools", calls)

    def _written_answer(self, parsed) -> str | None:
        """The argument of an answer call the turn wrote (None without one)."""
        for call in parsed.calls:
            if not isinstance(call, ToolResult) and call.name == self.answer_tool:
                return str(call.arguments.get("answer", "")).strip() or None
        return None

    @staticmethod
    def _numbered(call, n: int):
        """A call with an id unique in its episode, nine letters and digits (``call00003``:
        Mistral's templates take no other), unless the model wrote its own."""
        if isinstance(call, ToolResult) or (call.id and not call.id.startswith("call_")):
            return call
        return replace(call, id=f"call{n:05d}")

    def _results(self, loop: EpisodeLoop, e: Episode, results: list[ToolResult]) -> Request:
        """The turn's results: counted, an answer or a dead server ends the episode, the rest
        become the tool turn (module doc). A call the environment failed (a dead server, a
        timeout) marks the episode failed: it leaves the loss."""
        for result in results:
            if result.call is not None and result.error not in (
                "unknown_tool",
                "bad_arguments",
                "budget",
            ):
                e.meta["calls"][result.call.name] += 1
            if result.error:
                e.meta["errors"][result.error] += 1
            if result.error in ENVIRONMENT_ERRORS and not e.meta["failed"]:
                e.meta["failed"] = result.text.removeprefix("Error: ")
            elif not result.error and result.call is not None:
                self._dead.discard(result.call.name)  # back: a later death is said again
        died = [r for r in results if r.error == "server_died"]
        if died:
            tool = self.toolbox.tools.get(died[0].call.name) if died[0].call else None
            if (getattr(tool, "on_death", None) or self.on_server_death) == "stop":
                why = died[0].text.removeprefix("Error: ")
                raise InputError(f"environment tool_agent: {why} (on_server_death: stop)")
            e.meta["failed"] = died[0].text.removeprefix("Error: ")
            e.meta["answer"] = None
            e.end("server_died")
            self._say_died(died[0])
            return None
        for result in results:
            if (
                result.call is not None
                and result.call.name == self.answer_tool
                and not result.error
            ):
                e.meta["answer"] = str(result.call.arguments.get("answer", "")).strip() or None
                e.steps.append(Step(action="answer", text=e.meta["answer"] or ""))
                e.end("answer")
                return None
        e.meta["messages"].extend(self._tool_message(loop, e, r) for r in results)
        self._insert_tool_turn(loop, e)
        return None if e.done else self._next_turn(loop, e)

    def _say_died(self, result: ToolResult) -> None:
        """One stderr line the first time a tool's server is found dead (its episodes fail)."""
        name = result.call.name if result.call is not None else "?"
        if name in self._dead:
            return
        self._dead.add(name)
        why = result.text.removeprefix("Error: ")
        print(
            f"lit-rag: tool_agent: {why}; the episodes that call {name} fail "
            "(on_server_death: fail_episode)",
            file=sys.stderr,
            flush=True,
        )

    def _tool_message(self, loop: EpisodeLoop, e: Episode, result: ToolResult) -> dict:
        text = result.text
        ids = loop.encode(text)
        cut = self.max_result_tokens is not None and not result.error  # errors stay whole
        if cut and len(ids) > self.max_result_tokens:
            text = loop.tokenizer.decode(ids[: self.max_result_tokens]) + " ..."
            ids = ids[: self.max_result_tokens]
        if e.meta["tool_tokens"] + len(ids) > self.max_tool_tokens:
            text = (
                f"Error: the tool output budget ({self.max_tool_tokens} tokens per episode) is "
                "spent; answer now"
            )
            e.meta["errors"]["budget"] += 1
        else:
            e.meta["tool_tokens"] += len(ids)
        name = result.call.name if result.call is not None else "invalid"
        message = {"role": "tool", "name": name, "content": text}
        if result.call is not None and result.call.id:
            message["tool_call_id"] = result.call.id
        return message

    def _insert_tool_turn(self, loop: EpisodeLoop, e: Episode) -> None:
        """Insert the tool turn's tokens: what the template writes after the assistant message
        (its end-of-turn text, less what was sampled of it), then the difference of the
        renderings before and after the tool messages (module doc)."""
        tokenizer, messages = loop.tokenizer, e.meta["messages"]
        tool_count = 0
        while messages[-1 - tool_count]["role"] == "tool":
            tool_count += 1
        with_assistant = self.render(tokenizer, messages[:-tool_count], add_generation_prompt=False)
        full = self.render(tokenizer, messages, add_generation_prompt=True)
        sampled = tokenizer.decode(
            e.turns[-1].generation.token_ids.tolist(), skip_special_tokens=False
        )
        before = e.meta["rendered"] + (self.assistant_prefix if e.meta["turns"] == 1 else "")
        if with_assistant.startswith(before + sampled):
            tail = with_assistant[len(before) + len(sampled) :]
        else:  # the template rewrote the history or the message: what it writes after one
            render = functools.partial(self.render, tokenizer)
            tail = unsampled(sampled, template_turn_end(render, messages[: -tool_count - 1]))
        delta = (
            full[len(with_assistant) :]
            if full.startswith(with_assistant)
            else self._tool_turn_alone(tokenizer, messages[-tool_count:])
        )
        text = tail + delta
        ids = loop.encode(text)
        left = self.max_response_tokens - len(e.ids)
        if len(ids) >= left:
            kept = ids[: max(left, 0)]
            e.insert(kept, tokenizer.decode(kept))
            e.end("max_response_tokens", truncated=True)
            return
        e.insert(ids, text)
        e.meta["rendered"] = full
        if self.check_rendering:
            self._check(tokenizer, e, full)

    def _tool_turn_alone(self, tokenizer, tools: list[dict]) -> str:
        """The tool messages' rendering as verl writes it: a one-message conversation with and
        without them (for a template that rewrites the history it is given)."""
        base = [{"role": "user", "content": "x"}]
        without = self.render(tokenizer, base, add_generation_prompt=False)
        return self.render(tokenizer, base + tools, add_generation_prompt=True)[len(without) :]

    def _check(self, tokenizer, e: Episode, full: str) -> None:
        """Compare the tokens since the last check with the same stretch of ``full`` (the
        conversation re-rendered) tokenized; a turn where they differ is counted, with where
        and how many tokens, in ``meta["template_mismatches"]``: as a template mismatch when
        the texts differ, as retokenized when only the tokens do (the engine sampled ids that
        are not the tokenizer's encoding of their own text: a server that re-tokenizes the
        conversation feeds the model other ids, no template can help). Each turn is compared
        on its own, so one early difference neither hides nor repeats in later turns."""
        ours = e.prompt_ids + e.ids
        rendered = tokenizer(full, add_special_tokens=False)["input_ids"]
        (mine, theirs), e.meta["checked"] = e.meta["checked"], (len(ours), len(rendered))
        new, again = ours[mine:], rendered[theirs:]
        differ = sum(a != b for a, b in zip(new, again, strict=False)) + abs(len(new) - len(again))
        if not differ:
            return
        at = next(
            (i for i, (a, b) in enumerate(zip(new, again, strict=False)) if a != b),
            min(len(new), len(again)),
        )
        same_text = tokenizer.decode(new, skip_special_tokens=False) == tokenizer.decode(
            again, skip_special_tokens=False
        )
        e.meta["retokenized" if same_text else "mismatch"] += 1
        e.meta["mismatches"].append(
            {
                "turn": e.meta["turns"],
                # tokens: the same text, tokenized otherwise (the sampled ids are not the
                # tokenizer's own encoding of their text); template: another text
                "kind": "tokens" if same_text else "template",
                "tokens": differ,
                "trained": tokenizer.decode(new[max(at - 4, 0) : at + 8]),
                "rendered": tokenizer.decode(again[max(at - 4, 0) : at + 8]),
            }
        )

    def _message_answer(self, content: str) -> str | None:
        """The answer in a final message's text (its reasoning already left out by the
        parser): the ``answer_tag``'s text when one is set, else the whole text."""
        if self.answer_tag:
            return extract_tag(content, self.answer_tag)
        return content.strip() or None

    def _trajectory(self, e: Episode) -> Trajectory:
        if not e.stop_reason:
            e.end("max_turns")
        meta = e.meta
        trajectory = self.trajectory(
            e.example,
            e.group,
            e.prompt_ids,
            e.ids,
            e.logprobs,
            e.text,
            loss_mask=e.mask,
            prompt_text=e.prompt_text,
            steps=e.steps,
            truncated=e.truncated,
            pieces=e.pieces,
            sampled=e.sampled,
            versions=e.versions,
            meta={"messages": meta["messages"], "template_mismatches": meta["mismatches"]},
        )
        trajectory.contract = ToolEpisode(
            stop_reason=e.stop_reason,
            turns=meta["turns"],
            calls=dict(meta["calls"]),
            errors=dict(meta["errors"]),
            answer=meta["answer"],
            failed=meta["failed"],
            template_mismatch=meta["mismatch"],
            retokenized=meta["retokenized"],
            written=meta["written"],
        )
        trajectory.failed = meta["failed"]
        return trajectory

    # ---- answers and metrics ---------------------------------------------------------------
    def extract_answer(self, trajectory: Trajectory) -> str:
        """The answer tool's argument, else the last message's answer ("" for none)."""
        episode = ToolEpisode.find(trajectory, "environment tool_agent (extract_answer)")
        return (episode.answer if episode is not None else None) or ""

    def metrics(self, trajectories: list[Trajectory]) -> dict[str, torch.Tensor]:
        """Per-episode means: turns, tool calls, well-formed turns, answered, failed, each
        error kind, mismatched tokens; and the response length."""
        episodes = [ToolEpisode.find(t, "environment tool_agent (metrics)") for t in trajectories]
        episodes = [e for e in episodes if e is not None]
        if not episodes:
            return {}

        def mean(values) -> torch.Tensor:
            return torch.tensor([float(v) for v in values]).mean()

        written = sum(e.written for e in episodes)
        failed_calls = sum(v for e in episodes for k, v in e.errors.items() if k != "budget")
        found = {
            "turns": mean(e.turns for e in episodes),
            "tool_calls": mean(sum(e.calls.values()) for e in episodes),
            "answered": mean(e.answer is not None for e in episodes),
            "failed": mean(bool(e.failed) for e in episodes),
            "template_mismatch": mean(e.template_mismatch > 0 for e in episodes),
            "template_mismatch_turns": mean(e.template_mismatch for e in episodes),
            "retokenized": mean(e.retokenized > 0 for e in episodes),
            "tool_error_rate": torch.tensor(min(failed_calls / written, 1.0) if written else 0.0),
            "response_length": mean(t.completion_ids.numel() for t in trajectories),
        }
        for kind in (*TOOL_ERRORS, "budget"):  # every kind, every step: steady columns
            found[f"tool_errors/{kind}"] = mean(e.errors.get(kind, 0) for e in episodes)
        return found


def turn_text(tokenizer, ids: list[int]) -> str:
    """An assistant turn's text as the template writes it back: its ids decoded with special
    tokens kept (Mistral's ``[TOOL_CALLS]``, Llama's ``<|python_tag|>``), less the special
    tokens that end it (``<|im_end|>``, ``<|eot_id|>``, ``</s>``: the template writes its own)."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    end = len(ids)
    while end and ids[end - 1] in special:
        end -= 1
    return tokenizer.decode(ids[:end], skip_special_tokens=False)


def unsampled(sampled: str, turn_end: str) -> str:
    """``turn_end`` less its start that ``sampled`` already ends with: ChatML's
    ``<|im_end|>\\n`` after a turn that sampled ``<|im_end|>`` is ``\\n``."""
    for n in range(min(len(turn_end), len(sampled)), 0, -1):
        if sampled.endswith(turn_end[:n]):
            return turn_end[n:]
    return turn_end
