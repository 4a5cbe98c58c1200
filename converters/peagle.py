"""``--from peagle``: P-EAGLE drafts -> specfmt (speculators ``peagle``); ``specfmt upgrade`` of speculators' own.

A P-EAGLE draft is an EAGLE-3 draft (:mod:`.eagle3` reads it: every rule and check applies) plus
``mask_hidden`` [1, 1, n_aux·H_t] and the mask token (``mask_token_id``), which vLLM reads as
``pard_token`` (:mod:`specfmt.algorithms.peagle`). The mask token is a training choice no tensor
records, so a source without it is refused rather than guessed; the user may state it
(``--mask-token-id``, :attr:`~.base.Options.mask_token_id`).

SpecForge's native layout (``specforge/modeling/draft/peagle.py`` ``PEagleDraftModel``, sgl-project/SpecForge
a6b6b02) holds the tensors speculators 0.9 writes -- ``layers.0`` EAGLE-3's first layer (``hidden_norm``,
[., 2H] projections), ``layers.1..`` plain decoder layers, ``fc`` [H, 3·H_t], ``mask_hidden`` [1, 1, 3·H_t],
``norm``, ``lm_head`` [Vd, H], ``embed_tokens``, ``d2t``/``t2d`` -- under a plain Llama config (vLLM's
``llama_eagle3.py`` builds ``num_hidden_layers`` layers, the first with 2H inputs). Its config records
neither the mask token (``specforge/training/model_utils.py`` ``resolve_mask_token_id`` picks the run's
``--mask-token-id``, the tokenizer's mask, an unused embedding row, then pad/eos/unk) nor, by default, the
taps (``model_providers.py`` ``resolve_eagle_capture_layers``: ``[1, N//2-1, N-4]`` through SGLang's +1,
i.e. EAGLE-3's default (2, N//2, N-3), which :func:`~.taps.read_taps` writes with a note).
"""

from __future__ import annotations

from typing import Any

from specfmt.algorithms.peagle import PEagleConfig
from specfmt.errors import ConversionError
from specfmt.format.config import SpeculatorConfig
from specfmt.format.model import field_kinds

from .base import KEEP, Case, Example, Layout, Options, Plan, Rule, Seen, Source, register
from .eagle3 import Eagle3Converter, _eagle3
from .taps import SPECULATORS_TAPS


def _peagle(seen: Seen) -> bool:
    return _eagle3(seen) and seen.has(r"mask_hidden")


def _specforge(seen: Seen) -> bool:
    """A research config (not one :meth:`PEagleConverter.from_speculators` read) over P-EAGLE tensors."""
    return _peagle(seen) and seen.config.get(SPECULATORS_TAPS) is not True


@register
class PEagleConverter(Eagle3Converter):
    name = "peagle"
    label = "P-EAGLE"
    summary = "P-EAGLE drafts (EAGLE-3 with mask_hidden and a mask token): speculators 0.9's own and SpecForge's (with --mask-token-id)"
    detects_as = "peagle"
    upgrades = "peagle"
    rules = (Rule(r"mask_hidden", KEEP), *Eagle3Converter.rules)
    fields = {**Eagle3Converter.fields, **field_kinds(PEagleConfig, beyond=SpeculatorConfig)}
    layouts = (Layout("specforge", _specforge, "mask_hidden next to layers.0.hidden_norm.weight under a research config (SpecForge's P-EAGLE)",
                      details="SpecForge's `PEagleDraftModel` (`specforge/modeling/draft/peagle.py`): a Llama config "
                              "(`architectures: PEagleDraftModel`, `num_hidden_layers` layers: `layers.0` EAGLE-3's first layer, the others "
                              "plain), `draft_vocab_size`, no `mask_token_id`, taps only when a run overrode them; EAGLE-3's tensor names and "
                              "`mask_hidden` [1, 1, 3·H]",
                      outcome="converted with `--mask-token-id` (the token the SpecForge run used: its `--mask-token-id`, else the "
                              "tokenizer's mask, pad or eos token); without it **refused**: the config does not record it. Taps: "
                              "SpecForge's default [1, N//2-1, N-4] through SGLang's +1 is EAGLE-3's (2, N//2, N-3), written with a note",
                      examples=(Example("SpecForge qwen3-8b-peagle",
                                        "https://github.com/sgl-project/SpecForge/blob/fd6b16fcdfb651aba500d1eb4c9bc5a946d7696d/configs/qwen3-8b-peagle.json"),)),
               Layout("layers-named", _peagle, "mask_hidden next to layers.0.hidden_norm.weight (a P-EAGLE draft)",
                      details="speculators 0.9's `PEagleDraftModel` names: EAGLE-3's (`layers.{i}.*`, `fc`, `norm`, `lm_head`, "
                              "`embed_tokens`, `d2t`/`t2d`) and `mask_hidden` [1, 1, n_aux·H]; `mask_token_id` in the config",
                      outcome="converted (with `specfmt upgrade` for a speculators config); without `mask_token_id` **refused**: "
                              "vLLM reads it as `pard_token`, and no tensor says which token the parallel positions were trained with"),)
    cases = (
        Case("speculators 0.9 `peagle` output (`PEagleSpeculator`, `mask_token_id`, `embed_requires_grad`)",
             "converted by `specfmt upgrade`, every EAGLE-3 rule applied; `mask_hidden` kept as it is"),
        Case("`mask_token_id` missing or null (speculators' default is null)", "**refused**: vLLM reads `config_dict[\"mask_token_id\"]`"),
        Case("`--mask-token-id` with a source that records `mask_token_id`", "converted when they agree; **refused** when they differ"),
        Case("more than one decoder layer (SpecForge's qwen3-8b-peagle: 4)",
             "converted: `layers.0` takes [embedding, hidden] (2H), the others H, as vLLM's `llama_eagle3.py` builds them"),
    )
    fallback_layout = "layers-named"

    def claims(self, seen: Seen) -> bool:
        return seen.has(r"mask_hidden")

    def decide(self, src: Source, opts: Options, plan: Plan) -> None:
        """EAGLE-3's decisions (:meth:`Eagle3Converter.decide`), then the mask token and ``mask_hidden``.

        Raises:
            ConversionError: EAGLE-3's refusals; no mask token (neither ``mask_token_id`` nor ``--mask-token-id``),
                the two different, or one outside [0, V); no
                ``mask_hidden``, or one without n_aux·H_t values.
        """
        mask = _mask_token(src.config, opts)
        super().decide(src, opts, plan)
        if mask >= plan.config["transformer_layer_config"]["vocab_size"]:
            raise ConversionError(f"mask token id {mask} is outside the vocabulary [0, {plan.config['transformer_layer_config']['vocab_size']})",
                                  hint="give the token the draft was trained with")
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


def _mask_token(cfg: dict[str, Any], opts: Options) -> int:
    """The mask token: the config's ``mask_token_id``, else ``--mask-token-id``; both must agree.

    Raises:
        ConversionError: neither gives a non-negative integer, or the two differ.
    """
    mask, given = cfg.get("mask_token_id"), opts.mask_token_id
    if given is not None and mask is not None and given != mask:
        raise ConversionError(f"--mask-token-id {given} contradicts the source's mask_token_id {mask!r}", where="config.json",
                              hint="drop --mask-token-id; the draft was trained with the source's mask token")
    if mask is None:
        mask = given
    if type(mask) is not int or mask < 0:
        raise ConversionError(f"mask_token_id is {mask!r}: vLLM reads it as pard_token, the token every parallel position reads",
                              where="config.json", hint="pass --mask-token-id with the token the draft was trained with "
                                                        "(SpecForge: the run's --mask-token-id, else the tokenizer's mask, pad or eos token)")
    return mask


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
