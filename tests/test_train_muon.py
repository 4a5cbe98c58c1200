"""``specfmt.training.muon``: torch's Muon with the Newton-Schulz products in float32 on a CPU.

* each product of the iteration is torch's bf16 product (same operands, one rounding), and the whole orthogonalised
  update agrees with ``torch/optim/_muon.py::_zeropower_via_newtonschulz`` to bf16's precision, as close to the exact
  polar factor as torch's;
* with torch's own Newton-Schulz function in its place, a step is ``torch.optim.Muon``'s bit for bit (so the update
  rule around it is torch's), and the saved state loads into torch's class.

Its speed, the reason it exists, is measured by ``benchmarks/muon_cpu.py`` (docs/measured.md), not here.
"""

from __future__ import annotations

import pytest
import torch
from torch.optim import _muon

from specfmt.training import muon
from specfmt.training.muon import Muon, orthogonalize

COEF, STEPS, EPS = (3.4445, -4.775, 2.0315), 5, 1e-7
SHAPES = [(96, 288), (288, 96), (128, 128), (256, 768)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_update_is_torchs_to_bf16_precision_and_as_close_to_orthogonal(shape):
    torch.manual_seed(sum(shape))
    g = torch.randn(*shape) * 1e-2
    ours, theirs = orthogonalize(g, COEF, STEPS, EPS), _muon._zeropower_via_newtonschulz(g, COEF, STEPS, EPS)
    assert ours.dtype == theirs.dtype == torch.bfloat16 and ours.shape == theirs.shape == g.shape
    # torch's iteration is itself bf16 noise around US'V^T (S' in about 0.5-1.5): the two agree to a few bf16 steps of
    # the largest entry, and each is as far from the exact polar factor UV^T as the other
    scale = theirs.float().abs().max()
    assert (ours.float() - theirs.float()).abs().max() <= 4 * 2**-8 * scale
    u, _, vh = torch.linalg.svd(g.double(), full_matrices=False)
    polar = (u @ vh).float()
    d_ours, d_theirs = (ours.float() - polar).norm(), (theirs.float() - polar).norm()
    assert abs(d_ours - d_theirs) <= 0.02 * d_theirs
    # and it is not a no-op or the sign of the gradient
    assert (ours.float() - g.sign() * scale).abs().max() > 10 * 2**-8 * scale


def test_each_product_is_torchs_bf16_product():
    """One Newton-Schulz iteration's three products from the same bf16 operands, ours against torch's bf16 kernels:
    equal except where the float32 sums' order moves a last bit (a few in 10^4 entries)."""
    torch.manual_seed(0)
    x = torch.randn(128, 384).bfloat16()
    x = x / x.norm()
    a, b, c = COEF
    gram = x @ x.T
    f = lambda t: t.float()  # noqa: E731
    pairs = [
        (gram, (f(x) @ f(x).T).bfloat16()),
        (torch.addmm(gram, gram, gram, beta=b, alpha=c), torch.addmm(f(gram), f(gram), f(gram), beta=b, alpha=c).bfloat16()),
        (torch.addmm(x, gram, x, beta=a), torch.addmm(f(x), f(gram), f(x), beta=a).bfloat16()),
    ]
    # and orthogonalize's own iteration is these products: one iteration of it against one of torch's, both ways round
    pairs += [(_muon._zeropower_via_newtonschulz(g, COEF, 1, EPS), orthogonalize(g, COEF, 1, EPS))
              for g in (torch.randn(128, 384), torch.randn(384, 128))]
    for theirs, ours in pairs:
        differ = (theirs != ours)
        assert differ.float().mean() <= 1e-3
        assert ((f(theirs) - f(ours)).abs() <= f(theirs).abs() * 2**-7 + 1e-30)[differ].all()  # one bf16 step at most


def test_with_torchs_function_a_step_is_torchs_muon_bit_for_bit_and_the_state_loads_into_it(monkeypatch):
    torch.manual_seed(1)
    weights = [torch.randn(64, 96), torch.randn(48, 32)]

    def run(cls, steps=3):
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        opt = cls(params, lr=0.03, momentum=0.95, weight_decay=0.1, ns_steps=STEPS, adjust_lr_fn="match_rms_adamw")
        gen = torch.Generator().manual_seed(2)
        for _ in range(steps):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        return params, opt

    monkeypatch.setattr(muon, "orthogonalize", _muon._zeropower_via_newtonschulz)
    ours, ours_opt = run(Muon)
    theirs, theirs_opt = run(torch.optim.Muon)
    for p, q in zip(ours, theirs):
        assert torch.equal(p, q)
    assert type(ours_opt).__name__ == "Muon"
    state = ours_opt.state_dict()
    assert all(set(s) == {"momentum_buffer"} for s in state["state"].values())
    theirs_opt.load_state_dict(state)
    for s, t in zip(state["state"].values(), theirs_opt.state_dict()["state"].values()):
        assert torch.equal(s["momentum_buffer"], t["momentum_buffer"])


def test_bad_input_is_refused_as_torch_refuses_it():
    for args, msg in [((torch.randn(3, 4, 5), COEF, 5, EPS), "2D"), ((torch.randn(3, 4), COEF, 100, EPS), "less than 100"),
                      ((torch.randn(3, 4), COEF[:2], 5, EPS), "exactly 3")]:
        with pytest.raises(ValueError, match=msg):
            orthogonalize(*args)
        with pytest.raises(ValueError, match=msg):
            _muon._zeropower_via_newtonschulz(*args)
