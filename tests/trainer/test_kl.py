"""KL estimators on numbers worked by hand (Schulman 2020; ARENA Section 3.2)."""

import math

import pytest
import torch

from lit_rag.trainer.kl import ESTIMATORS, get_estimator, k1, k2, k3, low_var_kl


def test_estimators_by_hand():
    # log pi = log 0.5, log pi_ref = log 0.25  ->  log r = log(0.25 / 0.5) = -log 2 = -0.6931
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    # k1 = -log r = 0.6931
    assert k1(logp, ref).item() == pytest.approx(math.log(2))
    # k2 = 0.5 * (log r)^2 = 0.5 * 0.48045 = 0.24023
    assert k2(logp, ref).item() == pytest.approx(0.5 * math.log(2) ** 2)
    # k3 = r - log r - 1 = 0.5 + 0.6931 - 1 = 0.19315
    assert k3(logp, ref).item() == pytest.approx(0.5 + math.log(2) - 1)


def test_all_zero_when_policies_agree():
    x = torch.tensor([-0.1, -2.0, -7.5])
    for fn in ESTIMATORS.values():
        assert torch.equal(fn(x, x), torch.zeros(3))


def test_stabilized_is_k2_and_bounded_where_k3_explodes():
    # pi_theta -> 0 on a sampled token while pi_ref stays 0.5: log r = log 0.5 - (-40) ~ 39.3
    logp, ref = torch.tensor([-40.0]), torch.tensor([math.log(0.5)])
    assert get_estimator("stabilized") is k2
    assert k3(logp, ref).item() > 1e16  # exp(39.3) ~ 1.2e17
    assert k2(logp, ref).item() == pytest.approx(0.5 * (math.log(0.5) + 40) ** 2)  # ~772
    # gradient w.r.t. log pi: k3 -> 1 - r (exponential), k2 -> -(log r) (linear)
    lp = logp.clone().requires_grad_()
    k2(lp, ref).sum().backward()
    assert lp.grad.item() == pytest.approx(-(math.log(0.5) + 40))


def test_k2_symmetric_nonnegative():
    a, b = torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -0.5])
    assert torch.allclose(k2(a, b), k2(b, a))
    assert (k2(a, b) >= 0).all() and (k3(a, b) >= 0).all()


def test_unknown_estimator_lists_allowed():
    with pytest.raises(
        ValueError, match="unknown kl_estimator 'k4'; allowed: k1, k2, k3, low_var_kl, stabilized"
    ):
        get_estimator("k4")


def test_low_var_kl_is_verls_clamped_k3():
    """verl's ``low_var_kl`` (core_algos.kl_penalty): k3 = r - log r - 1, clamped to [-10, 10].

    log r = ref - logp:
       0     -> k3 = 1 - 0 - 1                  =  0
      -2     -> k3 = e^-2 + 2 - 1 = 0.1353 + 1  =  1.1353   (inside: unchanged)
       3     -> k3 = e^3 - 3 - 1 = 20.0855 - 4  = 16.0855   -> clamped to 10
     -12     -> k3 = e^-12 + 12 - 1 ~ 11.000006            -> clamped to 10
    Gradient w.r.t. log pi: d k3 / d logp = 1 - r; at log r = -2: 1 - 0.1353 = 0.8647; where
    clamped it is 0 (torch.clamp passes no gradient outside its bounds, as in verl).
    """
    logp = torch.zeros(4, requires_grad=True)
    ref = torch.tensor([0.0, -2.0, 3.0, -12.0])
    out = low_var_kl(logp, ref)
    assert out.tolist() == pytest.approx([0.0, math.exp(-2) + 1, 10.0, 10.0])
    assert k3(logp, ref)[2].item() == pytest.approx(
        math.exp(3) - 4
    )  # 16.0855: k3 itself is not clamped
    out.sum().backward()
    assert logp.grad.tolist() == pytest.approx([0.0, 1 - math.exp(-2), 0.0, 0.0])
    assert get_estimator("low_var_kl") is low_var_kl


def test_paper_recipes_use_verls_low_var_kl():
    """Eval-RAR trains in verl with Search-R1's settings (``kl_loss_type=low_var_kl``)."""
    from pathlib import Path

    import yaml

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    for name in ("eval_rar.yaml", "search_r1.yaml"):
        config = yaml.safe_load((recipes / name).read_text())
        assert config["model"]["algorithm"]["init_args"]["kl_estimator"] == "low_var_kl", name
