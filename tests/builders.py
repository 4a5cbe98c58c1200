"""Small research checkpoints built from the layouts in ``docs/design/research-formats.md``.

Shapes are tiny but every name, dtype and config field follows the real layouts:
SafeAILab EAGLE-3 (``pytorch_model.bin``, ``midlayer.*``, LlamaForCausalLM config
without tap ids), SpecForge/ModelOpt (``model.safetensors``, ``LlamaForCausalLMEagle3``,
nested ``eagle_config``), drafts with ``target_hidden_size`` and their own
``embed_tokens``, sharded safetensors with an index, full-vocabulary drafts.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_verifier(folder: Path, *, hidden: int = 64, vocab: int = 256, layers: int = 8, text_config: bool = False) -> Path:
    """A verifier folder with only its config.json (all EAGLE-3 conversion needs)."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": hidden * 3,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rope_theta": 500000.0,
    }
    if text_config:
        cfg = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "text_config": cfg}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def vocab_map(vocab: int, draft_vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t/t2d exactly as ``traineagle3/cnets.py::scandata`` builds them (offsets, bool mask)."""
    g = torch.Generator().manual_seed(seed)
    used = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    d2t = used - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    return d2t.to(torch.int64), t2d


def llama_layer_linears(p: str, r, *, hidden: int, inter: int, heads: int, kv_heads: int, in_width: int) -> dict[str, torch.Tensor]:
    """The seven projection weights of one Llama decoder layer under prefix ``p``, drawn with
    ``r(*shape)`` in a fixed order (q, k, v, o, gate, up, down); q/k/v take ``in_width`` inputs."""
    d = hidden // heads
    return {
        f"{p}self_attn.q_proj.weight": r(heads * d, in_width),
        f"{p}self_attn.k_proj.weight": r(kv_heads * d, in_width),
        f"{p}self_attn.v_proj.weight": r(kv_heads * d, in_width),
        f"{p}self_attn.o_proj.weight": r(hidden, heads * d),
        f"{p}mlp.gate_proj.weight": r(inter, hidden),
        f"{p}mlp.up_proj.weight": r(inter, hidden),
        f"{p}mlp.down_proj.weight": r(hidden, inter),
    }


def eagle3_tensors(
    *, hidden: int = 64, vocab: int = 256, draft_vocab: int = 128, inter: int = 96, heads: int = 2, kv_heads: int = 1,
    target_hidden: int | None = None, n_aux: int = 3, layers: int = 1, embed: bool = False, prefix: str = "midlayer.",
    dtype=torch.float16, seed: int = 0,
) -> dict[str, torch.Tensor]:
    """The state dict of an EAGLE-3 draft (``cnets.py`` ``Model``), research names."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: (torch.randn(*s, generator=g) * 0.02).to(dtype)  # noqa: E731
    ones = lambda n: torch.ones(n, dtype=dtype)  # noqa: E731
    H = hidden
    Ht = target_hidden or hidden
    sd: dict[str, torch.Tensor] = {}
    for i in range(layers):
        p = prefix if layers == 1 else f"{prefix}{i}."
        if prefix == "layers.":
            p = f"layers.{i}."
        w = 2 * H if i == 0 else H
        sd.update(llama_layer_linears(p, r, hidden=H, inter=inter, heads=heads, kv_heads=kv_heads, in_width=w))
        sd[f"{p}input_layernorm.weight"] = ones(H)
        sd[f"{p}post_attention_layernorm.weight"] = ones(H)
        if i == 0:
            sd[f"{p}hidden_norm.weight"] = ones(H)
    sd["fc.weight"] = r(H, n_aux * Ht)
    sd["norm.weight"] = ones(H)
    sd["lm_head.weight"] = r(draft_vocab, H)
    if draft_vocab < vocab:
        sd["d2t"], sd["t2d"] = vocab_map(vocab, draft_vocab, seed)
    if embed:
        sd["embed_tokens.weight"] = r(vocab, H)
    return sd


def eagle3_config(*, hidden: int = 64, vocab: int = 256, draft_vocab: int = 128, inter: int = 96, heads: int = 2, kv_heads: int = 1, layers: int = 1, **extra) -> dict:
    """A SafeAILab-style EAGLE-3 config.json: a LlamaConfig dump plus draft_vocab_size."""
    cfg = {
        "architectures": ["LlamaForCausalLM"], "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu",
        "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": inter, "max_position_embeddings": 2048,
        "model_type": "llama", "num_attention_heads": heads, "num_key_value_heads": kv_heads, "num_hidden_layers": layers,
        "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
        "transformers_version": "4.28.1", "use_cache": True, "vocab_size": vocab, "draft_vocab_size": draft_vocab,
    }
    cfg.update(extra)
    return cfg


def write_safeailab(folder: Path, **kw) -> Path:
    """SafeAILab layout: pytorch_model.bin (torch.save of the flat state dict) + config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg_kw = {k: kw[k] for k in ("hidden", "vocab", "draft_vocab") if k in kw}
    torch.save(eagle3_tensors(**kw), folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(eagle3_config(**cfg_kw)))
    return folder


def write_specforge(folder: Path, *, taps=(1, 4, 5), shards: int = 1, target_hidden: int | None = None, embed: bool = False, layers: int = 1, hidden: int = 64, vocab: int = 256, draft_vocab: int = 128, **kw) -> Path:
    """SpecForge/ModelOpt layout: model.safetensors (or shards + index), nested eagle_config."""
    folder.mkdir(parents=True, exist_ok=True)
    prefix = "midlayer." if layers == 1 else "midlayer."
    sd = eagle3_tensors(hidden=hidden, vocab=vocab, draft_vocab=draft_vocab, target_hidden=target_hidden, n_aux=len(taps), embed=embed, layers=layers, prefix=prefix, dtype=torch.bfloat16, **kw)
    extra = {
        "architectures": ["LlamaForCausalLMEagle3"], "head_dim": hidden // 2, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(taps), "use_aux_hidden_state": True},
    }
    if target_hidden:
        extra["target_hidden_size"] = target_hidden
    (folder / "config.json").write_text(json.dumps(eagle3_config(hidden=hidden, vocab=vocab, draft_vocab=draft_vocab, layers=layers, **extra)))
    return write_safetensors(folder, sd, shards)


def write_safetensors(folder: Path, sd: dict[str, torch.Tensor], shards: int = 1) -> Path:
    """``model.safetensors``, or ``shards`` files ``model-0000s-of-0000n.safetensors`` with an index."""
    if shards == 1:
        save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    names = sorted(sd)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: sd[n] for n in names[s::shards]}
        save_file(part, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


# --------------------------------------------------------------------------- EAGLE-1 / HASS


def eagle1_tensors(
    *, hidden: int = 64, vocab: int = 256, inter: int = 96, heads: int = 2, kv_heads: int = 1, layers: int = 1,
    fc_bias: bool = True, qkv_bias: bool = False, embed: bool = True, dtype=torch.float16, seed: int = 0, scale: float = 0.05,
) -> dict[str, torch.Tensor]:
    """The state dict of an EAGLE-1 draft (``cnets1.py`` ``Model``): unprefixed keys, layer 0
    without ``input_layernorm``, ``fc`` [H, 2H] with an optional bias, a copy of embed_tokens."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: (torch.randn(*s, generator=g) * scale).to(dtype)  # noqa: E731
    norm = lambda n: (1 + torch.randn(n, generator=g) * 0.1).to(dtype)  # noqa: E731
    H, d = hidden, hidden // heads
    sd: dict[str, torch.Tensor] = {"fc.weight": r(H, 2 * H)}
    if fc_bias:
        sd["fc.bias"] = (torch.randn(H, generator=g) * 0.5).to(dtype)
    for i in range(layers):
        p = f"layers.{i}."
        sd.update(llama_layer_linears(p, r, hidden=H, inter=inter, heads=heads, kv_heads=kv_heads, in_width=H))
        sd[f"{p}post_attention_layernorm.weight"] = norm(H)
        if i > 0:
            sd[f"{p}input_layernorm.weight"] = norm(H)
        if qkv_bias:
            for proj, n in (("q", heads * d), ("k", kv_heads * d), ("v", kv_heads * d)):
                sd[f"{p}self_attn.{proj}_proj.bias"] = r(n)
    if embed:
        sd["embed_tokens.weight"] = r(vocab, H)
    return sd


def eagle1_config(*, hidden: int = 64, vocab: int = 256, inter: int = 96, heads: int = 2, kv_heads: int = 1, layers: int = 1, bias: bool | None = None, **extra) -> dict:
    """An EAGLE-1 config.json: a LlamaConfig dump (like ``yuhuili/EAGLE-LLaMA3-Instruct-8B``);
    ``bias`` absent (Vicuna/LLaMA2 repos: fc has a bias) or false (LLaMA3 repos)."""
    cfg = {
        "architectures": ["LlamaForCausalLM"], "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu",
        "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": inter, "max_position_embeddings": 2048,
        "model_type": "llama", "num_attention_heads": heads, "num_key_value_heads": kv_heads, "num_hidden_layers": layers,
        "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
        "transformers_version": "4.28.1", "use_cache": True, "vocab_size": vocab, "rope_theta": 10000.0,
    }
    if bias is not None:
        cfg["bias"] = bias
    cfg.update(extra)
    return cfg


def write_eagle1(folder: Path, *, fmt: str = "bin", config: dict | None = None, **kw) -> Path:
    """An EAGLE-1/HASS folder: ``bin`` (pytorch_model.bin), ``safetensors`` (model.safetensors) or
    ``accelerate`` (``save_state``: pytorch_model.bin, pytorch_model_1.bin with the frozen head,
    optimizer.bin, scheduler.bin, random_states_0.pkl)."""
    folder.mkdir(parents=True, exist_ok=True)
    sd = eagle1_tensors(**kw)
    cfg_kw = {k: kw[k] for k in ("hidden", "vocab", "inter", "heads", "kv_heads", "layers") if k in kw}
    cfg = config or eagle1_config(**cfg_kw, bias=None if kw.get("fc_bias", True) else False)
    (folder / "config.json").write_text(json.dumps(cfg))
    if fmt == "safetensors":
        save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    torch.save(sd, folder / "pytorch_model.bin")
    if fmt == "accelerate":
        H, V = sd["fc.weight"].shape[0], kw.get("vocab", 256)
        torch.save({"weight": torch.randn(V, H).to(sd["fc.weight"].dtype)}, folder / "pytorch_model_1.bin")
        torch.save({"state": {}, "param_groups": []}, folder / "optimizer.bin")
        torch.save({"last_epoch": 3}, folder / "scheduler.bin")
        (folder / "random_states_0.pkl").write_bytes(b"\x80\x04N.")
    return folder


# --------------------------------------------------------------------------- older speculators checkpoints


def _llama_tlc(hidden: int, vocab: int, inter: int, heads: int, kv_heads: int, **extra) -> dict:
    tlc = {
        "attention_bias": False, "attention_dropout": 0.0, "head_dim": hidden // heads, "hidden_act": "silu", "hidden_size": hidden,
        "initializer_range": 0.02, "intermediate_size": inter, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": heads, "num_hidden_layers": 1, "num_key_value_heads": kv_heads, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 10000.0, "use_cache": True, "vocab_size": vocab,
    }
    tlc.update(extra)
    return tlc


def _spec_block(algo: str, verifier: str, k: int = 5) -> dict:
    return {
        "algorithm": algo, "default_proposal_method": "greedy",
        "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy", "speculative_tokens": k, "verifier_accept_k": 1}],
        "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": verifier},
    }


def write_speculators_eagle3(folder: Path, verifier: str, *, style: str = "converter-0.1", hidden: int = 64, vocab: int = 256, draft_vocab: int = 128, inter: int = 96, heads: int = 2, kv_heads: int = 1, taps: list[int] | None = None) -> Path:
    """An EAGLE-3 checkpoint as older speculators wrote it (``docs/design/speculators-format.md`` §1.4, §2).

    ``converter-0.1``: speculators 0.1.0.dev21's converter (``Eagle3Speculator``, ``auto_map``,
    ``has_no_defaults_at_init``, ``torch_dtype`` float32, no tap ids); ``modelopt``: NVIDIA
    ModelOpt's exporter (``0.1.0.dev14``, no ``norm_before_residual`` key, fp16, tap ids);
    ``trainer-0.8``: speculators 0.8.0.dev0's trainer (``Eagle3DraftModel``, 4 taps,
    ``norm_before_fc``/``norm_before_residual``/``norm_output`` true, its own embedding, bf16).
    """
    folder.mkdir(parents=True, exist_ok=True)
    taps = taps or {"converter-0.1": None, "modelopt": [1, 4, 5], "trainer-0.8": [1, 3, 5, 6]}[style]
    n_aux = len(taps or [0, 0, 0])
    dtype = {"converter-0.1": torch.float32, "modelopt": torch.float16, "trainer-0.8": torch.bfloat16}[style]
    sd = eagle3_tensors(hidden=hidden, vocab=vocab, draft_vocab=draft_vocab, inter=inter, heads=heads, kv_heads=kv_heads, n_aux=n_aux, prefix="layers.", dtype=dtype, embed=style == "trainer-0.8")
    cfg: dict = {
        "architectures": ["Eagle3Speculator"], "auto_map": {"": "eagle3.Eagle3SpeculatorConfig"}, "draft_vocab_size": draft_vocab,
        "speculators_config": _spec_block("eagle3", verifier), "speculators_model_type": "eagle3",
        "transformer_layer_config": _llama_tlc(hidden, vocab, inter, heads, kv_heads),
    }
    if style == "converter-0.1":
        cfg.update({"has_no_defaults_at_init": False, "norm_before_residual": False, "speculators_version": "0.1.0.dev21", "torch_dtype": "float32"})
    elif style == "modelopt":
        cfg.update({"speculators_version": "0.1.0.dev14", "torch_dtype": "float16", "eagle_aux_hidden_state_layer_ids": taps, "target_hidden_size": None})
    else:
        sd["input_norm.weight"] = torch.ones(n_aux * hidden, dtype=dtype)
        cfg.update({
            "architectures": ["Eagle3DraftModel"], "auto_map": {"": "config.Eagle3SpeculatorConfig"}, "dtype": "bfloat16",
            "eagle_aux_hidden_state_layer_ids": taps, "embed_requires_grad": False, "fc_norm": False, "norm_before_fc": True,
            "norm_before_residual": True, "norm_output": True, "speculators_version": "0.8.0.dev0", "target_hidden_size": None,
            "tie_word_embeddings": False, "transformers_version": "4.57.6",
        })
        cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 3
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def write_speculators_eagle(folder: Path, verifier: str, *, layernorms: bool = False, fusion_bias: bool = True, hidden: int = 64, vocab: int = 256, inter: int = 96, heads: int = 2, kv_heads: int = 1, dtype=torch.float32, seed: int = 0) -> Path:
    """An EAGLE-1/HASS checkpoint as speculators <= 0.6 wrote it (``EagleSpeculator``):
    ``fusion_fc.*``, ``transformer.*``, ``fusion_bias``; no embedding or lm_head."""
    folder.mkdir(parents=True, exist_ok=True)
    src = eagle1_tensors(hidden=hidden, vocab=vocab, inter=inter, heads=heads, kv_heads=kv_heads, embed=False, dtype=dtype, seed=seed, fc_bias=fusion_bias)
    sd = {("fusion_fc." + k[3:]) if k.startswith("fc.") else "transformer." + k[len("layers.0."):]: v for k, v in src.items()}
    if layernorms:
        for n in ("embedding_layernorm.weight", "pre_lm_head_layernorm.weight", "transformer.input_layernorm.weight"):
            sd[n] = torch.ones(hidden, dtype=dtype)
    cfg = {
        "architectures": ["EagleSpeculator", "LlamaDecoderLayer"], "auto_map": {"": "eagle.EagleSpeculatorConfig"},
        "fusion_bias": fusion_bias, "layernorms": layernorms, "speculators_config": _spec_block("eagle", verifier, k=3),
        "speculators_model_type": "eagle", "speculators_version": "0.3.0", "torch_dtype": "float32",
        "transformer_layer_architecture": "LlamaDecoderLayer",
        "transformer_layer_config": _llama_tlc(hidden, vocab, inter, heads, kv_heads, max_position_embeddings=2048),
    }
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder
