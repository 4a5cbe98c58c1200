"""Draft decoder-layer families: what a Llama or a Qwen3 layer of a draft is.

A draft's decoder layers follow the verifier family's layer: the same tensors, the same
config fields in ``transformer_layer_config``, the same forward pass. The family is a
parameter of an algorithm (EAGLE-3 runs on both, vLLM ``llama_eagle3.py`` and
``qwen3_eagle3.py``), never a fork of it. A family knows:

* its ``transformer_layer_config`` (:func:`decoder_config`) and the ``model_type`` /
  ``architectures`` it writes there;
* its tensors (:func:`layer_specs`): Qwen3 adds ``self_attn.{q,k}_norm.weight`` [d], an
  RMSNorm over each head's d features applied to q and k before rope
  (transformers ``Qwen3Attention``, vLLM ``qwen3.py``);
* its reference layer (:func:`blocks`), with transformers' Llama conventions for rope,
  RMSNorm and grouped-query attention.

Notation: H hidden size, I intermediate size, nH / nKV attention / KV heads, d head dim
(``head_dim``, else H / nH: Kimi, gpt-oss and Mistral 3 drafts set it otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..checkpoint.dtypes import DTYPE_NAMES
from ..errors import InputError
from ..format.config import DecoderConfig
from ..format.tensors import TensorSpec

if TYPE_CHECKING:  # pragma: no cover
    from ..sources.verifier import VerifierInfo


@dataclass(frozen=True)
class Family:
    """A decoder-layer family.

    Attributes:
        model_type: ``transformer_layer_config.model_type`` (what vLLM's speculators reader
            dispatches on: ``configs/speculators/algos.py``).
        architectures: the HF architectures written into ``transformer_layer_config``.
        qk_norm: the layer normalises q and k per head (Qwen3).
    """

    model_type: str
    architectures: tuple[str, ...]
    qk_norm: bool = False


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", ("LlamaForCausalLM",)),
    "qwen3": Family("qwen3", ("Qwen3ForCausalLM",), qk_norm=True),
}


def family(model_type: str | None) -> Family:
    """The family of a ``model_type`` (None: llama).

    Raises:
        InputError: a model type no draft family has.
    """
    fam = FAMILIES.get(model_type or "llama")
    if fam is None:
        raise InputError(f"no draft decoder-layer family {model_type!r}", hint=f"known: {', '.join(FAMILIES)}")
    return fam


def family_of(tlc: dict[str, Any]) -> Family:
    """The family a ``transformer_layer_config`` describes (llama when unknown: the tensor table
    then simply has no q/k norms, and the schema reports the model type)."""
    return FAMILIES.get(tlc.get("model_type") or "llama", FAMILIES["llama"])


def head_dim(tlc: dict[str, Any]) -> int:
    """d: ``head_dim`` when given, else H / nH."""
    return tlc.get("head_dim") or tlc["hidden_size"] // tlc["num_attention_heads"]


def layer_specs(prefix: str, tlc: DecoderConfig, in_width: int, *, input_norm: bool = True, hidden_norm: bool = False) -> dict[str, TensorSpec]:
    """The tensors of one decoder layer named ``prefix`` (e.g. ``layers.0``).

    ============================================= ============== =====================================
    name                                          shape          when
    ============================================= ============== =====================================
    ``self_attn.q_proj.weight``                   [nH·d, W]      W = ``in_width`` (2H for EAGLE-3 layer 0)
    ``self_attn.{k,v}_proj.weight``               [nKV·d, W]
    ``self_attn.o_proj.weight``                   [H, nH·d]
    ``mlp.{gate,up}_proj.weight``                 [I, H]
    ``mlp.down_proj.weight``                      [H, I]
    ``post_attention_layernorm.weight``           [H]
    ``input_layernorm.weight``                    [H]            ``input_norm``
    ``hidden_norm.weight``                        [H]            ``hidden_norm`` (EAGLE-3 layer 0)
    ``self_attn.{q,k,v}_proj.bias``, ``o_proj``   [nH·d] ... [H] ``attention_bias``
    ``mlp.*.bias``                                [I] / [H]      ``mlp_bias``
    ``self_attn.{q,k}_norm.weight``               [d]            Qwen3 family
    ============================================= ============== =====================================
    """
    H = tlc.hidden_size
    I = tlc.intermediate_size  # noqa: E741
    nH = tlc.num_attention_heads
    nKV = tlc.num_key_value_heads
    d = tlc.head_width
    specs = {
        f"{prefix}.self_attn.q_proj.weight": TensorSpec((nH * d, in_width)),
        f"{prefix}.self_attn.k_proj.weight": TensorSpec((nKV * d, in_width)),
        f"{prefix}.self_attn.v_proj.weight": TensorSpec((nKV * d, in_width)),
        f"{prefix}.self_attn.o_proj.weight": TensorSpec((H, nH * d)),
        f"{prefix}.mlp.gate_proj.weight": TensorSpec((I, H)),
        f"{prefix}.mlp.up_proj.weight": TensorSpec((I, H)),
        f"{prefix}.mlp.down_proj.weight": TensorSpec((H, I)),
        f"{prefix}.post_attention_layernorm.weight": TensorSpec((H,)),
    }
    if input_norm:
        specs[f"{prefix}.input_layernorm.weight"] = TensorSpec((H,))
    if hidden_norm:
        specs[f"{prefix}.hidden_norm.weight"] = TensorSpec((H,))
    if tlc.attention_bias:
        for p, n in (("q", nH), ("k", nKV), ("v", nKV)):
            specs[f"{prefix}.self_attn.{p}_proj.bias"] = TensorSpec((n * d,))
        specs[f"{prefix}.self_attn.o_proj.bias"] = TensorSpec((H,))
    if tlc.mlp_bias:
        specs[f"{prefix}.mlp.gate_proj.bias"] = TensorSpec((I,))
        specs[f"{prefix}.mlp.up_proj.bias"] = TensorSpec((I,))
        specs[f"{prefix}.mlp.down_proj.bias"] = TensorSpec((H,))
    if FAMILIES.get(tlc.model_type, FAMILIES["llama"]).qk_norm:
        specs[f"{prefix}.self_attn.q_norm.weight"] = TensorSpec((d,))
        specs[f"{prefix}.self_attn.k_norm.weight"] = TensorSpec((d,))
    return specs


def positive_int(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    """``cfg[key]`` as a positive integer.

    Raises:
        ConversionError: missing (without a default) or not a positive integer.
    """
    from ..errors import ConversionError

    val = cfg.get(key, default)
    if not isinstance(val, int) or isinstance(val, bool) or val < 1:
        raise ConversionError(f"source config field {key} must be a positive integer, got {val!r}", where="config.json")
    return val


def decoder_config(cfg: dict[str, Any], H: int, nH: int, V: int, verifier: "VerifierInfo", out_code: str, n_layers: int) -> DecoderConfig:
    """A draft decoder's config (``transformer_layer_config``) from the source's own fields.

    The family is ``cfg["model_type"]`` (llama when absent). Rope comes from the draft's
    config, never the verifier's: the EAGLE references build their rotary embedding from the
    draft config (base 10000 when ``rope_theta`` is absent, as in the official EAGLE-3 8B
    config), so the verifier's 500000 would be wrong. ``max_position_embeddings`` is raised
    to the verifier's (the official configs say 2048; vLLM #48894).

    Args:
        cfg: the source's decoder fields (``intermediate_size``, ``num_key_value_heads``,
            ``head_dim``, ``hidden_act``, ``rms_norm_eps``, rope fields, ``attention_bias``...).
        H, nH, V: hidden size, attention heads, the verifier's vocabulary.
        verifier: the verifier's fields (its context length).
        out_code: the safetensors dtype code written (``dtype``).
        n_layers: decoder layers.

    Returns:
        The typed config; :meth:`~specfmt.format.model.ConfigModel.dump` writes its keys in the
        order above (family, sizes, rope, biases, dtype, then any rope scaling and window fields).

    Raises:
        ConversionError: a required field is missing or not a positive integer.
        InputError: ``model_type`` names no draft family.
    """
    cfg = {k: v for k, v in cfg.items() if v is not None}  # null counts as absent (found by tests/test_fuzz.py)
    rope_params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else None
    theta = cfg.get("rope_theta", (rope_params or {}).get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling")
    if rope_params is None:
        rope_params = {"rope_type": "default"}
        if isinstance(scaling, dict):
            rope_params = {**scaling, "rope_type": scaling.get("rope_type", scaling.get("type", "default"))}
            rope_params.pop("type", None)
    rope_params = {**rope_params, "rope_theta": float(theta)}
    src_max = cfg.get("max_position_embeddings") or 2048
    fam = family(cfg.get("model_type", "llama"))
    tlc: dict[str, Any] = {
        "model_type": fam.model_type,
        "architectures": list(fam.architectures),
        "vocab_size": V,
        "hidden_size": H,
        "intermediate_size": positive_int(cfg, "intermediate_size"),
        "num_hidden_layers": n_layers,
        "num_attention_heads": nH,
        "num_key_value_heads": positive_int(cfg, "num_key_value_heads", nH),
        "head_dim": positive_int(cfg, "head_dim", H // nH),
        "hidden_act": cfg.get("hidden_act", "silu"),
        "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "max_position_embeddings": max(src_max, verifier.max_position_embeddings or 0),
        "rope_theta": float(theta),
        "rope_parameters": rope_params,
        "attention_bias": bool(cfg.get("attention_bias", False)),
        "mlp_bias": bool(cfg.get("mlp_bias", False)),
        "tie_word_embeddings": False,
        "dtype": DTYPE_NAMES[out_code],
    }
    if isinstance(scaling, dict):
        tlc["rope_scaling"] = scaling
    _carry_windows(cfg, tlc, n_layers)
    return DecoderConfig.of(tlc)


#: sliding-window fields a draft's layers may carry (speculators' trainer writes them; vLLM reads ``layer_types`` and ``sliding_window``)
WINDOW_FIELDS = ("layer_types", "sliding_window", "use_sliding_window", "max_window_layers")


def _carry_windows(cfg: dict[str, Any], tlc: dict[str, Any], n_layers: int) -> None:
    """Keep the source's sliding-window fields: dropping them turns a 2048-token window into full
    attention in vLLM without a word.

    Raises:
        ConversionError: ``layer_types`` is not one entry per layer of ``full_attention`` /
            ``sliding_attention``, or a sliding layer has no ``sliding_window``.
    """
    from ..errors import ConversionError

    types = cfg.get("layer_types")
    if types is None:
        return
    if not (isinstance(types, list) and len(types) == n_layers and set(types) <= {"full_attention", "sliding_attention"}):
        raise ConversionError(f"layer_types {types!r} must name full_attention or sliding_attention for each of the {n_layers} draft layer(s)",
                              where="config.json")
    if "sliding_attention" in types and not (type(cfg.get("sliding_window")) is int and cfg["sliding_window"] > 0):
        raise ConversionError(f"layer_types has sliding layers but sliding_window is {cfg.get('sliding_window')!r}", where="config.json")
    for key in WINDOW_FIELDS:
        if key in cfg:
            tlc[key] = cfg[key]


def verifier_decoder_fields(vcfg: dict[str, Any], model_type: str = "llama") -> dict[str, Any]:
    """The decoder fields of a new draft shaped like one verifier layer (its text config)."""
    src = {key: vcfg[key] for key in ("intermediate_size", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps",
                                      "rope_theta", "rope_parameters", "max_position_embeddings") if vcfg.get(key) is not None}
    src["model_type"] = model_type
    return src


# --------------------------------------------------------------------------- reference layers (torch)


def rms_norm(x, weight, eps: float):
    """Llama RMSNorm (computed in float32 or wider, as transformers' ``LlamaRMSNorm``)."""
    import torch

    wide = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return weight * wide.to(x.dtype)


@dataclass
class Rows:
    """Several sequences' new positions, laid one after another in a batch of one ([1, sum T_r]),
    each with its own KV cache: how a reference draft runs many chains in one pass (the weights are
    read once for all of them; vLLM lays its batches out the same way).

    Attributes:
        lengths: T_r, the new positions of each row, in order.
        past: per row, per draft layer, the cached blocks of (k, v) [1, n_kv, T', hd] (an empty
            list: nothing cached).
        key_positions: per row, [T'_total + T_r] the position of each key (cached, then new).
    """

    lengths: list[int]
    past: list[list[list[tuple[Any, Any]]]]
    key_positions: list[Any]

    def ends(self) -> list[int]:
        """Index of each row's last position in the batch."""
        out, at = [], -1
        for n in self.lengths:
            at += n
            out.append(at)
        return out


@lru_cache(maxsize=1)
def blocks() -> SimpleNamespace:
    """The reference layers as ``torch.nn.Module`` classes, built on first use so that importing
    specfmt never imports torch: ``RMSNorm``, ``Attention``, ``MLP``, ``Layer`` and ``Decoder``
    (rotary embedding and attention shared by the EAGLE drafts; transformers' Llama conventions)."""
    import torch
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, n: int, eps: float):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = eps

        def forward(self, x):
            return rms_norm(x, self.weight, self.eps)

    class Attention(nn.Module):
        def __init__(self, in_width: int, H: int, nH: int, nKV: int, hd: int, bias: bool, qk_norm: bool = False, eps: float = 1e-6):
            super().__init__()
            self.nH, self.nKV, self.hd = nH, nKV, hd
            self.q_proj = nn.Linear(in_width, nH * hd, bias=bias)
            self.k_proj = nn.Linear(in_width, nKV * hd, bias=bias)
            self.v_proj = nn.Linear(in_width, nKV * hd, bias=bias)
            self.o_proj = nn.Linear(nH * hd, H, bias=bias)
            if qk_norm:  # Qwen3: RMSNorm over each head's d features, before rope
                self.q_norm = RMSNorm(hd, eps)
                self.k_norm = RMSNorm(hd, eps)
            self.window: int | None = None  # a sliding-window layer sees the last `window` positions (set_windows)

    class MLP(nn.Module):
        def __init__(self, H: int, inter: int, bias: bool):
            super().__init__()
            self.gate_proj = nn.Linear(H, inter, bias=bias)
            self.up_proj = nn.Linear(H, inter, bias=bias)
            self.down_proj = nn.Linear(inter, H, bias=bias)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self, tlc: dict[str, Any], first: bool, input_norm: bool = True):
            super().__init__()
            H, eps = tlc["hidden_size"], tlc.get("rms_norm_eps", 1e-6)
            nH, nKV = tlc["num_attention_heads"], tlc.get("num_key_value_heads") or tlc["num_attention_heads"]
            hd = tlc.get("head_dim") or H // nH
            self.first = first
            self.self_attn = Attention(2 * H if first else H, H, nH, nKV, hd, bool(tlc.get("attention_bias")), family_of(tlc).qk_norm, eps)
            self.mlp = MLP(H, tlc["intermediate_size"], bool(tlc.get("mlp_bias")))
            self.input_layernorm = RMSNorm(H, eps) if input_norm else nn.Identity()
            if first:
                self.hidden_norm = RMSNorm(H, eps)
            self.post_attention_layernorm = RMSNorm(H, eps)

    class Decoder(nn.Module):
        """Rotary embedding and attention shared by the EAGLE drafts (transformers' Llama conventions)."""

        def _init_rope(self, tlc: dict[str, Any]) -> None:
            H = tlc["hidden_size"]
            hd = tlc.get("head_dim") or H // tlc["num_attention_heads"]
            theta = float((tlc.get("rope_parameters") or {}).get("rope_theta", tlc.get("rope_theta", 10000.0)))
            self.register_buffer("inv_freq", 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)), persistent=False)

        def _rope(self, x, positions):
            # x [B, n, T, hd]; rotate_half convention of transformers' Llama
            freqs = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
            emb = torch.cat([freqs, freqs], dim=-1)
            cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
            half = x.shape[-1] // 2
            rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
            return x * cos + rot * sin

        def _attend(self, attn, x, positions, past, mask, rows=None, layer=0):
            """Attention of ``x`` [B, T, in] at ``positions`` [T]; returns ``(output [B, T, H], new)``.

            Without ``rows``: the queries see the keys of ``past`` (blocks of (k, v) [B, n_kv, T', hd],
            every block at ``positions``: the training-time test) and their own, as ``mask``
            [T, T'+T] says; ``new`` is their (k, v). With ``rows`` (:class:`Rows`, B = 1): the T
            positions are several sequences' new positions one after another; each attends to its
            own KV cache (``rows.past[r][layer]``) and its own new keys, causally by position;
            ``new`` is one (k, v) per row."""
            B, T, _ = x.shape
            q = attn.q_proj(x).view(B, T, attn.nH, attn.hd)
            k = attn.k_proj(x).view(B, T, attn.nKV, attn.hd)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            v = attn.v_proj(x).view(B, T, attn.nKV, attn.hd).transpose(1, 2)
            q, k = self._rope(q, positions), self._rope(k, positions)
            if rows is None:
                o = self._sdpa(attn, q, torch.cat([p[0] for p in past] + [k], dim=2), torch.cat([p[1] for p in past] + [v], dim=2),
                               positions, positions.repeat(len(past) + 1), mask)
                new = (k, v)
            else:
                outs, new, at = [], [], 0
                for row_past, kpos, n in zip(rows.past, rows.key_positions, rows.lengths):
                    part = slice(at, at + n)
                    ks, vs = k[:, :, part], v[:, :, part]
                    cached = row_past[layer] if row_past else []
                    keys, vals = torch.cat([b[0] for b in cached] + [ks], dim=2), torch.cat([b[1] for b in cached] + [vs], dim=2)
                    outs.append(self._sdpa(attn, q[:, :, part], keys, vals, positions[part], kpos, kpos[None, :] <= positions[part, None]))
                    new.append((ks, vs))
                    at += n
                o = torch.cat(outs, dim=2)
            return attn.o_proj(o.transpose(1, 2).reshape(B, T, attn.nH * attn.hd)), new

        def _sdpa(self, attn, q, keys, vals, positions, key_positions, mask):
            """Scaled dot-product attention of queries at ``positions`` over keys at ``key_positions``
            (``mask`` True = attend; a sliding-window layer also drops keys ``window`` or more behind)."""
            if attn.window is not None:  # key j is seen from query i while i - j < window (transformers, vLLM)
                mask = mask & ((positions[:, None] - key_positions[None, :]) < attn.window)
            rep = attn.nH // attn.nKV
            return nn.functional.scaled_dot_product_attention(q, keys.repeat_interleave(rep, 1), vals.repeat_interleave(rep, 1), attn_mask=mask)

    return SimpleNamespace(RMSNorm=RMSNorm, Attention=Attention, MLP=MLP, Layer=Layer, Decoder=Decoder)


def set_windows(layers: Any, tlc: dict[str, Any]) -> None:
    """Give each reference layer its sliding window: ``layer_types[i] == "sliding_attention"`` with
    ``sliding_window`` W (speculators' trainer writes such drafts; vLLM's Llama and Qwen3 layers read
    both fields), else full attention."""
    types = tlc.get("layer_types") or []
    for i, layer in enumerate(layers):
        if i < len(types) and types[i] == "sliding_attention":
            layer.self_attn.window = int(tlc["sliding_window"])


def drop_qk_norms(layers: Any) -> None:
    """Remove the q/k norms of reference layers (a Qwen3 layer then computes what a Llama layer
    with the same other weights computes): the "q/k norms dropped" misreading of a Qwen3 draft."""
    for layer in layers:
        for name in ("q_norm", "k_norm"):
            if hasattr(layer.self_attn, name):
                delattr(layer.self_attn, name)


def load_state(model, tensors: dict[str, Any] | None, share: bool = False):
    """Load ``tensors`` into a reference module (strict; ``embed_tokens.weight`` kept aside as
    the attribute ``model.embed_tokens``, a tensor, since the draft may share the verifier's).

    ``share``: the module's parameters become ``tensors`` themselves, in their dtype and on their
    device (``load_state_dict(assign=True)``), so several modules built from one set of tensors
    (the reference run's misreadings of one checkpoint) hold one copy of the weights, not one each."""
    if tensors is not None:
        own = model.state_dict()
        if share:
            state = {n: t for n, t in tensors.items() if n != "embed_tokens.weight"}
            model.load_state_dict(state, strict=True, assign=True)
            model.requires_grad_(False)
            model.embed_tokens = tensors.get("embed_tokens.weight")
            return model
        state = {n: t.to(own[n].dtype) if n in own else t for n, t in tensors.items() if n != "embed_tokens.weight"}
        model.load_state_dict(state, strict=True)
        model.embed_tokens = tensors.get("embed_tokens.weight")
    return model
