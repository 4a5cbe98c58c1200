"""Issue 38: ``--optimizer muon|adamw``: speculators' parameter split, one Muon step by hand, and ``fit`` driving both.

The split is checked against speculators 0.9's own ``split_named_params_for_muon``
(``speculators/train/optimizers.py``), run in its test env on the same draft modules; the step against the
formulas of Muon (Keller Jordan's Newton-Schulz iteration, ``torch/optim/_muon.py``) and AdamW written out here.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from conftest import WORLD
from speculators_env import spec_env  # noqa: F401  (fixture)

from specfmt.algorithms import get, trainable
from specfmt.errors import InputError
from specfmt.sources.verifier import Verifier
from specfmt.training import optim
from specfmt.training.loop import STATE_FILE, TrainOptions, fit
from specfmt.training.optim import build_optimizer, split_for_muon


def _configs() -> list[tuple[str, dict, list[str]]]:
    """``(algorithm, config of a new draft for the world's verifier, parameters to freeze)`` for every trainable
    algorithm, EAGLE-3 also with 2 layers, its norms and per-tap norms, and with its lm_head frozen."""
    verifier = Verifier.load(str(WORLD / "verifier"))
    found = []
    for algo in trainable():
        t = algo.training
        variants = [({}, [])]
        if algo.name == "eagle3":
            variants = [({"draft_vocab": 512}, []), ({"layers": 2, "fc_norm": True, "draft_vocab": 512}, ["lm_head.weight"])]
        for given, frozen in variants:
            o = t.settle_options(t.parse_options(given, init=False), counts_only=False, init=False)
            found.append((algo.name, t.new_config(verifier, t.new_shape(replace(o, speculative_tokens=None, dtype="float32"))), frozen))
    return found


def _module(name: str, cfg: dict, frozen: list[str]):
    m = get(name).reference.module(cfg)
    for n, p in m.named_parameters():
        p.requires_grad_(n not in frozen)
    return m


#: speculators' split of the same modules, in its test env (specfmt is importable there: the same interpreter)
SPECULATORS_SPLIT = r"""
import json, sys
from specfmt.algorithms import get
from speculators.train.optimizers import split_named_params_for_muon
out = []
for name, cfg, frozen in json.loads(sys.argv[1]):
    m = get(name).reference.module(cfg)
    for n, p in m.named_parameters():
        p.requires_grad_(n not in frozen)
    muon, adamw = split_named_params_for_muon(m)
    out.append([[n for n, _ in muon], [n for n, _ in adamw]])
print(json.dumps(out))
"""


def test_the_split_is_speculators_own_on_every_trainable_draft(spec_env):
    cases = _configs()
    r = spec_env.run("-c", SPECULATORS_SPLIT, json.dumps(cases))
    assert r.returncode == 0, r.stderr[-2000:]
    theirs = json.loads(r.stdout.strip().splitlines()[-1])
    ours = [[[n for n, _ in group] for group in split_for_muon(_module(*c))] for c in cases]
    assert ours == theirs
    by_name = {(c[0], len(c[2])): s for c, s in zip(cases, ours)}
    muon, adamw = by_name[("eagle3", 0)]
    # the case is what it claims: matrices to Muon; norms and the output head to AdamW; a frozen tensor in neither
    assert "fc.weight" in muon and "layers.0.self_attn.q_proj.weight" in muon
    assert {"lm_head.weight", "norm.weight", "layers.0.hidden_norm.weight"} <= set(adamw)
    muon2, adamw2 = by_name[("eagle3", 1)]
    assert "layers.1.mlp.down_proj.weight" in muon2 and "lm_head.weight" not in muon2 + adamw2 and "fc_norm.0.weight" in adamw2
    medusa_muon, medusa_adamw = by_name[("medusa", 0)]
    assert "blocks.0.layers.0.weight" in medusa_muon and {"blocks.0.layers.0.bias", "lm_heads.0.weight"} <= set(medusa_adamw)


def _newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The quintic Newton-Schulz iteration in bfloat16 (Keller Jordan's Muon, coefficients (3.4445, -4.775, 2.0315)),
    written out: X = G / |G|_F (the wide way round), X <- aX + (bA + cA^2)X with A = XX^T."""
    a, b, c = 3.4445, -4.775, 2.0315
    x = g.bfloat16()
    tall = g.shape[0] > g.shape[1]
    x = x.T if tall else x
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        A = x @ x.T
        x = a * x + (b * A + c * (A @ A)) @ x
    return (x.T if tall else x).float()


def test_one_muon_step_is_the_formula_and_the_rest_is_adamw():
    name, cfg, _ = _configs()[0]
    m = _module(name, cfg, [])
    torch.manual_seed(0)
    for p in m.parameters():
        p.grad = torch.randn_like(p)
        with torch.no_grad():  # weights large enough that the weight decay term shows beside the bf16 tolerance
            p.normal_(0, 5.0)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    lr = 0.02
    opt = build_optimizer(m, "muon", lr)
    assert [type(o).__name__ for o in opt.optimizers] == ["Muon", "AdamW"]
    opt.step()
    muon = {n for n, _ in split_for_muon(m)[0]}
    for n, p in m.named_parameters():
        g, w = p.grad, before[n]
        if n in muon:
            mom = optim.MUON_MOMENTUM
            buf = (1 - mom) * g  # the momentum buffer after one step, from zero
            update = _newton_schulz(g + mom * (buf - g))  # Nesterov: g lerped towards the buffer
            scale = lr * 0.2 * math.sqrt(max(p.shape))  # match_rms_adamw
            want = w * (1 - lr * optim.MUON_WEIGHT_DECAY) - scale * update
            # bfloat16 Newton-Schulz: the update agrees to bf16's precision, scaled by the step
            assert torch.allclose(p.detach(), want, atol=scale * 0.03, rtol=0), n
            assert not torch.allclose(p.detach(), w - lr * g.sign(), atol=scale * 0.03), n  # not what AdamW would do
        else:
            want = w * (1 - lr * optim.ADAMW_WEIGHT_DECAY) - lr * g / (g.abs() + 1e-8)  # AdamW's first step: m/sqrt(v) = g/|g|
            assert torch.allclose(p.detach(), want, atol=1e-6), n


def test_adamw_is_adamw_throughout_and_a_bad_name_is_refused():
    name, cfg, _ = _configs()[0]
    m = _module(name, cfg, [])
    opt = build_optimizer(m, "adamw", 1e-3)
    assert [type(o).__name__ for o in opt.optimizers] == ["AdamW"]
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(m.parameters()))
    assert opt.optimizers[0].defaults["betas"] == (0.9, 0.95) and opt.optimizers[0].defaults["weight_decay"] == 0.0
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        build_optimizer(m, "sgd", 1e-3)


def test_fit_trains_with_muon_and_saves_both_optimizers_state(tmp_path):
    from test_train_metrics import FakeVerifier, _windows, tiny_draft

    draft = tiny_draft(1)
    opts = TrainOptions(steps=2, batch_size=2, seq_len=12, lr=2e-2, optimizer="muon", save_every=1)
    fit("eagle3", draft, FakeVerifier(), _windows(), opts, state_dir=tmp_path, fingerprint={"options": vars(opts)})
    saved = torch.load(tmp_path / STATE_FILE, weights_only=True)
    muon, adamw = split_for_muon(draft)
    assert saved["optimizer"]["kinds"] == ["Muon", "AdamW"]
    muon_state, adamw_state = (s["state"] for s in saved["optimizer"]["optimizers"])
    assert len(muon_state) == len(muon) and all(set(s) == {"momentum_buffer"} for s in muon_state.values())
    assert len(adamw_state) == len(adamw) and all({"exp_avg", "exp_avg_sq"} <= set(s) for s in adamw_state.values())
    assert saved["fingerprint"]["options"]["optimizer"] == "muon" and saved["step"] == 2
    # resuming under the other optimizer is another run: refused by the fingerprint, whose options record --optimizer
    with pytest.raises(InputError, match="differs in: options"):
        fit("eagle3", tiny_draft(1), FakeVerifier(), _windows(), replace(opts, optimizer="adamw"), state_dir=tmp_path, resume=True,
            fingerprint={"options": vars(replace(opts, optimizer="adamw"))})


def test_an_unknown_optimizer_is_one_line_before_anything_is_read(tmp_path):
    from specfmt.training.pipeline import TrainRequest, train_draft

    req = TrainRequest(out=str(tmp_path / "o"), verifier=str(WORLD / "verifier"), algorithm="eagle3", data=["nowhere.txt"])
    with pytest.raises(InputError, match="--optimizer must be muon or adamw, not 'sgd'"):
        train_draft(req, TrainOptions(optimizer="sgd"))
    assert not (tmp_path / "o").exists()
