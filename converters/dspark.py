"""``--from dspark``: DSpark drafts -> specfmt (speculators ``dspark``); ``specfmt upgrade`` of speculators' own.

A DSpark draft (:mod:`specfmt.algorithms.dspark`) saved by speculators 0.9 (``DSparkDraftModel.save_pretrained``) is a
DFlash draft (:mod:`.dflash` reads that part: every rule applies) plus ``markov_head.markov_w1`` [V, r],
``markov_head.markov_w2`` [Vd, r] and, with ``enable_confidence_head``, ``confidence_head.proj`` [1, H (+ r)]. A field
speculators leaves out is written with speculators' default (``DSparkSpeculatorConfig``), with a note, because vLLM's
default for three of them is the other one (``sample_from_anchor``, ``enable_confidence_head``,
``confidence_head_with_markov``: vLLM false, speculators true). Refused: a gated or rnn Markov head
(:data:`~specfmt.algorithms.dspark.VANILLA_ONLY`), no Markov head (``markov_rank`` 0), heads whose shapes are not the
config's, and sliding-window layers trained non-causal (:data:`~specfmt.algorithms.dspark.SLIDING_TRAP`).

SpecForge's native DSpark layout is named by :mod:`specfmt.detect` and refused (:data:`specfmt.algorithms.dspark.NATIVE_REFUSAL`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specfmt.algorithms.dspark import SLIDING_TRAP, VANILLA_ONLY, DSparkConfig
from specfmt.errors import ConversionError
from specfmt.format.config import SpeculatorConfig
from specfmt.format.model import field_kinds

from .base import KEEP, Case, Layout, Options, Plan, Rule, Seen, Source, register
from .dflash import DFlashConverter

#: speculators 0.9's ``DSparkSpeculatorConfig`` defaults, written when a field is absent
DEFAULTS = {"sample_from_anchor": True, "markov_rank": 256, "markov_head_type": "vanilla", "enable_confidence_head": True,
            "confidence_head_with_markov": True}


def _speculators_dspark(seen: Seen) -> bool:
    return seen.config.get("speculators_model_type") == "dspark" and seen.has(r"hidden_norm\.weight") and seen.has(r"markov_head\.markov_w1\.weight")


@register
class DSparkConverter(DFlashConverter):
    name = "dspark"
    label = "DSpark"
    summary = "DSpark drafts (DFlash with Markov and confidence heads): speculators 0.9's own (`DSparkDraftModel`), upgraded and checked"
    detects_as = "dspark"
    upgrades = "dspark"
    rules = (Rule(r"markov_head\.markov_w[12]\.weight", KEEP), Rule(r"confidence_head\.proj\.(weight|bias)", KEEP), *DFlashConverter.rules)
    fields = field_kinds(DSparkConfig, beyond=SpeculatorConfig)
    layouts = (Layout("speculators", _speculators_dspark, "speculators_model_type dspark, hidden_norm.weight and markov_head.markov_w1.weight",
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
             "**refused** by `--from auto` (`inspect` names it): vLLM cannot serve it as it is either"),
    )

    def claims(self, seen: Seen) -> bool:
        return seen.config.get("speculators_model_type") == "dspark"

    def decide(self, src: Source, opts: Options, plan: Plan) -> None:
        """DFlash's decisions (:meth:`DFlashConverter.decide`), then the heads' fields and tensors.

        Raises:
            ConversionError: DFlash's refusals; a head type other than vanilla; ``markov_rank`` not a positive int;
                ``markov_head.*`` or ``confidence_head.*`` missing or not of the config's shapes.
        """
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
        plan.config = _as_dspark(plan.config, fields)
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


def _as_dspark(cfg: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """A dflash config built by DFlash's decisions, as the dspark config it is (:class:`DSparkConfig`: name, architecture,
    the heads' fields after DFlash's)."""
    out: dict[str, Any] = {}
    for key, val in cfg.items():
        if key == "tie_word_embeddings":
            out.update(fields)
        out[key] = val
    out["architectures"] = [DSparkConfig.architecture]
    out["speculators_model_type"] = DSparkConfig.name
    out["speculators_config"] = {**cfg["speculators_config"], "algorithm": DSparkConfig.name}
    return DSparkConfig.of(out).dump()


__all__ = ["DEFAULTS", "DSparkConverter"]
