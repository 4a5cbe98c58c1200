"""``--from dflash``: DFlash drafts -> specfmt (speculators ``dflash``): z-lab's and SpecForge's research layout,
and ``specfmt upgrade`` of speculators' own.

A DFlash draft (:mod:`specfmt.algorithms.dflash`) saved by speculators 0.9 (``DFlashDraftModel.save_pretrained``)
already has the format's tensor names: ``fc``, ``hidden_norm``, ``layers.{i}.*`` (Qwen3 layers), ``norm``, and
``lm_head`` with ``d2t`` / ``t2d`` only with a draft vocabulary; ``embed_tokens`` and ``verifier_*`` are not saved
(``_keys_to_ignore_on_save``). Its config is the format's, read field by field and checked against the verifier and
the tensors. The mask token is a training choice no tensor records, so a config without it is refused.

The research layout is z-lab's (the published ``z-lab/*-DFlash*`` drafts) and SpecForge's, which trains
the same model class (``specforge/modeling/draft/dflash.py`` ``DFlashDraftModel``, sgl-project/SpecForge
a6b6b02): a Qwen3 config at the top level with ``block_size``, ``num_target_layers`` and ``dflash_config``
(``mask_token_id``, ``target_layer_ids``), and the tensors ``fc`` [H, n_aux·H], ``hidden_norm``,
``layers.{i}.*`` (Qwen3 layers), ``norm`` -- no embedding and no ``lm_head``: both are the verifier's
(``spec_generate``: ``target.model.embed_tokens``, ``target.lm_head``), so the output has Vd = V.

What the conversion decides, and its sources:

* taps: ``extract_context_feature`` reads ``hidden_states[id + 1]`` (``offset = 1``: index 0 is the
  embedding), the output of layer ``id``; speculators' aux id is ``id + 1`` (speculators 0.9
  ``convert/dflash/converter.py``) and vLLM reads ``aux - 1`` (``algos.py`` ``update_dflash``), i.e. ``id``
  again (:func:`~.taps.read_output_taps`). Without ``target_layer_ids`` SpecForge computes them
  (``build_target_layer_ids``), and so does this converter, with a note. An id of the verifier's last
  layer (N - 1) is refused: HF's ``hidden_states[N]`` is after the final norm, vLLM's layer N - 1 output before it;
  speculators drops that tap and, for Laguna-style sources, slices the matching ``fc`` columns away (lossy);
* ``block_size`` (top level; ``dflash_config.block_size`` in newer exports, both read by speculators):
  k = block_size - 1 (``spec_generate`` proposes the mask slots, the anchor is the verified token);
* ``mask_token_id`` from ``dflash_config``, else ``--mask-token-id`` (SpecForge falls back to the tokenizer:
  ``specforge/training/model_utils.py`` ``resolve_mask_token_id``); vLLM requires it;
* ``sliding_window_non_causal`` is written true: every z-lab/SpecForge layer attends without a causal mask
  (``Qwen3DFlashAttention.is_causal = False``), and vLLM builds all layers causal when it is false
  (:data:`specfmt.algorithms.dflash.CAUSAL_TRAP`) -- speculators' converter leaves its default, false.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from specfmt.algorithms.dflash import CAUSAL_TRAP, DFlashConfig
from specfmt.algorithms.layers import decoder_config
from specfmt.algorithms.sglang import EXPORT_KEY, exported_by_specfmt
from specfmt.checkpoint.dtypes import DTYPE_NAMES
from specfmt.errors import ConversionError
from specfmt.format.config import SpeculatorConfig
from specfmt.format.model import field_kinds

from .base import (BOOL, DECODER_FIELDS, INDEXES, KEEP, NON_NEGATIVE_INT, OBJECT, POSITIVE_INT, STRING, Case, Converter, Example, Layout,
                   Options, Plan, Refusal, Rule, Seen, Source, check_rotary_caches, check_vocab, decide_float_dtype, decoder_layer_count,
                   positive_int, refuse, register)
from .taps import read_output_taps


def _speculators_dflash(seen: Seen) -> bool:
    return seen.config.get("speculators_model_type") == "dflash" and seen.has(r"hidden_norm\.weight") and seen.has(r"layers\.0\.self_attn\.q_proj\.weight")


#: ``dflash_config`` keys of z-lab / SpecForge configs, and the value the forward vLLM runs needs (None: read elsewhere)
_DFLASH_KEYS: dict[str, Any] = {"mask_token_id": None, "target_layer_ids": None, "block_size": None,
                                "projector_type": None, "pure_draft_prefix_len": 0, "shift_label": False}


def _dc(cfg: dict[str, Any]) -> dict[str, Any]:
    dc = cfg.get("dflash_config")
    return dc if isinstance(dc, dict) else {}


def _zlab(seen: Seen) -> bool:
    return isinstance(seen.config.get("dflash_config"), dict) and seen.has(r"hidden_norm\.weight")


def sglang_export(seen: Seen, algorithm: str) -> bool:
    """``specfmt export --to sglang`` wrote it for a draft of ``algorithm`` (SGLang's DFlash-family layout: z-lab's)."""
    return _zlab(seen) and exported_by_specfmt(seen.config, algorithm) is not None


#: refusals that are conditions on the source config, checked first, in order
_CONFIG_REFUSALS: tuple[Refusal, ...] = (
    Refusal(lambda cfg: bool(set(_dc(cfg)) - set(_DFLASH_KEYS)),
            lambda cfg: f"dflash_config has fields this converter does not know: {sorted(set(_dc(cfg)) - set(_DFLASH_KEYS))}",
            hint="they may change the forward pass; remove them only if you know they do not"),
    Refusal(lambda cfg: _dc(cfg).get("projector_type") is not None,
            lambda cfg: f"dflash_config.projector_type={_dc(cfg)['projector_type']!r}: a projector vLLM's DFlashQwen3 model does not build (it has fc alone)"),
    *(Refusal(lambda cfg, k=key, need=need: _dc(cfg).get(k, need) != need,
              lambda cfg, k=key, need=need: f"dflash_config.{k}={_dc(cfg)[k]!r} describes a draft vLLM's DFlash model does not run (needs {need!r})")
      for key, need in _DFLASH_KEYS.items() if need is not None),
    Refusal(lambda cfg: cfg.get("model_type", "qwen3") != "qwen3",
            lambda cfg: f"draft model_type {cfg.get('model_type')!r}: vLLM's DFlash draft is Qwen3 layers (DFlashQwen3ForCausalLM)"),
    Refusal(lambda cfg: "sliding_attention" in (cfg.get("layer_types") or []),
            "sliding_attention layers: their block mask is not checked against vLLM's yet", hint="convert a draft of full-attention layers"),
    Refusal(lambda cfg: bool(cfg.get("tie_word_embeddings")), "tie_word_embeddings is true, but a DFlash draft has no embedding of its own"),
)

#: refusals on tensor names: the Laguna-style variant speculators converts by dropping tensors
_LAGUNA_REFUSALS: tuple[Refusal, ...] = (
    Refusal(lambda names: any(".g_proj." in n or n.startswith("aux_hidden_norms.") or "qkv_proj" in n for n in names),
            "Laguna-style DFlash tensors (qkv_proj, g_proj gates, aux_hidden_norms): vLLM's DFlashQwen3 computes neither the gates "
            "nor the per-tap norms; speculators' converter drops them and slices fc, which changes the draft's output",
            hint="specfmt converts exactly or not at all; serve this draft with the engine it was trained for", where=None),
)


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """SpecForge's default taps (``specforge/modeling/draft/dflash.py`` ``build_target_layer_ids``), layer outputs:
    the middle layer for one draft layer, else ``num_draft_layers`` ids spread evenly over [1, N - 3]."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 3 - 1
    return [int(round(1 + (i * span) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@register
class DFlashConverter(Converter):
    name = "dflash"
    label = "DFlash"
    summary = ("DFlash block drafts: z-lab's and SpecForge's layout (dflash_config; the verifier's embedding and head), "
               "and speculators 0.9's own (`DFlashDraftModel`), upgraded and checked")
    detects_as = "dflash"
    upgrades = "dflash"
    rules = (Rule(r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq", None, "rotary cache, equal to what rope_theta gives (checked)"),
             Rule(r"fc\.weight", KEEP), Rule(r"hidden_norm\.weight", KEEP), Rule(r"norm\.weight", KEEP), Rule(r"lm_head\.weight", KEEP),
             Rule(r"d2t|t2d", KEEP), Rule(r"embed_tokens\.weight", KEEP),
             Rule(r"layers\.\d+\.(self_attn\.[qkvo]_proj\.(weight|bias)|self_attn\.[qk]_norm\.weight|mlp\.(gate|up|down)_proj\.(weight|bias)"
                  r"|input_layernorm\.weight|post_attention_layernorm\.weight)", KEEP))
    #: speculators' fields (typed by :class:`~specfmt.algorithms.dflash.DFlashConfig`), and z-lab's / SpecForge's decoder and ``dflash_config``
    fields = {**DECODER_FIELDS, **field_kinds(DFlashConfig, beyond=SpeculatorConfig), "num_target_layers": POSITIVE_INT, "dflash_config": OBJECT,
              "auto_map": OBJECT, "target_layer_ids": INDEXES, "projector_type": STRING, "pure_draft_prefix_len": NON_NEGATIVE_INT, "shift_label": BOOL}
    nested_fields = ("dflash_config",)
    layouts = (
        Layout("sglang-export", lambda s: sglang_export(s, DFlashConfig.name), f"config has a {EXPORT_KEY} block of a DFlash draft "
               "(written by `specfmt export --to sglang`)",
               details="SGLang's `DFlashDraftModel` layout as specfmt writes it: z-lab's (a flat Qwen3 config, `num_target_layers`, "
                       "`dflash_config: {block_size, mask_token_id, target_layer_ids}`), the format's tensor names, no embedding or head",
               outcome="converted as z-lab's layout is (taps `target_layer_ids` + 1, k = block_size − 1, Vd = V): the draft it was "
                       "made from, tensor for tensor"),
        Layout("specforge", _zlab, "config has dflash_config (target_layer_ids, mask_token_id) next to hidden_norm.weight: a DFlash block draft",
               details="z-lab's published drafts and SpecForge's `DFlashDraftModel` (`specforge/modeling/draft/dflash.py`): a Qwen3 config "
                       "with `block_size`, `num_target_layers`, `dflash_config: {mask_token_id, target_layer_ids}`; tensors `layers.{i}.*`, "
                       "`fc` [H, n·H], `hidden_norm`, `norm`; no embedding or `lm_head` (the verifier's)",
               outcome="converted: taps `target_layer_ids` + 1 (layer outputs, `hidden_states[id + 1]`), k = block_size − 1, "
                       "`sliding_window_non_causal` true, Vd = V; every tensor kept as it is. Compared with speculators 0.9's "
                       "`DFlashConverter` in `tests/test_dflash_convert.py`",
               examples=(Example("SpecForge qwen3-8b-dflash",
                                 "https://github.com/sgl-project/SpecForge/blob/ffc4ab79a378a1f5005a89e8f6396f8404600ea5/configs/qwen3-8b-dflash.json"),
                         Example("SpecForge qwen3.5-35b-a3b-dflash"))),
        Layout("speculators", _speculators_dflash, "speculators_model_type dflash, hidden_norm.weight and Qwen3 layers.{i}.* (no embedding)",
               details="speculators 0.9's `DFlashDraftModel` names: `fc` [H, n_aux·H], `hidden_norm`, `layers.{i}.*` (Qwen3), `norm`; "
                       "`lm_head`, `d2t`/`t2d` only with a draft vocabulary; `embed_tokens` and `verifier_*` not saved",
               outcome="converted (`specfmt upgrade`); without `mask_token_id` **refused**"),
    )
    cases = (
        Case("speculators 0.9 `dflash` output (`DFlashSpeculator`, `block_size`, `aux_hidden_state_layer_ids`, `mask_token_id`)",
             "converted by `specfmt upgrade`: every tensor kept as it is, every field checked against the tensors and the verifier"),
        Case("`mask_token_id` missing or null (speculators' default is null)", "**refused**: vLLM reads `config_dict[\"mask_token_id\"]`"),
        Case("`sliding_window_non_causal` false (speculators' default) with full-attention layers",
             "written **true**, with a note: speculators trains full-attention layers non-causal either way, and vLLM reads the flag as "
             "`causal` for every layer"),
        Case("`speculative_tokens` other than `block_size` - 1 (`block_size` with `sample_from_anchor`)",
             "**refused** (also `--speculative-tokens`): vLLM runs a block of 1 + k"),
        Case("no `dflash_config.target_layer_ids`", "converted with SpecForge's default (`build_target_layer_ids`: even over [1, N−3]), with a note"),
        Case("a tap of the verifier's last layer (`target_layer_ids` holds N − 1)",
             "**refused**: HF's `hidden_states[N]` (what the draft was trained on) is after the final norm, vLLM's layer N − 1 output "
             "before it. speculators 0.9 drops the tap (and slices `fc` for Laguna sources): lossy"),
        Case("no `mask_token_id`", "converted with `--mask-token-id`; **refused** without it (vLLM requires it)"),
        Case("Laguna-style tensors (`qkv_proj`, `g_proj`, `aux_hidden_norms`)",
             "**refused**: vLLM's DFlashQwen3 has no gates or per-tap norms; speculators drops them (lossy)"),
        Case("`dflash_config` keys beyond `mask_token_id`, `target_layer_ids`, `block_size` (`projector_type`, `pure_draft_prefix_len` > 0, "
             "`shift_label` true, unknown ones)", "**refused**, naming the key"),
        Case("`--speculative-tokens` other than block_size − 1", "**refused**: vLLM runs a block of 1 + k"),
    )
    fallback_layout = "speculators"
    #: the research layout's block: false, slot i predicts anchor + i (k = B − 1); true, slot j predicts anchor + j + 1 (k = B)
    research_from_anchor: ClassVar[bool] = False

    def describe(self, seen: Seen) -> tuple[list[str], dict[str, Any]]:
        dc = _dc(seen.config)
        return [], {"hidden_size": seen.config.get("hidden_size"), "block_size": seen.config.get("block_size", dc.get("block_size")),
                    "target_layer_ids": dc.get("target_layer_ids"), "mask_token_id": dc.get("mask_token_id"),
                    "draft_layers": seen.config.get("num_hidden_layers")}

    def decide(self, src: Source, opts: Options, plan: Plan) -> None:
        """The output config (:meth:`~specfmt.algorithms.dflash.DFlashConfig.build`) from speculators' fields, checked; a z-lab /
        SpecForge config (``dflash_config``) is read by :meth:`_research`.

        Raises:
            ConversionError: no ``transformer_layer_config``; a decoder that is not Qwen3; no ``mask_token_id``; no taps;
                ``fc.weight`` that does not take the taps; a k other than the block's proposing slots.
        """
        if isinstance(src.config.get("dflash_config"), dict):
            return self._research(src, opts, plan)
        cfg, verifier = src.config, src.verifier.info
        tlc = cfg.get("transformer_layer_config")
        if not isinstance(tlc, dict):
            raise ConversionError("config.json has no transformer_layer_config object: not speculators' DFlash layout", where="config.json",
                                  hint="a z-lab / SpecForge DFlash draft has dflash_config")
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

    def _research(self, src: Source, opts: Options, plan: Plan, from_anchor: bool | None = None) -> None:
        """The dflash config (:class:`~specfmt.algorithms.dflash.DFlashConfig`) from a z-lab / SpecForge config; the
        tensors are kept as they are. ``from_anchor``: the block's reading (default :attr:`research_from_anchor`; an SGLang
        export of a DSpark draft records its own).

        Raises:
            ConversionError: the rows of :data:`_CONFIG_REFUSALS` and :data:`_LAGUNA_REFUSALS`; a vocabulary or hidden size
                other than the verifier's; ``fc.weight`` not [H, n_aux·H]; no block size, or two that differ; ``--speculative-tokens``
                other than block_size − 1; the mask token missing or contradicted (:func:`_mask_token`); the taps (:func:`_research_taps`).
        """
        cfg, verifier, out = src.config, src.verifier.info, plan.outputs()
        refuse(_CONFIG_REFUSALS, cfg)
        refuse(_LAGUNA_REFUSALS, plan.names())
        H, nH, V = positive_int(cfg, "hidden_size"), positive_int(cfg, "num_attention_heads"), positive_int(cfg, "vocab_size")
        check_vocab(V, src.verifier)
        if H != verifier.hidden_size:
            raise ConversionError(f"draft hidden_size {H} differs from the verifier's {verifier.hidden_size}; the draft embeds with the verifier's "
                                  "embedding and reads with its lm_head", hint="is --verifier the model this draft was trained for?")
        n_layers = decoder_layer_count({int(m.dst.split(".")[1]) for m in plan.moves if m.dst and m.dst.startswith("layers.")}, cfg)
        from_anchor = self.research_from_anchor if from_anchor is None else from_anchor
        B = _block_size(cfg, opts, from_anchor)
        taps = _research_taps(cfg, opts, verifier.num_hidden_layers, n_layers, plan.notes)
        fc = out.get("fc.weight")
        if fc is None or tuple(fc.shape) != (H, len(taps) * H):
            raise ConversionError(f"fc.weight {'missing' if fc is None else list(fc.shape)}, but {len(taps)} taps of width {H} need [{H}, {len(taps) * H}]")
        out_code = decide_float_dtype(plan.moves, opts)
        tlc = decoder_config(cfg, H, nH, V, verifier, out_code, n_layers)
        check_rotary_caches(src, tlc)
        plan.config = DFlashConfig.build(verifier, tlc, draft_vocab_size=V, block_size=B, taps=taps, mask_token_id=_mask_token(cfg, opts, V),
                                         sliding_window_non_causal=True, sample_from_anchor=from_anchor, dtype=DTYPE_NAMES[out_code]).dump()
        plan.notes.append("sliding_window_non_causal written true: every layer of this draft attends within its block without a causal mask, "
                          "and vLLM builds all layers causal when it is false")


def as_variant(cfg: dict[str, Any], fields: dict[str, Any], config: type[SpeculatorConfig]) -> dict[str, Any]:
    """A dflash config built by DFlash's decisions, as the config of the DFlash variant it is (``config``: DFlash2's
    or DSpark's class): its name and architecture, and the variant's own ``fields`` after DFlash's (before
    ``tie_word_embeddings``), checked by the class.

    Raises:
        pydantic.ValidationError: the result is not a valid ``config`` (a bug in the caller).
    """
    out: dict[str, Any] = {}
    for key, val in cfg.items():
        if key == "tie_word_embeddings":
            out.update(fields)
        out[key] = val
    out["architectures"] = [config.architecture]
    out["speculators_model_type"] = config.name
    out["speculators_config"] = {**cfg["speculators_config"], "algorithm": config.name}
    return config.of(out).dump()


def _speculative_tokens(cfg: dict[str, Any]) -> int | None:
    methods = (cfg.get("speculators_config") or {}).get("proposal_methods") or [{}]
    k = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    return k if type(k) is int else None




def _block_size(cfg: dict[str, Any], opts: Options, from_anchor: bool = False) -> int:
    """B from the top level or ``dflash_config`` (speculators reads both), checked against ``--speculative-tokens``.

    Raises:
        ConversionError: neither gives one, the two differ, B < 2, or ``--speculative-tokens`` is not B − 1 (B ``from_anchor``).
    """
    top, nested = cfg.get("block_size"), _dc(cfg).get("block_size")
    if top is not None and nested is not None and top != nested:
        raise ConversionError(f"block_size {top} and dflash_config.block_size {nested} differ", where="config.json")
    B = top if top is not None else nested
    if type(B) is not int or B < 2:
        raise ConversionError(f"block_size is {B!r}: a DFlash draft drafts a block of at least 2 (the anchor and a mask slot)", where="config.json")
    if opts.speculative_tokens is not None and opts.speculative_tokens != B - (not from_anchor):
        raise ConversionError(f"--speculative-tokens {opts.speculative_tokens}, but a block of {B} proposes {B - (not from_anchor)}; vLLM runs a block of 1 + k",
                              hint="drop --speculative-tokens")
    return B


def _mask_token(cfg: dict[str, Any], opts: Options, V: int) -> int:
    """``dflash_config.mask_token_id``, else ``--mask-token-id``; the two agree, and the token is in [0, V).

    Raises:
        ConversionError: neither is given, they differ, or the token is outside the vocabulary.
    """
    mask, given = _dc(cfg).get("mask_token_id"), opts.mask_token_id
    if mask is not None and given is not None and mask != given:
        raise ConversionError(f"--mask-token-id {given} contradicts dflash_config.mask_token_id {mask}", where="config.json", hint="drop --mask-token-id")
    mask = given if mask is None else mask
    if mask is None:
        raise ConversionError("dflash_config.mask_token_id is missing: vLLM reads it as the token of every mask slot", where="config.json",
                              hint="pass --mask-token-id with the token the draft was trained with")
    if mask >= V:
        raise ConversionError(f"mask token id {mask} is outside the vocabulary [0, {V})", where="config.json")
    return mask


def _research_taps(cfg: dict[str, Any], opts: Options, N: int, n_layers: int, notes: list[str]) -> list[int]:
    """vLLM's tap ids: ``target_layer_ids`` (else SpecForge's default, from ``num_target_layers``) read as layer outputs.

    Raises:
        ConversionError: ``num_target_layers`` is not the verifier's N; an id is N − 1 (see the module docstring); the
            checks of :func:`~.taps.read_output_taps`.
    """
    if cfg.get("num_target_layers") is not None and cfg["num_target_layers"] != N:
        raise ConversionError(f"num_target_layers {cfg['num_target_layers']} but the verifier has {N} layers", where="config.json",
                              hint="is --verifier the model this draft was trained for?")
    ids = _dc(cfg).get("target_layer_ids")
    if ids is None:
        ids = build_target_layer_ids(N, n_layers)
        notes.append(f"dflash_config.target_layer_ids not in the source; SpecForge's default for N={N} and {n_layers} draft layers is {ids}")
    if N - 1 in ids:
        raise ConversionError(f"dflash_config.target_layer_ids {ids} taps the verifier's last layer ({N - 1}): the draft was trained on HF's "
                              f"hidden_states[{N}], after the final norm, but vLLM reads layer {N - 1}'s output before it",
                              where="config.json", hint="no exact conversion exists (speculators drops this tap, which changes the draft)")
    return read_output_taps("dflash_config.target_layer_ids", list(ids), opts, N, notes, "z-lab's extract_context_feature: hidden_states[id + 1]")


__all__ = ["DFlashConverter", "as_variant", "build_target_layer_ids", "sglang_export"]
