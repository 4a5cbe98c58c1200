"""`specfmt convert --from eagle|hass`: layouts, the exact fc.bias fold, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from builders import eagle1_config, eagle1_tensors, write_eagle1
from conftest import load_out, tree_digest
from specfmt.convert import convert
from specfmt.converters import Options
from specfmt.errors import ConversionError
from specfmt.algorithms.eagle import eagle1_forward
from specfmt.validation.static import validate_static




def source_tensors(src: Path) -> dict[str, torch.Tensor]:
    if (src / "model.safetensors").exists():
        with safe_open(str(src / "model.safetensors"), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    return torch.load(src / "pytorch_model.bin", weights_only=True)


def forward_both(src_sd: dict, out_sd: dict, cfg: dict, T: int = 12, seed: int = 1, dtype=torch.float64):
    """The reference forward on the source weights and on the converted ones, same inputs."""
    g = torch.Generator().manual_seed(seed)
    H = cfg["hidden_size"]
    e = torch.randn(T, H, generator=g, dtype=dtype)
    h = torch.randn(T, H, generator=g, dtype=dtype)
    return eagle1_forward(src_sd, cfg, e, h), eagle1_forward(out_sd, cfg, e, h)


def write_state_dict(src: Path, sd: dict[str, torch.Tensor]) -> Path:
    """A SafeAILab-layout folder holding exactly ``sd`` (edited from ``eagle1_tensors``)."""
    src.mkdir()
    torch.save(sd, src / "pytorch_model.bin")
    (src / "config.json").write_text(json.dumps(eagle1_config()))
    return src


# --------------------------------------------------------------------------- the fc.bias fold


def test_fc_bias_is_folded_exactly(tmp_path, verifier):
    """float32 source: the converted draft computes the reference function to float32 rounding,
    while merely dropping the bias (what vLLM's loader would do) changes the output grossly."""
    src = write_eagle1(tmp_path / "src", dtype=torch.float32)
    before = tree_digest(src)
    res = convert("eagle", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    sd = source_tensors(src)

    assert "fc.bias" not in out and cfg["attention_bias"] is True and "bias" not in cfg
    assert cfg["specfmt"]["tensors"]["folded"].keys() == {"fc.bias"}
    assert set(cfg["specfmt"]["tensors"]["derived"]) == {f"layers.0.self_attn.{p}_proj.bias" for p in "qkvo"}
    b = sd["fc.bias"].double()
    assert torch.allclose(out["layers.0.self_attn.q_proj.bias"].double(), sd["layers.0.self_attn.q_proj.weight"].double() @ b, rtol=1e-6, atol=1e-7)
    assert torch.equal(out["layers.0.self_attn.o_proj.bias"], sd["fc.bias"])

    ref, got = forward_both(sd, out, cfg)
    scale = ref.abs().max().item()
    assert (ref - got).abs().max().item() < 1e-5 * scale
    dropped = {k: v for k, v in sd.items() if k != "fc.bias"}
    ref2, _ = forward_both(dropped, out, cfg)
    assert (ref - ref2).abs().max().item() > 1e-2 * scale  # the bias matters: the test can fail

    assert validate_static(tmp_path / "out").ok
    assert tree_digest(src) == before
    assert res.plan.layout == "safeailab"


def test_fold_with_qkv_bias_and_two_layers(tmp_path, verifier):
    """Qwen2-style q/k/v biases are summed with W·b on layer 0; layer 1 keeps its own and gets a zero o_proj bias."""
    src = write_eagle1(tmp_path / "src", dtype=torch.float32, layers=2, qkv_bias=True)
    convert("eagle", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    sd = source_tensors(src)
    assert cfg["num_hidden_layers"] == 2 and cfg["attention_bias"] is True
    assert torch.equal(out["layers.1.self_attn.q_proj.bias"], sd["layers.1.self_attn.q_proj.bias"])
    assert not out["layers.1.self_attn.o_proj.bias"].any()
    assert "layers.1.input_layernorm.weight" in out and "layers.0.input_layernorm.weight" not in out
    folded = cfg["specfmt"]["tensors"]["folded"]
    assert set(folded) == {"fc.bias", "layers.0.self_attn.q_proj.bias", "layers.0.self_attn.k_proj.bias", "layers.0.self_attn.v_proj.bias"}
    ref, got = forward_both(sd, out, cfg)
    assert (ref - got).abs().max().item() < 1e-5 * ref.abs().max().item()
    assert validate_static(tmp_path / "out").ok


def test_fold_in_float16_stays_at_rounding_level(tmp_path, verifier):
    """fp16 source (as released): the folded biases are rounded once to fp16; the output
    differs from the reference by fp16 rounding, far less than the bias's own effect."""
    src = write_eagle1(tmp_path / "src")
    convert("eagle", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    assert all(t.dtype == torch.float16 for t in out.values())
    sd = source_tensors(src)
    ref, got = forward_both(sd, out, cfg)
    ref2, _ = forward_both({k: v for k, v in sd.items() if k != "fc.bias"}, out, cfg)
    err, effect = (ref - got).abs().max().item(), (ref - ref2).abs().max().item()
    assert err < 2e-3 * ref.abs().max().item() and err * 50 < effect


def test_fold_that_overflows_float16_is_refused(tmp_path, verifier):
    sd = eagle1_tensors()
    sd["fc.bias"] = torch.full((64,), 3.0e4, dtype=torch.float16)
    sd["layers.0.self_attn.q_proj.weight"] = torch.full((64, 64), 0.5, dtype=torch.float16)
    src = write_state_dict(tmp_path / "src", sd)
    with pytest.raises(ConversionError, match=r"layers\.0\.self_attn\.q_proj\.bias.*NaN/Inf") as e:
        convert("eagle", str(src), tmp_path / "out", str(verifier))
    assert "--dtype float32" in e.value.one_line()
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.specfmt-*"))
    # the same checkpoint converts exactly in float32
    convert("eagle", str(src), tmp_path / "out32", str(verifier), opts=Options(dtype="float32"))
    assert validate_static(tmp_path / "out32").ok


def test_all_zero_fc_bias_is_dropped_not_folded(tmp_path, verifier):
    sd = eagle1_tensors()
    sd["fc.bias"] = torch.zeros(64, dtype=torch.float16)
    src = write_state_dict(tmp_path / "src", sd)
    convert("eagle", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    assert cfg["attention_bias"] is False and not any(k.endswith(".bias") for k in out)
    assert cfg["specfmt"]["tensors"]["dropped"]["fc.bias"].startswith("all zeros")


# --------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_no_bias_layout_is_copied_unchanged(tmp_path, verifier, fmt):
    """LLaMA3-family repos: "bias": false, no fc.bias -> every tensor copied bit for bit."""
    src = write_eagle1(tmp_path / "src", fmt=fmt, fc_bias=False)
    convert("eagle", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    sd = source_tensors(src)
    assert out.keys() == sd.keys()
    assert all(torch.equal(out[k], sd[k]) for k in sd)
    assert cfg["attention_bias"] is False and cfg["specfmt"]["tensors"]["derived"] == {}
    # what vLLM reads: a native Llama draft config plus the speculators block
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["EagleLlamaForCausalLM"]
    assert cfg["speculators_model_type"] == "eagle" and cfg["transformer_layer_config"]["hidden_size"] == 64
    assert cfg["max_position_embeddings"] == 4096  # raised to the verifier's
    assert validate_static(tmp_path / "out").ok


def test_accelerate_save_state_folder(tmp_path, verifier):
    src = write_eagle1(tmp_path / "src", fmt="accelerate")
    res = convert("eagle", str(src), tmp_path / "out", str(verifier))
    assert res.plan.layout == "accelerate"
    assert any(n.startswith("pytorch_model_1.bin not read") and "frozen verifier lm_head" in n for n in res.plan.notes)
    files = res.config["specfmt"]["source"]["files"]
    assert "pytorch_model.bin" in files and "pytorch_model_1.bin" not in files
    assert validate_static(tmp_path / "out").ok


def test_hass_uses_the_eagle_layout(tmp_path, verifier):
    src = write_eagle1(tmp_path / "src", fmt="safetensors")
    res = convert("hass", str(src), tmp_path / "out", str(verifier))
    assert res.plan.layout == "hass" and res.config["specfmt"]["source"]["format"] == "hass"
    assert res.config["speculators_model_type"] == "eagle"


def test_embed_copy_is_kept(tmp_path, verifier):
    src = write_eagle1(tmp_path / "src")
    res = convert("eagle", str(src), tmp_path / "out", str(verifier))
    _, out = load_out(tmp_path / "out")
    assert torch.equal(out["embed_tokens.weight"], source_tensors(src)["embed_tokens.weight"])
    assert any("embed_tokens.weight kept" in n for n in res.plan.notes)


# --------------------------------------------------------------------------- refusals


def _refused(tmp_path, src, verifier, match, source_format="eagle"):
    before = tree_digest(src)
    with pytest.raises(ConversionError, match=match):
        convert(source_format, str(src), tmp_path / "out", str(verifier))
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.specfmt-*"))
    assert tree_digest(src) == before


def test_layer0_input_norm_is_refused(tmp_path, verifier):
    sd = eagle1_tensors()
    sd["layers.0.input_layernorm.weight"] = torch.ones(64, dtype=torch.float16)
    src = write_state_dict(tmp_path / "src", sd)
    _refused(tmp_path, src, verifier, "first layer has no input norm")


def test_extra_norm_variant_is_refused(tmp_path, verifier):
    sd = eagle1_tensors()
    sd["embed_layernorm.weight"] = torch.ones(64, dtype=torch.float16)
    src = write_state_dict(tmp_path / "src", sd)
    _refused(tmp_path, src, verifier, "extra norms")


@pytest.mark.parametrize("kw,match", [({"vocab": 512}, "vocab_size 512 differs"), ({"hidden": 128}, "hidden_size 128 differs")])
def test_wrong_verifier_is_refused(tmp_path, verifier, kw, match):
    src = write_eagle1(tmp_path / "src", heads=2 if "hidden" not in kw else 4, **kw)
    _refused(tmp_path, src, verifier, match)


def test_unknown_and_missing_tensors_are_listed_together(tmp_path, verifier):
    sd = eagle1_tensors()
    sd["lm_head.weight"] = torch.zeros(256, 64, dtype=torch.float16)  # a vLLM-V0 style head copy
    del sd["layers.0.mlp.up_proj.weight"]
    src = write_state_dict(tmp_path / "src", sd)
    _refused(tmp_path, src, verifier, r"not part of the eagle layout: lm_head\.weight.*missing: layers\.0\.mlp\.up_proj\.weight")
