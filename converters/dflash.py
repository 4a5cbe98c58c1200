"""``--from dflash``: DFlash drafts -> specfmt (speculators ``dflash``); ``specfmt upgrade`` of speculators' own.

A DFlash draft (:mod:`specfmt.algorithms.dflash`) saved by speculators 0.9 (``DFlashDraftModel.save_pretrained``)
already has the format's tensor names: ``fc``, ``hidden_norm``, ``layers.{i}.*`` (Qwen3 layers), ``norm``, and
``lm_head`` with ``d2t`` / ``t2d`` only with a draft vocabulary; ``embed_tokens`` and ``verifier_*`` are not saved
(``_keys_to_ignore_on_save``). Its config is the format's, read field by field and checked against the verifier and
the tensors. The mask token is a training choice no tensor records, so a config without it is refused.

Only speculators' layout is read here; z-lab's and SpecForge's (a top-level ``dflash_config``) are named by
:mod:`specfmt.detect` and refused (:data:`specfmt.algorithms.dflash.NATIVE_REFUSAL`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specfmt.algorithms.dflash import CAUSAL_TRAP, DFlashConfig
from specfmt.algorithms.layers import decoder_config
from specfmt.checkpoint.dtypes import DTYPE_NAMES
from specfmt.errors import ConversionError
from specfmt.format.config import SpeculatorConfig
from specfmt.format.model import field_kinds

from .base import KEEP, Case, Converter, Layout, Options, Plan, Rule, Seen, Source, check_vocab, decide_float_dtype, decoder_layer_count, positive_int, register


def _speculators_dflash(seen: Seen) -> bool:
    return seen.config.get("speculators_model_type") == "dflash" and seen.has(r"hidden_norm\.weight") and seen.has(r"layers\.0\.self_attn\.q_proj\.weight")


@register
class DFlashConverter(Converter):
    name = "dflash"
    label = "DFlash"
    summary = "DFlash block drafts: speculators 0.9's own (`DFlashDraftModel`), upgraded and checked"
    detects_as = "dflash"
    upgrades = "dflash"
    rules = (Rule(r"fc\.weight", KEEP), Rule(r"hidden_norm\.weight", KEEP), Rule(r"norm\.weight", KEEP), Rule(r"lm_head\.weight", KEEP),
             Rule(r"d2t|t2d", KEEP), Rule(r"embed_tokens\.weight", KEEP),
             Rule(r"layers\.\d+\.(self_attn\.[qkvo]_proj\.(weight|bias)|self_attn\.[qk]_norm\.weight|mlp\.(gate|up|down)_proj\.(weight|bias)"
                  r"|input_layernorm\.weight|post_attention_layernorm\.weight)", KEEP))
    fields = field_kinds(DFlashConfig, beyond=SpeculatorConfig)
    layouts = (Layout("speculators", _speculators_dflash, "speculators_model_type dflash, hidden_norm.weight and Qwen3 layers.{i}.* (no embedding)",
                      details="speculators 0.9's `DFlashDraftModel` names: `fc` [H, n_aux·H], `hidden_norm`, `layers.{i}.*` (Qwen3), `norm`; "
                              "`lm_head`, `d2t`/`t2d` only with a draft vocabulary; `embed_tokens` and `verifier_*` not saved",
                      outcome="converted (`specfmt upgrade`); without `mask_token_id` **refused**"),)
    cases = (
        Case("speculators 0.9 `dflash` output (`DFlashSpeculator`, `block_size`, `aux_hidden_state_layer_ids`, `mask_token_id`)",
             "converted by `specfmt upgrade`: every tensor kept as it is, every field checked against the tensors and the verifier"),
        Case("`mask_token_id` missing or null (speculators' default is null)", "**refused**: vLLM reads `config_dict[\"mask_token_id\"]`"),
        Case("`sliding_window_non_causal` false (speculators' default) with full-attention layers",
             "written **true**, with a note: speculators trains full-attention layers non-causal either way, and vLLM reads the flag as "
             "`causal` for every layer"),
        Case("`speculative_tokens` other than `block_size` - 1 (`block_size` with `sample_from_anchor`)",
             "**refused** (also `--speculative-tokens`): vLLM runs a block of 1 + k"),
    )
    fallback_layout = "speculators"

    def claims(self, seen: Seen) -> bool:
        return seen.config.get("speculators_model_type") == "dflash"

    def decide(self, src: Source, opts: Options, plan: Plan) -> None:
        """The output config (:meth:`~specfmt.algorithms.dflash.DFlashConfig.build`) from speculators' fields, checked.

        Raises:
            ConversionError: no ``transformer_layer_config``; a decoder that is not Qwen3; no ``mask_token_id``; no taps;
                ``fc.weight`` that does not take the taps; a k other than the block's proposing slots.
        """
        cfg, verifier = src.config, src.verifier.info
        tlc = cfg.get("transformer_layer_config")
        if not isinstance(tlc, dict):
            raise ConversionError("config.json has no transformer_layer_config object: not speculators' DFlash layout", where="config.json",
                                  hint="z-lab / SpecForge DFlash drafts (dflash_config) are not read by this specfmt")
        if tlc.get("model_type", "qwen3") != "qwen3":
            raise ConversionError(f"transformer_layer_config.model_type is {tlc.get('model_type')!r}: vLLM builds DFlash drafts from Qwen3 layers only",
                                  where="config.json")
        mask = cfg.get("mask_token_id")
        if type(mask) is not int or mask < 0:
            raise ConversionError(f"mask_token_id is {mask!r}: vLLM reads it as the token every mask slot of the block reads", where="config.json",
                                  hint="set mask_token_id to the token the draft was trained with")
        H, nH, V = positive_int(tlc, "hidden_size"), positive_int(tlc, "num_attention_heads"), positive_int(tlc, "vocab_size")
        check_vocab(V, src.verifier)
        taps = self._taps(cfg, plan, H)
        block, from_anchor = positive_int(cfg, "block_size", 8), bool(cfg.get("sample_from_anchor", False))
        k = opts.speculative_tokens or _speculative_tokens(cfg)
        if k is not None and k != (block if from_anchor else block - 1):
            raise ConversionError(f"speculative_tokens {k}, but a block of {block} proposes {block if from_anchor else block - 1}",
                                  where="config.json", hint="vLLM runs a block of 1 + k: leave k to the block")
        out_code = decide_float_dtype(plan.moves, opts)
        n_layers = decoder_layer_count({int(m.dst.split(".")[1]) for m in plan.moves if m.dst and m.dst.startswith("layers.")}, tlc)
        layer = decoder_config({**tlc, "model_type": "qwen3"}, H, nH, V, verifier, out_code, n_layers)
        plan.config = DFlashConfig.build(verifier, layer, draft_vocab_size=positive_int(cfg, "draft_vocab_size", V), block_size=block, taps=taps,
                                         mask_token_id=mask, sliding_window_non_causal=self._non_causal(cfg, layer.dump(), plan),
                                         sample_from_anchor=from_anchor, target_hidden_size=cfg.get("target_hidden_size"), dtype=DTYPE_NAMES[out_code]).dump()

    def _taps(self, cfg: dict[str, Any], plan: Plan, H: int) -> list[int]:
        """``aux_hidden_state_layer_ids`` as written (speculators' convention is the format's), checked against ``fc.weight``.

        Raises:
            ConversionError: no taps, or ``fc.weight`` that does not take n_aux states of width H_t.
        """
        taps = cfg.get("aux_hidden_state_layer_ids")
        if not (isinstance(taps, list) and taps and all(type(t) is int for t in taps)):
            raise ConversionError(f"aux_hidden_state_layer_ids is {taps!r}: a DFlash draft names the verifier layers it reads",
                                  where="config.json", hint="write the tap layers the draft was trained with")
        fc, width = plan.outputs().get("fc.weight"), cfg.get("target_hidden_size") or H
        if fc is None or len(fc.shape) != 2 or fc.shape[1] != len(taps) * width:
            got = "no fc.weight" if fc is None else f"fc.weight {list(fc.shape)}"
            raise ConversionError(f"{got}, but {len(taps)} taps of width {width} need [{H}, {len(taps) * width}]")
        return list(taps)

    def _non_causal(self, cfg: dict[str, Any], tlc: dict[str, Any], plan: Plan) -> bool:
        """``sliding_window_non_causal``: as written, but true (with a note) where speculators' forward cannot tell (no
        sliding layer) and vLLM would otherwise build every layer causal (:data:`~specfmt.algorithms.dflash.CAUSAL_TRAP`)."""
        written = bool(cfg.get("sliding_window_non_causal", False))
        if written or "sliding_attention" in (tlc.get("layer_types") or []):
            return written
        plan.notes.append(f"sliding_window_non_causal written true (the source: {cfg.get('sliding_window_non_causal')!r}); the draft has no "
                          f"sliding-window layer, so speculators' forward is the same, and {CAUSAL_TRAP.rsplit('; ', 1)[0]}")
        return True

    def from_speculators(self, src: Source, cfg: dict[str, Any], notes: list[str]) -> Source:
        """speculators' DFlash config is read as it is (:meth:`decide` reads the format's own fields)."""
        return replace(src, config=cfg)


def _speculative_tokens(cfg: dict[str, Any]) -> int | None:
    methods = (cfg.get("speculators_config") or {}).get("proposal_methods") or [{}]
    k = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    return k if type(k) is int else None


__all__ = ["DFlashConverter"]
