"""``specfmt inspect`` and ``--from auto``: which format is this folder in?

Detection reads tensor names (from safetensors headers or weights-only pickles) and config
fields -- never ``architectures``, which five writers spell five ways (``LlamaForCausalLM``,
``LlamaForCausalLMEagle3``, ``Eagle3Speculator``, ``Eagle3DraftModel``, ``MedusaModel`` ...).

A research layout is recognised by the very predicates its converter plans with
(:attr:`specfmt.converters.base.Converter.layouts`), so ``inspect``, ``--from auto`` and the
provenance block name layouts the same way. Formats no converter reads (vLLM-native Medusa
heads, the MLP speculator, a plain causal LM) are named here, with what identifies them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .checkpoint.files import CONFIG_FILE, read_json
from .checkpoint.reader import CheckpointReader
from .converters import REGISTRY
from .converters.base import Seen
from .hub.resolve import resolve


@dataclass
class Detection:
    """What a folder holds.

    Attributes:
        format: ``specfmt``, ``speculators``, a research format a converter reads (``eagle3``,
            ``eagle`` for EAGLE-1/2 or HASS, ``medusa``), ``mlp_speculator``, ``causal-lm`` or
            ``unknown``.
        layout: the repository layout within the format (e.g. ``safeailab``).
        evidence: the facts the decision rests on.
        summary: key figures (sizes, vocabularies, taps, files).
        convert_hint: the ``specfmt convert`` command that applies, if any.
        candidates: the ``--from`` names whose converter accepts this layout (more than
            one when the files cannot tell them apart, e.g. EAGLE-1 and HASS).
    """

    format: str
    layout: str
    evidence: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    convert_hint: str | None = None
    candidates: list[str] = field(default_factory=list)


def _speculators(cfg: dict[str, Any], ev: list[str], summary: dict[str, Any]) -> Detection:
    algo = cfg.get("speculators_model_type")
    ev.append(f"config has speculators_config (speculators_model_type={algo!r})")
    fmt = "specfmt" if isinstance(cfg.get("specfmt"), dict) else "speculators"
    if fmt == "specfmt":
        src = cfg["specfmt"].get("source", {})
        ev.append(f"config has a specfmt provenance block (from {src.get('format')}/{src.get('layout')})")
    summary.update(
        algorithm=algo,
        speculators_version=cfg.get("speculators_version"),
        verifier=(cfg.get("speculators_config") or {}).get("verifier", {}).get("name_or_path"),
        tap_layers=cfg.get("eagle_aux_hidden_state_layer_ids"),
        draft_vocab_size=cfg.get("draft_vocab_size"),
        norm_before_residual=cfg.get("norm_before_residual"),
    )
    if fmt == "specfmt":
        return Detection(fmt, str(algo), ev, summary, "specfmt validate DIR", ["speculators"])
    return Detection(fmt, str(algo), ev, summary, "specfmt upgrade SRC -o OUT", ["speculators"])


@dataclass(frozen=True)
class Foreign:
    """A format no converter reads, and what identifies it.

    Attributes:
        format / layout: what ``inspect`` calls it (layout None: the config's ``model_type``).
        test: ``test(seen) -> bool``.
        evidence: one line.
        figures: ``figures(seen) -> dict`` for the summary.
    """

    format: str
    layout: str | None
    test: Callable[[Seen], bool]
    evidence: str
    figures: Callable[[Seen], dict[str, Any]] = lambda seen: {}


FOREIGN = (
    Foreign("mlp_speculator", "fms-extras", lambda s: s.has(r"(speculator\.)?emb\.\d+\.weight") and s.has(r"(speculator\.)?head\.\d+\.weight"),
            "speculator.emb.* / speculator.head.* tensors (IBM MLP speculator)"),
    Foreign("causal-lm", None, lambda s: s.has(r"(model\.)?layers\.\d+\.self_attn\.[qkv]_proj\.weight") and s.has(r"(model\.)?embed_tokens\.weight"),
            "a full decoder stack with embeddings (a verifier-like causal LM, not a draft)",
            lambda s: {"model_type": s.config.get("model_type"), "layers": s.config.get("num_hidden_layers"),
                       "hidden_size": s.config.get("hidden_size"), "vocab_size": s.config.get("vocab_size")}),
)


def detect(folder: str | Path) -> Detection:
    """Detect the format of a checkpoint folder (or Hub id).

    Raises:
        InputError, HubError: the folder cannot be found or its weights cannot be read.
    """
    res = resolve(str(folder), allow_patterns=["*.json", "*.safetensors", "*.bin", "*.pt"], what="checkpoint")
    cfg: dict[str, Any] = {}
    if (res.folder / CONFIG_FILE).is_file():
        cfg = read_json(res.folder / CONFIG_FILE)
    pickles = sorted({n for c in REGISTRY.values() for n in c.pickle_names})
    with CheckpointReader(res.folder, pickle_names=[p.name for p in res.folder.glob("*") if p.name in pickles]) as reader:
        seen = Seen.of(cfg, reader)
        infos = reader.infos
    summary: dict[str, Any] = {
        "path": res.name_or_path,
        "weights": reader.files,
        "tensors": len(infos),
        "size_mib": round(sum(i.nbytes for i in infos.values()) / 2**20, 2),
        "dtypes": sorted({i.dtype for i in infos.values()}),
    }
    ev: list[str] = []
    if "speculators_config" in cfg:
        return _speculators(cfg, ev, summary)

    matches = [(c, lay) for c in REGISTRY.values() for lay in [c.layout_of(seen)] if lay is not None and c.claims(seen)]
    if matches:
        first, layout = matches[0]
        candidates = [c.name for c, _ in matches if c.detects_as == first.detects_as]
        ev.append(layout.evidence)
        more, figures = first.describe(seen)
        ev += more
        summary.update(figures)
        hint = " or ".join(f"--from {c}" for c in candidates)
        return Detection(first.detects_as, layout.name, ev, summary, f"specfmt convert {hint} SRC -o OUT --verifier VERIFIER", candidates)

    for foreign in FOREIGN:
        if foreign.test(seen):
            ev.append(foreign.evidence)
            summary.update(foreign.figures(seen))
            return Detection(foreign.format, foreign.layout or str(cfg.get("model_type")), ev, summary, None)

    ev.append("no known draft layout matches the tensor names")
    return Detection("unknown", "unknown", ev, summary, None)


__all__ = ["Detection", "detect"]
