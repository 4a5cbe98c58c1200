"""Converters from research checkpoint layouts to the specfmt format (``specfmt.converters``).

One module per source format, each registering a :class:`~specfmt.converters.base.Converter`
under its ``--from`` name: :mod:`.eagle3`, :mod:`.eagle` (EAGLE-1/2 and HASS), :mod:`.medusa`
and :mod:`.speculators` (older speculators checkpoints, handed to the others). :mod:`.taps` holds
the tap convention that drafts fusing verifier layers share (EAGLE-3 now, DFlash next).
"""

from __future__ import annotations

from specfmt.errors import InputError

from . import eagle3, medusa, eagle, speculators  # noqa: F401, I001  (each registers itself; this order is --from auto's)
from .base import REGISTRY, Converter, Derived, Options, Plan, Rule, Source, TensorMove, register


def get(name: str) -> Converter:
    """The converter registered as ``name``.

    Raises:
        InputError: no converter has that name.
    """
    if name not in REGISTRY:
        raise InputError(f"unknown source format {name!r}", hint=f"choose --from from: {', '.join(sorted(REGISTRY))}, or auto")
    return REGISTRY[name]


__all__ = ["REGISTRY", "Converter", "Derived", "Options", "Plan", "Rule", "Source", "TensorMove", "get", "register"]
