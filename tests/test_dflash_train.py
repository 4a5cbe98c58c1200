"""Issue 38: ``specfmt train dflash``, speculators 0.9's DFlash objective checked against speculators' own code.

* the batched training pass (:meth:`DFlashDraft.blocks`) is the serving pass (:meth:`DFlashDraft.forward`, what the
  reference proposer and vLLM run), block by block;
* the anchors are speculators' ``select_anchors`` draws for the same seed;
* the loss, step for step: the Qwen3 world's DFlash draft, loaded by speculators (``DFlashDraftModel``, SDPA attention,
  eager losses) and by specfmt, on the same batch and anchors, gives the same loss at each of three AdamW steps, for
  D-PACE with cross-entropy (speculators' DFlash default) and exponential weights with KL;
* D-PACE's weights against a hand computation;
* ``specfmt train dflash`` writes a draft that passes the static checks (the reference run and vLLM: the world's draft it
  trained, test_world_qwen3_dflash.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from speculators_env import spec_env  # noqa: F401  (fixture)
from world_qwen3 import WORLD, convert_draft

from specfmt.algorithms import get
from specfmt.algorithms.dflash import DFlashOptions, dflash_loss, position_weights, select_anchors

DRAFT = WORLD / "dflash-speculators"
T, STEPS, LR = 48, 3, 1e-2


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The world's DFlash draft converted, its module, and one batch of the world's verifier: ids, taps, the last state
    before (for speculators) and after (for specfmt) the final norm, a loss mask with a hole."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = convert_draft(DRAFT, tmp_path_factory.mktemp("dflashtrain") / "draft")
    cfg = json.loads((folder / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(WORLD / "verifier"))
    model = AutoModelForCausalLM.from_pretrained(str(WORLD / "verifier"), dtype=torch.float32).eval()
    text = (Path(__file__).parent / "test_dflash_train.py").read_text()
    ids = torch.tensor([tok.encode(text)[:T]])
    seen = {}
    hook = model.model.layers[-1].register_forward_hook(lambda m, a, out: seen.__setitem__("pre", out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        out = model.model(input_ids=ids, output_hidden_states=True)
    hook.remove()
    aux = torch.cat([out.hidden_states[j] for j in cfg["aux_hidden_state_layer_ids"]], dim=-1)
    mask = torch.ones(1, T, dtype=torch.bool)
    mask[0, 10:14] = False
    return {"folder": folder, "cfg": cfg, "ids": ids, "aux": aux, "pre": seen["pre"], "last": out.last_hidden_state, "mask": mask,
            "embed": model.get_input_embeddings().weight.detach(), "head": model.get_output_embeddings().weight.detach(),
            "tensors": load_file(str(folder / "model.safetensors"))}


def _module(world):
    return get("dflash").module(world["cfg"], {n: t.clone() for n, t in world["tensors"].items()})


def test_the_training_pass_is_the_serving_pass_block_by_block(world):
    draft = _module(world).eval()
    S = world["cfg"]["block_size"]
    anchors = torch.tensor([[0, 7, 20, 33]])
    ctx = draft.context(world["aux"])
    block_ids = torch.full((1, 4, S), draft.mask_token_id)
    block_ids[..., 0] = world["ids"][0, anchors[0]]
    with torch.no_grad():
        together = draft.blocks(world["embed"][block_ids], ctx, anchors)
        for a, p in enumerate(anchors[0].tolist()):
            alone = draft(world["embed"][block_ids[0, a]][None], ctx[:, :p], torch.arange(p), torch.arange(p, p + S))
            assert torch.allclose(together[0, a], alone[0], atol=1e-5), p
        causal = draft.blocks(world["embed"][block_ids], ctx, anchors, causal=True)
        p = 20
        alone = draft(world["embed"][block_ids[0, 2]][None], ctx[:, :p], torch.arange(p), torch.arange(p, p + S), causal=True)
        assert torch.allclose(causal[0, 2], alone[0], atol=1e-5) and not torch.allclose(causal, together, atol=1e-3)


def test_dpace_weights_by_hand():
    mask = torch.tensor([[0.0, 1, 1, 0, 1]])
    per = torch.tensor([[0.0, 0.5, 1.0, 0.0, 2.0]])
    alpha = 0.5
    c = [1.0] + [(1 - alpha) * math.exp(-x) + alpha if m else 1.0 for x, m in zip([0.5, 1.0, 0.0, 2.0], [1, 1, 0, 1])]
    prefix = [math.prod(c[:i + 1]) for i in range(5)]
    want = [m * sum(mask[0, i].item() * prefix[i] for i in range(j, 5)) for j, m in enumerate(mask[0].tolist())]
    got = position_weights("dpace", per, mask, 4.0, alpha)
    assert torch.allclose(got[0], torch.tensor(want), atol=1e-6)
    assert torch.allclose(position_weights("exp", per, mask, 4.0, alpha)[0], torch.tensor([0, 1, math.exp(-0.25), math.exp(-0.5), math.exp(-0.75)]))


#: speculators' DFlash loss on the same batch and weights, three AdamW steps (one per line: the loss)
SPECULATORS_STEPS = r"""
import json, sys, torch
from safetensors.torch import load_file
import speculators.models.dflash.core as core
from speculators import SpeculatorModel
from speculators.models.dflash import DFlashSpeculatorConfig
from speculators.losses import resolve_loss_config
batch, spec = load_file(sys.argv[1]), json.loads(sys.argv[2])
cfg = DFlashSpeculatorConfig.from_pretrained(".")
cfg.transformer_layer_config._attn_implementation = "sdpa"
m = SpeculatorModel.from_pretrained(".", config=cfg).float()
m.load_verifier_weights()
anchors = torch.tensor(spec["anchors"]); valid = torch.ones(len(anchors), dtype=torch.bool)
core.select_anchors = lambda loss_mask, n, block_size: (anchors, valid)
opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=spec["lr"], weight_decay=0.0)
kw = dict(loss_config=resolve_loss_config(spec["loss"], "eager"), per_position_loss_weight=spec["weight"], gamma=4.0,
          dpace_alpha=0.5, max_anchors=len(anchors))
for _ in range(spec["steps"]):
    _, loss, _ = m(hidden_states=batch["aux"], input_ids=batch["ids"], loss_mask=batch["mask"], verifier_last_hidden_states=batch["pre"],
                   document_ids=torch.zeros_like(batch["ids"]), **kw)
    print(json.dumps(float(loss)))
    opt.zero_grad(); loss.backward(); opt.step()
"""

SPECULATORS_DRAW = r"""
import json, sys, torch
from speculators.models.dflash.utils import select_anchors
mask = torch.tensor(json.loads(sys.argv[1]))
torch.manual_seed(int(sys.argv[2]))
a, v = select_anchors(mask, int(sys.argv[3]), int(sys.argv[4]))
print(json.dumps([a.tolist(), v.tolist()]))
"""


def test_anchors_are_speculators_draws(spec_env, world):  # noqa: F811
    mask = world["mask"].long()
    for n in (8, 60):  # fewer than the valid positions, and more (padded, not valid)
        r = spec_env.run("-c", SPECULATORS_DRAW, json.dumps(mask.tolist()), "11", str(n), "4")
        assert r.returncode == 0, r.stderr[-2000:]
        theirs = json.loads(r.stdout.strip().splitlines()[-1])
        a, v = select_anchors(world["mask"], n, 4, torch.Generator().manual_seed(11))
        assert [a[0].tolist(), v[0].tolist()] == theirs
    assert sum(theirs[1]) == T - 4 - 4 and not any(10 <= x < 14 for x in theirs[0][:sum(theirs[1])])


@pytest.mark.parametrize("weight,loss", [("dpace", "ce"), ("exp", "kl")])
def test_the_loss_is_speculators_step_for_step(spec_env, world, tmp_path, weight, loss):  # noqa: F811
    anchors = [0, 3, 9, 15, 16, 22, 30, 38, 43]  # 43 = T - 1 - block_size: the last anchor speculators allows
    batch = tmp_path / "batch.safetensors"
    save_file({"aux": world["aux"].contiguous(), "ids": world["ids"], "mask": world["mask"].long(), "pre": world["pre"].contiguous()},
              str(batch))
    spec = {"anchors": anchors, "lr": LR, "steps": STEPS, "loss": "ce" if loss == "ce" else "kl_div",
            "weight": "dpace" if weight == "dpace" else "fixed-exp-decay"}
    r = spec_env.run("-c", SPECULATORS_STEPS, batch, json.dumps(spec), cwd=DRAFT)
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = [json.loads(x) for x in r.stdout.strip().splitlines()[-STEPS:]]
    draft = _module(world).train()
    opts = DFlashOptions(position_weight=weight, loss=loss)
    opt = torch.optim.AdamW(draft.parameters(), lr=LR, weight_decay=0.0)
    ours = []
    for _ in range(STEPS):
        res = dflash_loss(draft, world["embed"], world["head"], world["ids"], world["aux"], world["last"], opts, loss_mask=world["mask"],
                          anchors=(torch.tensor([anchors]), torch.ones(1, len(anchors), dtype=torch.bool)))
        ours.append(float(res[0].detach()))
        opt.zero_grad()
        res[0].backward()
        opt.step()
    assert ours == pytest.approx(theirs, rel=2e-4), (ours, theirs)
    assert len(set(ours)) == STEPS  # the steps move the weights: the same trajectory, not the same constant
    # the figures count the slots under the loss mask: anchor 9's slots 1..3 sit at 10..12, in the hole
    counted = res[2]
    assert counted == [len(anchors) - sum(10 <= a + j < 14 for a in anchors) for j in (1, 2, 3)]


def test_train_dflash_writes_a_draft_the_checks_pass(tmp_path):
    """A new draft's config and tensors pass the static checks (the reference run and vLLM: the world's retrained draft,
    test_world_qwen3_dflash.py, kept out of here for CI's time)."""
    import sysconfig

    from specfmt.training.loop import TrainOptions
    from specfmt.training.pipeline import TrainRequest, train_draft
    from specfmt.validation.static import validate_static

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    req = TrainRequest(out=str(tmp_path / "out"), verifier=str(WORLD / "verifier"), algorithm="dflash", data=[str(stdlib / "argparse.py")],
                       device="cpu", block_size=4, layers=1, taps=[2, 4, 6], max_anchors=16, validate=False)
    res = train_draft(req, TrainOptions(steps=4, batch_size=2, seq_len=64, lr=3e-3, save_every=0, heldout=0))
    assert validate_static(tmp_path / "out").ok and res.stats.steps == 4
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dflash" and cfg["block_size"] == 4 and cfg["aux_hidden_state_layer_ids"] == [2, 4, 6]
    assert cfg["mask_token_id"] == 2  # the tokenizer's pad: no mask token, no free row
    assert cfg["sliding_window_non_causal"] is False and cfg["transformer_layer_config"]["layer_types"] == ["sliding_attention"]  # causal
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert cfg["specfmt"]["train"]["options"]["position_weight"] == "dpace" and len(res.stats.accuracy) == 3


def test_block_mask_causal_is_written_and_trained_as_speculators_trainer_does(tmp_path, world):
    """``--block-mask causal`` (the default): a new draft written as speculators 0.9's trainer writes its default (every
    layer ``sliding_attention``, the verifier's context length as the window, ``sliding_window_non_causal`` false), which
    the static checks pass and whose training pass is the causal one (each slot sees the block up to itself);
    ``non-causal`` writes DFlash's plain layers with the flag true; an unknown mask is refused in one line before anything
    is written."""
    from specfmt.algorithms.dflash_nn import block_causal
    from specfmt.errors import InputError
    from specfmt.training.loop import TrainOptions
    from specfmt.training.pipeline import TrainRequest, train_draft
    from specfmt.validation.static import validate_static

    def request(out, mask):
        return TrainRequest(out=str(out), verifier=str(WORLD / "verifier"), algorithm="dflash", device="cpu", block_size=4, layers=2,
                            taps=[2, 4, 6], block_mask=mask, dry_run=True, validate=False)

    train_draft(request(tmp_path / "causal", "causal"), TrainOptions())
    assert validate_static(tmp_path / "causal").ok
    cfg = json.loads((tmp_path / "causal" / "config.json").read_text())
    tlc = cfg["transformer_layer_config"]
    verifier = json.loads((WORLD / "verifier" / "config.json").read_text())
    assert cfg["sliding_window_non_causal"] is False and tlc["layer_types"] == ["sliding_attention"] * 2
    assert tlc["sliding_window"] == verifier["max_position_embeddings"] and block_causal(cfg) == [True, True]
    # the same weights as a non-causal draft: the causal config's pass is the non-causal draft's pass forced causal
    plain = {**cfg, "sliding_window_non_causal": True, "transformer_layer_config": {k: v for k, v in tlc.items()
                                                                                 if k not in ("layer_types", "sliding_window", "use_sliding_window")}}
    assert block_causal(plain) == [False, False]
    tensors = {n: t for n, t in get("dflash").module(cfg).state_dict().items()}
    causal, both = get("dflash").module(cfg, tensors).eval(), get("dflash").module(plain, tensors).eval()
    anchors = torch.tensor([[0, 7, 20, 33]])
    block_ids = torch.full((1, 4, 4), causal.mask_token_id)
    block_ids[..., 0] = world["ids"][0, anchors[0]]
    ctx = causal.context(world["aux"])
    with torch.no_grad():
        got = causal.blocks(world["embed"][block_ids], ctx, anchors)
        assert torch.allclose(got, both.blocks(world["embed"][block_ids], ctx, anchors, causal=True), atol=1e-6)
        assert not torch.allclose(got, both.blocks(world["embed"][block_ids], ctx, anchors), atol=1e-3)
    train_draft(request(tmp_path / "both", "non-causal"), TrainOptions())
    written = json.loads((tmp_path / "both" / "config.json").read_text())
    assert written["sliding_window_non_causal"] is True and "layer_types" not in written["transformer_layer_config"]
    assert block_causal(written) == [False, False] and validate_static(tmp_path / "both").ok
    with pytest.raises(InputError, match="--block-mask must be causal or non-causal"):
        train_draft(request(tmp_path / "bad", "upper"), TrainOptions())
    assert not (tmp_path / "bad").exists()
