"""Activation checkpointing modes (lit_rag/models/activation_checkpointing.py): what each mode
recomputes in the backward pass, counted op by op on a tiny Llama, and the setting's values."""

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lit_rag.models import activation_checkpointing
from lit_rag.models.loading import ModelConfig, TinyConfig, load_model

LAYERS = 2


class OpCount(TorchDispatchMode):
    """Counts the aten ops run while active (by op packet name: ``mm``, ``silu``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func._overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _ops(mode: str) -> Counter:
    """Op counts of one forward + backward of a tiny policy (2 layers) under ``mode``."""
    model = load_model(
        ModelConfig(
            tiny=TinyConfig(hidden_size=32, num_layers=LAYERS, num_heads=2, seed=3),
            gradient_checkpointing=mode,
        )
    ).train()
    ids = torch.randint(5, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    counter = OpCount()
    with counter:
        model(input_ids=ids, use_cache=False).logits.sum().backward()
    return counter.ops


def test_each_mode_recomputes_what_it_says():
    none, selective, full = _ops("none"), _ops("selective"), _ops("full")
    # without checkpointing SiLU runs once per layer in the forward
    assert none["silu"] == LAYERS
    # selective: the element-wise work runs again in the backward pass (SiLU twice per layer),
    # the matrix products and the attention kernel do not (their outputs are kept)
    assert selective["silu"] == 2 * LAYERS
    assert selective["mm"] == none["mm"]
    attention = [name for name in none if "scaled_dot_product" in name and "backward" not in name]
    assert attention and all(selective[name] == none[name] for name in attention)
    # full: the layer again, matrix products and attention included: per layer 6 of its 7
    # linear layers (q, k, v, o, gate, up) run one more forward matmul each; down's output is
    # needed by no backward, and torch stops the recomputation once it has what it needs
    assert full["silu"] == 2 * LAYERS
    assert full["mm"] == none["mm"] + 6 * LAYERS
    assert all(full[name] == 2 * none[name] for name in attention)


@pytest.mark.parametrize(
    ("value", "mode"),
    [(True, "full"), (False, "none"), (None, "none"), ("selective", "selective"), ("full", "full")],
)
def test_setting_values(value, mode):
    assert activation_checkpointing.normalize(value) == mode
    assert (
        ModelConfig(tiny=TinyConfig(), gradient_checkpointing=value).gradient_checkpointing == mode
    )


def test_default_is_selective_and_unknown_names_the_allowed():
    assert ModelConfig(tiny=TinyConfig()).gradient_checkpointing == "selective"
    with pytest.raises(ValueError, match="gradient_checkpointing 'some'.*none, selective, full"):
        ModelConfig(tiny=TinyConfig(), gradient_checkpointing="some")
