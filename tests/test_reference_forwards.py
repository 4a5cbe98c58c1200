"""One reference forward per algorithm: EAGLE-1's and Medusa's, each checked against a plain implementation here.

The reference proposer (``validate --run``), the trainer and the converters' checks run one module class
per algorithm (:class:`~specfmt.algorithms.eagle_nn.Eagle1Draft`, :class:`~specfmt.algorithms.medusa_nn.MedusaHeads`).
Each had a twin until issue 24 (a transformers-based EAGLE-1 forward, a functional Medusa proposer); the
twins were compared on random float64 weights, then deleted, and live on here as the plain implementations
the survivors are held to.
"""

from __future__ import annotations

import torch

from specfmt.algorithms.eagle import draft_module as eagle1_module, eagle1_forward, eagle1_proposer
from specfmt.algorithms.layers import load_state
from specfmt.algorithms.medusa import draft_module as medusa_module, medusa_proposer
from specfmt.algorithms.reference import VerifierStates

H, V = 32, 97
EAGLE1_CFG = {"hidden_size": H, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "vocab_size": V, "rms_norm_eps": 1e-6, "max_position_embeddings": 128, "rope_theta": 10000.0, "attention_bias": True}


def _random(module, seed: int) -> dict[str, torch.Tensor]:
    """The module's tensors, random (norms around 1, biases non-zero), in float64."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, t in module.state_dict().items():
        r = torch.randn(t.shape, generator=g, dtype=torch.float64)
        out[n] = 1 + 0.2 * r if n.endswith("norm.weight") else 0.2 * r
    return out


def plain_eagle1(tensors: dict[str, torch.Tensor], cfg: dict, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """EAGLE-1 (``cnets1.py``) on transformers' own Llama layers: ``fc(cat([embed, h]))`` (``fc.bias`` when
    present), then the layers, layer 0's input norm an identity; [T, H] -> [T, H]."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    dt = embeds.dtype
    bias = any(n.endswith("_proj.bias") for n in tensors)
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "max_position_embeddings")
    config = LlamaConfig(**{k: cfg[k] for k in keys}, num_hidden_layers=cfg["num_hidden_layers"], attention_bias=bias,
                         rope_parameters={"rope_type": "default", "rope_theta": float(cfg["rope_theta"])})
    config._attn_implementation = "sdpa"
    x = torch.cat([embeds, hidden], dim=-1) @ tensors["fc.weight"].to(dt).T
    if "fc.bias" in tensors:
        x = x + tensors["fc.bias"].to(dt)
    x = x[None]
    positions = torch.arange(x.shape[1])[None]
    cos_sin = LlamaRotaryEmbedding(config).to(dtype=dt)(x, positions)
    for i in range(cfg["num_hidden_layers"]):
        layer = LlamaDecoderLayer(config, layer_idx=i).to(dt)
        if i == 0:
            layer.input_layernorm = torch.nn.Identity()
        state = {n[len(f"layers.{i}."):]: t.to(dt) for n, t in tensors.items() if n.startswith(f"layers.{i}.")}
        if bias:
            state.setdefault("self_attn.o_proj.bias", torch.zeros(cfg["hidden_size"], dtype=dt))
        layer.load_state_dict(state, strict=True)
        with torch.no_grad():
            out = layer(x, attention_mask=None, position_ids=positions, position_embeddings=cos_sin)
        x = out[0] if isinstance(out, tuple) else out
    return x[0]


def test_eagle1_module_is_the_plain_forward_pass_on_random_weights():
    tensors = _random(eagle1_module(EAGLE1_CFG), 0)
    g = torch.Generator().manual_seed(1)
    T = 11
    e, h = torch.randn(T, H, generator=g, dtype=torch.float64), torch.randn(T, H, generator=g, dtype=torch.float64)
    want = plain_eagle1(tensors, EAGLE1_CFG, e, h)
    module = load_state(eagle1_module(EAGLE1_CFG).double(), tensors)  # float64 weights, as eagle1_forward loads them
    with torch.no_grad():
        got, _ = module(e[None], h[None], torch.arange(T))
    # transformers' Llama layers compute rope angles and RMSNorm in float32 even for float64 inputs: 1e-6 relative
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(eagle1_forward(tensors, EAGLE1_CFG, e, h), got[0], rtol=0, atol=0)  # the one forward, by name
    assert want.abs().max() > 0.1  # a forward pass that computes something


def test_eagle1_research_tensors_run_with_their_fc_bias_and_qkv_biases():
    """A research checkpoint's ``fc.bias`` and q/k/v biases without an ``o_proj`` bias (EAGLE-Qwen2's
    ``qkv_bias``) run as they are: the reference forward and the proposer read them."""
    tensors = {n: t for n, t in _random(eagle1_module(EAGLE1_CFG), 4).items() if not n.endswith("o_proj.bias")}
    tensors["fc.bias"] = torch.randn(H, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    g = torch.Generator().manual_seed(6)
    e, h = torch.randn(7, H, generator=g, dtype=torch.float64), torch.randn(7, H, generator=g, dtype=torch.float64)
    want = plain_eagle1(tensors, EAGLE1_CFG, e, h)
    torch.testing.assert_close(eagle1_forward(tensors, EAGLE1_CFG, e, h), want, rtol=1e-5, atol=1e-6)
    without = eagle1_forward({n: t for n, t in tensors.items() if n != "fc.bias"}, EAGLE1_CFG, e, h)
    assert (without - want).abs().max() > 1e-2  # the bias is read, not dropped
    # the proposer's first token: the head's argmax over the last position's feature
    head, embed = torch.randn(V, H, dtype=torch.float64), torch.randn(V, H, dtype=torch.float64)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    states = VerifierStates([torch.randn(7, H, dtype=torch.float64), h], torch.zeros(7, V, dtype=torch.float64))
    first = eagle1_proposer(tensors, EAGLE1_CFG, head, embed)(tokens, states, 1)
    assert first == [int((plain_eagle1(tensors, EAGLE1_CFG, embed[torch.tensor(tokens[1:])], h)[-1] @ head.T).argmax())]


def plain_medusa(tensors: dict[str, torch.Tensor], layers: int, h: torch.Tensor, i: int) -> torch.Tensor:
    """Medusa head i (``medusa_model.py`` ``ResBlock``): L blocks ``x + SiLU(W x + b)``, then its head; [H] -> [V]."""
    x = h
    for j in range(layers):
        x = x + torch.nn.functional.silu(x @ tensors[f"blocks.{i}.layers.{j}.weight"].T + tensors[f"blocks.{i}.layers.{j}.bias"])
    return x @ tensors[f"lm_heads.{i}.weight"].T


def test_medusa_module_and_proposer_are_the_plain_heads_on_random_weights():
    cfg = {"hidden_size": H, "vocab_size": V, "num_heads": 3, "num_hidden_layers": 2, "medusa_fc_bias": True, "original_lm_head": False}
    tensors = _random(medusa_module(cfg), 2)
    module = load_state(medusa_module(cfg).double(), tensors)  # float64 weights, as the proposer holds them
    propose = medusa_proposer(tensors, cfg)
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        h = torch.randn(5, H, generator=g, dtype=torch.float64)
        states = VerifierStates([h], torch.zeros(5, V, dtype=torch.float64))
        with torch.no_grad():
            logits = module(h[-1])
        want = [plain_medusa(tensors, 2, h[-1], i) for i in range(3)]
        for got, w in zip(logits, want):
            torch.testing.assert_close(got, w, rtol=0, atol=1e-12)
        assert propose([1, 2, 3, 4, 5, 6], states, 3) == [int(w.argmax()) for w in want]
