"""Chat templates that show tools to a model whose own template has none (SmolLM2's ChatML, say).

A tool agent renders its conversation with the tokenizer's own template when it has one that
reads ``tools``; a recipe may name one of these instead (``chat_template: hermes``) or give a
Jinja file of its own. Each is the tool-calling part of a published template, so a model
trained here meets the same text at inference:

- ``hermes``: Qwen2.5's template (ChatML; tools listed in the system message inside
  ``<tools></tools>``, calls as ``<tool_call>`` JSON, results as ``<tool_response>`` blocks in
  a user turn), without Qwen's default system line.
- ``llama3``: Llama 3.1's JSON tool calling (tools listed in the first user message, calls as
  ``{"name": ..., "parameters": ...}``, results in ``ipython`` turns).

An assistant message's ``content`` is rendered as it is (the agent keeps the text the model
wrote, calls and all), so a rendering of the conversation reproduces what was sampled.

Training templates. A model's own template may rewrite earlier turns: Qwen3's drops an empty
think block and rewrites the newlines around reasoning, Llama 3.1's trims every message,
Mistral NeMo's refuses two assistant messages around tool results. Trained across tool turns,
the text the model saw while sampling is then not the text a re-rendering shows, so the
tokens trained are not the tokens an inference server would feed it. :func:`prefix_problem`
finds this by rendering a probe conversation turn by turn, and each family has a training
template here that renders earlier turns as they were sampled (``chat_template: qwen3``,
``llama3.1``, ``mistral``), the shape of TRL's ``qwen3_training.jinja``: the model's template
with the rewriting taken out. A tool agent whose model template fails the check trains with
its family's training template (one line says so) or stops with one line naming the turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERMES = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' or message['role'] == 'assistant' "
    "or (message['role'] == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA3 = (
    "{{- bos_token }}"
    "{%- set rest = messages %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + messages[0]['content'] "
    "+ '<|eot_id|>' }}"
    "{%- set rest = messages[1:] %}"
    "{%- endif %}"
    "{%- for message in rest %}"
    "{%- set role = 'ipython' if message['role'] == 'tool' else message['role'] %}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' }}"
    "{%- if tools and loop.first and message['role'] == 'user' %}"
    "{{- 'Given the following functions, please respond with a JSON for a function call with "
    "its proper arguments that best answers the given prompt.\\n\\nRespond in the format "
    '{\\"name\\": function name, \\"parameters\\": dictionary of argument name and its value}. '
    "Do not use variables.\\n\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson(indent=4) + '\\n\\n' }}{%- endfor %}"
    "{%- endif %}"
    "{{- message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

_SHIPPED = Path(__file__).resolve().parent / "chat_templates"
#: the training templates (module doc), by ``chat_template`` name
TRAINING = ("qwen3", "llama3.1", "mistral")
#: ``chat_template`` names a recipe may give
TEMPLATES = {"hermes": HERMES, "llama3": LLAMA3} | {
    name: (_SHIPPED / f"{name}.jinja").read_text(encoding="utf-8") for name in TRAINING
}
#: template family -> (its training template, its calls' parser)
FAMILIES = {
    "qwen3": ("qwen3", "hermes"),
    "chatml": ("hermes", "hermes"),
    "llama3": ("llama3.1", "llama3"),
    "mistral": ("mistral", "mistral"),
}


def chat_template(value: str | None) -> str | None:
    """The template a recipe's ``chat_template`` names: None (the tokenizer's own), a name in
    :data:`TEMPLATES`, or a path to a Jinja file (read as text; it only formats)."""
    if value is None or value in TEMPLATES:
        return None if value is None else TEMPLATES[value]
    path = Path(value)
    if path.suffix in (".jinja", ".j2", ".txt") and path.is_file():
        return path.read_text(encoding="utf-8")
    raise ValueError(
        f"environment chat_template: got {value!r}; allowed: {', '.join(TEMPLATES)}, own, a "
        "path to a .jinja file, or null (the tokenizer's own if it preserves prefixes, else "
        "its family's training template)"
    )


def family(template: str | None) -> str | None:
    """The family a template's text belongs to (a key of :data:`FAMILIES`), None if unknown."""
    text = template or ""
    if "<|im_start|>" in text:
        return "qwen3" if "<think>" in text else "chatml"
    if "<|start_header_id|>" in text:
        return "llama3"
    if "[INST]" in text:
        return "mistral"
    return None


#: what a probe conversation's assistant turns write: a call after reasoning, reasoning ending
#: in one newline, text with a leading space and a trailing newline, a plain answer
PROBE_TURNS = (
    "<think>\nThe town first.\n</think>\n\n"
    '<tool_call>\n{"name": "search", "arguments": {"query": "Mira Tolvan"}}\n</tool_call>',
    '<think>\nOne more.\n</think>\n{"name": "search", "parameters": {"query": "Kessa"}}',
    ' [TOOL_CALLS][{"name": "search", "arguments": {"query": "Dorvale"}}]\n',
    "Kessa",
)
SENTINEL = "\u2063lit-rag\u2063"


Render = Callable[[list[dict], bool], str]


def turn_end(render: Render, history: list[dict]) -> str:
    """What the template writes after an assistant message's text that follows ``history``
    (``<|im_end|>\\n``, ``<|eot_id|>``), whatever the text."""
    written = render([*history, {"role": "assistant", "content": SENTINEL}], False)
    return written[written.find(SENTINEL) + len(SENTINEL) :] if SENTINEL in written else ""


def generation_text(render: Render, messages: list[dict]) -> str | None:
    """What the generation prompt writes after the assistant header (Qwen3's empty think
    block when thinking is off): the text an assistant message must start with so that its
    rendering repeats the prompt it was sampled from; None when the prompt is not the start
    of an assistant message's rendering."""
    prompt = render(messages, True)
    written = render([*messages, {"role": "assistant", "content": SENTINEL}], False)
    head = written[: written.find(SENTINEL)] if SENTINEL in written else None
    if head is None or not prompt.startswith(head):
        return None
    return prompt[len(head) :]


def prefix_problem(render: Render, messages: list[dict]) -> str:
    """ "" when the template preserves prefixes over a probe tool conversation that starts
    with ``messages``: each assistant message renders as its prompt plus the text sampled,
    and each tool turn extends the rendering before it; else which turn breaks, in a few
    words. ``render(messages, add_generation_prompt)`` renders with the agent's tools."""
    try:
        return _probe(render, list(messages))
    except Exception as exc:  # noqa: BLE001 (a template that raises fails the check)
        return f"the template raised {type(exc).__name__}: {exc}"


def _probe(render: Render, messages: list[dict]) -> str:
    extra = generation_text(render, messages)
    if extra is None:
        return "the generation prompt is not how an assistant message starts"
    prompt = render(messages, True)
    for turn, text in enumerate(PROBE_TURNS, 1):
        messages.append({"role": "assistant", "content": extra + text})
        written = render(messages, False)
        if not written.startswith(prompt + text):
            return f"assistant turn {turn} is rendered differently from how it was sampled"
        if turn == len(PROBE_TURNS):
            return ""
        for call in range(2 if turn == 1 else 1):
            messages.append(
                {
                    "role": "tool",
                    "name": "search",
                    "content": f"Doc {call + 1}: Kessa is a harbour town.",
                    "tool_call_id": f"call{turn:03d}{call:02d}",
                }
            )
        prompt = render(messages, True)
        if not prompt.startswith(written):
            return f"the tool turn after assistant turn {turn} rewrites the text before it"
    return ""


@dataclass(frozen=True)
class Choice:
    """The template a tool agent renders with (None: the tokenizer's own), the parser of its
    family, and a line to print when it is not the one the recipe named."""

    template: str | None
    parser: str
    note: str = ""


def parser_of(template: str | None) -> str:
    """The calls' parser of a template's family (``hermes`` for an unknown one)."""
    known = family(template)
    return FAMILIES[known][1] if known else "hermes"


def choose(setting: str | None, own: str | None, check: Callable[[str | None], str]) -> Choice:
    """The template for ``setting`` (a recipe's ``chat_template``): ``own`` as it is; a name or
    file when it preserves prefixes; None: the model's own (``own``, its text) when it
    preserves prefixes, else its family's training template. ``check(template)`` gives
    :func:`prefix_problem` of a template (None: the model's own).

    Raises:
        ValueError: No template that preserves prefixes can be had (one line saying why).
    """
    if setting == "own":
        return Choice(None, parser_of(own))
    if setting is not None:
        text = chat_template(setting)
        problem = check(text)
        if problem:
            raise ValueError(
                f"environment chat_template {setting}: the template rewrites earlier turns "
                f"({problem}); give one that writes each message as it is"
            )
        return Choice(text, parser_of(text))
    if own is None:
        raise ValueError(
            "environment tool_agent needs a chat template: the tokenizer has none; set "
            "chat_template: hermes (or llama3, or a .jinja file)"
        )
    problem = check(None)
    if not problem:
        return Choice(None, parser_of(own))
    known = family(own)
    name = FAMILIES[known][0] if known else None
    fixed = "" if name is None else check(TEMPLATES[name])
    if name is None or fixed:
        raise ValueError(
            f"environment tool_agent: the model's chat template rewrites earlier turns "
            f"({problem}) and no training template of lit-rag's fits it; give chat_template: "
            "a .jinja file that writes each message as it is (or own to train with it anyway)"
        )
    return Choice(
        TEMPLATES[name],
        FAMILIES[known][1],
        f"lit-rag: tool_agent: the model's chat template rewrites earlier turns ({problem}); "
        f"training with lit-rag's {name} training template, which writes them as sampled "
        "(chat_template: own keeps the model's)",
    )
