"""The shipped example world is what the README says: small, real, and in the research layout."""

import json

import torch

from conftest import REPO
from specfmt.checks import vocab_map_problems
from specfmt.convert import convert
from specfmt.validate import validate_static

WORLD = REPO / "examples" / "world"

SAFEAILAB_KEYS = {
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight", "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight", "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
}


def test_world_is_small():
    size = sum(p.stat().st_size for p in WORLD.rglob("*") if p.is_file())
    assert size < 20 * 2**20


def test_verifier_has_distinct_default_taps_and_cpu_friendly_heads():
    cfg = json.loads((WORLD / "verifier" / "config.json").read_text())
    assert cfg["num_hidden_layers"] >= 8  # (2, N//2, N-3) distinct
    assert cfg["head_dim"] >= 32  # vLLM's CPU attention rejects smaller heads
    assert (WORLD / "verifier" / "tokenizer.json").is_file()


def test_draft_is_exactly_the_safeailab_layout():
    folder = WORLD / "eagle3-safeailab"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "pytorch_model.bin"]
    sd = torch.load(folder / "pytorch_model.bin", weights_only=True)
    assert set(sd) == SAFEAILAB_KEYS
    assert {sd[k].dtype for k in sd if k not in ("d2t", "t2d")} == {torch.float16}
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert "eagle_aux_hidden_state_layer_ids" not in cfg and "eagle_config" not in cfg and "rope_theta" not in cfg
    assert cfg["draft_vocab_size"] == sd["lm_head.weight"].shape[0] < cfg["vocab_size"]
    assert vocab_map_problems(sd["d2t"], sd["t2d"], cfg["vocab_size"], cfg["draft_vocab_size"]) == []


def test_world_converts_and_validates(tmp_path):
    convert("eagle3", str(WORLD / "eagle3-safeailab"), tmp_path / "out", str(WORLD / "verifier"))
    rep = validate_static(tmp_path / "out")
    assert rep.ok, rep.to_json()
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
