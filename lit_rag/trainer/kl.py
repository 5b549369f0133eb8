"""Per-token KL estimators, chosen by name (Schulman, "Approximating KL divergence", 2020).

With samples from the policy pi_theta and the log-ratio ``log_r = log pi_ref - log pi_theta``:

    k1 = -log_r                   unbiased, high variance, can be negative
    k2 = 0.5 * log_r ** 2         biased, low variance, non-negative, symmetric in log_r
    k3 = exp(log_r) - log_r - 1   unbiased, low variance, non-negative (GRPO, DeepSeekMath)

ARENA Section 3.2 ("KL divergence stabilization") and Appendix F: standard GRPO uses k3, which
"becomes numerically unstable when the policy assigns near-zero probability to sampled
outputs", because ``r = pi_ref / pi_theta`` explodes; they replace it, citing Schulman [35],
with an estimator that "maintains non-negativity and provides a symmetric, smooth penalty for
large divergences" and "avoids singularities even when pi_theta is small". The formula itself
was lost in the text we have. Of Schulman's three, only k2 fits every clause: it is
non-negative, symmetric in log r (a quadratic), smooth, and has no exp(log r) term, so its
gradient is linear in log r rather than exponential. ``stabilized`` is therefore k2.

``low_var_kl`` is verl's estimator of that name (``verl/trainer/ppo/core_algos.py``,
``kl_penalty``, as vendored in Search-R1's release): k3 clamped to [-10, 10]. Eval-RAR trains
in verl with Search-R1's settings (Section 5.1; Search-R1's ``train_grpo.sh`` sets
``kl_loss_type=low_var_kl``), so its recipes use it. k3 is never negative, so only the upper
bound acts: a token whose k3 exceeds 10 (log r above ~2.61, pi_ref / pi above ~13.6, or log r
below -11) contributes 10 and no gradient. ``k3`` stays unclamped (GRPO, DeepSeekMath Eq. 4).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``log pi - log pi_ref``."""
    return logp - ref_logp


def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``0.5 (log pi_ref - log pi)^2`` (ARENA's stabilized estimator)."""
    return 0.5 * (ref_logp - logp) ** 2


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``r - log r - 1`` with ``r = pi_ref / pi`` (GRPO's estimator)."""
    log_r = ref_logp - logp
    return torch.exp(log_r) - log_r - 1


#: verl's clamp of ``low_var_kl``.
LOW_VAR_KL_BOUND = 10.0


def low_var_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 clamped to ``[-10, 10]`` (verl's ``low_var_kl``); outside the bounds no gradient."""
    return torch.clamp(k3(logp, ref_logp), min=-LOW_VAR_KL_BOUND, max=LOW_VAR_KL_BOUND)


ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": k1,
    "k2": k2,
    "k3": k3,
    "low_var_kl": low_var_kl,
    "stabilized": k2,
}


def get_estimator(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Estimator by name; an unknown name lists the allowed ones."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown kl_estimator '{name}'; allowed: {', '.join(ESTIMATORS)}")
    return ESTIMATORS[name]
