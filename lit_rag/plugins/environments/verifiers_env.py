"""A verifiers environment (``verifiers.v1``, an installed taskset package) as a tool agent.

verifiers' environments are tasks (a prompt, a system prompt, an answer or info), tools (MCP
toolsets) and reward functions. This environment takes the first two from an installed
environment (:class:`~lit_rag.api.VerifiersEnv`, loaded once) and rolls them out with lit-rag's
engine through :class:`~lit_rag.plugins.environments.tool_agent.ToolAgentEnvironment`: the
task's own first messages, the toolsets' tools rendered by the chat template, token-exact tool
turns. verifiers' rollout is not used: its harness programs call a model server, lit-rag
samples the tokens itself. The episode ends when the model replies without a tool call (as in
verifiers' chat loop: there is no answer tool), the reply being the answer.

Each trajectory keeps the conversation OpenAI-style in ``meta["verifiers_conversation"]``
(assistant ``tool_calls`` read by the parser, tool messages tied to them), which the
``verifiers_rubric`` reward scores with the environment's reward functions. The examples are
the environment's tasks: ``data.train: verifiers:<env-id>``, or :meth:`examples`.
"""

from __future__ import annotations

import copy
from typing import Any

from lit_rag.api import (
    Example,
    InputError,
    ToolBox,
    Trajectory,
    VerifiersEnv,
    registry,
    verifiers_conversation,
)

#: The built-in tool agent, through the registry (a plugin imports only ``lit_rag.api``).
ToolAgentEnvironment = registry.resolve("environment", "tool_agent")


class VerifiersEnvironment(ToolAgentEnvironment):
    """A verifiers environment's tasks and tools as a tool agent (module doc).

    Args:
        environment: The verifiers environment's id: its installed package
            (``vf-corpus-env`` imports ``vf_corpus_env``; a hub id ``owner/name@version``
            imports ``name``).
        env_args: Its taskset config's fields (e.g. ``{"split": "train"}``; ``task: {...}``
            for the task config).
        chat_template: None: the tokenizer's own (it must render ``tools``) when it preserves
            prefixes, else its family's training template; ``own``, a name or a Jinja file
            (:class:`ToolAgentEnvironment`).
        parser: How calls are read: ``auto`` (the template family's), ``hermes``, ``llama3``,
            ``mistral`` or a dotted path.
        max_turns: Assistant turns per episode.
        max_calls: Tool calls per episode.
        max_tool_tokens: Tokens of tool output per episode.
        max_result_tokens: One result is cut to this many tokens (None: whole).
        max_response_tokens: The whole completion, tool turns included.
        answer_tag: Read the answer from this tag of the last message (None: its text).
        check_rendering: Check each tool turn against a full re-rendering.
        chat_template_kwargs: Keyword arguments of the chat template.
        tool_timeout_s: A tool call that runs longer fails with ``timeout``.
    """

    def __init__(
        self,
        environment: str,
        env_args: dict | None = None,
        chat_template: str | None = None,
        parser: str = "auto",
        max_turns: int = 4,
        max_calls: int = 8,
        max_tool_tokens: int = 1024,
        max_result_tokens: int | None = 256,
        max_response_tokens: int = 1024,
        answer_tag: str | None = None,
        check_rendering: bool = True,
        chat_template_kwargs: dict | None = None,
        tool_timeout_s: float = 30.0,
    ) -> None:
        if not isinstance(environment, str) or not environment.strip():
            raise ValueError(
                f"environment verifiers: environment must be an id, got {environment!r}"
            )
        super().__init__(
            tools=[],
            system_prompt="",
            chat_template=chat_template,
            parser=parser,
            max_turns=max_turns,
            max_calls=max_calls,
            max_tool_tokens=max_tool_tokens,
            max_result_tokens=max_result_tokens,
            max_response_tokens=max_response_tokens,
            answer_tool="",  # no answer tool: a reply without calls ends the episode
            answer_tag=answer_tag,
            check_rendering=check_rendering,
            chat_template_kwargs=chat_template_kwargs,
        )
        if tool_timeout_s <= 0:
            raise ValueError(
                f"environment verifiers: tool_timeout_s must be > 0, got {tool_timeout_s}"
            )
        self.environment = environment.strip()
        self.env_args = dict(env_args or {})
        self.tool_timeout_s = tool_timeout_s
        self._vf: VerifiersEnv | None = None

    @property
    def vf(self) -> VerifiersEnv:
        """The verifiers environment, loaded on first use (once per process)."""
        if self._vf is None:
            self._vf = VerifiersEnv.load(self.environment, self.env_args)
        return self._vf

    def __getstate__(self) -> dict:  # a copy for another process loads its own
        return {**super().__getstate__(), "_vf": None}

    # ---- data and tools --------------------------------------------------------------------
    def examples(self, limit: int | None = None) -> list[Example]:
        """The environment's tasks as examples (the first ``limit``), what
        ``data.train: verifiers:<env-id>`` loads."""
        return self.vf.examples(limit)

    @property
    def toolbox(self) -> ToolBox:
        """The environment's toolsets' tools (built on first use)."""
        if self._toolbox is None:
            self._toolbox = ToolBox(
                self.vf.tools(timeout_s=self.tool_timeout_s),
                batch=self.batch_tool_calls,
                overlap=self.overlap_tools,
            )
        return self._toolbox

    def setup(self) -> None:
        """Load the environment and list its tools now, so a missing one fails before the
        first rollout."""
        _ = self.toolbox

    # ---- rendering -------------------------------------------------------------------------
    def messages(self, example: Example) -> list[dict[str, Any]]:
        """The task's own first messages (its system prompt, then its prompt)."""
        found = example.meta.get(VerifiersEnv.META_MESSAGES)
        if found is None:
            if VerifiersEnv.META_TASK not in example.meta:
                raise InputError(
                    f"environment verifiers: example {example.id!r} is not one of "
                    f"{self.environment}'s tasks; train on data.train: "
                    f"{VerifiersEnv.SOURCE_PREFIX}{self.environment}"
                )
            found = self.vf.prompt_messages(self.vf.task_for(example))
        return copy.deepcopy(list(found))

    # ---- trajectories ----------------------------------------------------------------------
    def _trajectory(self, e) -> Trajectory:
        trajectory = super()._trajectory(e)
        trajectory.meta[VerifiersEnv.META_CONVERSATION] = verifiers_conversation(
            trajectory.meta["messages"], self.chosen_parser()
        )
        return trajectory
