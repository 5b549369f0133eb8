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
"""

from __future__ import annotations

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

#: ``chat_template`` names a recipe may give
TEMPLATES = {"hermes": HERMES, "llama3": LLAMA3}


def chat_template(value: str | None) -> str | None:
    """The template a recipe's ``chat_template`` names: None (the tokenizer's own), a name in
    :data:`TEMPLATES`, or a path to a Jinja file (read as text; it only formats)."""
    if value is None or value in TEMPLATES:
        return None if value is None else TEMPLATES[value]
    path = Path(value)
    if path.suffix in (".jinja", ".j2", ".txt") and path.is_file():
        return path.read_text(encoding="utf-8")
    raise ValueError(
        f"environment chat_template: got {value!r}; allowed: {', '.join(TEMPLATES)}, a path to "
        "a .jinja file, or null (the tokenizer's own)"
    )
