"""SCDD schedule: boundaries, masses, peak, MDLM limit, errors."""

from __future__ import annotations

import pytest
import torch

from dlmkit.diffusion import SCDDLoss, scdd_schedule
from dlmkit.diffusion.schedules import check_scdd_grid


def test_boundaries():
    m = scdd_schedule(torch.tensor([0.0, 1.0]), max_ratio=0.2)
    assert torch.allclose(m.clean, torch.tensor([1.0, 0.0], dtype=torch.float64))
    assert torch.allclose(m.absorbed, torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert torch.allclose(m.uniform, torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize("ratio, shape, peak", [(0.1, 1.0, 0.5), (0.3, 1.0, 0.3), (0.05, 0.7, 0.8)])
def test_masses_and_peak(ratio, shape, peak):
    t = torch.linspace(0, 1, 2001, dtype=torch.float64)
    m = scdd_schedule(t, max_ratio=ratio, gamma_shape=shape, t_peak=peak)
    assert torch.allclose(m.clean + m.uniform + m.absorbed, torch.ones_like(t))
    assert ((m.clean >= 0) & (m.uniform >= 0) & (m.absorbed >= 0)).all()
    at_peak = scdd_schedule(torch.tensor(peak), max_ratio=ratio, gamma_shape=shape, t_peak=peak)
    assert at_peak.uniform.item() == pytest.approx(ratio, rel=1e-12)
    assert m.uniform.max().item() <= ratio + 1e-12
    assert (m.gamma[1:] <= m.gamma[:-1] + 1e-12).all()  # non-absorbed mass decreases
    assert (m.rho[1:-1] <= m.rho[:-2] + 1e-12).all()  # clean share of it decreases
    check_scdd_grid(ratio, shape, peak, 1000)


def test_invalid_forward_process_is_rejected():
    """Here rho rises near t = 1 (a clean-share 'keep' probability > 1), so refuse it."""
    m = scdd_schedule(torch.linspace(0, 1, 1001), max_ratio=0.3, gamma_shape=2.5, t_peak=0.3)
    assert (m.rho[1:-1] > m.rho[:-2]).any()
    with pytest.raises(ValueError, match="not a valid forward process"):
        SCDDLoss(mask_token_id=0, max_ratio=0.3, gamma_shape=2.5, t_peak=0.3)


def test_ratio_zero_is_mdlm_linear():
    t = torch.linspace(0, 1, 11, dtype=torch.float64)
    m = scdd_schedule(t, max_ratio=0.0)
    assert torch.allclose(m.clean, 1 - t) and torch.allclose(m.absorbed, t)
    assert torch.equal(m.uniform, torch.zeros_like(t))


@pytest.mark.parametrize("kw, name", [({"max_ratio": 1.0}, "max_ratio"),
                                       ({"max_ratio": -0.1}, "max_ratio"),
                                       ({"gamma_shape": 0.0}, "gamma_shape"),
                                       ({"t_peak": 0.0}, "t_peak"), ({"t_peak": 1.0}, "t_peak")])
def test_bad_parameters(kw, name):
    with pytest.raises(ValueError, match=name):
        scdd_schedule(0.5, **kw)
