"""Published layouts beyond each family's first one (issue 18): vLLM V0's EAGLE wrapper, Medusa
heads in vLLM's names and without residual blocks, and how each is converted or refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from builders import eagle1_config, eagle1_tensors, write_eagle1
from conftest import load_out, tree_digest
from specfmt.convert import convert
from specfmt.converters import Options
from specfmt.detect import detect
from specfmt.errors import ConversionError
from specfmt.validation.static import validate_static


# --------------------------------------------------------------------------- vLLM V0 EAGLE wrapper


def write_v0_wrapper(folder: Path, *, fc_bias: bool, outer_bias: bool | None = True, inner_bias: bool | None = None, prefix: str = "",
                     head: bool = True, truncated: int | None = None, seed: int = 0, **sizes) -> Path:
    """vLLM V0's EAGLE conversion (``{"model_type": "eagle", "model": cfg}``, PR #6830's script): the
    draft's Llama config nested, ``eagle_fc_bias``, a copy of the verifier's head, optional ``model.``;
    ``sizes`` as :func:`builders.eagle1_config` takes them (hidden, vocab, inter, heads, kv_heads)."""
    folder.mkdir(parents=True)
    sd = eagle1_tensors(fc_bias=fc_bias, dtype=torch.float32, seed=seed, **sizes)
    if head:
        sd["lm_head.weight"] = torch.randn(sizes.get("vocab", 256), sizes.get("hidden", 64))
    sd = {(prefix + k if k != "lm_head.weight" else k): v for k, v in sd.items()}
    inner = eagle1_config(bias=inner_bias, **sizes)
    cfg = {"model_type": "eagle", "model": inner}
    if outer_bias is not None:
        cfg["eagle_fc_bias"] = outer_bias
    if truncated is not None:
        cfg["truncated_vocab_size"] = truncated
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(sd, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("prefix", ["", "model."])
def test_v0_wrapper_unwrapped_and_equal_to_the_plain_layout(tmp_path, verifier, prefix):
    """The wrapper converts to exactly what the same draft in SafeAILab's layout gives: bias folded,
    the head copy dropped with its reason, the source untouched."""
    src = write_v0_wrapper(tmp_path / "v0", fc_bias=True, prefix=prefix)
    plain = write_eagle1(tmp_path / "plain", fmt="safetensors", dtype=torch.float32)
    before = tree_digest(src)
    d = detect(src)
    assert (d.format, d.layout, d.candidates) == ("eagle", "vllm-v0", ["eagle"])
    res = convert("auto", str(src), tmp_path / "out", str(verifier))
    convert("eagle", str(plain), tmp_path / "out-plain", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    cfg_plain, out_plain = load_out(tmp_path / "out-plain")
    assert res.plan.layout == "vllm-v0" and cfg["specfmt"]["source"]["layout"] == "vllm-v0"
    assert out.keys() == out_plain.keys() and all(torch.equal(out[k], out_plain[k]) for k in out)
    assert "verifier's lm_head" in cfg["specfmt"]["tensors"]["dropped"]["lm_head.weight"]
    assert cfg["attention_bias"] is True and "fc.bias" not in out
    assert cfg["specfmt"]["tensors"]["folded"].keys() == {prefix + "fc.bias"}
    assert validate_static(tmp_path / "out", str(verifier)).ok
    assert tree_digest(src) == before


def test_v0_wrapper_tensors_decide_the_bias(tmp_path, verifier):
    """eagle_fc_bias true outside, bias false inside, no fc.bias in the file: no bias, and a note says so."""
    src = write_v0_wrapper(tmp_path / "v0", fc_bias=False, outer_bias=True, inner_bias=False)
    res = convert("eagle", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    assert cfg["attention_bias"] is False and not any(k.endswith(".bias") for k in out)
    assert any("eagle_fc_bias=True" in n and "the tensors decide" in n for n in res.plan.notes)


def test_v0_wrapper_truncated_vocabulary_refused(tmp_path, verifier):
    src = write_v0_wrapper(tmp_path / "v0", fc_bias=True, truncated=128)
    with pytest.raises(ConversionError, match="token_map"):
        convert("eagle", str(src), tmp_path / "out", str(verifier))
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- Medusa


def write_vllm_medusa(folder: Path, *, heads: int = 3, bias: bool = False, cfg_extra: dict | None = None, hidden: int = 64, vocab: int = 256) -> Path:
    """Heads in vLLM's names (``abhigoyal/vllm-medusa-vicuna-7b-v1.3``): blocks.{i}.layers.0, lm_heads.{i}."""
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(3)
    sd = {}
    for i in range(heads):
        sd[f"blocks.{i}.layers.0.weight"] = torch.randn(hidden, hidden, generator=g) * 0.05
        if bias:
            sd[f"blocks.{i}.layers.0.bias"] = torch.randn(hidden, generator=g) * 0.05
        sd[f"lm_heads.{i}.weight"] = torch.randn(vocab, hidden, generator=g) * 0.05
    save_file(sd, str(folder / "model.safetensors"))
    cfg = {"architectures": ["MedusaModel"], "hidden_size": hidden, "model_type": "medusa", "num_heads": heads, "num_hidden_layers": 1,
           "truncated_vocab_size": vocab, "vocab_size": vocab, **(cfg_extra or {})}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("bias", [False, True])
def test_medusa_vllm_names(tmp_path, verifier, bias):
    src = write_vllm_medusa(tmp_path / "src", bias=bias)
    d = detect(src)
    assert (d.format, d.layout, d.candidates) == ("medusa", "vllm", ["medusa"])
    res = convert("auto", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    assert cfg["medusa_fc_bias"] is bias and cfg["num_heads"] == 3 and cfg["num_hidden_layers"] == 1
    src_sd = __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(src / "model.safetensors"))
    assert out.keys() == src_sd.keys() and all(torch.equal(out[k], src_sd[k]) for k in out)
    assert any("cannot be recovered" in n for n in res.plan.notes) is (not bias)
    assert validate_static(tmp_path / "out", str(verifier)).ok


def test_medusa_vllm_names_truncated_vocabulary_refused(tmp_path, verifier):
    src = write_vllm_medusa(tmp_path / "src", cfg_extra={"truncated_vocab_size": 128})
    with pytest.raises(ConversionError, match="token_map"):
        convert("medusa", str(src), tmp_path / "out", str(verifier))


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_medusa_without_residual_blocks_is_recognised(tmp_path, verifier, fmt):
    """medusa_num_layers 0: only {i}.0.weight per head; inspect and --from auto name it Medusa."""
    src = tmp_path / "src"
    src.mkdir()
    sd = {f"{i}.0.weight": torch.randn(256, 64) for i in range(3)}
    if fmt == "pt":
        torch.save(sd, src / "medusa_lm_head.pt")
    else:
        save_file(sd, str(src / "medusa_lm_head.safetensors"))
    (src / "config.json").write_text(json.dumps({"base_model_name_or_path": "x", "medusa_num_heads": 3, "medusa_num_layers": 0}))
    d = detect(src)
    assert d.format == "medusa" and d.candidates == ["medusa"]
    convert("auto", str(src), tmp_path / "out", str(verifier))
    cfg, out = load_out(tmp_path / "out")
    assert cfg["num_hidden_layers"] == 0 and sorted(out) == [f"lm_heads.{i}.weight" for i in range(3)]


# --------------------------------------------------------------------------- EAGLE-3


def test_eagle3_config_with_the_verifiers_depth_and_one_midlayer(tmp_path, verifier):
    """num_hidden_layers 8 (the verifier's) but one unnumbered midlayer.*: converted as one layer, with a note."""
    from builders import write_safeailab

    src = write_safeailab(tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 8}))
    res = convert("auto", str(src), tmp_path / "out", str(verifier))
    out_cfg, out = load_out(tmp_path / "out")
    assert out_cfg["transformer_layer_config"]["num_hidden_layers"] == 1
    assert any("num_hidden_layers=8" in n and "one unnumbered midlayer" in n for n in res.plan.notes)
    assert validate_static(tmp_path / "out", str(verifier)).ok


# --------------------------------------------------------------------------- speculators' pre-release EAGLE dialect


def test_speculators_pre_release_eagle_dialect(tmp_path, verifier):
    """model_type llama_eagle, no speculators_model_type, speculators_config.algorithm eagle, a static_tree
    proposal with draft_tokens, fusion_fc/transformer tensors: converted as speculators' eagle, k from draft_tokens."""
    from builders import write_speculators_eagle

    src = write_speculators_eagle(tmp_path / "src", str(verifier))
    ref = write_speculators_eagle(tmp_path / "ref", str(verifier))
    cfg = json.loads((src / "config.json").read_text())
    del cfg["speculators_model_type"], cfg["speculators_version"], cfg["auto_map"]
    cfg["model_type"] = "llama_eagle"
    cfg["speculators_config"]["proposal_methods"] = [{"proposal_type": "static_tree", "draft_tokens": 4}]
    cfg["speculators_config"]["default_proposal_method"] = "static_tree"
    (src / "config.json").write_text(json.dumps(cfg))
    d = detect(src)
    assert d.format == "speculators" and d.summary["algorithm"] == "eagle"
    res = convert("auto", str(src), tmp_path / "out", str(verifier))
    convert("auto", str(ref), tmp_path / "out-ref", str(verifier))
    out_cfg, out = load_out(tmp_path / "out")
    _, out_ref = load_out(tmp_path / "out-ref")
    assert out_cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert out.keys() == out_ref.keys() and all(torch.equal(out[k], out_ref[k]) for k in out)
    assert any("pre-release dialect" in n for n in res.plan.notes) and any("static_tree" in n for n in res.plan.notes)
    assert validate_static(tmp_path / "out", str(verifier)).ok


#: how SpecForge sources are read here: SGLang's layer-output tap ids (converters/eagle3.py read_taps)
SGLANG_TAPS = Options(tap_ids="layer-output")


def write_d2t_only(folder: Path, dtype=torch.int32, **kw) -> Path:
    """A SpecForge-layout EAGLE-3 draft saved with ``d2t`` only (as ``dtype``), no ``t2d``."""
    from builders import write_specforge

    src = write_specforge(folder, **kw)
    sd = __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(src / "model.safetensors"))
    del sd["t2d"]
    sd["d2t"] = sd["d2t"].to(dtype)
    save_file(sd, str(src / "model.safetensors"))
    return src


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_eagle3_d2t_without_t2d(tmp_path, verifier, dtype):
    """d2t alone (int32 or int64), no t2d: t2d built exactly from d2t, d2t written as int64; the
    output equals the same draft converted with both maps."""
    from builders import write_specforge

    ref = write_specforge(tmp_path / "ref")
    src = write_d2t_only(tmp_path / "src", dtype)
    res = convert("auto", str(src), tmp_path / "out", str(verifier), opts=SGLANG_TAPS)
    convert("auto", str(ref), tmp_path / "out-ref", str(verifier), opts=SGLANG_TAPS)
    _, out = load_out(tmp_path / "out")
    _, out_ref = load_out(tmp_path / "out-ref")
    assert out.keys() == out_ref.keys() and all(torch.equal(out[k], out_ref[k]) for k in out)
    assert out["d2t"].dtype == torch.int64 and out["t2d"].dtype == torch.bool
    assert any("no t2d" in n for n in res.plan.notes)
    assert validate_static(tmp_path / "out", str(verifier)).ok


def test_eagle3_d2t_that_is_not_a_map_is_refused(tmp_path, verifier):
    from builders import write_specforge

    src = write_specforge(tmp_path / "src")
    sd = __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(src / "model.safetensors"))
    del sd["t2d"]
    sd["d2t"] = torch.zeros_like(sd["d2t"]) - 1  # target id -1 for draft id 0
    save_file(sd, str(src / "model.safetensors"))
    with pytest.raises(ConversionError, match="distinct, ascending target ids"):
        convert("auto", str(src), tmp_path / "out", str(verifier), opts=SGLANG_TAPS)


def test_modelopt_without_aux_hidden_states_is_refused_with_how_vllm_serves_it(tmp_path, verifier):
    """ModelOpt's eagle_config.use_aux_hidden_state false: vLLM builds it from its own config; no speculators field."""
    from builders import write_specforge

    src = write_specforge(tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["eagle_config"]["use_aux_hidden_state"] = False
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="use_aux_hidden_state is false.*method.*eagle3"):
        convert("auto", str(src), tmp_path / "out", str(verifier))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", [True, False])
def test_specforge_top_level_norm_output_is_specforges_meaning(tmp_path, verifier, value):
    """SpecForge's norm_output (llama3_eagle.py compute_logits): true = RMSNorm before lm_head with the pre-norm
    output fed back, i.e. vLLM's norm_output false; false = no norm before lm_head, which vLLM cannot run."""
    from builders import write_specforge

    src = write_specforge(tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["norm_output"] = value
    (src / "config.json").write_text(json.dumps(cfg))
    if not value:
        with pytest.raises(ConversionError, match="un-normed output"):
            convert("auto", str(src), tmp_path / "out", str(verifier), opts=SGLANG_TAPS)
        return
    res = convert("auto", str(src), tmp_path / "out", str(verifier), opts=SGLANG_TAPS)
    out_cfg, _ = load_out(tmp_path / "out")
    assert out_cfg["norm_output"] is False and any("SpecForge's" in n for n in res.plan.notes)


def test_gpt_oss_shaped_draft_head_dim_and_norm_before_fc(tmp_path):
    """A gpt-oss-120b-Eagle3-shaped draft (ModelOpt/SpecForge export): head_dim 16 while H / nH = 12,
    eagle_config.norm_before_fc with input_norm.weight [3 H]. Converted with both kept, and the reference
    forward pass loads it strictly and runs."""
    from builders import eagle3_config, write_safetensors, write_verifier

    from specfmt.algorithms.eagle3 import draft_module

    H, nH, kv, hd, V, Vd, inter = 48, 4, 2, 16, 256, 128, 96
    ver = write_verifier(tmp_path / "verifier", hidden=H, vocab=V, layers=8)
    g = torch.Generator().manual_seed(0)
    r = lambda *s: (torch.randn(*s, generator=g) * 0.05).to(torch.bfloat16)  # noqa: E731
    sd = {"midlayer.self_attn.q_proj.weight": r(nH * hd, 2 * H), "midlayer.self_attn.k_proj.weight": r(kv * hd, 2 * H),
          "midlayer.self_attn.v_proj.weight": r(kv * hd, 2 * H), "midlayer.self_attn.o_proj.weight": r(H, nH * hd),
          "midlayer.mlp.gate_proj.weight": r(inter, H), "midlayer.mlp.up_proj.weight": r(inter, H), "midlayer.mlp.down_proj.weight": r(H, inter),
          "midlayer.input_layernorm.weight": r(H), "midlayer.post_attention_layernorm.weight": r(H), "midlayer.hidden_norm.weight": r(H),
          "fc.weight": r(H, 3 * H), "input_norm.weight": r(3 * H), "norm.weight": r(H), "lm_head.weight": r(Vd, H)}
    from builders import vocab_map

    sd["d2t"], sd["t2d"] = vocab_map(V, Vd)
    src = tmp_path / "src"
    src.mkdir()
    cfg = eagle3_config(hidden=H, vocab=V, draft_vocab=Vd, inter=inter, heads=nH, kv_heads=kv, head_dim=hd, architectures=["LlamaForCausalLMEagle3"],
                        eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 4, 5], "use_aux_hidden_state": True, "norm_before_fc": True})
    (src / "config.json").write_text(json.dumps(cfg))
    write_safetensors(src, sd)
    convert("auto", str(src), tmp_path / "out", str(ver), opts=SGLANG_TAPS)
    out_cfg, out = load_out(tmp_path / "out")
    assert out_cfg["norm_before_fc"] is True and out_cfg["transformer_layer_config"]["head_dim"] == hd
    assert tuple(out["layers.0.self_attn.q_proj.weight"].shape) == (nH * hd, 2 * H) and "input_norm.weight" in out
    assert validate_static(tmp_path / "out", str(ver)).ok
    m = draft_module(out_cfg, {k: v.float() for k, v in out.items()})
    T = 5
    logits, feedback, _ = m(torch.randn(1, T, H), m.combine(torch.randn(1, T, 3 * H)), torch.arange(T))
    assert logits.shape == (1, T, Vd) and feedback.shape == (1, T, H) and torch.isfinite(logits).all()


# --------------------------------------------------------------------------- named refusals


def test_mlp_speculator_is_named_with_the_vllm_releases_that_serve_it(tmp_path, verifier):
    """IBM's MLP speculator (fms-extras names): inspect and --from auto say what it is and which vLLM serves it."""
    src = tmp_path / "src"
    src.mkdir()
    sd = {f"speculator.emb.{i}.weight": torch.zeros(256, 32) for i in range(3)}
    sd |= {f"speculator.head.{i}.weight": torch.zeros(256, 32) for i in range(3)}
    sd |= {f"speculator.proj.{i}.weight": torch.zeros(32, 64 if i == 0 else 32) for i in range(3)}
    save_file(sd, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"architectures": ["MLPSpeculatorPreTrainedModel"], "model_type": "mlp_speculator", "n_predict": 3,
                                                 "emb_dim": 64, "inner_dim": 32, "vocab_size": 256}))
    d = detect(src)
    assert d.format == "mlp_speculator" and "0.33 removed it" in d.served and "does not convert" in d.served
    with pytest.raises(Exception, match="mlp_speculator.*V0-engine releases"):
        convert("auto", str(src), tmp_path / "out", str(verifier))


def test_explicit_from_on_a_named_format_says_what_it_is(tmp_path, verifier):
    """--from eagle3 on an MLA EAGLE-3 draft: refused as what it is (how vLLM serves it), not with its tensor list;
    on a P-EAGLE draft (converted since issue 25): refused naming the converter that reads it."""
    from builders import write_specforge

    for name, extra in (("mla", {"midlayer.self_attn.q_a_proj.weight": torch.zeros(8, 64, dtype=torch.bfloat16)}),
                        ("peagle", {"mask_hidden": torch.zeros(1, 1, 3 * 64, dtype=torch.bfloat16)})):
        src = write_specforge(tmp_path / name)
        sd = __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(src / "model.safetensors"))
        save_file({**sd, **extra}, str(src / "model.safetensors"))
    with pytest.raises(ConversionError, match="--from eagle3: the source is native-draft.*which no converter reads.*MLA"):
        convert("eagle3", str(tmp_path / "mla"), tmp_path / "out", str(verifier))
    with pytest.raises(ConversionError, match="--from eagle3 cannot read this source: it is a P-EAGLE research draft.*which --from peagle reads"):
        convert("eagle3", str(tmp_path / "peagle"), tmp_path / "out", str(verifier))


def test_v0_wrapper_token_map_refused(tmp_path, verifier):
    src = write_v0_wrapper(tmp_path / "v0", fc_bias=True)
    sd = __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(src / "model.safetensors"))
    sd["token_map"] = torch.arange(128)
    save_file(sd, str(src / "model.safetensors"))
    with pytest.raises(ConversionError, match="token_map"):
        convert("eagle", str(src), tmp_path / "out", str(verifier))
