"""The real tokenizers of ``tests/real_tokenizers.py`` encode exactly as the models' own.

Qwen2.5 / Qwen3 and Llama 3.1: every input of llama.cpp's tokenizer tests encodes to the ids
its reference files hold (``tests/fixtures/vocab_reference/``, written with the hub tokenizers);
Llama 3.1 also agrees with Meta's own tiktoken tokenizer (``llama_models``) on more text and
its special tokens. Mistral NeMo agrees with mistral-common's Tekkenizer on text, control
tokens and a whole chat request with tools. And every family's real chat template renders a
conversation with tools (Qwen3 with and without thinking) to text whose control tokens are
single ids that decode back to it.
"""

from __future__ import annotations

from functools import cache

import pytest
from real_tokenizers import (
    FAMILIES,
    FIXTURES,
    LLAMA_MODELS,
    MISTRAL_COMMON,
    package_file,
    template_text,
    tokenizer,
)

TEXTS = (
    "Hello world",
    " Hello world",
    "Who founded Orbel Mills? Mira Tolvan, born in Kessa (1987).",
    "Ünïcödé naïve café; e\u0301 composed and decomposed; Straße, ΑΒΓ, Привет",
    "日本語のテキストと中文文本，한국어 텍스트",
    "emoji 🤖👍🏽 and flags 🇫🇷",
    "numbers 1 12 123 1234 12345 3.14159 -42 1e-9 1,000,000",
    "  leading, trailing  \t tabs\t\tand\n\n\nnew lines \r\n crlf ",
    'def f(x):\n    return {"a": [x ** 2, None]}  # comment\n',
    '<tool_call>\n{"name": "search", "arguments": {"query": "Kessa"}}\n</tool_call>',
    "don't I'll we'VE they'D it's",
)
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the corpus.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "What to look for."}},
            "required": ["query"],
        },
    },
}
CHAT = [
    {"role": "system", "content": "You answer questions."},
    {"role": "user", "content": "Who founded Orbel Mills?"},
    {"role": "assistant", "content": "Mira Tolvan."},
    {"role": "user", "content": "Where was she born?"},
]
CALL = {"name": "search", "arguments": {"query": "Mira Tolvan"}}
TOOL_TURN = [
    *CHAT,
    {
        "role": "assistant",
        "tool_calls": [{"id": "call00001", "type": "function", "function": CALL}],
    },
    {"role": "tool", "tool_call_id": "call00001", "name": "search", "content": "Born in Kessa."},
]
#: (bos, eos, pad) of Qwen2.5-Instruct and Qwen3
QWEN_SPECIALS = (None, "<|im_end|>", "<|endoftext|>")


@cache
def reference(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's ``ggml-vocab-<name>.gguf.inp`` / ``.out`` as (text, ids), read as
    tests/test-tokenizer-0.cpp reads them (raw bytes, inputs split on the separator line)."""
    folder = FIXTURES / "vocab_reference"
    raw = (folder / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode("utf-8")
    texts = raw.split("\n__ggml_vocab_test__\n")
    texts = texts[:-1] if texts[-1] == "" else texts
    lines = (folder / f"ggml-vocab-{name}.gguf.out").read_bytes().decode("utf-8").split("\n")
    ids = [[int(i) for i in line.split()] for line in lines[: len(texts)]]
    assert len(texts) == len(ids) == 46 and lines[len(texts) :] in ([], [""])
    return list(zip(texts, ids, strict=True))


@pytest.mark.parametrize(
    "family, vocab", [("qwen2.5", "qwen2"), ("qwen3", "qwen2"), ("llama3.1", "llama-bpe")]
)
def test_every_llama_cpp_reference_input_encodes_to_its_ids(family, vocab):
    tok = tokenizer(family)
    cases = reference(vocab)
    got = tok([text for text, _ in cases], add_special_tokens=False)["input_ids"]
    assert [(text, ids) for (text, _), ids in zip(cases, got, strict=True)] == cases


def test_qwen_added_tokens_have_their_ids_and_only_the_pipe_ones_are_special():
    qwen25, qwen3 = tokenizer("qwen2.5"), tokenizer("qwen3")
    assert (len(qwen25), len(qwen3)) == (151665, 151669)
    ids = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<|object_ref_start|>": 151646,
        "<|vision_start|>": 151652,
        "<|video_pad|>": 151656,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<|fim_prefix|>": 151659,
        "<|file_sep|>": 151664,
        "<tool_response>": 151665,
        "</tool_response>": 151666,
        "<think>": 151667,
        "</think>": 151668,
    }
    assert {t: qwen3.convert_tokens_to_ids(t) for t in ids} == ids
    assert qwen25.convert_ids_to_tokens(list(range(151643, 151665))) == qwen3.convert_ids_to_tokens(
        list(range(151643, 151665))
    )
    plain = sorted(i for i, token in qwen3.added_tokens_decoder.items() if not token.special)
    assert plain == [151657, 151658, 151665, 151666, 151667, 151668]
    for tok in (qwen25, qwen3):
        assert (tok.bos_token, tok.eos_token, tok.pad_token) == QWEN_SPECIALS
        # eos, pad and the config's additional_special_tokens: <|im_start|> .. <|video_pad|>
        assert sorted(tok.all_special_ids) == list(range(151643, 151657))
    text = "<|im_start|>assistant\n<think>\nx\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>"
    ids = qwen3(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == 151644 and ids[-1] == 151645 and 151667 in ids and 151657 in ids
    assert qwen3.decode(ids) == text  # the added tokens are single ids that decode back
    kept = "assistant\n<think>\nx\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    assert qwen3.decode(ids, skip_special_tokens=True) == kept


def test_llama_agrees_with_metas_own_tokenizer():
    package_file("llama_models", "llama3/tokenizer.model", LLAMA_MODELS)  # or skip
    from llama_models.llama3.tokenizer import Tokenizer

    meta, tok = Tokenizer.get_instance(), tokenizer("llama3.1")
    assert {t: tok.convert_tokens_to_ids(t) for t in meta.special_tokens} == meta.special_tokens
    assert all(tok.added_tokens_decoder[i].special for i in meta.special_tokens.values())
    assert len(tok) == meta.n_words == 128256
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (
        "<|begin_of_text|>",
        "<|eot_id|>",
        None,
    )
    assert sorted(tok.all_special_ids) == [128000, 128009]  # no additional_special_tokens
    prompt = tok.apply_chat_template(TOOL_TURN, tools=[SEARCH], tokenize=False)
    texts = [*TEXTS, *(text for text, _ in reference("llama-bpe")), prompt]
    expected = [meta.encode(t, bos=False, eos=False, allowed_special="all") for t in texts]
    assert tok(texts, add_special_tokens=False)["input_ids"] == expected
    assert tok("Hi")["input_ids"] == meta.encode("Hi", bos=True, eos=False)


@cache
def mistral_common():
    """mistral-common's own tokenizer of the same tekken file (skips where it is missing)."""
    path = package_file("mistral_common", "data/tekken_240718.json", MISTRAL_COMMON)
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.from_file(str(path))


def test_mistral_agrees_with_mistral_commons_tekkenizer():
    tok, reference_tok = tokenizer("mistral"), mistral_common()
    tekken = reference_tok.instruct_tokenizer.tokenizer
    assert len(tok) == tekken.n_words == 131072
    controls = ("[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]")
    controls += ("[TOOL_RESULTS]", "[/TOOL_RESULTS]", "<s>", "</s>", "<unk>")
    ids = {name: tekken.get_special_token(name) for name in controls}
    assert {name: tok.convert_tokens_to_ids(name) for name in controls} == ids
    assert all(tok.added_tokens_decoder[i].special for i in ids.values())
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", None)
    texts = [*TEXTS, *(text for text, _ in reference("llama-bpe"))]  # llama.cpp's inputs too
    got = tok(texts, add_special_tokens=False)["input_ids"]
    assert got == [tekken.encode(text, bos=False, eos=False) for text in texts]
    assert tok("Hi")["input_ids"] == tekken.encode("Hi", bos=True, eos=False)
    pieces = ("[INST]", "Who?", "[/INST]", "[TOOL_CALLS]", "[{}]", "</s>", "[TOOL_RESULTS]", "{}")
    expected = [
        [ids[piece]] if piece in ids else tekken.encode(piece, bos=False, eos=False)
        for piece in pieces
    ]
    assert tok("".join(pieces), add_special_tokens=False)["input_ids"] == sum(expected, [])


def test_mistral_nemos_template_encodes_a_tool_request_as_mistral_common_does():
    """The HF template on the converted tokenizer gives mistral-common's own tokens for a chat
    with tools; on a tool result it differs as the shipped template does (the content is not
    JSON-quoted, the system message goes with the last user message only)."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    tok, reference_tok = tokenizer("mistral"), mistral_common()
    request = ChatCompletionRequest.from_openai(CHAT, tools=[SEARCH])
    expected = reference_tok.encode_chat_completion(request).tokens
    text = tok.apply_chat_template(CHAT, tools=[SEARCH], tokenize=False)
    assert tok(text, add_special_tokens=False)["input_ids"] == expected
    text = tok.apply_chat_template(TOOL_TURN, tools=[SEARCH], tokenize=False)
    assert '[TOOL_RESULTS]{"content": Born in Kessa., "call_id": "call00001"}' in text


#: family -> (chat template kwargs, what the rendered prompt ends with)
ENDS = {
    "qwen2.5": ({}, "<|im_start|>assistant\n"),
    "qwen3": ({}, "<|im_start|>assistant\n"),
    "qwen3-no-thinking": (
        {"enable_thinking": False},
        "<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ),
    "llama3.1": ({}, "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "mistral": ({}, '"call_id": "call00001"}[/TOOL_RESULTS]'),
}
#: family -> control tokens the rendered tool conversation holds as single ids
CONTROLS = {
    "qwen": ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"),
    "llama3.1": ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    "mistral": ("<s>", "[AVAILABLE_TOOLS]", "[INST]", "[TOOL_CALLS]", "[TOOL_RESULTS]"),
}


@pytest.mark.parametrize("case", list(ENDS))
def test_every_familys_template_renders_a_tool_conversation(case):
    family = case.removesuffix("-no-thinking")
    tok, (kwargs, end) = tokenizer(family), ENDS[case]
    assert tok.chat_template == template_text(family)
    for messages in (CHAT, TOOL_TURN):
        text = tok.apply_chat_template(
            messages, tools=[SEARCH], tokenize=False, add_generation_prompt=True, **kwargs
        )
        assert "Where was she born?" in text and '"name": "search"' in text
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    assert text.endswith(end) and "Born in Kessa." in text
    assert '"query": "Mira Tolvan"' in text  # the call's arguments, as JSON
    for control in CONTROLS["qwen" if family.startswith("qwen") else family]:
        assert tok.convert_tokens_to_ids(control) in ids, control


def test_the_kit_names_its_families_and_templates():
    assert FAMILIES == ("qwen2.5", "qwen3", "llama3.1", "mistral")
    assert "<|im_start|>" in template_text("qwen2_5") == template_text("qwen2.5")
    with pytest.raises(ValueError, match="unknown family"):
        tokenizer("gpt2")
