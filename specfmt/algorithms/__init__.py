"""The algorithms specfmt knows, one module each, found by ``speculators_model_type``.

* :mod:`~specfmt.algorithms.eagle3`: EAGLE-3 (Llama or Qwen3 draft layers);
* :mod:`~specfmt.algorithms.eagle`: EAGLE-1/2 and HASS;
* :mod:`~specfmt.algorithms.medusa`: Medusa heads;
* :mod:`~specfmt.algorithms.layers`: the draft decoder-layer families they share;
* :mod:`~specfmt.algorithms.base`: the contract (:class:`~specfmt.algorithms.base.Algorithm`);
* :mod:`~specfmt.algorithms.reference`: the base the reference proposers share;
* :mod:`~specfmt.algorithms.checks`: a config against the schema and its algorithm's rules,
  tensors against its table.

Shared code looks an algorithm up here and calls it; it never branches on the name.
"""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from . import eagle3, eagle, medusa  # noqa: F401, I001  (each registers itself; EAGLE-3 first)
from .base import REGISTRY, Algorithm, NewDraft, Variant


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
    """The algorithms ``specfmt train`` can train."""
    return [a for a in REGISTRY.values() if a.train_summary]




def expected_tensors(cfg: dict[str, Any]) -> dict[str, Any]:
    """The tensors a schema-valid config implies (its algorithm's :meth:`~Algorithm.expected_tensors`).

    Raises:
        InputError: an algorithm without a known tensor layout.
    """
    return of(cfg).expected_tensors(cfg)


__all__ = ["Algorithm", "NewDraft", "Variant", "expected_tensors", "find", "get", "names", "of", "trainable"]
