"""``--from dflash2``: DFlash2 drafts -> specfmt (speculators ``dflash2``); ``specfmt upgrade`` of speculators' own.

A DFlash2 draft (:mod:`specfmt.algorithms.dflash2`) saved by speculators 0.9 (``DFlash2DraftModel.save_pretrained``) is a
DFlash draft (:mod:`.dflash` reads that part: every rule applies) plus, in every layer, ``attention_conv`` and ``mlp_conv``
(``base_kernel`` [2, K, H], ``kernel_projection.weight`` [2·K·H/g, H]) and the ``candidate_selector`` (``predecessor_codebook``
and ``successor_codebook`` [V, r], ``hidden_projection.weight`` [r, H]). A field speculators leaves out is written with
speculators' default (``DFlash2SpeculatorConfig``: K 2, g 16, r 256, top-k 16, ``sliding_window_non_causal`` true), with a note:
vLLM's ``qwen3_dflash2.py`` has no default for the four. Refused: a part whose shape is not the config's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specfmt.algorithms.dflash2 import DFlash2Config
from specfmt.errors import ConversionError
from specfmt.format.config import SpeculatorConfig
from specfmt.format.model import field_kinds

from specfmt.algorithms.sglang import EXPORT_KEY

from .base import KEEP, Case, Layout, Options, Plan, Rule, Seen, Source, register
from .dflash import DFlashConverter, _dc, as_variant, sglang_export

#: speculators 0.9's ``DFlash2SpeculatorConfig`` defaults, written when a field is absent
DEFAULTS = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16, "sliding_window_non_causal": True}
#: the parts DFlash2 adds to DFlash's tensors
PARTS = ("layers.", "candidate_selector.")


def _speculators_dflash2(seen: Seen) -> bool:
    return (seen.config.get("speculators_model_type") == "dflash2" and seen.has(r"hidden_norm\.weight")
            and seen.has(r"candidate_selector\.predecessor_codebook"))


@register
class DFlash2Converter(DFlashConverter):
    name = "dflash2"
    label = "DFlash2"
    summary = "DFlash2 drafts (DFlash with dynamic convolutions and a candidate selector): speculators 0.9's own, upgraded and checked"
    detects_as = "dflash2"
    upgrades = "dflash2"
    rules = (Rule(r"layers\.\d+\.(attention|mlp)_conv\.(base_kernel|kernel_projection\.weight)", KEEP),
             Rule(r"candidate_selector\.(predecessor_codebook|successor_codebook|hidden_projection\.weight)", KEEP), *DFlashConverter.rules)
    fields = field_kinds(DFlash2Config, beyond=SpeculatorConfig)
    layouts = (Layout("sglang-export", lambda s: sglang_export(s, DFlash2Config.name), f"config has a {EXPORT_KEY} block of a DFlash2 draft "
                      "(written by `specfmt export --to sglang`)",
                      details="SGLang's `DFlash2DraftModel` layout as specfmt writes it: DFlash's (z-lab's) with `conv_kernel_size`, "
                              "`conv_group_size`, `selector_rank` and `selector_top_k` inside `dflash_config`, the format's tensor names",
                      outcome="converted: DFlash's reading of the rest, the four fields from `dflash_config`; the draft it was made from, "
                              "tensor for tensor"),
               Layout("speculators", _speculators_dflash2, "speculators_model_type dflash2, hidden_norm.weight and candidate_selector.*",
                      details="speculators 0.9's `DFlash2DraftModel` names: DFlash's, `layers.{i}.attention_conv.*` / `mlp_conv.*` "
                              "(`base_kernel` [2, K, H], `kernel_projection.weight` [2·K·H/g, H]), `candidate_selector.*` ([V, r], [r, H])",
                      outcome="converted (`specfmt upgrade`); parts not of the config's shapes **refused**"),)
    cases = (
        Case("speculators 0.9 `dflash2` output (`DFlash2DraftModel`, the four conv/selector fields)",
             "converted by `specfmt upgrade`: every tensor kept as it is, DFlash's checks and the parts' shapes checked"),
        Case("a conv/selector field absent", "written as speculators' default, with a note: vLLM's qwen3_dflash2.py has no default"),
        Case("a part whose shape is not the config's", "**refused**"),
    )

    def claims(self, seen: Seen) -> bool:
        return seen.config.get("speculators_model_type") == "dflash2" or sglang_export(seen, DFlash2Config.name)

    def decide(self, src: Source, opts: Options, plan: Plan) -> None:
        """DFlash's decisions (:meth:`DFlashConverter.decide`), then the four fields and the parts' shapes.

        Raises:
            ConversionError: DFlash's refusals; a convolution or selector tensor missing or not of the config's shape.
        """
        if isinstance(src.config.get("dflash_config"), dict):
            return self._sglang_export(src, opts, plan)
        cfg = {**DEFAULTS, **{k: v for k, v in src.config.items() if v is not None}}
        plan.notes.extend(f"{k} absent: written {v!r}, speculators' default" for k, v in DEFAULTS.items() if src.config.get(k) is None)
        super().decide(replace(src, config=cfg), opts, plan)
        plan.config = as_variant(plan.config, {k: cfg[k] for k in DEFAULTS if k != "sliding_window_non_causal"}, DFlash2Config)
        self._check_parts(plan)

    def _sglang_export(self, src: Source, opts: Options, plan: Plan) -> None:
        """SGLang's layout as ``specfmt export`` writes it: the four fields from ``dflash_config`` (where SGLang reads them), the
        rest by DFlash's reading of z-lab's layout (:meth:`DFlashConverter._research`).

        Raises:
            ConversionError: a field missing from ``dflash_config``; DFlash's research refusals; a part of another shape.
        """
        dc = _dc(src.config)
        missing = [k for k in DEFAULTS if k != "sliding_window_non_causal" and type(dc.get(k)) is not int]
        if missing:
            raise ConversionError(f"dflash_config has no {', '.join(missing)}: SGLang builds no convolution or selector without them",
                                  where="config.json", hint=f"the {EXPORT_KEY} block says specfmt wrote this folder; was it edited?")
        fields = {k: dc[k] for k in DEFAULTS if k != "sliding_window_non_causal"}
        rest = {k: v for k, v in dc.items() if k not in fields}
        self._research(replace(src, config={**src.config, "dflash_config": rest}), opts, plan)
        plan.config = as_variant(plan.config, fields, DFlash2Config)
        self._check_parts(plan)

    def _check_parts(self, plan: Plan) -> None:
        """Every convolution and selector tensor is there with the config's shape.

        Raises:
            ConversionError: one is missing or of another shape.
        """
        from specfmt.algorithms import get

        outputs, dflash = plan.outputs(), get("dflash").expected_tensors({**plan.config, "speculators_model_type": "dflash"})
        for name, spec in get("dflash2").expected_tensors(plan.config).items():
            info = outputs.get(name)
            if name in dflash or not name.startswith(PARTS) or (info is not None and tuple(info.shape) == spec.shape):
                continue
            got = "missing" if info is None else f"{list(info.shape)}"
            raise ConversionError(f"{name} is {got}, but this config needs {list(spec.shape)}", where="model.safetensors",
                                  hint="conv_kernel_size, conv_group_size and selector_rank must be the ones the draft was trained with")


__all__ = ["DEFAULTS", "DFlash2Converter"]
