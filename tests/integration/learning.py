"""What a short LoRA run on a real model can show it learned, read from what the run leaves.

A few steps of 2 x 2 samples on a 135M model rarely move a validation metric, but they show
that the update reached the policy whenever the rewards gave it something to learn from:

- peft starts every ``lora_B`` at zero (the adapted model is the base), and AdamW leaves a zero
  tensor at zero until a gradient reaches it (decoupled weight decay of 0 is 0), so a non-zero
  ``lora_B`` in ``last.ckpt`` means an update moved the policy;
- a GRPO group whose rewards are all equal has advantage 0, and the KL term has no gradient
  while the policy is the reference, so the policy moves exactly when some step had a group with
  reward variance (``rollout/zero_variance_group_fraction`` < 1).
"""

from __future__ import annotations

from pathlib import Path

import torch


def lora_moved(runs: Path) -> bool:
    """Whether the run's ``last.ckpt`` holds a non-zero LoRA ``B`` matrix (see the module)."""
    (last,) = runs.rglob("last.ckpt")
    state = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    b = [value for key, value in state.items() if ".lora_B." in key]
    assert b, f"{last} holds no LoRA B matrices"
    return any(bool(value.abs().sum() > 0) for value in b)


def had_signal(step: dict) -> bool:
    """Whether a training step (a metrics.csv row) had a group with reward variance."""
    return float(step["rollout/zero_variance_group_fraction"]) < 1.0
