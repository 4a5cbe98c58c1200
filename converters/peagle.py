"""``--from peagle``: P-EAGLE drafts -> specfmt (speculators ``peagle``); ``specfmt upgrade`` of speculators' own.

A P-EAGLE draft is an EAGLE-3 draft (:mod:`.eagle3` reads it: every rule and check applies) plus
``mask_hidden`` [1, 1, n_aux·H_t] and the mask token (``mask_token_id``), which vLLM reads as
``pard_token`` (:mod:`specfmt.algorithms.peagle`). The mask token is a training choice no tensor
records, so a source without it is refused rather than guessed.
"""

from __future__ import annotations

from typing import Any

from specfmt.algorithms.peagle import PEagleConfig
from specfmt.errors import ConversionError
from specfmt.format.config import SpeculatorConfig
from specfmt.format.model import field_kinds

from .base import KEEP, Case, Layout, Options, Plan, Rule, Seen, Source, register
from .eagle3 import Eagle3Converter, _eagle3


def _peagle(seen: Seen) -> bool:
    return _eagle3(seen) and seen.has(r"mask_hidden")


@register
class PEagleConverter(Eagle3Converter):
    name = "peagle"
    label = "P-EAGLE"
    summary = "P-EAGLE drafts (EAGLE-3 with mask_hidden and a mask token): speculators 0.9's own, layers named as vLLM's"
    detects_as = "peagle"
    upgrades = "peagle"
    rules = (Rule(r"mask_hidden", KEEP), *Eagle3Converter.rules)
    fields = {**Eagle3Converter.fields, **field_kinds(PEagleConfig, beyond=SpeculatorConfig)}
    layouts = (Layout("layers-named", _peagle, "mask_hidden next to layers.0.hidden_norm.weight (a P-EAGLE draft)",
                      details="speculators 0.9's `PEagleDraftModel` names: EAGLE-3's (`layers.{i}.*`, `fc`, `norm`, `lm_head`, "
                              "`embed_tokens`, `d2t`/`t2d`) and `mask_hidden` [1, 1, n_aux·H]; `mask_token_id` in the config",
                      outcome="converted (with `specfmt upgrade` for a speculators config); without `mask_token_id` **refused**: "
                              "vLLM reads it as `pard_token`, and no tensor says which token the parallel positions were trained with"),)
    cases = (
        Case("speculators 0.9 `peagle` output (`PEagleSpeculator`, `mask_token_id`, `embed_requires_grad`)",
             "converted by `specfmt upgrade`, every EAGLE-3 rule applied; `mask_hidden` kept as it is"),
        Case("`mask_token_id` missing or null (speculators' default is null)", "**refused**: vLLM reads `config_dict[\"mask_token_id\"]`"),
        Case("SpecForge's native P-EAGLE layout (`PEagleDraftModel` config at the top level, no `mask_token_id`)",
             "**refused** by `--from auto` (`inspect` names it): its config does not say the mask token"),
    )
    fallback_layout = "layers-named"

    def claims(self, seen: Seen) -> bool:
        return seen.has(r"mask_hidden")

    def decide(self, src: Source, opts: Options, plan: Plan) -> None:
        """EAGLE-3's decisions (:meth:`Eagle3Converter.decide`), then the mask token and ``mask_hidden``.

        Raises:
            ConversionError: EAGLE-3's refusals; no ``mask_token_id`` (or one outside [0, V)); no
                ``mask_hidden``, or one without n_aux·H_t values.
        """
        mask = src.config.get("mask_token_id")
        if type(mask) is not int or mask < 0:
            raise ConversionError(f"mask_token_id is {mask!r}: vLLM reads it as pard_token, the token every parallel position reads",
                                  where="config.json", hint="set mask_token_id to the token the draft was trained with")
        super().decide(src, opts, plan)
        cfg = plan.config
        width = len(cfg["eagle_aux_hidden_state_layer_ids"]) * (cfg["target_hidden_size"] or cfg["transformer_layer_config"]["hidden_size"])
        info = plan.outputs().get("mask_hidden")
        if info is None or _count(info.shape) != width:
            got = "no mask_hidden" if info is None else f"mask_hidden {list(info.shape)}"
            raise ConversionError(f"{got}, but a P-EAGLE draft with these taps needs [1, 1, {width}]",
                                  hint="vLLM loads mask_hidden for parallel drafting and stops without it")
        plan.config = _as_peagle(cfg, mask)
        if tuple(info.shape) != (1, 1, width):
            plan.notes.append(f"mask_hidden {list(info.shape)} holds the {width} values of [1, 1, {width}]; vLLM reads it flat")

    def from_speculators(self, src: Source, cfg: dict[str, Any], notes: list[str]) -> Source:
        """EAGLE-3's reading of a speculators config (:meth:`Eagle3Converter.from_speculators`) and ``mask_token_id``."""
        out = super().from_speculators(src, cfg, notes)
        if "mask_token_id" in cfg:
            out.config["mask_token_id"] = cfg["mask_token_id"]
        return out


def _count(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _as_peagle(cfg: dict[str, Any], mask: int) -> dict[str, Any]:
    """An eagle3 config built by EAGLE-3's decisions, as the peagle config it is (:class:`PEagleConfig`: name,
    architecture, ``mask_token_id`` after EAGLE-3's fields)."""
    out: dict[str, Any] = {}
    for key, val in cfg.items():
        if key == "tie_word_embeddings":
            out["mask_token_id"] = mask
        out[key] = val
    out["architectures"] = [PEagleConfig.architecture]
    out["speculators_model_type"] = PEagleConfig.name
    out["speculators_config"] = {**cfg["speculators_config"], "algorithm": PEagleConfig.name}
    return PEagleConfig.of(out).dump()


__all__ = ["PEagleConverter"]
