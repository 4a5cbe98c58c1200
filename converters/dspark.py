"""``--from dspark``: DSpark drafts -> specfmt (speculators ``dspark``): SpecForge's layout, and ``specfmt upgrade`` of speculators' own.

A DSpark draft (:mod:`specfmt.algorithms.dspark`) saved by speculators 0.9 (``DSparkDraftModel.save_pretrained``) is a
DFlash draft (:mod:`.dflash` reads that part: every rule applies) plus ``markov_head.markov_w1`` [V, r],
``markov_head.markov_w2`` [Vd, r] and, with ``enable_confidence_head``, ``confidence_head.proj`` [1, H (+ r)]. A field
speculators leaves out is written with speculators' default (``DSparkSpeculatorConfig``), with a note, because vLLM's
default for three of them is the other one (``sample_from_anchor``, ``enable_confidence_head``,
``confidence_head_with_markov``: vLLM false, speculators true). Refused: a gated or rnn Markov head
(:data:`~specfmt.algorithms.dspark.VANILLA_ONLY`), no Markov head (``markov_rank`` 0), heads whose shapes are not the
config's, and sliding-window layers trained non-causal (:data:`~specfmt.algorithms.dspark.SLIDING_TRAP`).

SpecForge's native DSpark layout (``specforge/modeling/draft/dspark.py`` ``DSparkDraftModel(DFlashDraftModel)`` and
``specforge/algorithms/common/dflash_family_model.py`` ``OnlineDSparkModel``, sgl-project/SpecForge a6b6b02) is SpecForge's
DFlash layout (:mod:`.dflash` ``_research`` reads it: taps ``target_layer_ids`` + 1, the mask token, the block) with the
heads' fields inside ``dflash_config`` and the same head tensors as speculators': ``markov_head.markov_w1`` [V, r],
``markov_head.markov_w2`` [V, r] (SpecForge's ``VanillaMarkovHead`` projects to the full vocabulary: Vd = V) and
``confidence_head.proj`` [1, H (+ r)] (``AcceptRatePredictor``). What the conversion decides, and its sources:

* ``sample_from_anchor`` true: ``OnlineDSparkModel._build_dspark_labels_and_mask`` labels slot j of the block with the
  token at anchor + j + 1 (``label_offsets = arange(1, block_size + 1)``), so every slot proposes and k = B;
  each slot's Markov ``prev`` is the anchor, then the token before it (``prev_token_ids``), as speculators' and vLLM's;
* the heads' fields from ``dflash_config`` with SpecForge's defaults (``DSparkDraftModel._init_draft_head``,
  ``build_markov_head``): ``markov_rank`` 0 (no head: refused), ``markov_head_type`` vanilla,
  ``enable_confidence_head`` = ``confidence_head_alpha`` > 0, ``confidence_head_with_markov`` false;
* ``confidence_head_alpha`` is read for that default alone: the loss weight SpecForge trains with is
  ``training.dspark_confidence_head_alpha`` (``specforge/config/schema.py``), and no forward reads it;
* ``attention_mode`` (gqa or mha) only checks the head counts in SpecForge (``DSparkDraftModel.__init__``): the attention
  is the Qwen3 one either way, so it is checked the same way and not written;
* ``projector_type`` must be ``dspark`` (or absent: SpecForge sets it), as ``DSparkDraftModel`` requires.

SpecForge's own ``spec_generate`` (``DFlashDraftModel._sample_draft_tokens`` in ``DSparkDraftModel``) drafts from the last
B − 1 slots, one slot later than it trained them; the conversion follows the training forward, which is what the weights mean.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specfmt.algorithms.dspark import SLIDING_TRAP, VANILLA_ONLY, DSparkConfig
from specfmt.errors import ConversionError
from specfmt.format.config import SpeculatorConfig
from specfmt.format.model import field_kinds

from .base import KEEP, STRING, Case, Example, Layout, Options, Plan, Refusal, Rule, Seen, Source, refuse, register
from specfmt.algorithms.sglang import EXPORT_KEY, exported_by_specfmt

from .dflash import DFlashConverter, _dc, as_variant, sglang_export

#: speculators 0.9's ``DSparkSpeculatorConfig`` defaults, written when a field is absent
DEFAULTS = {"sample_from_anchor": True, "markov_rank": 256, "markov_head_type": "vanilla", "enable_confidence_head": True,
            "confidence_head_with_markov": True}


#: SpecForge's ``dflash_config`` keys of a DSpark draft beyond DFlash's, read here and taken out before DFlash's reading
NATIVE_KEYS = ("attention_mode", "confidence_head_alpha", "confidence_head_with_markov", "enable_confidence_head", "markov_head_type",
               "markov_rank", "projector_type")


def _specforge_dspark(seen: Seen) -> bool:
    dc = _dc(seen.config)
    return (isinstance(seen.config.get("dflash_config"), dict) and seen.has(r"hidden_norm\.weight")
            and (seen.has(r"(markov_head|confidence_head)\..+") or dc.get("projector_type") == "dspark" or "markov_rank" in dc))


def _heads_mode(cfg: dict[str, Any]) -> str | None:
    """What is wrong with ``attention_mode`` against the head counts (SpecForge ``DSparkDraftModel.__init__``), or None."""
    mode, nH, nKV = str(_dc(cfg).get("attention_mode", "gqa")).lower(), cfg.get("num_attention_heads"), cfg.get("num_key_value_heads") or cfg.get("num_attention_heads")
    if mode not in ("gqa", "mha"):
        return f"{mode!r} is neither gqa nor mha"
    if type(nH) is int and type(nKV) is int and (nKV >= nH if mode == "gqa" else nKV != nH):
        return f"{mode!r} with {nH} query and {nKV} key/value heads (gqa needs fewer key/value heads, mha as many)"
    return None


#: the note on ``sliding_window_non_causal`` for a DSpark draft (DFlash's says what vLLM's DFlash reader does with it)
_NATIVE_CAUSAL = ("sliding_window_non_causal written true: every layer of this draft attends within its block without a causal mask "
                  "(SpecForge's Qwen3DFlashAttention); vLLM's DSpark reader builds full-attention layers non-causal whatever it says")

#: refusals of SpecForge's DSpark ``dflash_config``, checked first, in order (DFlash's follow, :data:`.dflash._CONFIG_REFUSALS`)
NATIVE_REFUSALS: tuple[Refusal, ...] = (
    Refusal(lambda cfg: _dc(cfg).get("projector_type", "dspark") != "dspark",
            lambda cfg: f"dflash_config.projector_type={_dc(cfg)['projector_type']!r}: SpecForge's DSparkDraftModel requires 'dspark' "
                        "(specforge/modeling/draft/dspark.py)", hint="is this another SpecForge draft (Domino: projector_type domino)?"),
    Refusal(lambda cfg: _heads_mode(cfg) is not None,
            lambda cfg: f"dflash_config.attention_mode {_heads_mode(cfg)}: SpecForge's DSparkDraftModel does not build this draft"),
    Refusal(lambda cfg: type(_dc(cfg).get("confidence_head_alpha", 0.0)) not in (int, float) or _dc(cfg).get("confidence_head_alpha", 0.0) < 0,
            lambda cfg: f"dflash_config.confidence_head_alpha is {_dc(cfg)['confidence_head_alpha']!r}: SpecForge reads a number >= 0"),
    Refusal(lambda cfg: str(_dc(cfg).get("markov_head_type", "vanilla")).lower() != "vanilla",
            lambda cfg: f"dflash_config.markov_head_type is {_dc(cfg)['markov_head_type']!r}: {VANILLA_ONLY}",
            hint="serve it with SpecForge, or retrain with the vanilla head"),
    Refusal(lambda cfg: not _dc(cfg).get("markov_rank"),
            lambda cfg: f"dflash_config.markov_rank is {_dc(cfg).get('markov_rank')!r}: SpecForge builds no Markov head, but vLLM's "
                        "Qwen3DSparkModel always builds one", hint="without a Markov head it is not a draft vLLM's DSpark model runs"),
)


def _speculators_dspark(seen: Seen) -> bool:
    return seen.config.get("speculators_model_type") == "dspark" and seen.has(r"hidden_norm\.weight") and seen.has(r"markov_head\.markov_w1\.weight")


@register
class DSparkConverter(DFlashConverter):
    name = "dspark"
    label = "DSpark"
    summary = ("DSpark drafts (DFlash with Markov and confidence heads): SpecForge's layout (the heads' fields in dflash_config), "
               "and speculators 0.9's own (`DSparkDraftModel`), upgraded and checked")
    detects_as = "dspark"
    upgrades = "dspark"
    rules = (Rule(r"markov_head\.markov_w[12]\.weight", KEEP), Rule(r"confidence_head\.proj\.(weight|bias)", KEEP), *DFlashConverter.rules)
    fields = {**DFlashConverter.fields, **field_kinds(DSparkConfig, beyond=SpeculatorConfig), "attention_mode": STRING}
    research_from_anchor = True
    layouts = (Layout("sglang-export", lambda s: sglang_export(s, DSparkConfig.name), f"config has a {EXPORT_KEY} block of a DSpark draft "
                      "(written by `specfmt export --to sglang`)",
                      details="SGLang's `DSparkDraftModel` layout as specfmt writes it: DFlash's (z-lab's) with `dflash_config.block_size` "
                              "SGLang's gamma (the tokens a block proposes), and `markov_rank`, `markov_head_type`, `enable_confidence_head`, "
                              "`confidence_head_with_markov`, `sample_from_anchor` at the top level, where SGLang's heads read them",
                      outcome="converted: B = gamma (+ 1 without `sample_from_anchor`), the heads' fields as written, DFlash's reading of "
                              "the rest; the draft it was made from, tensor for tensor"),
               Layout("specforge", _specforge_dspark,
                      "config has dflash_config next to hidden_norm.weight, with markov_head.* / confidence_head.* tensors (or "
                      "projector_type dspark, markov_rank): SpecForge's DSpark draft",
                      details="SpecForge's `DSparkDraftModel` (`specforge/modeling/draft/dspark.py`): its DFlash layout (a Qwen3 config with "
                              "`block_size`, `num_target_layers`, `dflash_config`; `layers.{i}.*`, `fc`, `hidden_norm`, `norm`; no embedding or "
                              "`lm_head`) plus `dflash_config` `{markov_rank, markov_head_type, enable_confidence_head, "
                              "confidence_head_with_markov, confidence_head_alpha, attention_mode, projector_type}` and the tensors "
                              "`markov_head.markov_w1` [V, r], `markov_head.markov_w2` [V, r], `confidence_head.proj` [1, H (+ r)] with its bias",
                      outcome="converted: DFlash's reading of the backbone (taps `target_layer_ids` + 1, the mask token, Vd = V), "
                              "`sample_from_anchor` true (slot j trained on anchor + j + 1), k = block_size, the heads' fields from "
                              "`dflash_config` with SpecForge's defaults; every tensor kept as it is",
                      examples=(Example("SpecForge qwen3-8b-dspark",
                                        "https://github.com/sgl-project/SpecForge/blob/08eaeac1fde8d45312020959301d047e9a68d528/configs/qwen3-8b-dspark.json"),
                                Example("SpecForge qwen3.6-27b-dspark",
                                        "https://github.com/sgl-project/SpecForge/blob/a9b1a05f3ef5a53573cf28b3f19a5068465389c1/configs/qwen3.6-27b-dspark.json"))),
               Layout("speculators", _speculators_dspark, "speculators_model_type dspark, hidden_norm.weight and markov_head.markov_w1.weight",
                      details="speculators 0.9's `DSparkDraftModel` names: DFlash's, `markov_head.markov_w1` [V, r], `markov_head.markov_w2` "
                              "[Vd, r], `confidence_head.proj` [1, H (+ r)] with its bias",
                      outcome="converted (`specfmt upgrade`); a gated or rnn Markov head, or no mask token, **refused**"),)
    cases = (
        Case("speculators 0.9 `dspark` output (`DSparkDraftModel`, `markov_rank`, `sample_from_anchor` true)",
             "converted by `specfmt upgrade`: every tensor kept as it is, DFlash's checks and the heads' shapes checked"),
        Case("`sample_from_anchor`, `enable_confidence_head` or `confidence_head_with_markov` absent",
             "written as speculators' default (true), with a note: vLLM's reader takes an absent one as false"),
        Case("`markov_head_type` gated or rnn", "**refused**: vLLM 0.30-0.33 builds the vanilla head alone"),
        Case("`markov_rank` 0 (no Markov head)", "**refused**: vLLM's Qwen3DSparkModel always builds the head; the draft is a DFlash draft"),
        Case("sliding-window layers with `sliding_window_non_causal` true",
             "**refused**: vLLM's DSpark reader builds sliding-window layers causal"),
        Case("SpecForge's native DSpark layout (`DSparkDraftModel`, the heads' fields inside `dflash_config`)",
             "converted: `sample_from_anchor` true and k = block_size (SpecForge trains slot j on the token at anchor + j + 1), "
             "the heads' fields written at the top level where vLLM's `update_dspark` and `qwen3_dspark.py` read them"),
        Case("SpecForge DSpark: a head field absent from `dflash_config`",
             "SpecForge's default, checked against the tensors: `enable_confidence_head` = `confidence_head_alpha` > 0, "
             "`confidence_head_with_markov` false, `markov_head_type` vanilla"),
        Case("SpecForge DSpark: `confidence_head_alpha`",
             "not written: in the draft config it is only the default of `enable_confidence_head` (the loss weight is the "
             "training config's `dspark_confidence_head_alpha`)"),
        Case("SpecForge DSpark: `attention_mode`", "checked against the head counts (gqa: fewer key/value heads, mha: as many) "
             "and not written: the attention is Qwen3's either way; another mode or a mismatch **refused**"),
        Case("SpecForge DSpark: `projector_type` other than `dspark`, `markov_rank` 0 or absent, `markov_head_type` gated or rnn",
             "**refused**: SpecForge's `DSparkDraftModel` requires `dspark`; vLLM always builds a vanilla Markov head"),
    )

    def claims(self, seen: Seen) -> bool:
        return seen.config.get("speculators_model_type") == "dspark" or _specforge_dspark(seen) or sglang_export(seen, DSparkConfig.name)

    def decide(self, src: Source, opts: Options, plan: Plan) -> None:
        """DFlash's decisions (:meth:`DFlashConverter.decide`), then the heads' fields and tensors.

        Raises:
            ConversionError: DFlash's refusals; a head type other than vanilla; ``markov_rank`` not a positive int;
                ``markov_head.*`` or ``confidence_head.*`` missing or not of the config's shapes.
        """
        if exported_by_specfmt(src.config, DSparkConfig.name) is not None:
            return self._sglang_export(src, opts, plan)
        if isinstance(src.config.get("dflash_config"), dict):
            return self._specforge(src, opts, plan)
        cfg = {**DEFAULTS, **{k: v for k, v in src.config.items() if v is not None}}
        for key in DEFAULTS:
            if src.config.get(key) is None:
                vllm = ", where vLLM's reader would take false" if isinstance(DEFAULTS[key], bool) else ""
                plan.notes.append(f"{key} absent: written {DEFAULTS[key]!r}, speculators' default{vllm}")
        if cfg["markov_head_type"] != "vanilla":
            raise ConversionError(f"markov_head_type is {cfg['markov_head_type']!r}: {VANILLA_ONLY}", where="config.json",
                                  hint="serve it with speculators, or retrain with the vanilla head")
        if type(cfg["markov_rank"]) is not int or cfg["markov_rank"] < 1:
            raise ConversionError(f"markov_rank is {cfg['markov_rank']!r}: a DSpark draft has a Markov head (vLLM always builds one)",
                                  where="config.json", hint="a draft without one is a DFlash draft: convert it with --from dflash")
        super().decide(replace(src, config=cfg), opts, plan)
        fields = {k: cfg[k] for k in ("markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")}
        plan.config = as_variant(plan.config, fields, DSparkConfig)
        self._check_heads(plan)

    def _specforge(self, src: Source, opts: Options, plan: Plan) -> None:
        """SpecForge's DSpark draft: :data:`NATIVE_REFUSALS`, DFlash's reading of the rest of ``dflash_config``
        (:meth:`DFlashConverter._research`, with ``sample_from_anchor`` true), then the heads' fields and tensors.

        Raises:
            ConversionError: the rows of :data:`NATIVE_REFUSALS`; DFlash's research refusals; the heads' tensors missing or
                not of the config's shapes.
        """
        refuse(NATIVE_REFUSALS, src.config)
        dc = _dc(src.config)
        fields = {"markov_rank": dc["markov_rank"], "markov_head_type": "vanilla",
                  "enable_confidence_head": bool(dc.get("enable_confidence_head", float(dc.get("confidence_head_alpha") or 0.0) > 0.0)),
                  "confidence_head_with_markov": bool(dc.get("confidence_head_with_markov", False))}
        rest = {k: v for k, v in dc.items() if k not in NATIVE_KEYS}
        super().decide(replace(src, config={**src.config, "dflash_config": rest}), opts, plan)
        plan.config = as_variant(plan.config, fields, DSparkConfig)
        plan.notes[:] = [_NATIVE_CAUSAL if n.startswith("sliding_window_non_causal written true") else n for n in plan.notes]
        plan.notes.append("sample_from_anchor written true: SpecForge trains slot j of the block on the token at anchor + j + 1 "
                          "(OnlineDSparkModel), so every slot proposes and k = block_size")
        self._check_heads(plan)

    def _sglang_export(self, src: Source, opts: Options, plan: Plan) -> None:
        """SGLang's layout as ``specfmt export`` writes it: the heads' fields and ``sample_from_anchor`` from the top level,
        ``dflash_config.block_size`` read as the provenance records it (SGLang's gamma: B = gamma, + 1 without
        ``sample_from_anchor``), the rest by DFlash's reading of z-lab's layout (:meth:`DFlashConverter._research`).

        Raises:
            ConversionError: a field missing or of the wrong type, a block not recorded as gamma; DFlash's research refusals;
                the heads' tensors missing or not of the config's shapes.
        """
        cfg, recorded = src.config, exported_by_specfmt(src.config, DSparkConfig.name)
        types = {"markov_rank": int, "markov_head_type": str, "enable_confidence_head": bool, "confidence_head_with_markov": bool,
                 "sample_from_anchor": bool}
        bad = [k for k, t in types.items() if type(cfg.get(k)) is not t]
        gamma = _dc(cfg).get("block_size")
        if bad or recorded.get("block_size") != "gamma" or type(gamma) is not int:
            raise ConversionError(f"not as specfmt export writes a DSpark draft: {', '.join(bad) or 'dflash_config.block_size'} missing or "
                                  "of the wrong type, or the block not recorded as gamma", where="config.json",
                                  hint=f"the {EXPORT_KEY} block says specfmt wrote this folder; was it edited?")
        from_anchor = cfg["sample_from_anchor"]
        fields = {k: cfg[k] for k in types if k != "sample_from_anchor"}
        block = {**_dc(cfg), "block_size": gamma + (not from_anchor)}
        self._research(replace(src, config={**cfg, "dflash_config": block}), opts, plan, from_anchor=from_anchor)
        plan.config = as_variant(plan.config, fields, DSparkConfig)
        self._check_heads(plan)

    def _check_heads(self, plan: Plan) -> None:
        """Every tensor the heads need is there with the config's shape (:meth:`~specfmt.algorithms.dspark.DSpark.expected_tensors`).

        Raises:
            ConversionError: one is missing or of another shape.
        """
        from specfmt.algorithms import get

        outputs = plan.outputs()
        for name, spec in get("dspark").expected_tensors(plan.config).items():
            if not name.startswith(("markov_head.", "confidence_head.")):
                continue
            info = outputs.get(name)
            if info is None or tuple(info.shape) != spec.shape:
                got = "missing" if info is None else f"{list(info.shape)}"
                raise ConversionError(f"{name} is {got}, but this config needs {list(spec.shape)}", where="model.safetensors",
                                      hint="markov_rank, draft_vocab_size and the confidence fields must be the ones the draft was trained with")

    def _non_causal(self, cfg: dict[str, Any], tlc: dict[str, Any], plan: Plan) -> bool:
        """``sliding_window_non_causal`` as written: vLLM's DSpark reader never reads it (full-attention layers are non-causal
        there whatever it says), so DFlash's rewrite does not apply.

        Raises:
            ConversionError: true with sliding-window layers (:data:`~specfmt.algorithms.dspark.SLIDING_TRAP`).
        """
        written = bool(cfg.get("sliding_window_non_causal", False))
        if written and "sliding_attention" in (tlc.get("layer_types") or []):
            raise ConversionError(f"sliding_window_non_causal is true with sliding-window layers: {SLIDING_TRAP}", where="config.json",
                                  hint="vLLM would run this draft's sliding layers other than it was trained")
        return written


__all__ = ["DEFAULTS", "NATIVE_KEYS", "NATIVE_REFUSALS", "DSparkConverter"]
