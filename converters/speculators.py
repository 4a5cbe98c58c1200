"""``--from speculators`` (``specfmt upgrade``): older speculators checkpoints -> the current format.

What it accepts, and what an upgrade makes explicit, is stated once, in
:attr:`SpeculatorsConverter.layouts` and :attr:`SpeculatorsConverter.cases`; the docs render them
(``docs/layouts.md``). The format behind them: ``docs/design/speculators-format.md``.

The upgrade hands the source to the research converter that :attr:`~Converter.upgrades` its
algorithm (its :meth:`~Converter.from_speculators` translates the dialect), so every rule and
check of a conversion applies; ``specfmt upgrade`` prints what changed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specfmt.errors import ConversionError, VersionError
from specfmt.format.versions import check_speculators_version

from .base import REGISTRY, Case, Converter, Example, Layout, Options, Plan, Source, register


def _speculators(seen) -> bool:
    return isinstance(seen.config.get("speculators_config"), dict)


@register
class SpeculatorsConverter(Converter):
    name = "speculators"
    label = "older speculators/ModelOpt checkpoints"
    summary = ("speculators-format checkpoints of speculators 0.1-0.9 and NVIDIA ModelOpt, of every algorithm another converter here "
               "upgrades (eagle <= 0.6): rewrite in the current version")
    detects_as = "speculators"
    fields = {}  # the speculators dialect is read by the converter it is handed to
    layouts = (Layout("speculators", _speculators, "config has speculators_config",
                      details="a speculators-format config.json (`speculators_model_type`, `speculators_config`, "
                              "`transformer_layer_config`) written by speculators 0.1-0.9 or NVIDIA ModelOpt's exporter",
                      outcome="rewritten in the current version by the converter of its algorithm, with every rule and check of a "
                              "conversion; `specfmt upgrade` prints what changed"),)
    cases = (
        Case("eagle3 written by speculators 0.1.x-0.9.x (the converter's `Eagle3Speculator`, the trainer's `Eagle3DraftModel`) or by "
             "NVIDIA ModelOpt's exporter (`speculators_version: 0.1.0.dev14`)",
             "converted; made explicit: tap layers (older files let speculators guess them), `norm_before_residual` (speculators' "
             "default false; vLLM assumes true when the key is missing), `num_aux_hidden_states`, `dtype` for `torch_dtype`. Removed: "
             "`auto_map` to a module no checkpoint ships, `has_no_defaults_at_init`. Kept: a draft's sliding window (`layer_types`, "
             "`sliding_window`, `use_sliding_window`)"),
        Case("speculators 0.8 training output: 4 taps, `norm_before_fc` (`input_norm` [4H]), `norm_output` (EAGLE-3.1's meaning), "
             "`norm_before_residual`", "converted",
             (Example("speculators issue #1065", "https://github.com/vllm-project/speculators/issues/1065"),)),
        Case("eagle (EAGLE-1/HASS) of speculators <= 0.6: `fusion_fc.*` and `transformer.*`, optional `fusion_fc.bias` (`fusion_bias`)",
             "converted into the `eagle` layout (vLLM 0.32 has no speculators `eagle` algorithm), `fusion_fc.bias` folded exactly. The "
             "`layernorms` variant (`embedding_layernorm`, `pre_lm_head_layernorm`) is **refused**: vLLM's EAGLE model has no such norms"),
        Case("the pre-release EAGLE dialect: no `speculators_model_type` (`model_type: llama_eagle`, `speculators_config.algorithm: "
             "eagle`), `draft_tokens`, `static_tree`",
             "converted: the algorithm is read from `speculators_config.algorithm` and k from `draft_tokens`; the tree proposal is "
             "written as greedy, with a note (a proposal method is an inference setting, not a weight)",
             (Example("speculators PR #31, vLLM PR #20436", note="the dialect's code only, never merged; no published checkpoint found"),)),
        Case("speculators 0.9's own outputs of the newer algorithms (P-EAGLE, DFlash and its variants: each "
             "`speculators_model_type` a converter upgrades, listed under `specfmt upgrade`)",
             "handed to the converter of that algorithm (`--from peagle`, ...), which reads speculators' layout as well as the research one"),
        Case("other algorithms (`mtp`, ...), which no converter here upgrades", "**refused**: vLLM serves them as they are"),
    )

    def plan(self, src: Source, opts: Options) -> Plan:
        """Translate the speculators config into the source the algorithm's converter reads
        (:meth:`~Converter.from_speculators`), then plan with that converter.

        Raises:
            VersionError: ``speculators_version`` is newer than this specfmt or malformed.
            ConversionError: not a speculators config, an algorithm without a vLLM model,
                or any refusal of the converter it is handed to.
        """
        cfg = src.config
        notes: list[str] = []
        version, algo = _read_dialect(cfg, notes)
        target = next((c for c in REGISTRY.values() if c.upgrades is not None and c.upgrades == algo), None)
        if target is None:
            known = ", ".join(c.upgrades for c in REGISTRY.values() if c.upgrades)
            raise ConversionError(
                f"speculators_model_type {algo!r} cannot be upgraded by this specfmt ({known})",
                where="config.json",
                hint="mtp checkpoints are served by vLLM as they are",
            )
        k = opts.speculative_tokens or _speculative_tokens(cfg)
        opts = replace(opts, speculative_tokens=k)
        plan = target.plan(target.from_speculators(src, cfg, notes), opts)
        plan.source_format = self.name
        plan.layout = f"speculators-{version or 'unversioned'}"
        plan.notes = notes + plan.notes
        return plan


def _read_dialect(cfg: dict[str, Any], notes: list[str]) -> tuple[Any, Any]:
    """``(speculators_version, algorithm)`` of a speculators config, with notes on what an older
    dialect leaves implicit (no version, the pre-release ``speculators_config.algorithm``, a tree proposal).

    Raises:
        VersionError: ``speculators_version`` is newer than this specfmt or malformed.
        ConversionError: no ``speculators_config`` object, or ``transformer_layer_config`` not an object.
    """
    if not isinstance(cfg.get("speculators_config"), dict):
        raise ConversionError("config.json has no speculators_config object; this is not a speculators checkpoint", where="config.json", hint="pick the research format with --from, or --from auto")
    version = cfg.get("speculators_version")
    if version is None:
        notes.append("no speculators_version in the source; read as the oldest layout")
    else:
        status = check_speculators_version(version)
        if status.status == "newer":
            raise VersionError(status.message, where="config.json")
    algo = cfg.get("speculators_model_type")
    if algo is None:
        algo = cfg["speculators_config"].get("algorithm")
        notes.append(f"no speculators_model_type (model_type {cfg.get('model_type')!r}, the pre-release dialect); "
                     f"algorithm {algo!r} read from speculators_config.algorithm")
    proposal = _first_proposal(cfg)
    if proposal.get("proposal_type") not in (None, "greedy"):
        notes.append(f"proposal_type {proposal.get('proposal_type')!r}: vLLM proposes a chain of k tokens, written as greedy "
                     "(a proposal method is an inference setting; the weights are the same)")
    if not isinstance(cfg.get("transformer_layer_config"), dict):
        raise ConversionError("transformer_layer_config must be an object", where="config.json")
    return version, algo


def _first_proposal(cfg: dict[str, Any]) -> dict[str, Any]:
    methods = cfg["speculators_config"].get("proposal_methods")
    first = methods[0] if isinstance(methods, list) and methods else None
    return first if isinstance(first, dict) else {}


def _speculative_tokens(cfg: dict[str, Any]) -> int | None:
    """k of the first proposal method: ``speculative_tokens``, or the pre-release dialect's ``draft_tokens``."""
    proposal = _first_proposal(cfg)
    k = proposal.get("speculative_tokens", proposal.get("draft_tokens"))
    return k if isinstance(k, int) and not isinstance(k, bool) and k >= 1 else None


__all__ = ["SpeculatorsConverter"]
