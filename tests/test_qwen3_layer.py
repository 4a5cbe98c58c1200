"""A Qwen3-layer EAGLE-3 draft (q/k RMSNorm per head, speculators' default draft layer) through the
reference, the trainer and ``validate --run --no-vllm``: the draft-layer family is a parameter of
the EAGLE-3 algorithm, not a fork of it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import WORLD, run_cli
from specfmt.algorithms.eagle3 import draft_module
from specfmt.algorithms.layers import FAMILIES


def qwen3_cfg(layers: int = 2) -> dict:
    tlc = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
           "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "num_aux_hidden_states": 3}
    return {"speculators_model_type": "eagle3", "transformer_layer_config": tlc, "draft_vocab_size": 64,
            "eagle_aux_hidden_state_layer_ids": [0, 1, 2], "norm_before_residual": False}


def test_the_reference_layer_is_transformers_qwen3_layer():
    """Layer 1 of the draft (a plain Qwen3 decoder layer) computes what transformers' ``Qwen3DecoderLayer``
    computes with the same weights: q/k normed per head before rope."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding

    torch.manual_seed(0)
    cfg = qwen3_cfg()
    draft = draft_module(cfg).double()
    with torch.no_grad():
        for n, p in draft.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)  # not the identity: a norm that is skipped must show
    assert draft.layers[1].self_attn.q_norm.weight.shape == (16,)
    tlc = cfg["transformer_layer_config"]
    hf = Qwen3Config(**{k: v for k, v in tlc.items() if k not in ("architectures", "model_type", "num_aux_hidden_states")},
                     attention_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    hf._attn_implementation = "sdpa"
    ref = Qwen3DecoderLayer(hf, layer_idx=1).double()
    ref.load_state_dict({n: t for n, t in draft.layers[1].state_dict().items()}, strict=True)
    x = torch.randn(1, 7, 32, dtype=torch.float64)
    pos = torch.arange(7)
    with torch.no_grad():
        want = ref(x, attention_mask=None, position_ids=pos[None], position_embeddings=Qwen3RotaryEmbedding(hf).double()(x, pos[None]))
        want = want[0] if isinstance(want, tuple) else want
        layer = draft.layers[1]
        mask = torch.ones(7, 7, dtype=torch.bool).tril()
        a, _ = draft._attend(layer.self_attn, layer.input_layernorm(x), pos, [], mask)
        got = x + a
        got = got + layer.mlp(layer.post_attention_layernorm(got))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # transformers normalises in float32
    # and q/k norms change the output: dropping them is not a no-op
    with torch.no_grad():
        layer.self_attn.q_norm.weight.fill_(1.0)
        layer.self_attn.k_norm.weight.fill_(1.0)
        a2, _ = draft._attend(layer.self_attn, layer.input_layernorm(x), pos, [], mask)
    assert (a2 - a).abs().max() > 1e-3


def test_q_k_norms_dropped_is_a_misreading_of_qwen3_layers_only():
    """Qwen3 drafts get one more misreading, their layers without q/k norms (a Llama layer's forward
    pass on the same weights); Llama drafts do not (issue #18)."""
    from specfmt.algorithms import get
    from specfmt.algorithms.reference import VerifierStates
    from specfmt.validation.run import CAUSES, variants

    cfg = {**qwen3_cfg(), "draft_vocab_size": 64}
    vs = [v for v in variants(cfg, 8) if v.cause == "q/k norms"]
    assert len(vs) == 1 and vs[0].cfg is cfg and "q/k norms" in CAUSES
    llama = {**cfg, "transformer_layer_config": {**cfg["transformer_layer_config"], "model_type": "llama"}}
    assert not [v for v in variants(llama, 8) if v.cause == "q/k norms"]
    # the misreading's draft is the written one minus the norms: the same as a Llama layer
    torch.manual_seed(0)
    tensors = {n: t.uniform_(0.5, 1.5) if n.endswith("norm.weight") else t for n, t in draft_module(cfg).state_dict().items()}
    embed = torch.randn(64, 32)
    states = VerifierStates([torch.randn(5, 32) for _ in range(4)], torch.randn(5, 64))
    algo = get("eagle3")
    plain = {n: t for n, t in tensors.items() if "q_norm" not in n and "k_norm" not in n}
    want = algo.proposer(variants(llama, 8)[0], plain, embed, None)([3, 4, 5, 6, 7, 8], states, 3)
    assert algo.proposer(vs[0], tensors, embed, None)([3, 4, 5, 6, 7, 8], states, 3) == want


@pytest.fixture(scope="module")
def qwen3_draft(tmp_path_factory):
    """A new Qwen3-layer EAGLE-3 draft for the example verifier, trained a few steps by ``specfmt train``."""
    import argparse

    out = tmp_path_factory.mktemp("qwen3") / "draft"
    r = run_cli("train", "eagle3", "--draft-layer", "qwen3", "-o", out, "--verifier", WORLD / "verifier", "--data", argparse.__file__,
                "--draft-vocab", "512", "--steps", "4", "--batch-size", "2", "--seq-len", "64", "--no-validate")
    assert r.returncode == 0, r.stderr
    return out


def test_the_trainer_trains_a_qwen3_layer_draft(qwen3_draft):
    cfg = json.loads((qwen3_draft / "config.json").read_text())
    tlc = cfg["transformer_layer_config"]
    assert tlc["model_type"] == "qwen3" and tlc["architectures"] == list(FAMILIES["qwen3"].architectures)
    t = load_file(str(qwen3_draft / "model.safetensors"))
    assert t["layers.0.self_attn.q_norm.weight"].shape == (tlc["head_dim"],)
    assert "layers.0.self_attn.q_norm.weight" in cfg["specfmt"]["train"]["trained"]
    r = run_cli("validate", qwen3_draft)
    assert r.returncode == 0, r.stdout


def test_validate_run_and_train_init_read_a_qwen3_layer_draft(qwen3_draft, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join((WORLD / "prompts.jsonl").read_text().splitlines()[:2]) + "\n")
    r = run_cli("validate", qwen3_draft, "--run", "--no-vllm", "--prompts", prompts, "--max-tokens", "8", "--json")
    data = json.loads(r.stdout)
    st = {c["name"]: c["status"] for c in data["checks"]}
    # the draft is read as written, with its q/k norms, and no misreading (the q/k norms dropped among them) is
    # accepted more often than it: after 4 training steps nothing is accepted on these 2 prompts either way
    assert st["reference"] == "pass" and st["variants"] == "pass", (st, data["variants"])
    assert data["reference"]["num_drafts"] > 0
    assert "q/k norms" in {v["cause"] for v in data["variants"]}
    assert all(v["mean_acceptance_length"] <= data["reference"]["mean_acceptance_length"] + 0.15 for v in data["variants"]), data["variants"]
    r = run_cli("train", "eagle3", "--init", qwen3_draft, "-o", tmp_path / "more", "--verifier", WORLD / "verifier",
                "--data", __import__("argparse").__file__, "--steps", "2", "--batch-size", "2", "--seq-len", "64", "--no-validate")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "more" / "config.json").read_text())["transformer_layer_config"]["model_type"] == "qwen3"
