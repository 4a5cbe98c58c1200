"""``--from eagle`` / ``--from hass``: EAGLE-1/2 and HASS drafts -> specfmt (``eagle``).

The layouts it accepts, and the variations it converts or refuses, are stated once, in
:attr:`EagleConverter.layouts`, :attr:`EagleConverter.cases` and :attr:`HassConverter.layouts`;
the docs render them (``docs/layouts.md``). The formats behind them:
``docs/design/research-formats.md`` §2-§3.

The output is vLLM's ``EagleLlamaForCausalLM`` (``vllm/model_executor/models/llama_eagle.py``,
method ``eagle``): the same names, no ``lm_head``/``norm`` (the verifier's head is
used), and a Llama config at the top level of config.json, which is what vLLM 0.32
reads for this method (its speculators loader has no ``eagle`` algorithm).

Two decisions read from vLLM 0.32's code:

* **fc.bias.** vLLM's ``fc`` has no bias (``ReplicatedLinear(2H, H, bias=False)``), and
  a ``bias`` config key would mean attention bias (vLLM PR #9580). Layer 0 has no input
  norm, so ``fc``'s output x = W·[e; h] + b enters the layer only through q/k/v
  (linear) and the residual. Hence, exactly, ``q_proj(x) = W_q·(W·[e;h]) + W_q·b``
  (likewise k, v) and the residual's ``+ b`` can be added by ``o_proj``'s bias. With
  ``attention_bias: true`` vLLM's Llama layer builds q/k/v **and** o_proj biases
  (``llama.py``: ``bias_o_proj = attention_bias``), so the bias is folded into
  ``layers.0.self_attn.{q,k,v}_proj.bias = W·b`` (plus any existing qkv bias) and
  ``layers.0.self_attn.o_proj.bias = b``; later layers get exact zeros (or their own
  qkv biases). Rope is applied after the projection in both, so it sees the same q/k.
  The fold is computed in float64; if a folded value does not fit the output dtype the
  conversion is refused (``--dtype float32`` fixes it). A layer 0 *with* an input norm
  would make the fold inexact; such a checkpoint is refused.
* **embed_tokens.** The reference uses the draft's own copy (strict load). vLLM loads
  a copy when present and shares the verifier's embedding only when the two are
  ``torch.equal`` (``llm_base_proposer._maybe_share_embeddings``), so keeping the copy
  reproduces the reference in every case at no serving cost; it is kept.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specfmt.algorithms.eagle import EagleConfig, build_config
from specfmt.algorithms.layers import decoder_config
from specfmt.algorithms.sglang import EXPORT_KEY, exported_by_specfmt
from specfmt.errors import ConversionError
from specfmt.format.config import DecoderConfig

from .base import (BOOL, DECODER_FIELDS, KEEP, OBJECT, POSITIVE_INT, Case, Converter, Derived, Example, FieldReading, Layout, NameMap, Options, Plan,
                   Refusal, Rule, Seen, Source, TensorMove, check_rotary_caches, check_source_types, check_vocab, decide_float_dtype,
                   decoder_layer_count, positive_int, read_fields, refuse, register)

_FROZEN_HEAD = "accelerate save_state file of the second prepared module: the frozen verifier lm_head (EAGLE issue #100); vLLM uses the verifier's own"
_FROZEN_FILES = {"pytorch_model_1.bin": _FROZEN_HEAD, "model_1.safetensors": _FROZEN_HEAD}

#: config keys of the NM/speculators "layernorms" variant that vLLM's EAGLE model cannot run
_EXTRA_NORMS = ("embed_layernorm.weight", "post_embedding_layernorm.weight", "hidden_layernorm.weight", "lm_head_layernorm.weight")

#: the speculators-eagle (<= 0.6) dialect: its tensor names as EAGLE-1 research names
SPECULATORS_EAGLE_NAMES = NameMap(regex=((r"^fusion_fc\.(weight|bias)$", r"fc.\1"), (r"^transformer\.(.+)$", r"layers.0.\1")))

#: vLLM V0's EAGLE wrapper dialect: ``model.`` stripped, the copy of the verifier's head left out
#: (:meth:`EagleConverter.plan` drops it with its reason)
V0_NAMES = NameMap(regex=((r"^(model\.)?lm_head\.weight$", None),), prefix=(("model.", ""),))


#: ``EAGLEConfig.model_type`` of vLLM V0 (``vllm/transformers_utils/configs/eagle.py``): a config file's
#: model type, not the name of an algorithm
_V0_MODEL_TYPE = "eagle"


def _v0_wrapper(cfg: dict[str, Any]) -> bool:
    """vLLM V0's ``EAGLEConfig`` file: ``model_type: eagle`` with the draft's config nested under ``model``."""
    return cfg.get("model_type") == _V0_MODEL_TYPE and isinstance(cfg.get("model"), dict)


def _v0_names(names: set[str]) -> dict[str, str]:
    """``{research name: source name}`` of a V0 wrapper's tensors (:data:`V0_NAMES`)."""
    return V0_NAMES.view(names)


def _eagle1(seen: Seen) -> bool:
    """``fc.weight`` [H, 2H] (token embedding and verifier state) and a first decoder layer."""
    fc = seen.shapes.get("fc.weight")
    return bool(fc) and len(fc) == 2 and fc[1] == 2 * fc[0] and seen.has(r"layers\.0\.self_attn\.q_proj\.weight")


def _accelerate(seen: Seen) -> bool:
    return _eagle1(seen) and any(f in seen.files for f in _FROZEN_FILES)


def _exported(cfg: dict[str, Any]) -> bool:
    """``specfmt export --to sglang`` wrote it (an EAGLE-1 draft in SGLang's ``LlamaForCausalLMEagle`` layout)."""
    return exported_by_specfmt(cfg, EagleConfig.name) is not None


#: refusals that are conditions on tensor names (:meth:`Plan.names`), checked first
_EXTRA_NORM_REFUSALS = (
    Refusal(lambda names: any(n in names for n in _EXTRA_NORMS),
            lambda names: f"the draft has extra norms {[n for n in _EXTRA_NORMS if n in names]} (the speculators/Neural Magic 'layernorms' "
                          "variant); vLLM's EAGLE model has no such norms",
            hint="this checkpoint cannot be served by vLLM's EAGLE-1 model without changing its output", where=None),
)
_LAYER0_REFUSALS = (
    Refusal(lambda names: "layers.0.input_layernorm.weight" in names,
            "layers.0.input_layernorm.weight is present, but an EAGLE-1 draft's first layer has no input norm (cnets.py) and vLLM replaces it with Identity",
            hint="this is not an EAGLE-1/HASS checkpoint; check --from", where=None),
)
#: refusals that are conditions on the decoder config built for the draft
_DECODER_REFUSALS = (
    Refusal(lambda tlc: "sliding_attention" in (tlc.layer_types or []),
            "sliding-window layers in an EAGLE-1 draft: the EAGLE-1 reference (transformers' Llama layers) runs them with full attention",
            hint="specfmt converts EAGLE-1 drafts whose layers attend to the whole context"),
)
#: the decoder model types vLLM serves EAGLE-1 drafts as (Llama layers)
_LLAMA_TYPES = ("llama", "qwen2", "mistral")


def _v0_extra_norms(names: set[str]) -> list[str]:
    """V0's ``add_para_norm`` tensors (``enorm`` / ``hnorm``)."""
    return sorted(n for n in names if n.split(".")[-2:-1] and n.split(".")[-2] in ("enorm", "hnorm"))


#: refusals of a vLLM V0 wrapper, on ``(outer config, nested config, source tensor names)``, in order
_V0_REFUSALS = (
    Refusal(lambda c: c[0].get("truncated_vocab_size", c[1].get("truncated_vocab_size")) not in (None, c[1].get("vocab_size")),
            lambda c: f"truncated_vocab_size {c[0].get('truncated_vocab_size', c[1].get('truncated_vocab_size'))} differs from vocab_size "
                      f"{c[1].get('vocab_size')}: vLLM V0's token_map, which vLLM's EAGLE model (V1) no longer has",
            hint="specfmt converts EAGLE-1 drafts over the full vocabulary"),
    Refusal(lambda c: bool(c[2] & {"token_map", "model.token_map"}),
            "the V0 wrapper holds a token_map (a truncated draft vocabulary), which vLLM's EAGLE model (V1) no longer has",
            hint="specfmt converts EAGLE-1 drafts over the full vocabulary", where=None),
    Refusal(lambda c: bool(_v0_extra_norms(c[2]) or c[0].get("add_para_norm") or c[1].get("add_para_norm")),
            lambda c: f"add_para_norm (enorm/hnorm {_v0_extra_norms(c[2])}): V0's extra norms, which vLLM's EAGLE model (V1) has no place for",
            hint="this draft cannot be served by vLLM's EAGLE-1 model without changing its output"),
)

#: a speculators <= 0.6 eagle config's ``layernorms`` variant
_LAYERNORMS = Refusal(lambda cfg: bool(cfg.get("layernorms")),
                      "layernorms: true (embedding_layernorm / pre_lm_head_layernorm): vLLM's EAGLE model has no such norms",
                      hint="this draft cannot be served by vLLM's EAGLE-1 model without changing its output")


#: field readings: yuhuili/EAGLE-mixtral-instruct-8x7B's ``mixtral`` config over dense layers holds
#: Llama layers (SafeAILab's ``cnets.py`` builds ``LlamaDecoderLayer`` from any config). ``ctx``: the plan's names.
_TYPE_READINGS = (
    FieldReading("model_type", lambda cfg, names: cfg.get("model_type", "llama") == "mixtral" and not any(".block_sparse_moe." in n for n in names),
                 lambda cfg, names: "llama",
                 "model_type 'mixtral' but the layers hold dense gate/up/down_proj (SafeAILab's cnets.py builds Llama layers "
                 "whatever model_type says): converted as Llama layers"),
)
#: refusals on the model type as read (vLLM serves EAGLE-1 drafts as Llama layers)
_TYPE_REFUSALS = (
    Refusal(lambda cfg: cfg.get("model_type", "llama") not in _LLAMA_TYPES,
            lambda cfg: f"draft decoder model_type {cfg.get('model_type', 'llama')!r}: vLLM serves EAGLE-1 drafts only as Llama layers"),
)


def _attention_biases(cfg: dict[str, Any], names: set[str], n_layers: int) -> set[str]:
    """The source's own attention biases: all of layers' q/k/v or none, no o_proj, no config switch; in an SGLang
    export (:func:`_export_biases`), all of q/k/v/o or none, as ``attention_bias`` says.

    Raises:
        ConversionError: an o_proj bias, q/k/v biases on some projections only, or ``attention_bias``/``mlp_bias`` set.
    """
    if _exported(cfg):
        return _export_biases(cfg, names, n_layers)
    qkv_bias = {n for n in names if n.endswith("_proj.bias") and ".self_attn." in n}
    if any(n.endswith("o_proj.bias") for n in qkv_bias):
        raise ConversionError("the draft has an o_proj bias, which no EAGLE-1 reference layer has", hint="check --from")
    if qkv_bias and qkv_bias != {f"layers.{i}.self_attn.{p}_proj.bias" for i in range(n_layers) for p in "qkv"}:
        raise ConversionError(f"q/k/v biases are present for some projections only: {sorted(qkv_bias)}")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ConversionError("attention_bias/mlp_bias in an EAGLE-1 config: the reference builds its layers without them (qkv_bias is its only bias switch)", where="config.json")
    return qkv_bias


def _export_biases(cfg: dict[str, Any], names: set[str], n_layers: int) -> set[str]:
    """An SGLang export's attention biases: its layers are the format's (SGLang's Llama layers build q/k/v and o_proj
    biases from ``attention_bias``, as vLLM's do), so every q/k/v/o bias of every layer is there exactly when
    ``attention_bias`` is true, and each is kept as it is.

    Raises:
        ConversionError: the biases and ``attention_bias`` disagree, or ``mlp_bias`` is set.
    """
    biases = {n for n in names if n.endswith("_proj.bias") and ".self_attn." in n}
    every = {f"layers.{i}.self_attn.{p}_proj.bias" for i in range(n_layers) for p in "qkvo"}
    if biases != (every if cfg.get("attention_bias") else set()) or cfg.get("mlp_bias"):
        raise ConversionError(f"attention_bias is {cfg.get('attention_bias')!r} but the export holds {len(biases)} of the {len(every)} q/k/v/o "
                              "biases (or mlp_bias is set): not as specfmt export writes it", where="config.json",
                              hint=f"the {EXPORT_KEY} block says specfmt wrote this folder; was it edited?")
    return biases


def _fc_bias(src: Source, plan: Plan, names: set[str]) -> bool:
    """``fc.bias``: dropped when all zeros, else folded exactly into layer 0's attention biases
    (layer 0 has no input norm); the config's ``bias`` switch only gets a note. Returns whether it is folded."""
    cfg = src.config
    if "fc.bias" not in names:
        if cfg.get("bias", True) is True and "bias" in cfg:
            plan.notes.append('config says "bias": true but the weights hold no fc.bias; the tensors decide (no bias)')
        return False
    b_move = next(m for m in plan.moves if m.dst == "fc.bias")
    if cfg.get("bias") is False:
        plan.notes.append('config says "bias": false but the weights hold fc.bias (EAGLE issue #100: training always saves it); the tensor decides')
    if not bool(src.get(b_move.src).count_nonzero()):  # torch: the fold that follows needs it anyway
        b_move.drop("all zeros: adds nothing")
        return False
    if _exported(cfg):
        raise ConversionError("fc.bias is not all zeros, but specfmt export writes an EAGLE-1 draft's fc.bias as zeros (the format has "
                              "none; its research bias is already folded into the attention biases)", where="model.safetensors",
                              hint=f"the {EXPORT_KEY} block says specfmt wrote this folder; was it edited?")
    b_move.drop("folded exactly: layers.0.self_attn.{q,k,v}_proj.bias = W_{q,k,v}·fc.bias, layers.0.self_attn.o_proj.bias = fc.bias "
                "(layer 0 has no input norm)", "fold")
    return True


@register
class EagleConverter(Converter):
    name = "eagle"
    label = "EAGLE-1/2"
    summary = "EAGLE-1/2 drafts (SafeAILab v1 layout: fc [H,2H], layers.*, optional fc.bias folded exactly)"
    detects_as = "eagle"
    upgrades = "eagle"
    rules = (
        Rule(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq", None, "rotary cache, equal to what rope_theta gives (checked)"),
        Rule(r"fc\.weight", KEEP),
        Rule(r"fc\.bias", KEEP),  # folded or dropped in decide(), never written as is
        Rule(r"layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.(weight|bias)", KEEP),
        Rule(r"layers\.\d+\.(input_layernorm|post_attention_layernorm)\.weight", KEEP),
        Rule(r"embed_tokens\.weight", KEEP),
    )
    fields = {**DECODER_FIELDS, "bias": BOOL, "qkv_bias": BOOL, "fusion_bias": BOOL, "layernorms": BOOL, "eagle_fc_bias": BOOL, "model": OBJECT,
              "truncated_vocab_size": POSITIVE_INT}
    nested_fields = ("model",)
    ignore_files = _FROZEN_FILES
    layouts = (
        Layout("sglang-export", lambda s: _eagle1(s) and _exported(s.config),
               f"config has a {EXPORT_KEY} block of an EAGLE-1 draft (written by `specfmt export --to sglang`)",
               details="SGLang's `LlamaForCausalLMEagle` layout as specfmt writes it: the format's names, a flat Llama config, and an "
                       "all-zero `fc.bias` (SGLang's `fc` has a bias, the format's none); attention biases, when the draft has them, on "
                       "q/k/v and o_proj of every layer (`attention_bias: true`), as SGLang's and vLLM's Llama layers build them",
               outcome="converted: the all-zero `fc.bias` dropped (it adds nothing), every other tensor kept as it is, `attention_bias` "
                       "as written; `--from auto` reads it without asking `--from eagle` or `--from hass`"),
        Layout("vllm-v0", lambda s: _v0_wrapper(s.config) and _eagle1(Seen(s.config, {n: s.shapes[o] for n, o in _v0_names(s.names).items()}, s.format, s.files)),
               "config model_type 'eagle' with the draft's config nested under 'model' (vLLM V0's EAGLE wrapper)",
               details="written by the conversion script of vLLM PR #6830: `eagle_fc_bias` beside or inside `model` (sometimes contradicted "
                       "by an inner `bias`), tensors sometimes under `model.`, plus a copy of the verifier's `lm_head.weight` (V0's `EAGLE` "
                       "class loaded it)",
               outcome="converted: unwrapped, the tensors decide the bias (`fc.bias` folded, a zero one dropped), the head copy dropped "
                       "with its reason (vLLM's EAGLE model applies the verifier's own head). A `truncated_vocab_size` below the vocabulary "
                       "(V0's `token_map`) is refused",
               examples=(Example("abhigoyal/EAGLE-LLaMA3-Instruct-8B-vllm", note="the repo exists; no published config text found"),
                         Example("abhigoyal/vllm-eagle-llama-68m-random", note="the repo exists; no published config text found"))),
        Layout("accelerate", _accelerate, "an accelerate save_state folder: the frozen verifier head in pytorch_model_1.bin / model_1.safetensors",
               details="`eagle/train/main.py`'s `accelerator.save_state` folders: the draft as in `safeailab`, plus optimizer, scheduler "
                       "and RNG state (not weights)",
               outcome="converted; the frozen verifier head is not read, with a note"),
        Layout("safeailab", _eagle1, "fc.weight [H, 2H] fuses token embedding and verifier state (EAGLE-1/2 / HASS)",
               details="SafeAILab/EAGLE `v1` checkpoints (`yuhuili/EAGLE-*`): one `pytorch_model.bin` (or `model.safetensors`), unprefixed "
                       "keys, `fc.bias` [H] unless the config says `\"bias\": false`, `layers.0` without `input_layernorm`, a frozen copy of "
                       "the verifier's `embed_tokens`",
               examples=(Example("yuhuili/EAGLE-LLaMA3-Instruct-8B",
                                 "https://github.com/SafeAILab/EAGLE/blob/f872b7fe099672e48a6d4fb7fdabe7cea2bda767/eagle/train/EAGLE-LLaMA3-Instruct-8B.json",
                                 "`\"bias\": false`, no `fc.bias`, float16"),)),
    )
    cases = (
        Case("an all-zero `fc.bias` (the vLLM V0 wrapper's `eagle_fc_bias`, SGLang's `fc`, which always has a bias)",
             "dropped: `x = W·[e; h] + 0` is exactly `W·[e; h]` in every dtype (adding zero rounds nothing), so the draft "
             "computes the same without it and nothing is folded"),
        Case("`fc.bias` (SafeAILab v1 without `\"bias\": false`; HASS always)",
             "converted: a non-zero `fc.bias` is folded exactly into layer 0 (`q/k/v_proj.bias = W·b`, `o_proj.bias = b`, "
             "`attention_bias: true`; computed in float64), a zero one dropped. A fold that does not fit the output dtype is refused "
             "(`--dtype float32` fixes it). `--from auto` asks for `--from eagle` or `--from hass`",
             (Example("yuhuili/EAGLE-Vicuna-33B-v1.3",
                      "https://github.com/SafeAILab/EAGLE/blob/2320d52e443672367a7b8447160f81af8318d1b1/eagle/train/vicuna_33B_config.json",
                      "float32, 13 KV heads for 52 heads"),)),
        Case("`model_type: mixtral` with dense Llama layers",
             "converted as Llama layers, with a note (`cnets.py` builds Llama layers whatever `model_type` says)",
             (Example("yuhuili/EAGLE-mixtral-instruct-8x7B",
                      "https://github.com/SafeAILab/EAGLE/blob/2320d52e443672367a7b8447160f81af8318d1b1/eagle/train/Mixtral_8x7B_config.json"),)),
        Case("the draft's own `embed_tokens`",
             "kept: the reference uses it, and vLLM shares the verifier's embedding instead only when the two are equal"),
        Case("layer 0 with an input norm, or the extra-norm (\"layernorms\") variant",
             "**refused** with the reason: vLLM's EAGLE model has no place for those norms, and the `fc.bias` fold would not be exact"),
    )
    fallback_layout = "safeailab"

    def plan(self, src: Source, opts: Options) -> Plan:
        """A vLLM V0 wrapper is unwrapped first (:meth:`unwrap_v0`); every other layout plans as is."""
        if not _v0_wrapper(src.config):
            return super().plan(src, opts)
        check_source_types(src.config, self.fields, nested=self.nested_fields)
        notes: list[str] = []
        inner = self.unwrap_v0(src, notes)
        plan = super().plan(inner, opts)
        plan.layout = "vllm-v0"
        V = inner.config.get("vocab_size")
        for name in ("lm_head.weight", "model.lm_head.weight"):
            info = src.source_names.get(name)
            if info is None:
                continue
            if len(info.shape) != 2 or info.shape[0] != V:
                raise ConversionError(f"{name} has shape {list(info.shape)}; a copy of the verifier's head is [vocab_size={V}, H]")
            plan.moves.append(TensorMove(name, None, "drop", "copy of the verifier's lm_head that vLLM V0's EAGLE wrapper loaded; vLLM's EAGLE model "
                                         "applies the verifier's own head", info, info.dtype))
        plan.notes = notes + plan.notes
        return plan

    def unwrap_v0(self, src: Source, notes: list[str]) -> Source:
        """vLLM V0's ``{"model_type": "eagle", "model": {...}}`` as the research layout: the nested config,
        ``model.``-prefixed names stripped, the head copy set aside (the tensors decide ``fc.bias``).

        Raises:
            ConversionError: a row of :data:`_V0_REFUSALS`: a truncated vocabulary (V0's ``token_map``) or
                V0's extra norms, which vLLM's EAGLE model (V1) has no place for.
        """
        cfg = src.config
        inner = dict(cfg["model"])
        refuse(_V0_REFUSALS, (cfg, inner, set(src.source_names)))
        claims = {k: v for k, v in (("eagle_fc_bias", cfg.get("eagle_fc_bias")), ("model.eagle_fc_bias", inner.get("eagle_fc_bias")),
                                    ("model.bias", inner.get("bias"))) if v is not None}
        has_bias = "fc.bias" in _v0_names(set(src.source_names))
        if any(v != has_bias for v in claims.values()):
            said = ", ".join(f"{k}={v}" for k, v in claims.items())
            notes.append(f"vLLM V0 wrapper: {said}, but fc.bias is {'present' if has_bias else 'absent'}; the tensors decide")
        notes.append("vLLM V0 EAGLE wrapper (model_type 'eagle'): the draft's config nested under 'model' was unwrapped")
        research = {k: v for k, v in inner.items() if k not in ("eagle_fc_bias", "bias", "truncated_vocab_size", "architectures")}
        return replace(src, config=research, names=V0_NAMES)

    def describe(self, seen: Seen) -> tuple[list[str], dict[str, Any]]:
        if _v0_wrapper(seen.config):
            seen = Seen(seen.config["model"], {n: seen.shapes[o] for n, o in _v0_names(seen.names).items()}, seen.format, seen.files)
        bias = "fc.bias" in seen.shapes
        ev = ["fc.bias present: EAGLE-1/2 or HASS (HASS always trains it), the files cannot tell which" if bias
              else "no fc.bias: EAGLE-1/2 (HASS always saves fc.bias)"]
        return ev, {"hidden_size": seen.shapes["fc.weight"][0], "fc_bias": bias, "own_embedding": "embed_tokens.weight" in seen.shapes}

    def decide(self, src: Source, opts: Options, plan: Plan) -> None:
        """The output config (:func:`specfmt.algorithms.eagle.build_config`) and the ``fc.bias`` fold.

        Reads the plan's names (:meth:`Plan.names`), never the source's.

        Raises:
            ConversionError: the source does not describe an EAGLE-1 draft that vLLM's
                ``EagleLlamaForCausalLM`` can run exactly as the reference computes it
                (sizes against the verifier, an input norm on layer 0, the extra-norm
                variant, a non-Llama decoder), or the config disagrees with the tensors.
        """
        cfg, verifier, names = src.config, src.verifier.info, plan.names()
        refuse(_EXTRA_NORM_REFUSALS, names)
        refuse(_TYPE_REFUSALS, read_fields(_TYPE_READINGS, cfg, names, plan.notes))
        refuse(_LAYER0_REFUSALS, names)
        H, nH, V = positive_int(cfg, "hidden_size"), positive_int(cfg, "num_attention_heads"), positive_int(cfg, "vocab_size")
        check_vocab(V, src.verifier)
        if H != verifier.hidden_size:
            raise ConversionError(
                f"draft hidden_size {H} differs from the verifier's {verifier.hidden_size}; EAGLE-1 feeds the verifier's last hidden state into fc [H, 2H]",
                hint="is --verifier the model this draft was trained for?",
            )
        fc = plan.outputs().get("fc.weight")
        if fc is None or tuple(fc.shape) != (H, 2 * H):
            raise ConversionError(f"fc.weight must be [{H}, {2 * H}] (token embedding and verifier state), got {None if fc is None else list(fc.shape)}")
        out_code = decide_float_dtype(plan.moves, opts)
        n_layers = decoder_layer_count({int(m.dst.split(".")[1]) for m in plan.moves if m.dst and m.dst.startswith("layers.")}, cfg)
        tlc = decoder_config({**cfg, "model_type": "llama"}, H, nH, V, verifier, out_code, n_layers)
        refuse(_DECODER_REFUSALS, tlc)
        check_rotary_caches(src, tlc)
        qkv_bias = _attention_biases(cfg, names, n_layers)
        fold = _fc_bias(src, plan, names)
        tlc.attention_bias = self._biases(plan, tlc, n_layers, qkv_bias, fold, out_code)
        plan.config = build_config(verifier, tlc, speculative_tokens=opts.speculative_tokens or 3)
        if "embed_tokens.weight" in names:
            plan.notes.append("embed_tokens.weight kept: the reference uses the draft's own copy; vLLM shares the verifier's embedding instead only when the two are equal")

    def _biases(self, plan: Plan, tlc: "DecoderConfig", n_layers: int, qkv_bias: set[str], fold: bool, out_code: str) -> bool:
        """The attention biases written (vLLM's ``attention_bias`` applies to every layer): layer 0's
        folded from ``fc.bias``, the source's own q/k/v biases copied, zeros elsewhere. Returns
        whether there are any."""
        H, d, kv = tlc.hidden_size, tlc.head_dim, tlc.num_key_value_heads
        widths = {"q": tlc.num_attention_heads * d, "k": kv * d, "v": kv * d, "o": H}
        if fold:
            for m in plan.moves:
                if m.dst in qkv_bias and m.dst.startswith("layers.0."):
                    m.drop(f"summed exactly into {m.src} together with W·fc.bias", "fold")
        attention_bias = fold or bool(qkv_bias)
        if attention_bias:
            for i in range(n_layers):
                for p in "qkvo":
                    name = f"layers.{i}.self_attn.{p}_proj.bias"
                    if name in qkv_bias and not (fold and i == 0):
                        continue  # an existing qkv bias, copied as is
                    plan.derived.append(self._bias(name, i, p, widths[p], fold, name in qkv_bias, out_code))
        return attention_bias

    @staticmethod
    def _bias(name: str, layer: int, proj: str, width: int, fold: bool, has_own: bool, out_code: str) -> Derived:
        """One attention bias of the output: W_p·fc.bias (+ own) for layer 0's q/k/v, fc.bias for its o_proj, else own or zeros."""
        import torch

        if fold and layer == 0 and proj == "o":
            return Derived(name, (width,), out_code, "fc.bias (the residual's share of fc's bias)", lambda get: get("fc.bias").to(torch.float64))
        if fold and layer == 0:
            weight = f"layers.0.self_attn.{proj}_proj.weight"

            def compute(get: Any, weight: str = weight, own: str | None = name if has_own else None) -> Any:
                out = get(weight).to(torch.float64) @ get("fc.bias").to(torch.float64)
                return out + get(own).to(torch.float64) if own else out

            return Derived(name, (width,), out_code, f"{weight} · fc.bias" + (" + the source's own bias" if has_own else ""), compute)
        return Derived(name, (width,), out_code, "zeros (attention_bias applies to every layer; exact)", lambda get, w=width: torch.zeros(w, dtype=torch.float64))

    def from_speculators(self, src: Source, cfg: dict[str, Any], notes: list[str]) -> Source:
        """A speculators <= 0.6 ``eagle`` checkpoint (``EagleSpeculator``) as the research layout:
        ``fusion_fc.*`` -> ``fc.*``, ``transformer.*`` -> ``layers.0.*`` (one Llama layer with an
        Identity input norm); the ``layernorms`` variant adds norms vLLM's EAGLE model lacks.

        Raises:
            ConversionError: ``layernorms: true``.
        """
        _LAYERNORMS.check(cfg)
        new_to_old = SPECULATORS_EAGLE_NAMES.view(src.source_names)
        if ("fc.bias" in new_to_old) != bool(cfg.get("fusion_bias", False)):
            notes.append(f"fusion_bias={cfg.get('fusion_bias')!r} but fusion_fc.bias is {'present' if 'fc.bias' in new_to_old else 'absent'}; the tensors decide")
        research = {key: val for key, val in cfg["transformer_layer_config"].items() if key not in ("architectures", "tie_word_embeddings", "torch_dtype", "dtype")}
        research["num_hidden_layers"] = 1  # EagleSpeculator holds exactly one transformer layer
        return replace(src, config=research, names=SPECULATORS_EAGLE_NAMES)


@register
class HassConverter(EagleConverter):
    """HArmonizedSS/HASS drafts: the EAGLE-1 layout (``docs/design/research-formats.md`` §3); ``fc.bias``
    is always trained and saved (``train/main_hass.py``), so it is always folded."""

    name = "hass"
    summary = "HASS drafts (HArmonizedSS/HASS: the EAGLE-1 layout, always with fc.bias)"
    upgrades = None
    layouts = (EagleConverter.layouts[1],
               Layout("hass", _eagle1, EagleConverter.layouts[2].evidence,
                      details="HArmonizedSS/HASS: the EAGLE-1 layout; `train/main_hass.py` always trains and saves `fc.bias`",
                      outcome="converted; `fc.bias` folded exactly, as for EAGLE-1. A draft without `fc.bias` is refused: it is "
                              "EAGLE-1/2, which `--from eagle` reads",
                      examples=(Example("HArmonizedSS/HASS-LLaMA2-Chat-7B",
                                        "https://github.com/HArmonizedSS/HASS/blob/38922e43fec95f0bd2993f33aaa6ee82371741a5/train/llama_2_chat_7B_config.json"),)))

    def claims(self, seen: Seen) -> bool:
        """Only with ``fc.bias``: HASS always trains and saves it, so a draft without one is EAGLE-1/2;
        never a vLLM V0 wrapper, which vLLM's EAGLE conversion wrote, nor an SGLang export of an EAGLE-1 draft
        (its ``fc.bias`` is the zeros specfmt writes for SGLang's ``fc``)."""
        return "fc.bias" in seen.shapes and not _v0_wrapper(seen.config) and not _exported(seen.config)
    fallback_layout = "hass"

    def decide(self, src: Source, opts: Options, plan: Plan) -> None:
        """As EAGLE-1's, for a draft with ``fc.bias`` only.

        Raises:
            ConversionError: no ``fc.bias``. HASS's ``train/main_hass.py`` always trains and saves it
                (``docs/design/research-formats.md`` §3), so the draft is not a HASS output, and recording
                layout ``hass`` would be false; ``inspect`` says the same (:meth:`EagleConverter.describe`). The
                tensors convert as they are with ``--from eagle`` (issue 35).
        """
        if "fc.bias" not in plan.names():
            raise ConversionError("--from hass: the draft has no fc.bias, which HASS (train/main_hass.py) always trains and saves, so it "
                                  "is an EAGLE-1/2 draft, not a HASS one", tensors={"missing": ["fc.bias"]},
                                  hint="convert it with --from eagle")
        super().decide(src, opts, plan)


__all__ = ["EagleConverter", "HassConverter"]
