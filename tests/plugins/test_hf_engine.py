"""The hf engine on a tiny random model: lengths, stop strings, sampling log-probs."""

import torch

from lit_rag.plugins.engines.hf import HFEngine
from lit_rag.rollout.base import SamplingParams
from lit_rag.trainer.logprobs import completion_logprobs


def engine(tiny_policy, **kwargs):
    model, tok = tiny_policy
    e = HFEngine(**kwargs)
    e.bind(model, tok)
    return e, model, tok


def test_budget_and_truncation_flag(tiny_policy):
    """Greedy, so every length is known from the rows' own 12-token greedy runs (no EOS id):
    with a budget of 6 each row is its run's first 6 tokens, cut, unfinished; with the EOS id
    set to row 0's 3rd new token, each row ends at that token's first occurrence within 6,
    finished and the EOS kept (row 0: by index 2 at the latest), else is cut as before."""
    e, model, tok = engine(tiny_policy)
    prompts = [tok("Who founded it?")["input_ids"], tok("Where?")["input_ids"]]
    model.generation_config.eos_token_id = None
    tok.eos_token_id = None
    long = [
        g.token_ids.tolist()
        for g in e.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0))
    ]
    assert [len(run) for run in long] == [12, 12]
    cut = e.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    assert [g.token_ids.tolist() for g in cut] == [run[:6] for run in long]
    assert [g.finished for g in cut] == [False, False]
    eos = long[0][2]
    model.generation_config.eos_token_id = eos
    ended = e.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    for g, run in zip(ended, long, strict=True):
        length = run[:6].index(eos) + 1 if eos in run[:6] else 6
        assert g.token_ids.tolist() == run[:length] and g.finished == (eos in run[:6])
        assert g.logprobs.shape == g.token_ids.shape
    assert ended[0].finished and len(ended[0].token_ids) <= 3


def test_sampling_logprobs_match_a_forward_pass(tiny_policy):
    e, model, tok = engine(tiny_policy)
    torch.manual_seed(1)
    prompt = tok("In which city")["input_ids"]
    (g,) = e.generate([prompt], SamplingParams(max_new_tokens=5, temperature=0.7))
    ids = torch.tensor([prompt + g.token_ids.tolist()])
    recomputed = completion_logprobs(
        model, ids, torch.ones_like(ids), len(g.token_ids), temperature=0.7
    )
    assert torch.allclose(recomputed[0], g.logprobs, atol=1e-4)


def test_greedy_is_deterministic_and_batched_equals_single(tiny_policy):
    e, _, tok = engine(tiny_policy, max_batch_size=1)
    prompts = [tok("a b c")["input_ids"], tok("the of and in was")["input_ids"]]
    greedy = SamplingParams(max_new_tokens=5, temperature=0.0)
    one_by_one = e.generate(prompts, greedy)
    e.max_batch_size = None
    batched = e.generate(prompts, greedy)  # left padding must not change greedy output
    assert [g.token_ids.tolist() for g in one_by_one] == [g.token_ids.tolist() for g in batched]


def test_stop_string_ends_the_row(tiny_policy):
    e, _, tok = engine(tiny_policy)
    torch.manual_seed(0)
    prompts = [tok("x")["input_ids"]] * 4
    free = e.generate(prompts, SamplingParams(max_new_tokens=12, temperature=1.0))
    # stop on a string the free-running samples produced, after its first occurrence
    target = free[0].text[2:4] if len(free[0].text) >= 4 else free[0].text
    torch.manual_seed(0)
    stopped = e.generate(prompts, SamplingParams(max_new_tokens=12, temperature=1.0, stop=[target]))
    first = stopped[0]
    assert target in first.text and first.finished
    assert len(first.token_ids) <= len(free[0].token_ids)
    # the stop string is not already complete one token earlier
    assert target not in tok.decode(first.token_ids[:-1])


def test_submit_collect_batches_by_sampling_setting_and_cuts_each_row_to_its_budget(tiny_policy):
    """The base engine's submit / collect: one generate call per sampling setting (the widest
    budget), each row cut back to its own budget (unfinished when cut), tickets kept."""
    from helpers import ScriptedPolicy

    from lit_rag.rollout.base import SamplingParams

    _, tok = tiny_policy
    text = "the company was founded by the founder"
    engine = ScriptedPolicy(tok, [[text, text], ["[1]"]])
    short = engine.submit([5, 6], SamplingParams(max_new_tokens=3, stop=["x"]))
    other = engine.submit([7], SamplingParams(max_new_tokens=5, stop=["y"]))  # another setting
    wide = engine.submit([8], SamplingParams(max_new_tokens=50, stop=["x"]))
    done = dict(engine.collect())
    assert [params.max_new_tokens for _, params in engine.log] == [50, 5]  # two calls
    full = tok(text, add_special_tokens=False)["input_ids"]
    assert done[short].token_ids.tolist() == full[:3] and not done[short].finished
    assert done[short].text == tok.decode(full[:3])
    assert done[wide].token_ids.tolist() == full and done[wide].finished
    assert done[other].text == "[1]" and engine.collect() == []


def test_unknown_fsdp_generation_is_a_one_line_error():
    import pytest

    with pytest.raises(
        ValueError, match="engine fsdp_generation 'layers' is not known; allowed: gather, per_layer"
    ):
        HFEngine(fsdp_generation="layers")


def test_fsdp_gather_generates_without_units_and_puts_them_back(tiny_policy, tmp_path):
    """One gloo process (the two-rank run is tests/trainer/test_fsdp_multiturn.py): inside
    ``generating()`` the tree has no FSDP unit (no collective per decoding step), greedy text is
    the unsharded model's, and afterwards every unit is back in its place."""
    import copy

    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from lit_rag.plugins.engines.hf import _collective_forward

    model, tok = tiny_policy
    # an in-process vLLM (tests/cli/test_fit_vllm.py) leaves a one-process default group
    # behind: reuse it then, with a gloo group of our own for FSDP
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        layer = type(model.model.layers[0])
        sharded = FSDP(
            copy.deepcopy(model),
            auto_wrap_policy=ModuleWrapPolicy({layer}),
            device_id=torch.device("cpu"),
            use_orig_params=True,
            process_group=dist.new_group(ranks=[0], backend="gloo"),
        )
        units = [n for n, m in sharded.named_modules() if isinstance(m, FSDP)]
        assert len(units) == 1 + len(model.model.layers)  # the root and one per layer
        engine, plain = HFEngine(), HFEngine()
        engine.bind(sharded, tok)
        plain.bind(model, tok)
        prompt = [tok("Where was Mira Tolvan born?")["input_ids"]]
        greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
        with engine.generating():
            assert not any(isinstance(m, FSDP) for m in sharded.module.modules())
            assert not _collective_forward(sharded)
            got = engine.generate(prompt, greedy)[0]
        assert [n for n, m in sharded.named_modules() if isinstance(m, FSDP)] == units
        assert got.token_ids.tolist() == plain.generate(prompt, greedy)[0].token_ids.tolist()
    finally:
        if created:
            dist.destroy_process_group()
