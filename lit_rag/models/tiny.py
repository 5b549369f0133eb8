"""A tiny random causal LM and a tokenizer built in code: tests and smoke runs, no downloads.

The tokenizer is a byte-level BPE trained on a fixed text in a few milliseconds (the same
merges every time), so any string can be encoded; it has a ChatML chat template like
SmolLM2 and Qwen, so environments exercise the chat-template path in tests too.
"""

from __future__ import annotations

from functools import lru_cache

import torch

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_TRAINING_TEXT = """
A conversation between User and Assistant. The user asks a question and gives some references.
<question> <references> <relevance> </relevance> <analysis> </analysis> <answer> </answer>
<think> </think> <search> </search> <information> </information> <evaluate> </evaluate>
Who founded the company? Where was the founder born? In which city is the headquarters?
[1] [2] [3] [4] [5] [6] [7] [8] [9] [10] 0123456789 the of and in was is a to by
"""


@lru_cache(maxsize=4)
def _tokenizer_json(vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_TRAINING_TEXT] * 4, trainer=trainer)
    return tok.to_str()


def build_tiny_tokenizer(vocab_size: int = 512):
    """A deterministic byte-level BPE tokenizer with ChatML tokens and chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(vocab_size)),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_tiny_model(config, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A randomly initialised Llama-style model sized by a :class:`TinyConfig`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer(config.vocab_size)
    hf_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.hidden_size * 2,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    fork_devices: list = []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(hf_config)
    return model.to(dtype)
