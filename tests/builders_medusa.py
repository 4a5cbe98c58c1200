"""Small Medusa checkpoints built from the layouts in ``docs/design/research-formats.md`` §5.

The heads are the reference modules themselves (FasterDecoding/Medusa
``medusa/model/medusa_model.py``: ``ResBlock``, ``ModuleList([Sequential(*([ResBlock(H)] * L),
Linear(H, V, bias=False)) ...])``), so the saved key names are what the reference saves:

* v0.1: ``medusa_lm_head.pt`` (``torch.save(medusa_head.state_dict())``) and a config with
  only ``base_model_name_or_path``, ``medusa_num_heads`` (understated), ``medusa_num_layers``;
* legacy trainer: ``medusa_lm_head.safetensors`` with the same keys;
* version 2: ``Sequential(*([ResBlock(H)] * L))`` only, config ``"version": "2"``;
* Medusa-2 full model: a Llama state dict (``model.*``, ``lm_head.weight``) plus
  ``medusa_head.*``, in sharded ``pytorch_model-*.bin`` with ``pytorch_model.bin.index.json``.

Verifiers with weights (for version-2 heads, which read the verifier's ``lm_head``) are
written by :func:`write_verifier_weights`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from builders import write_safetensors, write_verifier
from safetensors.torch import save_file
from torch import nn


class ResBlock(nn.Module):
    """``x + SiLU(Linear(H, H)(x))``, as in the reference (weights randomised here, not zero)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        self.act = nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


def medusa_heads(*, hidden: int = 64, vocab: int = 256, heads: int = 5, layers: int = 1, version: int = 1, bias: bool = True, dtype=torch.bfloat16, seed: int = 0) -> dict[str, torch.Tensor]:
    """The state dict of the reference ``medusa_head`` ModuleList (no prefix).

    Version 1: ``{i}.{j}.linear.{weight,bias}`` and ``{i}.{L}.weight``; version 2: no per-head
    Linear. ``[ResBlock(H)] * L`` repeats one instance, so for L > 1 the blocks of a head share
    their weights while the state dict lists every index. ``bias=False`` removes the biases
    (as an earlier conversion that dropped them would).
    """
    torch.manual_seed(seed)
    mods = []
    for _ in range(heads):
        seq = [*([ResBlock(hidden)] * layers)]
        if version == 1:
            seq.append(nn.Linear(hidden, vocab, bias=False))
        mods.append(nn.Sequential(*seq))
    module = nn.ModuleList(mods)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.05)
    sd = {k: v.detach().to(dtype).clone() for k, v in module.state_dict().items()}
    if not bias:
        sd = {k: v for k, v in sd.items() if not k.endswith(".bias")}
    return sd


def medusa_config(*, heads: int = 2, layers: int = 1, version: str | None = None, base: str = "lmsys/vicuna-7b-v1.3") -> dict:
    """The reference ``MedusaConfig`` dump: no model_type, no sizes."""
    cfg = {"base_model_name_or_path": base, "medusa_num_heads": heads, "medusa_num_layers": layers, "transformers_version": "4.31.0"}
    if version is not None:
        cfg["version"] = version
        cfg["transformers_version"] = "4.46.2"
    return cfg


def write_v01(folder: Path, *, config_heads: int = 2, heads: int = 5, layers: int = 1, **kw) -> Path:
    """v0.1 layout (``FasterDecoding/medusa-vicuna-7b-v1.3``): medusa_lm_head.pt, the config understating the heads."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(medusa_heads(heads=heads, layers=layers, **kw), folder / "medusa_lm_head.pt")
    (folder / "config.json").write_text(json.dumps(medusa_config(heads=config_heads, layers=layers)))
    return folder


def write_legacy(folder: Path, *, heads: int = 3, layers: int = 1, prefix: str = "", **kw) -> Path:
    """Legacy-trainer layout (``train_legacy.py`` before 2b8020f): medusa_lm_head.safetensors, v0.1 keys."""
    folder.mkdir(parents=True, exist_ok=True)
    sd = {prefix + k: v for k, v in medusa_heads(heads=heads, layers=layers, **kw).items()}
    save_file(sd, str(folder / "medusa_lm_head.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(medusa_config(heads=heads, layers=layers)))
    return folder


def write_v2(folder: Path, *, heads: int = 3, layers: int = 1, **kw) -> Path:
    """Version-2 layout (``train_legacy.py`` from 2b8020f): residual blocks only, config version "2"."""
    folder.mkdir(parents=True, exist_ok=True)
    sd = medusa_heads(heads=heads, layers=layers, version=2, **kw) if layers else {}
    save_file(sd, str(folder / "medusa_lm_head.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(medusa_config(heads=heads, layers=layers, version="2", base="HuggingFaceH4/zephyr-7b-beta")))
    return folder


def llama_state_dict(*, hidden: int = 64, vocab: int = 256, layers: int = 2, inter: int = 96, dtype=torch.bfloat16, seed: int = 1) -> dict[str, torch.Tensor]:
    """A Llama causal LM state dict as transformers 4.31 saved it (rotary caches included)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)
    sd = {"model.embed_tokens.weight": r(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        sd.update({
            p + "self_attn.q_proj.weight": r(hidden, hidden), p + "self_attn.k_proj.weight": r(hidden, hidden),
            p + "self_attn.v_proj.weight": r(hidden, hidden), p + "self_attn.o_proj.weight": r(hidden, hidden),
            p + "self_attn.rotary_emb.inv_freq": 1.0 / (10000.0 ** (torch.arange(0, 32, 2).float() / 32)),
            p + "mlp.gate_proj.weight": r(inter, hidden), p + "mlp.up_proj.weight": r(inter, hidden),
            p + "mlp.down_proj.weight": r(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden, dtype=dtype), p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=dtype),
        })
    sd["model.norm.weight"] = torch.ones(hidden, dtype=dtype)
    sd["lm_head.weight"] = r(vocab, hidden)
    return sd


def write_full(folder: Path, *, heads: int = 4, layers: int = 1, hidden: int = 64, vocab: int = 256, shards: int = 2) -> Path:
    """Medusa-2 full model (``FasterDecoding/medusa-1.0-*``): LlamaConfig + medusa fields, sharded pickles."""
    folder.mkdir(parents=True, exist_ok=True)
    sd = llama_state_dict(hidden=hidden, vocab=vocab)
    sd.update({"medusa_head." + k: v for k, v in medusa_heads(hidden=hidden, vocab=vocab, heads=heads, layers=layers).items()})
    names = sorted(sd)
    weight_map = {}
    for s in range(shards):
        fname = f"pytorch_model-{s + 1:05d}-of-{shards:05d}.bin"
        part = {n: sd[n] for n in names[s::shards]}
        torch.save(part, folder / fname)
        weight_map.update({n: fname for n in part})
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    cfg = {
        "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": hidden,
        "initializer_range": 0.02, "intermediate_size": 96, "max_position_embeddings": 4096, "model_type": "llama",
        "num_attention_heads": 2, "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": 0, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.34.0", "use_cache": True, "vocab_size": vocab,
        "medusa_num_heads": heads, "medusa_num_layers": layers,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def write_verifier_weights(folder: Path, *, hidden: int = 64, vocab: int = 256, shards: int = 1, tied: bool = False, dtype=torch.bfloat16) -> Path:
    """A verifier folder (``builders.write_verifier`` config) with Llama weights in safetensors.

    ``shards`` > 1 writes ``model-0000s-of-0000n.safetensors`` with an index; ``tied`` sets
    ``tie_word_embeddings`` and leaves ``lm_head.weight`` out.
    """
    write_verifier(folder, hidden=hidden, vocab=vocab)
    if tied:
        cfg = json.loads((folder / "config.json").read_text())
        cfg["tie_word_embeddings"] = True
        (folder / "config.json").write_text(json.dumps(cfg))
    sd = llama_state_dict(hidden=hidden, vocab=vocab, dtype=dtype, seed=7)
    sd = {k: v for k, v in sd.items() if "rotary_emb" not in k and not (tied and k == "lm_head.weight")}
    return write_safetensors(folder, sd, shards)
