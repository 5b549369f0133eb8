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


ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": k1,
    "k2": k2,
    "k3": k3,
    "stabilized": k2,
}


def get_estimator(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Estimator by name; an unknown name lists the allowed ones."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown kl_estimator '{name}'; allowed: {', '.join(ESTIMATORS)}")
    return ESTIMATORS[name]
