"""``--from eagle3``: EAGLE-3 research checkpoints -> specfmt (speculators ``eagle3``).

The layouts it accepts, and the variations it converts or refuses, are stated once, in
:attr:`Eagle3Converter.layouts` and :attr:`Eagle3Converter.cases`; the docs render them
(``docs/layouts.md``). The formats behind them: ``docs/design/research-formats.md`` §4.

Forward pass of the reference (``eagle/model/cnets.py``): the residual is taken
*before* ``hidden_norm``, i.e. ``norm_before_residual = false``; vLLM's speculators
loader assumes ``true`` when the key is missing, so it is always written.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from specfmt.algorithms.eagle3 import Eagle3Config, build_config, default_taps
from specfmt.algorithms.layers import FAMILIES, decoder_config
from specfmt.algorithms.sglang import EXPORT_KEY
from specfmt.checkpoint.dtypes import DTYPE_NAMES
from specfmt.errors import ConversionError
from specfmt.format.config import SpeculatorConfig
from specfmt.format.model import field_kinds

from .base import (BOOL, DECODER_FIELDS, KEEP, OBJECT, Case, Converter, Derived, Example, FieldReading, Layout, Options, Plan, Refusal, Rule, Seen, Source,
                   check_rotary_caches, check_vocab, decide_float_dtype, decoder_layer_count, positive_int, read_fields, refuse, register)
from .taps import SPECULATORS_TAPS as _SPECULATORS_TAPS
from .taps import TAP_READINGS, describe_taps, read_taps  # noqa: F401  (TAP_READINGS, read_taps: the names this module gave them)

#: eagle_config keys of SpecForge / ModelOpt exports and the values the EAGLE-3
#: forward pass that vLLM runs requires (None: any value; read elsewhere).
_EAGLE_CONFIG_KEYS: dict[str, Any] = {
    "eagle_aux_hidden_state_layer_ids": None,
    "use_aux_hidden_state": True,  # False is EAGLE-1 style (no fc over taps)
    "use_input_layernorm_in_first_layer": True,
    "use_last_layernorm": True,  # norm.weight before lm_head
    "use_mtp_layernorm": False,  # extra enorm/hnorm: not in vLLM's Eagle3 model
    "next_layer_regular": True,
    "parallel_draft_step": 1,  # >1 is parallel drafting, not plain EAGLE-3
    "parallel_draft_heads_num_layers": None,
    "draft_vocab_size": None,
    "has_lm_head": True,
    "norm_before_fc": None,
    "fc_norm": None,
    "norm_output": None,
}


#: the decoder layer every EAGLE-3 checkpoint has, under either naming
_SIGNATURE = r"midlayer\.(\d+\.)?self_attn\.q_proj\.weight|layers\.0\.hidden_norm\.weight"


def _eagle3(seen: Seen) -> bool:
    return seen.has(_SIGNATURE)


def _exported(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The provenance of ``specfmt export --to sglang`` (:mod:`specfmt.export`), or None for any other config."""
    block = cfg.get(EXPORT_KEY)
    return block if isinstance(block, dict) and block.get("engine") == "sglang" and block.get("algorithm") == Eagle3Config.name else None


def _export_reading(cfg: dict[str, Any], opts: Options) -> Options:
    """An SGLang export read back as the draft it was made from: its tap ids in the convention it records
    (``tap_ids``), its k. ``--tap-ids`` may only repeat the recorded convention. Other configs: ``opts`` as given.

    Raises:
        ConversionError: ``--tap-ids`` contradicts the recorded convention.
    """
    recorded = _exported(cfg)
    if recorded is None:
        return opts
    tap_ids = recorded.get("tap_ids")
    if opts.tap_ids is not None and opts.tap_ids != tap_ids:
        raise ConversionError(f"--tap-ids {opts.tap_ids} contradicts the export, which records its tap ids as {tap_ids}s",
                              where="config.json", hint="drop --tap-ids")
    return replace(opts, tap_ids=tap_ids, speculative_tokens=opts.speculative_tokens or recorded.get("speculative_tokens"))


#: eagle3 top-level keys carried over from a speculators config into the research-style config
_SPECULATORS_FLAGS = ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "norm_before_fc", "fc_norm")


def _ec(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config's nested ``eagle_config`` (SpecForge / ModelOpt), or ``{}``."""
    ec = cfg.get("eagle_config") or {}
    return ec if isinstance(ec, dict) else {}


def _flag_refusal(key: str, need: Any) -> Refusal:
    """The row refusing an ``eagle_config`` flag of :data:`_EAGLE_CONFIG_KEYS` set to another value than vLLM's model needs."""
    return Refusal(lambda cfg: key in _ec(cfg) and _ec(cfg)[key] != need,
                   lambda cfg: f"eagle_config.{key}={_ec(cfg)[key]!r} describes a draft vLLM's EAGLE-3 model does not run (needs {need!r})")


#: refusals that are conditions on the source config, checked first, in order
_CONFIG_REFUSALS: tuple[Refusal, ...] = (
    Refusal(lambda cfg: not isinstance(cfg.get("eagle_config") or {}, dict), "eagle_config must be an object"),
    Refusal(lambda cfg: bool(set(_ec(cfg)) - set(_EAGLE_CONFIG_KEYS)),
            lambda cfg: f"eagle_config has fields this converter does not know: {sorted(set(_ec(cfg)) - set(_EAGLE_CONFIG_KEYS))}",
            hint="they may change the forward pass; remove them only if you know they do not"),
    # vLLM 0.32 llama_eagle3.py: with eagle_config.use_aux_hidden_state false the model has no fc and
    # takes the verifier's last hidden state (nvidia/gpt-oss-120b-Eagle3-v2); the speculators
    # reader (update_eagle3) carries no such field and specfmt's reference has no such pass
    Refusal(lambda cfg: _ec(cfg).get("use_aux_hidden_state", True) is False,
            "eagle_config.use_aux_hidden_state is false: an EAGLE-3 module fed only the verifier's last hidden state (no fc over taps). "
            "vLLM builds it natively from this config (Eagle3LlamaForCausalLM reads eagle_config; serve the folder with "
            "--speculative-config '{\"method\": \"eagle3\", \"model\": DIR}'), but the speculators format has no field for it",
            hint="serve this ModelOpt export as it is; specfmt does not convert it"),
    *(_flag_refusal(key, need) for key, need in _EAGLE_CONFIG_KEYS.items() if need is not None),
    Refusal(lambda cfg: cfg.get("model_type", "llama") not in FAMILIES,
            lambda cfg: f"draft decoder model_type {cfg.get('model_type', 'llama')!r} is not supported by vLLM's EAGLE-3 ({', '.join(FAMILIES)})"),
    Refusal(lambda cfg: bool(cfg.get("tie_word_embeddings")), "tie_word_embeddings is true, but an EAGLE-3 draft's lm_head (Vd rows) is its own"),
)

#: refusals that are conditions on the output tensor names (the draft's head and vocabulary map)
_HEAD_REFUSALS: tuple[Refusal, ...] = (
    Refusal(lambda out: "lm_head.weight" not in out, "the draft has no lm_head.weight",
            hint="an EAGLE-3 draft always has its own head over the draft vocabulary", where=None),
)
_VOCAB_REFUSALS: tuple[Refusal, ...] = (
    Refusal(lambda out: "t2d" in out and "d2t" not in out, "the source has t2d but no d2t",
            hint="d2t (draft id -> target id offsets) is the map vLLM reads; re-export the draft", where=None),
)

#: refusals on the norm flags, checked after the field readings
_FLAG_REFUSALS: tuple[Refusal, ...] = (
    Refusal(lambda cfg: not isinstance(cfg.get("norm_before_residual", False), bool),
            lambda cfg: f"norm_before_residual must be true or false, got {cfg.get('norm_before_residual', False)!r}"),
)

#: field readings applied before the decoder layers are counted: SafeAILab's ``cnets.py`` and
#: SGLang's ``llama_eagle3.py`` build one midlayer whatever the config says (issue 18: configs that
#: copy the verifier's depth); the tensors are the truth. ``ctx``: the plan.
_LAYER_READINGS: tuple[FieldReading, ...] = (
    FieldReading("num_hidden_layers",
                 lambda cfg, plan: cfg.get("num_hidden_layers", 1) != 1 and any(re.fullmatch(r"midlayer\.[a-z_]+\..+", m.src) for m in plan.moves),
                 lambda cfg, plan: 1,
                 lambda cfg: f"config num_hidden_layers={cfg.get('num_hidden_layers')} but the weights hold one unnumbered midlayer.* "
                             "(SafeAILab's and SGLang's EAGLE-3 code build one layer whatever the config says); converted as 1 layer"),
)

#: field readings of the norm flags. ``norm_output`` means two things. In speculators, vLLM and a
#: nested ``eagle_config`` (speculators' eagle3_converter reads it there) it is EAGLE-3.1's: the
#: normed output is fed back to the next step. At the top level of a SpecForge config it is
#: SpecForge's (``llama3_eagle.py``, ``compute_logits``, default true): RMSNorm before ``lm_head``,
#: the pre-norm output fed back -- vLLM's ``norm_output`` false; its ``false`` has no vLLM reading.
_NORM_READINGS: tuple[FieldReading, ...] = (
    FieldReading("norm_output", lambda cfg, _: "norm_output" in cfg, lambda cfg, _: bool(_ec(cfg).get("norm_output", False)),
                 "norm_output true at the top level is SpecForge's (RMSNorm before lm_head, the pre-norm output fed back; "
                 "llama3_eagle.py compute_logits): vLLM's norm_output false, written false",
                 Refusal(lambda cfg: cfg["norm_output"] is False,
                         "norm_output false at the top level of a SpecForge config: its logits come from the un-normed output "
                         "(specforge/modeling/draft/llama3_eagle.py, compute_logits), but vLLM's EAGLE-3 model always norms before lm_head",
                         hint="this draft cannot be served by vLLM without changing its output")),
)


def _widths(cfg: dict[str, Any], out: dict[str, Any], H: int, verifier_hidden: int) -> int | None:
    """``target_hidden_size`` (None when absent), checked: the verifier's width, and a draft
    narrower or wider than it carries its own ``embed_tokens``.

    Raises:
        ConversionError: the width differs from the verifier's, or the draft's own embedding is missing.
    """
    Ht = positive_int(cfg, "target_hidden_size") if cfg.get("target_hidden_size") is not None else None
    if (Ht or H) != verifier_hidden:
        raise ConversionError(f"the draft expects a verifier hidden size of {Ht or H} but the verifier has {verifier_hidden}",
                              hint="is --verifier the model this draft was trained for?")
    if (Ht or H) != H and "embed_tokens.weight" not in out:
        raise ConversionError(
            f"draft hidden size {H} differs from the verifier's {Ht}, so the draft needs its own embed_tokens.weight, which the source lacks",
            hint="vLLM would borrow the verifier's embedding of the wrong width (vLLM issue #18906)",
        )
    return Ht


def _drop_identity_map(src: Source, plan: Plan, out: dict[str, Any], Vd: int, V: int) -> None:
    """A full-vocabulary draft (Vd = V) with ``d2t``: vLLM builds no vocabulary map and rejects
    ``d2t`` ("no module or parameter named 'draft_id_to_target_id'"); all-zero offsets are the
    identity, so dropping them is exact.

    Raises:
        ConversionError: ``d2t`` is not all zeros.
    """
    if Vd != V or "d2t" not in out:
        return
    if src.array("d2t").any():
        raise ConversionError("draft_vocab_size equals the vocabulary but d2t is not all zeros (not the identity map)")
    for m in plan.moves:
        if m.dst in ("d2t", "t2d"):
            m.drop("full vocabulary (Vd = V): d2t is all zeros, the identity; vLLM rejects a map here")


@register
class Eagle3Converter(Converter):
    name = "eagle3"
    summary = "EAGLE-3 drafts: SafeAILab (pytorch_model.bin, midlayer.*) and SpecForge/ModelOpt (model.safetensors, eagle_config)"
    detects_as = "eagle3"
    upgrades = "eagle3"
    rules = (
        Rule(r"(midlayer|layers)\.(\d+\.)?self_attn\.rotary_emb\.inv_freq", None, "rotary cache, equal to what rope_theta gives (checked)"),
        Rule(r"midlayer\.(\d+)\.(.+)", r"layers.\1.\2"),  # ModelOpt multi-layer drafts
        Rule(r"midlayer\.(.+)", r"layers.0.\1"),  # SafeAILab / SpecForge single layer
        Rule(r"layers\.\d+\..+", KEEP),
        Rule(r"(fc|norm|lm_head|embed_tokens|input_norm)\.weight", KEEP),
        Rule(r"fc_norm\.\d+\.weight", KEEP),
        Rule(r"d2t|t2d", KEEP),
        Rule(r"target_model\..+", None, "frozen copy of the verifier saved with the training state; vLLM loads the verifier itself"),
        Rule(r"verifier_(lm_head|norm)\.weight", None, "frozen verifier head used only in training"),
    )
    #: the decoder's fields, EAGLE-3's own (typed in :class:`~specfmt.algorithms.eagle3.Eagle3Config`), and the research-only flags
    fields = {**DECODER_FIELDS, **field_kinds(Eagle3Config, beyond=SpeculatorConfig), "use_aux_hidden_state": BOOL, "eagle_config": OBJECT}
    nested_fields = ("eagle_config",)
    layouts = (
        Layout("sglang-export", lambda s: _eagle3(s) and _exported(s.config) is not None,
               f"config has a {EXPORT_KEY} block (written by `specfmt export --to sglang`)",
               details="SGLang's `LlamaForCausalLMEagle3` layout as specfmt writes it: `midlayer.*`, no `t2d`, tap ids in "
                       "`eagle_config`, top-level `norm_output` in SGLang's (EAGLE-3.1's) meaning",
               outcome="converted without `--tap-ids`: the ids are read in the convention the export records, `norm_output` as SGLang "
                       "reads it, k as exported, `t2d` rebuilt from `d2t`; the draft it was exported from, tensor for tensor"),
        Layout("specforge", lambda s: _eagle3(s) and "eagle_config" in s.config, "config has a nested eagle_config (SpecForge / ModelOpt export)",
               details="SpecForge / NVIDIA ModelOpt exports: `model.safetensors` (also sharded, with an index), `architectures: "
                       "LlamaForCausalLMEagle3`, tap ids in `eagle_config.eagle_aux_hidden_state_layer_ids`; ModelOpt multi-layer drafts "
                       "use `midlayer.{i}.*`",
               outcome="converted with `--tap-ids`; taps from `eagle_config`. Those ids come in two conventions the file does not say "
                       "(`read_taps`): SpecForge's `[1, 46, 90]` (94 layers) are SGLang's layer outputs, which become vLLM ids "
                       "`[2, 47, 91]` with `--tap-ids layer-output`. Without `--tap-ids` the conversion is **refused**, naming both readings",
               examples=(Example("SpecForge qwen3-235B-A22B-eagle3",
                                 "https://github.com/sgl-project/SpecForge/blob/cbb0d9561e2b3b8e48bb19ef4eec6ad213433307/configs/qwen3-235B-A22B-eagle3.json"),)),
        Layout("safeailab", lambda s: _eagle3(s) and s.has(r"midlayer\..+"), "midlayer.* tensors (EAGLE-3 decoder layer)",
               details="SafeAILab/EAGLE `traineagle3`: `pytorch_model.bin` (float16 pickle), one unnumbered `midlayer.*`, `architectures: "
                       "LlamaForCausalLM`, no tap ids, no `embed_tokens` (the verifier's is used), `d2t` int64 + `t2d` bool when Vd < V",
               outcome="converted; taps (2, N//2, N-3), the reference's, with a note",
               examples=(Example("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                 "https://github.com/SafeAILab/EAGLE/blob/9666a8182d9bed8b5b637fd4a126c90d9b9c3db2/eagle/traineagle3/config.json"),)),
        Layout("layers-named", _eagle3, "layers.0.hidden_norm.weight (EAGLE-3 decoder layer)",
               details="the decoder layers already named `layers.{i}.*` (vLLM's and speculators' names)"),
    )
    cases = (
        Case("sharded safetensors with an index (`model.safetensors.index.json`)", "converted; the index may name only files in the folder"),
        Case("the draft's own `embed_tokens` [V, H], with or without `target_hidden_size` (H ≠ H_t)", "converted; the embedding is kept",
             (Example("SpecForge outputs/llama3-8b-eagle3/epoch_0",
                      "https://github.com/sgl-project/SpecForge/blob/64f59f5caf70360661efeb986026196a3319b54a/outputs/llama3-8b-eagle3/epoch_0/config.json",
                      "a `save_pretrained` output, float32"),)),
        Case("`head_dim` ≠ H / heads", "converted; the reference forward pass uses `head_dim` too",
             (Example("SpecForge gpt-oss-120B-eagle3",
                      "https://github.com/sgl-project/SpecForge/blob/94d67101e02cf23fce6032bbb553bce1ce48e368/configs/gpt-oss-120B-eagle3.json", "64 vs 45"),
              Example("TorchSpec kimi_k25_eagle3",
                      "https://github.com/lightseekorg/TorchSpec/blob/06a9760b2d64ad9c6d51dc25e9f652308e03aa63/configs/draft_models/kimi_k25_eagle3.json"))),
        Case("full vocabulary: no `draft_vocab_size`, no `d2t`/`t2d`", "converted",
             (Example("TorchSpec kimi_k25_eagle3",
                      "https://github.com/lightseekorg/TorchSpec/blob/06a9760b2d64ad9c6d51dc25e9f652308e03aa63/configs/draft_models/kimi_k25_eagle3.json",
                      "V = 163840"),)),
        Case("EAGLE-3.1: `fc_norm` (`fc_norm.{0,1,2}.weight`) and SpecForge's top-level `norm_output`",
             "converted. SpecForge's `norm_output: true` means \"norm before lm_head, the pre-norm output fed back\" (`llama3_eagle.py`, "
             "`compute_logits`), which is vLLM's `norm_output: false`; it is written false, with a note. `false` (no norm before lm_head) "
             "is refused: vLLM always norms there",
             (Example("SpecForge qwen3-30B-A3B-eagle3.1",
                      "https://github.com/sgl-project/SpecForge/blob/b7ce50cdc7689b670b3b86eaa2eff1838b9f269a/configs/qwen3-30B-A3B-eagle3.1.json"),)),
        Case("`norm_before_fc` in a nested `eagle_config` (ModelOpt gpt-oss exports)", "converted; tested on a built gpt-oss-shaped draft",
             (Example("sglang PR #32334", "https://github.com/sgl-project/sglang/pull/32334",
                      "states the flags of gpt-oss-120b-Eagle3-v3; no published config text found"),)),
        Case("`num_hidden_layers` = the verifier's depth, one unnumbered `midlayer.*`",
             "converted as one layer, with a note (SafeAILab's and SGLang's code build one layer whatever the config says)",
             (Example("BaldEagle issue #6", note="reports 40 for EAGLE3-Vicuna1.3-13B; no config text found"),)),
        Case("`d2t` alone, int32 or int64, no `t2d`",
             "converted: `t2d` is built from `d2t` and an int32 `d2t` widened to int64, exactly (vLLM reads only `d2t`)",
             (Example("no published file found", note="a Kimi card mentions `d2t` without `t2d`"),)),
        Case("ModelOpt `eagle_config.use_aux_hidden_state: false` (last hidden state only, no fc)",
             "**refused**: vLLM builds it from its own config (`--speculative-config '{\"method\": \"eagle3\", \"model\": DIR}'`); "
             "the speculators format has no field for it",
             (Example("nvidia/gpt-oss-120b-Eagle3-v2", note="named in vLLM's code"),)),
        Case("`eagle_config` flags that describe another forward pass (`use_mtp_layernorm: true`, `parallel_draft_step` > 1, "
             "`has_lm_head: false`, ...; `_EAGLE_CONFIG_KEYS`), or fields the converter does not know",
             "**refused**, naming the flag and the value vLLM's EAGLE-3 model needs"),
    )
    fallback_layout = "layers-named"

    def describe(self, seen: Seen) -> tuple[list[str], dict[str, Any]]:
        cfg, fc = seen.config, seen.shapes.get("fc.weight")
        ec = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
        ev = [f"fc.weight {list(fc)}: {fc[1] // fc[0] if fc[0] else '?'} tapped verifier states"] if fc and len(fc) == 2 else []
        return ev, {
            "hidden_size": cfg.get("hidden_size"),
            "vocab_size": cfg.get("vocab_size"),
            "draft_vocab_size": (seen.shapes.get("lm_head.weight") or [None])[0],
            "vocab_map": "d2t/t2d" if "d2t" in seen.shapes else "none (full vocabulary)",
            "own_embedding": "embed_tokens.weight" in seen.shapes,
            "target_hidden_size": cfg.get("target_hidden_size"),
            "tap_layers": describe_taps(cfg.get("eagle_aux_hidden_state_layer_ids", ec.get("eagle_aux_hidden_state_layer_ids"))),
        }

    def decide(self, src: Source, opts: Options, plan: Plan) -> None:
        """The output config (:func:`specfmt.algorithms.eagle3.build_config`): taps, draft vocabulary,
        widths and norm flags read from the source and checked against the verifier and the tensors.

        Reads the plan's output names (:meth:`Plan.outputs`), never the source's; an SGLang export as recorded (:func:`_export_reading`).

        Raises:
            ConversionError: the source config or tensors do not describe an EAGLE-3 draft that vLLM can run exactly
                as the source computes it (the rows of :data:`_CONFIG_REFUSALS`, :data:`_VOCAB_REFUSALS` and
                :data:`_FLAG_REFUSALS`, and the sizes checked here).
        """
        cfg, verifier, out = src.config, src.verifier.info, plan.outputs()
        opts = _export_reading(cfg, opts)
        refuse(_CONFIG_REFUSALS, cfg)
        H, nH, V = positive_int(cfg, "hidden_size"), positive_int(cfg, "num_attention_heads"), positive_int(cfg, "vocab_size")
        check_vocab(V, src.verifier)
        Vd = self._draft_vocab(src, plan, out, V)
        Ht = _widths(cfg, out, H, verifier.hidden_size)
        taps = read_taps(cfg, opts, verifier.num_hidden_layers, plan.notes, default_taps)
        fc = out.get("fc.weight")
        if fc is None:
            raise ConversionError("the draft has no fc.weight", hint="EAGLE-3 fuses the tapped verifier states through fc")
        if len(fc.shape) != 2 or fc.shape[1] != len(taps) * (Ht or H):
            raise ConversionError(f"fc.weight has shape {list(fc.shape)}, which does not take {len(taps)} taps of width {Ht or H}")
        out_code = decide_float_dtype(plan.moves, opts)
        _drop_identity_map(src, plan, out, Vd, V)
        cfg = read_fields(_LAYER_READINGS, cfg, plan, plan.notes)
        n_layers = decoder_layer_count({int(m.dst.split(".")[1]) for m in plan.moves if m.dst and m.dst.startswith("layers.")}, cfg)
        tlc = decoder_config(cfg, H, nH, V, verifier, out_code, n_layers)
        check_rotary_caches(src, tlc)
        cfg = cfg if _exported(cfg) else read_fields(_NORM_READINGS, cfg, plan, plan.notes)  # an export's norm_output is SGLang's
        ec = _ec(cfg)
        flag = lambda k: bool(cfg.get(k, ec.get(k, False)))  # noqa: E731
        norm_output = flag("norm_output")
        refuse(_FLAG_REFUSALS, cfg)
        plan.config = build_config(verifier, tlc, speculative_tokens=opts.speculative_tokens or 3, draft_vocab_size=Vd, taps=taps,
                                   norm_before_residual=cfg.get("norm_before_residual", False), target_hidden_size=Ht,
                                   norm_before_fc=flag("norm_before_fc"), fc_norm=flag("fc_norm"), norm_output=norm_output, dtype=DTYPE_NAMES[out_code])
        if "norm_before_residual" not in cfg:
            plan.notes.append("norm_before_residual not in the source; wrote false, the EAGLE-3 reference forward pass (vLLM would assume true)")

    def _draft_vocab(self, src: Source, plan: Plan, out: dict[str, Any], V: int) -> int:
        """Vd, the rows of ``lm_head.weight``, checked against the config's ``draft_vocab_size``; a
        ``d2t`` saved without ``t2d`` gets ``t2d`` built from it (:meth:`_t2d_from_d2t`).

        Raises:
            ConversionError: no ``lm_head.weight``, a config ``draft_vocab_size`` other than its rows, or ``t2d`` without ``d2t``.
        """
        refuse(_HEAD_REFUSALS, out)
        Vd = out["lm_head.weight"].shape[0]
        cfg_vd = src.config.get("draft_vocab_size", _ec(src.config).get("draft_vocab_size"))
        if cfg_vd is not None and cfg_vd != Vd:
            raise ConversionError(f"config draft_vocab_size={cfg_vd} but lm_head.weight has {Vd} rows", where="config.json")
        if cfg_vd is None:
            plan.notes.append(f"draft_vocab_size not in the source config; taken from lm_head.weight rows ({Vd})")
        refuse(_VOCAB_REFUSALS, out)
        if "d2t" in out and "t2d" not in out and Vd != V:
            self._t2d_from_d2t(src, plan, Vd, V)
        return Vd

    @staticmethod
    def _t2d_from_d2t(src: Source, plan: Plan, Vd: int, V: int) -> None:
        """A draft saved with ``d2t`` only (int64 or int32; vLLM reads only ``d2t``): ``t2d`` [V] bool is
        a function of it -- True at target id ``i + d2t[i]`` -- and an int32 ``d2t`` widens exactly to int64.

        Raises:
            ConversionError: ``d2t`` is not [Vd] integers giving Vd distinct, ascending target ids in [0, V).
        """
        import numpy as np

        info = plan.outputs()["d2t"]
        if info.dtype not in ("I64", "I32") or tuple(info.shape) != (Vd,):
            raise ConversionError(f"d2t must be [{Vd}] int64 or int32 offsets, got {list(info.shape)} {info.dtype}")
        ids = np.arange(Vd, dtype=np.int64) + src.array("d2t").astype(np.int64)
        if ids.min(initial=0) < 0 or ids.max(initial=0) >= V or (ids[1:] <= ids[:-1]).any():
            raise ConversionError(f"d2t does not map the {Vd} draft ids to distinct, ascending target ids in [0, {V})",
                                  hint="d2t holds offsets (target id - draft id), as SafeAILab's and SpecForge's trainers write it")

        def t2d(get: Any) -> Any:
            import torch

            mask = torch.zeros(V, dtype=torch.bool)
            mask[torch.arange(Vd, dtype=torch.int64) + get("d2t").to(torch.int64)] = True
            return mask

        move = next(m for m in plan.moves if m.src == "d2t")
        if info.dtype == "I32":
            move.drop("widened exactly to int64 (written as the derived d2t)", "fold")
            plan.derived.append(Derived("d2t", (Vd,), "I64", "d2t (int32 in the source) widened to int64", lambda get: get("d2t").to(__import__("torch").int64)))
        plan.derived.append(Derived("t2d", (V,), "BOOL", "built from d2t: True at target id i + d2t[i] (the source saved d2t only)", t2d))
        plan.notes.append(f"the source has d2t ({info.dtype}) but no t2d; t2d built exactly from d2t (vLLM reads only d2t)")

    def from_speculators(self, src: Source, cfg: dict[str, Any], notes: list[str]) -> Source:
        """A speculators eagle3 config as the research config :meth:`decide` reads: the decoder
        fields of ``transformer_layer_config`` plus the EAGLE-3 flags; tensor names are already ours."""
        tlc = cfg["transformer_layer_config"]
        research = {key: val for key, val in tlc.items() if key not in ("architectures", "num_aux_hidden_states", "tie_word_embeddings", "torch_dtype", "dtype")}
        research.update({key: cfg[key] for key in _SPECULATORS_FLAGS if cfg.get(key) is not None})
        # speculators' Eagle3SpeculatorConfig default is false (and it always writes the key);
        # vLLM assumes true when the key is absent -- decide() writes false and notes it
        if "norm_before_residual" in cfg:
            research["norm_before_residual"] = cfg["norm_before_residual"]
        if cfg.get("norm_output") is not None:  # EAGLE-3.1's meaning, which decide() reads from eagle_config
            research["eagle_config"] = {"norm_output": cfg["norm_output"]}
        if cfg.get("eagle_aux_hidden_state_layer_ids") is None:
            notes.append("eagle_aux_hidden_state_layer_ids missing or null: speculators then taps the reference default, written explicitly below")
        research[_SPECULATORS_TAPS] = True  # vLLM's convention by definition (read_taps)
        return replace(src, config=research)

