"""The process's global random states (torch CPU, Python, NumPy) as plain types and tensors: what
a checkpoint carries per rank (:mod:`lit_rag.trainer.state`) and what a rollout worker borrows
from the trainer and hands back (:mod:`lit_rag.rollout.workers.process`)."""

from __future__ import annotations

import random

import numpy as np
import torch


def rng_states() -> dict:
    """The global RNG states of torch, Python and NumPy, as plain types."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [
            str(name),
            torch.from_numpy(keys.astype(np.int64)),
            int(pos),
            int(has_gauss),
            float(gauss),
        ],
    }


def restore_rng_states(states: dict) -> None:
    """Set the global RNGs from :func:`rng_states`'s output."""
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    name, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


def seed_all(seed: int) -> None:
    """Seed torch, Python and NumPy's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
