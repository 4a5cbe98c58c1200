"""The algorithms specfmt knows, one module each, found by ``speculators_model_type``.

* :mod:`~specfmt.algorithms.eagle3`: EAGLE-3 (Llama or Qwen3 draft layers);
* :mod:`~specfmt.algorithms.eagle`: EAGLE-1/2 and HASS;
* :mod:`~specfmt.algorithms.medusa`: Medusa heads;
* :mod:`~specfmt.algorithms.peagle`: P-EAGLE, EAGLE-3 drafting k tokens in one pass (a subclass of EAGLE-3's);
* :mod:`~specfmt.algorithms.dflash`: DFlash, a block drafted in one non-causal pass over the verifier's taps;
* :mod:`~specfmt.algorithms.layers`: the draft decoder-layer families they share;
* :mod:`~specfmt.algorithms.base`: the contract, split by concern (:class:`~specfmt.algorithms.base.Algorithm`
  and the optional :class:`~specfmt.algorithms.base.Reference`, :class:`~specfmt.algorithms.base.Training`,
  :class:`~specfmt.algorithms.base.Card`);
* :mod:`~specfmt.algorithms.reference`: the base the reference proposers share;
* :mod:`~specfmt.algorithms.nn_layers`, :mod:`~specfmt.algorithms.eagle3_nn`, :mod:`~specfmt.algorithms.eagle_nn`,
  :mod:`~specfmt.algorithms.medusa_nn`, :mod:`~specfmt.algorithms.peagle_nn`,
  :mod:`~specfmt.algorithms.dflash_nn`: the drafts as ``torch.nn.Module`` classes (these modules import
  torch; the others import it only where a draft runs);
* :mod:`~specfmt.algorithms.inventory`: tensors against the table their config implies.

A config is checked against the schema and its algorithm's rules here (:func:`schema_violations`,
:func:`validate_config`).

Shared code looks an algorithm up here and calls it; it never branches on the name.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigSchemaError, Finding, InputError
from ..format.schema import json_schema_findings
from . import eagle3, eagle, medusa, peagle, dflash  # noqa: F401, I001  (each registers itself; EAGLE-3 first)
from .base import REGISTRY, Algorithm, AlgorithmOptions, Variant


def get(name: str) -> Algorithm:
    """The algorithm registered as ``name``.

    Raises:
        InputError: no algorithm has that name.
    """
    if name not in REGISTRY:
        raise InputError(f"unknown algorithm {name!r}", hint=f"known: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def find(name: Any) -> Algorithm | None:
    """The algorithm registered as ``name``, or None (for configs not yet validated)."""
    return REGISTRY.get(name) if isinstance(name, str) else None


def of(cfg: dict[str, Any]) -> Algorithm:
    """The algorithm of a config (its ``speculators_model_type``).

    Raises:
        InputError: an algorithm without a known tensor layout.
    """
    algo = find(cfg.get("speculators_model_type"))
    if algo is None:
        raise InputError(f"no tensor layout known for speculators_model_type {cfg.get('speculators_model_type')!r}")
    return algo


def names() -> list[str]:
    """Every algorithm's name, in registration order (EAGLE-3 first)."""
    return list(REGISTRY)


def trainable() -> list[Algorithm]:
    """The algorithms ``specfmt train`` can train (those with a training part), in registration order."""
    return [a for a in REGISTRY.values() if a.training is not None]


def causes() -> dict[str, str]:
    """Every misreading cause the registered algorithms declare (:attr:`~specfmt.algorithms.base.Reference.causes`),
    with its one-line explanation, in registration order (a cause two algorithms share is listed once)."""
    out: dict[str, str] = {}
    for algo in REGISTRY.values():
        if algo.reference is not None:
            for cause, why in algo.reference.causes.items():
                out.setdefault(cause, why)
    return out


def expected_tensors(cfg: dict[str, Any]) -> dict[str, Any]:
    """The tensors a schema-valid config implies (its algorithm's :meth:`~Algorithm.expected_tensors`).

    Raises:
        InputError: an algorithm without a known tensor layout.
    """
    return of(cfg).expected_tensors(cfg)


def schema_violations(config: Any) -> list[tuple[str, str]]:
    """Every violation of the v1 schema (:func:`specfmt.format.schema.json_schema_violations`) and
    of the rules a schema cannot state (the algorithm's, :meth:`Algorithm.config_violations`).

    Args:
        config: a parsed ``config.json``.

    Returns:
        ``[(json_path, message), ...]`` sorted by path; empty when the config is valid.
        Paths look like ``$.speculators_config.proposal_methods[0].speculative_tokens``.
    """
    return sorted({(f.path, f.message) for f in schema_findings(config)})


def schema_findings(config: Any) -> list[Finding]:
    """:func:`schema_violations` as findings (:class:`~specfmt.errors.Finding`: the same paths and messages),
    each with the config keys it concerns (:func:`specfmt.format.schema.json_schema_findings`; a rule
    across fields concerns the keys along its path) and its kind (the JSON Schema keyword, or ``rule``).

    Returns:
        The findings sorted by path and message, without duplicates; empty when the config is valid.
    """
    out = json_schema_findings(config)
    if not out and isinstance(config, dict):
        out = sorted({Finding.at(p, m, kind="rule") for p, m in _semantic_violations(config)}, key=lambda f: (f.path, f.message))
    return out


def _semantic_violations(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """Cross-field rules of the format (only run once the schema holds): the typed config's
    (:meth:`specfmt.format.config.SpeculatorConfig.violations`: the proposal block's own consistency,
    a native config's agreement, then the algorithm's own rules)."""
    return get(cfg["speculators_model_type"]).config_violations(cfg)


def validate_config(config: Any, where: str) -> None:
    """Raise :class:`ConfigSchemaError` listing every violation (with its JSON path).

    Args:
        config: a parsed ``config.json``.
        where: the file it came from, for the message.
    """
    violations = schema_violations(config)
    if violations:
        first = "; ".join(f"{p}: {m}" for p, m in violations[:3])
        more = f" (and {len(violations) - 3} more)" if len(violations) > 3 else ""
        raise ConfigSchemaError(
            f"config does not match the specfmt v1 schema: {first}{more}",
            violations,
            where=where,
            hint="run `specfmt validate` on the folder for the full list",
        )


__all__ = ["Algorithm", "AlgorithmOptions", "Variant", "causes", "expected_tensors", "find", "get", "names", "of", "schema_violations", "trainable",
           "validate_config"]
