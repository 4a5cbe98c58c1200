"""``--from speculators`` (``specfmt upgrade``): older speculators checkpoints -> the current format.

Accepted (``speculators-format.md`` §1-§3):

* **eagle3** written by speculators 0.1.x-0.9.x (``Eagle3DraftModel`` from the trainer,
  ``Eagle3Speculator`` from the converter) and by NVIDIA ModelOpt's exporter
  (``speculators_version: 0.1.0.dev14``). Older files may lack
  ``eagle_aux_hidden_state_layer_ids`` (speculators then tapped the reference default),
  ``norm_before_residual`` (speculators' default false; vLLM assumes true when absent),
  ``target_hidden_size`` and ``transformer_layer_config.num_aux_hidden_states``; carry
  ``torch_dtype`` instead of ``dtype``, ``auto_map`` to a module no checkpoint ships, and
  ``has_no_defaults_at_init``. Tensors already have the current names.
* **eagle** (EAGLE-1/HASS, speculators <= 0.6, ``EagleSpeculator``): ``fusion_fc.*`` and
  ``transformer.*`` (one Llama layer with an Identity input norm), optional
  ``fusion_fc.bias`` (``fusion_bias``); the ``layernorms`` variant adds
  ``embedding_layernorm``/``pre_lm_head_layernorm`` norms vLLM's EAGLE model lacks and
  is refused. vLLM 0.32 has no speculators ``eagle`` algorithm, so the output is
  specfmt's ``eagle`` layout (``fusion_fc.bias`` folded exactly, see ``eagle.py``).

* **the first EAGLE dialect** of speculators' pre-releases (the ``llama_eagle`` model of
  speculators PR #31 and vLLM PR #20436, neither merged; no published checkpoint was found):
  no ``speculators_model_type`` -- ``model_type: llama_eagle`` and
  ``speculators_config.algorithm: "eagle"`` say the algorithm --, a proposal method that may be
  ``static_tree`` with ``draft_tokens`` instead of ``speculative_tokens``, and the
  ``fusion_fc.*`` / ``transformer.*`` tensors of ``eagle`` above. The algorithm is read from
  ``speculators_config.algorithm`` and ``draft_tokens`` is k; vLLM 0.32 proposes a chain of k
  tokens (a tree proposal is an inference setting, not a weight), which a note says.

The upgrade hands the source to the research converter that :attr:`~Converter.upgrades` its
algorithm (its :meth:`~Converter.from_speculators` translates the dialect), so every rule and
check of a conversion applies; ``specfmt upgrade`` prints what changed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specfmt.errors import ConversionError, VersionError
from specfmt.format.versions import check_speculators_version

from .base import REGISTRY, Converter, Layout, Options, Plan, RenamedReader, Source, register, restore_source_names


def _speculators(seen) -> bool:
    return isinstance(seen.config.get("speculators_config"), dict)


@register
class SpeculatorsConverter(Converter):
    name = "speculators"
    summary = "speculators-format checkpoints of speculators 0.1-0.9 and NVIDIA ModelOpt (eagle3; eagle <= 0.6): rewrite in the current version"
    detects_as = "speculators"
    fields = {}  # the speculators dialect is read by the converter it is handed to
    layouts = (Layout("speculators", _speculators, "config has speculators_config"),)

    def plan(self, src: Source, opts: Options) -> Plan:
        """Translate the speculators config into the source the algorithm's converter reads
        (:meth:`~Converter.from_speculators`), then plan with that converter.

        Raises:
            VersionError: ``speculators_version`` is newer than this specfmt or malformed.
            ConversionError: not a speculators config, an algorithm without a vLLM model,
                or any refusal of the converter it is handed to.
        """
        cfg = src.config
        if not isinstance(cfg.get("speculators_config"), dict):
            raise ConversionError("config.json has no speculators_config object; this is not a speculators checkpoint", where="config.json", hint="pick the research format with --from, or --from auto")
        notes: list[str] = []
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
        target = next((c for c in REGISTRY.values() if c.upgrades is not None and c.upgrades == algo), None)
        if target is None:
            known = ", ".join(c.upgrades for c in REGISTRY.values() if c.upgrades)
            raise ConversionError(
                f"speculators_model_type {algo!r} cannot be upgraded by this specfmt ({known})",
                where="config.json",
                hint="dflash, peagle and mtp checkpoints are served by vLLM as they are",
            )
        k = opts.speculative_tokens or _speculative_tokens(cfg)
        opts = replace(opts, speculative_tokens=k)
        research = target.from_speculators(src, cfg, notes)
        plan = target.plan(research, opts)
        if isinstance(research.reader, RenamedReader):
            plan = restore_source_names(plan, research.reader.new_to_old)
        plan.source_format = self.name
        plan.layout = f"speculators-{version or 'unversioned'}"
        plan.notes = notes + plan.notes
        return plan


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
