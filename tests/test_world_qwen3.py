"""The Qwen3 world (``examples/world-qwen3``, issue #18): a Qwen3 verifier and an EAGLE-3 draft with a
Qwen3 decoder layer, saved as speculators 0.9 saves it, converted by ``--from auto``, run by the
reference (figures equal to the ones ``make_world_qwen3.py`` recorded) and by vLLM 0.32, which
attaches it as ``Eagle3Qwen3ForCausalLM`` with no speculative flags."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import REPO, assert_figures, run_cli
from specfmt.convert import convert
from specfmt.validation.run import validate_run
from speculators_env import spec_env  # noqa: F401  (fixture)
from world_qwen3 import MANIFEST, WORLD, convert_draft, saves_again, tensor_names

DRAFT = WORLD / "eagle3-speculators"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert_draft(DRAFT, tmp_path_factory.mktemp("qwen3world") / "draft")


def test_world_is_small_and_its_verifier_is_qwen3():
    assert sum(p.stat().st_size for p in WORLD.rglob("*") if p.is_file()) < 15e6  # issue #18
    cfg = json.loads((WORLD / "verifier" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["num_hidden_layers"] >= 8 and cfg["head_dim"] >= 32
    names = tensor_names(WORLD / "verifier" / "model.safetensors")
    assert {f"model.layers.{i}.self_attn.{n}_norm.weight" for i in range(8) for n in "qk"} <= names
    assert (WORLD / "verifier" / "tokenizer.json").read_bytes() == (REPO / "examples" / "world" / "verifier" / "tokenizer.json").read_bytes()


def test_draft_is_the_speculators_layout_with_a_qwen3_layer():
    assert sorted(p.name for p in DRAFT.iterdir()) == ["config.json", "config.py", "model.safetensors"]
    assert (DRAFT / "config.py").read_bytes() == (REPO / "examples" / "vendor" / "speculators-0.9.0-eagle3-config.py").read_bytes()
    cfg = json.loads((DRAFT / "config.json").read_text())
    assert (DRAFT / "config.json").read_text() == json.dumps(cfg, indent=2, sort_keys=True) + "\n"
    assert cfg["speculators_model_type"] == "eagle3" and cfg["speculators_version"] == "0.9.0" and cfg["auto_map"] == {"": "config.Eagle3SpeculatorConfig"}
    tlc = cfg["transformer_layer_config"]
    assert tlc["model_type"] == "qwen3" and tlc["layer_types"] == ["sliding_attention"] and "transformers_version" not in tlc
    assert tensor_names(DRAFT / "model.safetensors") == {
        "d2t", "t2d", "embed_tokens.weight", "fc.weight", "norm.weight", "lm_head.weight", "layers.0.hidden_norm.weight",
        "layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight", "layers.0.self_attn.q_norm.weight",
        "layers.0.self_attn.k_norm.weight", *{f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"},
        *{f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}}


def test_speculators_saves_the_draft_again_byte_for_byte(spec_env, tmp_path):  # noqa: F811
    """speculators 0.9.0 loads the draft (its verifier resolved from the draft's folder, as
    speculators resolves relative paths against the working directory) and writes the same
    config.json, config.py and model.safetensors again."""
    shown = saves_again(spec_env, DRAFT, tmp_path / "again", "type(m.config.transformer_layer_config).__name__")
    assert shown == ["Eagle3DraftModel", "Qwen3Config"]


def test_auto_detects_speculators_and_keeps_every_tensor(converted):
    cfg = json.loads((converted / "config.json").read_text())
    assert cfg["transformer_layer_config"]["model_type"] == "qwen3"
    src = tensor_names(DRAFT / "model.safetensors")
    assert tensor_names(converted / "model.safetensors") == src


def test_reference_figures_are_the_ones_the_world_was_made_with(converted):
    """The reference run on the 16 held-out prompts x 32 tokens reproduces world.json exactly; the
    draft's q/k norms matter (read without them it is accepted less often) and no misreading beats it."""
    res = validate_run(converted, prompts=str(WORLD / "prompts.jsonl"), max_tokens=32, num_speculative_tokens=3, use_vllm=False, write=False)
    st = {c.name: c.status for c in res.report.checks}
    assert res.report.ok and st["variants"] == "pass", res.report.to_json()
    got = {**res.reference, "k": res.k, "prompts": len(res.prompts.ids), "tokens": len(res.prompts.ids) * res.max_tokens}
    assert_figures(got, MANIFEST["draft"]["heldout"], "qwen3 world")
    assert got["mean_acceptance_length"] >= 1.8
    dropped = next(v for v in res.variants if v["cause"] == "q/k norms")
    assert dropped["mean_acceptance_length"] < got["mean_acceptance_length"]


def test_figures_are_those_of_a_plain_step_by_step_loop():
    """world.json's figures counted again without specfmt (``plain_eagle3``): transformers' Qwen3 verifier, a full pass
    per step, and the speculators draft's forward pass in plain torch from its own file (q/k RMS-normed per head; its
    one layer's 2048-token sliding window is wider than any sequence here)."""
    from plain_eagle3 import PlainEagle3, one_thread, speculative_figures
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    verifier = AutoModelForCausalLM.from_pretrained(str(WORLD / "verifier"), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(WORLD / "verifier"))
    sd = load_file(str(DRAFT / "model.safetensors"))
    cfg = json.loads((DRAFT / "config.json").read_text())
    tlc = cfg["transformer_layer_config"]
    assert not cfg["norm_before_residual"] and not cfg["norm_before_fc"] and not cfg["fc_norm"] and not cfg["norm_output"]
    layer = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj", "gate": "mlp.gate_proj",
             "up": "mlp.up_proj", "down": "mlp.down_proj", "input_norm": "input_layernorm", "hidden_norm": "hidden_norm",
             "post_norm": "post_attention_layernorm", "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}
    w = {short: sd[f"layers.0.{name}.weight"] for short, name in layer.items()}
    w.update(fc=sd["fc.weight"], norm=sd["norm.weight"], lm_head=sd["lm_head.weight"], d2t=sd["d2t"], embed=sd["embed_tokens.weight"])
    draft = PlainEagle3(w, heads=tlc["num_attention_heads"], kv_heads=tlc["num_key_value_heads"], head_dim=tlc["head_dim"],
                        eps=tlc["rms_norm_eps"], theta=tlc["rope_parameters"]["rope_theta"])
    prompts = [tokenizer.encode(json.loads(line)["prompt"]) for line in (WORLD / "prompts.jsonl").read_text().splitlines()]
    assert max(map(len, prompts)) + 32 + 3 < tlc["sliding_window"]
    with one_thread():
        got = speculative_figures(verifier, draft, prompts, cfg["eagle_aux_hidden_state_layer_ids"], k=3, max_tokens=32)
    assert_figures(got, MANIFEST["draft"]["heldout"], "qwen3 world")


def test_train_init_reads_the_converted_draft(converted, tmp_path):
    data = str(REPO / "examples" / "make_world.py")
    r = run_cli("train", "eagle3", "--draft-layer", "qwen3", "--init", converted, "-o", tmp_path / "more", "--verifier", WORLD / "verifier", "--data", data,
                "--steps", "2", "--batch-size", "2", "--seq-len", "64", "--no-validate")
    assert r.returncode == 0, r.stderr
    cfg = json.loads((tmp_path / "more" / "config.json").read_text())
    assert cfg["transformer_layer_config"]["model_type"] == "qwen3" and cfg["specfmt"]["train"]["steps"] == 2
    assert "layers.0.self_attn.q_norm.weight" in cfg["specfmt"]["train"]["trained"]
    r = run_cli("train", "eagle3", "--draft-layer", "llama", "--init", converted, "-o", tmp_path / "wrong", "--verifier", WORLD / "verifier",
                "--data", data, "--steps", "1")
    assert r.returncode != 0 and "has qwen3 decoder layers, not llama" in r.stderr and not (tmp_path / "wrong").exists()


@pytest.mark.vllm
def test_vllm_serves_it_as_eagle3_qwen3_and_agrees_with_the_reference(converted):
    """``validate --run`` as the quickstart runs it: vLLM started as ``vllm serve OUT`` (no speculative
    flags) attaches the draft as ``Eagle3Qwen3ForCausalLM``; per position it agrees with the reference
    within 0.1, both at mean acceptance length >= 1.8, the figures world.json recorded."""
    res = validate_run(converted, prompts=str(WORLD / "prompts.jsonl"), max_tokens=32, num_speculative_tokens=3,
                       min_acceptance_length=1.8, write=False)
    st = {c.name: c.status for c in res.report.checks}
    assert res.report.ok, res.report.to_json()
    assert all(st[n] == "pass" for n in ("reference", "variants", "vllm", "vllm_exact", "vllm_weights", "agreement", "acceptance")), st
    ref, vl = res.reference, res.vllm
    assert vl["method"] == "eagle3" and vl["draft_class"] == "Eagle3Qwen3ForCausalLM" and vl["form"] == "auto"
    from specfmt.serving import LAUNCHERS, installed_distribution

    assert vl["command"] == f"{' '.join(LAUNCHERS[installed_distribution()[0]])} {converted}"  # as the installed build starts it
    gaps = [abs(a - b) for a, b in zip(ref["acceptance_rate_per_position"], vl["acceptance_rate_per_position"])]
    assert len(gaps) == 3 and max(gaps) <= 0.1
    assert ref["mean_acceptance_length"] >= 1.8 and vl["mean_acceptance_length"] >= 1.8
    recorded = MANIFEST["validate_run"]
    assert ref["mean_acceptance_length"] == recorded["reference"]["mean_acceptance_length"]
    assert abs(vl["mean_acceptance_length"] - recorded["vllm"]["mean_acceptance_length"]) <= 0.1
