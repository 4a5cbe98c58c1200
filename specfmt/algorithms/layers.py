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
* its reference layer (:class:`specfmt.algorithms.nn_layers.Layer`, in the module that imports
  torch), with transformers' Llama conventions for rope, RMSNorm and grouped-query attention.

Notation: H hidden size, I intermediate size, nH / nKV attention / KV heads, d head dim
(``head_dim``, else H / nH: Kimi, gpt-oss and Mistral 3 drafts set it otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
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


def kept_window(tlc: dict[str, Any]) -> Any:
    """The sliding window W that a draft's ``sliding_attention`` layers get, read as transformers' config class for
    ``model_type`` reads it (vLLM builds the draft's config with that class): ``sliding_window``, except where the
    class has a ``use_sliding_window`` switch (Qwen2, Qwen3, Qwen3-MoE) and it is off, written false or left out (the
    class default is false): then the class sets ``sliding_window`` to None (transformers 5
    ``models/qwen3/configuration_qwen3.py``). None: no window; vLLM's Llama and Qwen3 EAGLE-3 layers then attend in
    full (``llama.py``, ``qwen3_eagle3.py``: ``config.sliding_window``), and its DFlash layers refuse to start
    (``qwen3_dflash.py::_resolve_layer_attention``, :class:`specfmt.algorithms.dflash.DFlashConfig`). A kept window is
    returned as written; the config rules check that it is a positive int."""
    from transformers import CONFIG_MAPPING

    try:
        switch_default = getattr(CONFIG_MAPPING[tlc.get("model_type")], "use_sliding_window", None)
    except KeyError:  # a model type transformers does not know: the field as written
        switch_default = None
    if switch_default is not None and not tlc.get("use_sliding_window", switch_default):
        return None
    return tlc.get("sliding_window")  # as written: the config rules say whether it is a window in tokens


def window_violations(window: Any) -> list[tuple[str, str]]:
    """The config rule for the window of ``sliding_attention`` layers: ``sliding_window`` a positive int, in tokens.
    EAGLE-3 checks the window as written (:meth:`specfmt.algorithms.eagle3.Eagle3Config.window_violations`), DFlash the
    one its config class keeps (:func:`kept_window`, :class:`specfmt.algorithms.dflash.DFlashConfig`)."""
    if type(window) is int and window > 0:
        return []
    return [("$.transformer_layer_config.sliding_window", f"{window!r}, but layer_types has sliding layers; give the window in tokens")]


def set_windows(layers: Any, tlc: dict[str, Any]) -> None:
    """Give each reference layer its sliding window: ``layer_types[i] == "sliding_attention"`` with the
    window its config class keeps (:func:`kept_window`; speculators' trainer writes such drafts, vLLM's Llama
    and Qwen3 layers read both fields), else full attention (also where no window is kept)."""
    types = tlc.get("layer_types") or []
    window = kept_window(tlc)
    for i, layer in enumerate(layers):
        if i < len(types) and types[i] == "sliding_attention":
            layer.self_attn.window = None if window is None else int(window)


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
