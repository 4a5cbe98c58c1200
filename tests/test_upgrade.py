"""`specfmt upgrade` / `convert --from speculators`, and `convert --from auto`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from builders import eagle1_tensors, write_eagle1, write_safeailab, write_speculators_eagle, write_speculators_eagle3
from conftest import tree_digest
from specfmt.convert import config_changes, convert
from specfmt.errors import ConversionError, InputError, VersionError
from specfmt.algorithms.eagle import eagle1_forward
from specfmt.validation.static import validate_static


def load(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    cfg = json.loads((folder / "config.json").read_text())
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return cfg, {k: f.get_tensor(k) for k in f.keys()}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specfmt", *args], capture_output=True, text=True, env=os.environ.copy())


@pytest.mark.parametrize("style", ["converter-0.1", "modelopt", "trainer-0.8"])
def test_older_eagle3_checkpoints_are_upgraded(tmp_path, verifier, style):
    src = write_speculators_eagle3(tmp_path / "src", str(verifier.resolve()), style=style)
    old_cfg, old_t = load(src)
    before = tree_digest(src)
    res = convert("speculators", str(src), tmp_path / "out", str(verifier))
    cfg, out = load(tmp_path / "out")
    assert tree_digest(src) == before
    assert out.keys() == old_t.keys() and all(torch.equal(out[k], old_t[k]) for k in out)  # tensors untouched
    assert cfg["speculators_version"] == "0.9.0" and cfg["architectures"] == ["Eagle3DraftModel"]
    assert "auto_map" not in cfg and "has_no_defaults_at_init" not in cfg and "torch_dtype" not in cfg
    assert cfg["transformer_layer_config"]["num_aux_hidden_states"] == len(cfg["eagle_aux_hidden_state_layer_ids"])
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == old_cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    if style == "converter-0.1":
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # written explicitly (vLLM would guess)
        assert any("eagle_aux_hidden_state_layer_ids missing" in n for n in res.plan.notes)
    if style == "modelopt":
        assert cfg["norm_before_residual"] is False  # speculators' default; vLLM would assume true
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 4, 5]
    if style == "trainer-0.8":
        assert cfg["norm_before_residual"] is True and cfg["norm_before_fc"] is True and cfg["norm_output"] is True
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5, 6]
    assert validate_static(tmp_path / "out").ok
    changes = config_changes(old_cfg, cfg)
    assert "~ $.speculators_version: " + json.dumps(old_cfg["speculators_version"]) + ' -> "0.9.0"' in changes
    assert any(line.startswith("- $.auto_map.") for line in changes)


def test_upgrading_a_current_checkpoint_changes_nothing(tmp_path, verifier):
    convert("eagle3", str(write_safeailab(tmp_path / "research")), tmp_path / "v1", str(verifier))
    convert("speculators", str(tmp_path / "v1"), tmp_path / "again", str(verifier))
    a, ta = load(tmp_path / "v1")
    b, tb = load(tmp_path / "again")
    assert config_changes(a, b) == []
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def test_speculators_eagle1_layout_is_renamed_and_its_bias_folded(tmp_path, verifier):
    src = write_speculators_eagle(tmp_path / "src", str(verifier.resolve()))
    res = convert("speculators", str(src), tmp_path / "out", str(verifier))
    cfg, out = load(tmp_path / "out")
    _, old = load(src)
    assert cfg["speculators_model_type"] == "eagle" and cfg["model_type"] == "llama" and cfg["attention_bias"] is True
    assert res.config["specfmt"]["tensors"]["renamed"]["fusion_fc.weight"] == "fc.weight"
    assert "fusion_fc.bias" in res.config["specfmt"]["tensors"]["folded"]
    assert torch.equal(out["layers.0.mlp.up_proj.weight"], old["transformer.mlp.up_proj.weight"])
    # the same function as the reference EAGLE-1 forward over the original tensors
    research = {("fc." + k[10:]) if k.startswith("fusion_fc.") else "layers.0." + k[12:]: v for k, v in old.items()}
    g = torch.Generator().manual_seed(0)
    e, h = torch.randn(9, 64, generator=g, dtype=torch.float64), torch.randn(9, 64, generator=g, dtype=torch.float64)
    ref, got = eagle1_forward(research, cfg, e, h), eagle1_forward(out, cfg, e, h)
    assert (ref - got).abs().max().item() < 1e-5 * ref.abs().max().item()
    assert validate_static(tmp_path / "out").ok


def test_layernorms_variant_is_refused(tmp_path, verifier):
    src = write_speculators_eagle(tmp_path / "src", str(verifier.resolve()), layernorms=True)
    with pytest.raises(ConversionError, match="layernorms"):
        convert("speculators", str(src), tmp_path / "out", str(verifier))
    assert not (tmp_path / "out").exists()


def test_newer_speculators_version_is_refused(tmp_path, verifier):
    src = write_speculators_eagle3(tmp_path / "src", str(verifier.resolve()), style="modelopt")
    cfg = json.loads((src / "config.json").read_text())
    cfg["speculators_version"] = "0.11.0"
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VersionError, match="newer"):
        convert("speculators", str(src), tmp_path / "out", str(verifier))


def test_research_checkpoint_is_not_a_speculators_one(tmp_path, verifier):
    with pytest.raises(ConversionError, match=r"--from speculators cannot read this source: it is an EAGLE-3 research draft \(safeailab layout\), which --from eagle3 reads"):
        convert("speculators", str(write_safeailab(tmp_path / "src")), tmp_path / "out", str(verifier))


def test_upgrade_cli_prints_the_changes_and_uses_the_named_verifier(tmp_path, verifier):
    src = write_speculators_eagle3(tmp_path / "src", str(verifier.resolve()), style="modelopt")
    r = cli("upgrade", str(src), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "~ $.speculators_version: \"0.1.0.dev14\" -> \"0.9.0\"" in r.stdout
    assert "+ $.norm_before_residual = false" in r.stdout
    assert validate_static(tmp_path / "out").ok


def test_upgrade_cli_with_an_unreachable_verifier_says_how_to_fix(tmp_path):
    src = write_speculators_eagle3(tmp_path / "src", "/model/from_s3", style="trainer-0.8")
    r = cli("upgrade", str(src), "-o", str(tmp_path / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "/model/from_s3" in r.stderr and "--verifier" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- --from auto


def test_auto_picks_the_only_fitting_format(tmp_path, verifier):
    res = convert("auto", str(write_safeailab(tmp_path / "e3")), tmp_path / "o1", str(verifier))
    assert res.plan.source_format == "eagle3"
    res = convert("auto", str(write_eagle1(tmp_path / "e1", fc_bias=False)), tmp_path / "o2", str(verifier))
    assert res.plan.source_format == "eagle"  # no fc.bias: HASS always has one
    res = convert("auto", str(write_speculators_eagle3(tmp_path / "sp", str(verifier.resolve()), style="modelopt")), tmp_path / "o3", str(verifier))
    assert res.plan.source_format == "speculators"


def test_auto_stops_when_two_formats_fit(tmp_path, verifier):
    src = write_eagle1(tmp_path / "src")  # with fc.bias: EAGLE-1 or HASS
    with pytest.raises(InputError, match=r"fit 2 formats \(eagle, hass\)") as e:
        convert("auto", str(src), tmp_path / "out", str(verifier))
    assert "--from eagle, --from hass" in e.value.one_line()
    assert not (tmp_path / "out").exists()


def test_auto_names_what_it_found_when_nothing_fits(tmp_path, verifier):
    src = tmp_path / "src"
    src.mkdir()
    sd = eagle1_tensors()
    torch.save({f"model.{k}": v for k, v in sd.items() if k.startswith("layers.")} | {"model.embed_tokens.weight": sd["embed_tokens.weight"]}, src / "pytorch_model.bin")
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    r = cli("convert", "--from", "auto", str(src), "-o", str(tmp_path / "out"), "--verifier", str(verifier))
    assert r.returncode == 2 and "detected causal-lm" in r.stderr and "Traceback" not in r.stderr


def test_a_sliding_window_draft_keeps_its_window_through_the_upgrade(tmp_path, verifier):
    """speculators' trainer writes ``layer_types: [sliding_attention]`` with ``sliding_window``; vLLM's Llama and
    Qwen3 layers read both. Dropping them would turn the window into full attention without a word."""
    import torch

    from specfmt.algorithms.eagle3 import draft_module

    src = write_speculators_eagle3(tmp_path / "src", str(verifier.resolve()), style="trainer-0.8")
    cfg = json.loads((src / "config.json").read_text())
    cfg["transformer_layer_config"].update(layer_types=["sliding_attention"], sliding_window=4, use_sliding_window=True)
    (src / "config.json").write_text(json.dumps(cfg))
    convert("speculators", str(src), tmp_path / "out", str(verifier))
    tlc = json.loads((tmp_path / "out" / "config.json").read_text())["transformer_layer_config"]
    assert tlc["layer_types"] == ["sliding_attention"] and tlc["sliding_window"] == 4 and tlc["use_sliding_window"] is True
    # the reference layer honours the window: within it a sliding layer is a full one, beyond it not
    out_cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    full = {**out_cfg, "transformer_layer_config": {k: v for k, v in tlc.items() if k not in ("layer_types", "sliding_window")}}
    torch.manual_seed(0)
    a, b = draft_module(out_cfg).double(), draft_module(full).double()
    b.load_state_dict(a.state_dict())
    n_aux, H = len(out_cfg["eagle_aux_hidden_state_layer_ids"]), tlc["hidden_size"]
    e, h = torch.randn(1, 9, H, dtype=torch.float64), torch.randn(1, 9, H, dtype=torch.float64)
    la, lb = a(e, h, torch.arange(9))[0], b(e, h, torch.arange(9))[0]
    assert torch.allclose(la[:, :4], lb[:, :4]) and not torch.allclose(la[:, 4:], lb[:, 4:])
    assert n_aux == 4
    bad = {**cfg["transformer_layer_config"], "layer_types": ["sliding_attention", "full_attention"]}
    cfg["transformer_layer_config"] = bad
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="for each of the 1 draft layer"):
        convert("speculators", str(src), tmp_path / "out2", str(verifier))
