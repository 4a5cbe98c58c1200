"""DFlash (issue 25): a block drafted in one non-causal pass, as a full algorithm of its own.

* the format: ``DFlashConfig`` (speculators ``DFlashSpeculatorConfig``'s fields, ``mask_token_id`` and
  ``sliding_window_non_causal`` required), its rules and its tensor table (speculators' saved state dict:
  no embedding, ``lm_head`` only with a draft vocabulary);
* serving: method ``dflash``; the card names the block, the taps with vLLM's id - 1 and the mask token.
"""

from __future__ import annotations

import pytest

from builders import _spec_block
from specfmt.algorithms import get, schema_violations
from specfmt.algorithms.recognised import recognised
from specfmt.format.versions import SPECULATORS_VERSION
from specfmt.serving import explicit_config

H, V, N_LAYERS, TAPS, MASK, B = 32, 97, 5, [1, 2, 4], 95, 4


def dflash_config(block: int = B, vd: int = V, mask: int = MASK, taps=TAPS, layers: int = 1, **more) -> dict:
    return {"architectures": ["DFlashSpeculator"], "speculators_model_type": "dflash", "speculators_version": SPECULATORS_VERSION,
            "speculators_config": _spec_block("dflash", "verifier", k=block - 1 + bool(more.get("sample_from_anchor"))),
            "transformer_layer_config": {"model_type": "qwen3", "vocab_size": V, "hidden_size": H, "intermediate_size": 48,
                                         "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                                         "rms_norm_eps": 1e-6, "max_position_embeddings": 128, "rope_theta": 10000.0},
            "draft_vocab_size": vd, "block_size": block, "target_hidden_size": None, "aux_hidden_state_layer_ids": list(taps),
            "mask_token_id": mask, "sliding_window_non_causal": True, "sample_from_anchor": False, "tie_word_embeddings": False, **more}


# --------------------------------------------------------------------------- format


def test_a_dflash_config_validates_and_is_no_longer_only_recognised():
    cfg = dflash_config()
    assert schema_violations(cfg) == [] and schema_violations(dflash_config(vd=64)) == []
    assert recognised("dflash") is None and get("dflash").title == "DFlash" and get("dflash").vllm_method == "dflash"
    for key in ("mask_token_id", "sliding_window_non_causal", "block_size", "aux_hidden_state_layer_ids"):  # vLLM reads them; the trap
        assert any(key in p or key in m for p, m in schema_violations({k: v for k, v in cfg.items() if k != key})), key


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


def test_sliding_window_non_causal_may_be_false_when_every_layer_slides():
    """vLLM's one causal flag then matches speculators' training (sliding layers causal): no finding."""
    cfg = dflash_config(layers=2, sliding_window_non_causal=False)
    cfg["transformer_layer_config"].update(layer_types=["sliding_attention"] * 2, sliding_window=16)
    assert schema_violations(cfg) == []
    cfg["transformer_layer_config"]["layer_types"] = ["sliding_attention", "full_attention"]
    assert [p for p, _ in schema_violations(cfg)] == ["$.sliding_window_non_causal"]


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
