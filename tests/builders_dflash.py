"""DFlash drafts for the tests (issue 25): a config in the format's fields, and a small random draft for the Qwen3 world verifier."""

from __future__ import annotations

from pathlib import Path

from builders import _spec_block
from specfmt.algorithms import get
from specfmt.format.versions import SPECULATORS_VERSION

REPO = Path(__file__).resolve().parents[1]

H, V, TAPS, MASK, B = 32, 97, [1, 2, 4], 95, 4


def dflash_config(block: int = B, vd: int = V, mask: int = MASK, taps=TAPS, layers: int = 1, **more) -> dict:
    return {"architectures": ["DFlashSpeculator"], "speculators_model_type": "dflash", "speculators_version": SPECULATORS_VERSION,
            "speculators_config": _spec_block("dflash", "verifier", k=block - 1 + bool(more.get("sample_from_anchor"))),
            "transformer_layer_config": {"model_type": "qwen3", "vocab_size": V, "hidden_size": H, "intermediate_size": 48,
                                         "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                                         "rms_norm_eps": 1e-6, "hidden_act": "silu", "max_position_embeddings": 128, "rope_theta": 10000.0},
            "draft_vocab_size": vd, "block_size": block, "target_hidden_size": None, "aux_hidden_state_layer_ids": list(taps),
            "mask_token_id": mask, "sliding_window_non_causal": True, "sample_from_anchor": False, "tie_word_embeddings": False, **more}


def write_world_dflash(folder, *, vd: int = 2048, seed: int = 0):
    """A small random DFlash draft for the Qwen3 world verifier (``examples/world-qwen3/verifier``: 8 layers, H = 128,
    V = 2048), as specfmt writes it: block 4, taps [2, 4, 6], mask token 2047; with a draft vocabulary when ``vd`` < V."""
    import json

    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    spec = _spec_block("dflash", str((REPO / "examples" / "world-qwen3" / "verifier").resolve()), k=3)
    spec["verifier"]["architectures"] = ["Qwen3ForCausalLM"]
    cfg = {**dflash_config(), "speculators_config": spec, "draft_vocab_size": vd, "aux_hidden_state_layer_ids": [2, 4, 6], "mask_token_id": 2047,
           "transformer_layer_config": {"model_type": "qwen3", "vocab_size": 2048, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 1,
                                        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6, "hidden_act": "silu",
                                        "max_position_embeddings": 2048, "rope_theta": 10000.0}, "dtype": "float32"}
    g = torch.Generator().manual_seed(seed)
    tensors = {n: torch.ones_like(p) if n.endswith("norm.weight") else 0.02 * torch.randn(p.shape, generator=g)
               for n, p in get("dflash").module(cfg).state_dict().items() if n not in ("d2t", "t2d")}
    if vd < 2048:
        tensors["d2t"] = torch.zeros(vd, dtype=torch.long)  # the first vd ids
        tensors["t2d"] = torch.arange(2048) < vd
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder, cfg
