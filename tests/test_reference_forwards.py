"""One reference forward per algorithm: the EAGLE-1 and Medusa twins agree before one of each is deleted.

The reference proposer (``validate --run``), the trainer and the converters' checks must run the same
forward pass; here the two implementations each algorithm had are compared on random float64 weights.
"""

from __future__ import annotations

import torch

from specfmt.algorithms.eagle import draft_module as eagle1_module, eagle1_forward
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


def test_eagle1_module_and_forward_function_agree_on_random_weights():
    tensors = _random(eagle1_module(EAGLE1_CFG), 0)
    g = torch.Generator().manual_seed(1)
    T = 11
    e, h = torch.randn(T, H, generator=g, dtype=torch.float64), torch.randn(T, H, generator=g, dtype=torch.float64)
    want = eagle1_forward(tensors, EAGLE1_CFG, e, h)
    module = eagle1_module(EAGLE1_CFG, tensors).double()
    with torch.no_grad():
        got, _ = module(e[None], h[None], torch.arange(T))
    # transformers' Llama layers compute rope angles and RMSNorm in float32 even for float64 inputs: 1e-6 relative
    torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-6)
    assert want.abs().max() > 0.1  # a forward pass that computes something


def test_medusa_module_and_proposer_agree_on_random_weights():
    cfg = {"hidden_size": H, "vocab_size": V, "num_heads": 3, "num_hidden_layers": 2, "medusa_fc_bias": True, "original_lm_head": False}
    tensors = _random(medusa_module(cfg), 2)
    module = medusa_module(cfg, tensors).double()
    propose = medusa_proposer(tensors, cfg)
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        h = torch.randn(5, H, generator=g, dtype=torch.float64)
        states = VerifierStates([h], torch.zeros(5, V, dtype=torch.float64))
        with torch.no_grad():
            logits = module(h[-1])
        assert propose([1, 2, 3, 4, 5, 6], states, 3) == [int(x.argmax()) for x in logits]
