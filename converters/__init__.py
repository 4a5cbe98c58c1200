"""Converters from research checkpoint layouts to the specfmt format (``specfmt.converters``).

One module per source format, each registering a :class:`~specfmt.converters.base.Converter`
under its ``--from`` name: :mod:`.eagle3`, :mod:`.eagle` (EAGLE-1/2 and HASS), :mod:`.medusa`
and :mod:`.speculators` (older speculators checkpoints, handed to the others), :mod:`.peagle` (P-EAGLE, on EAGLE-3's converter), :mod:`.dflash` (speculators' DFlash outputs). :mod:`.taps` holds
the tap convention that drafts fusing verifier layers share (EAGLE-3 now, DFlash next).
"""

from __future__ import annotations

from specfmt.errors import InputError

from . import eagle3, medusa, eagle, dflash, speculators, peagle  # noqa: F401, I001  (each registers itself; this order is --from auto's)
from .base import REGISTRY, Converter, Derived, Options, Plan, Rule, Source, TensorMove, register


def get(name: str) -> Converter:
    """The converter registered as ``name``.

    Raises:
        InputError: no converter has that name.
    """
    if name not in REGISTRY:
        raise InputError(f"unknown source format {name!r}", hint=f"choose --from from: {', '.join(sorted(REGISTRY))}, or auto")
    return REGISTRY[name]


def from_choices(*extra: str) -> str:
    """The ``--from`` values for a command's help, from the registry (a new converter appears by registering):
    ``"eagle3, medusa, eagle (EAGLE-1/2), ..."`` followed by ``extra`` (e.g. ``"auto"``)."""
    labels = {name: vars(type(c)).get("label", "") for name, c in REGISTRY.items()}  # a subclass (hass) names its own
    names = [f"{name} ({label})" if label else name for name, label in labels.items()]
    return ", ".join([*names, *extra])


__all__ = ["REGISTRY", "Converter", "Derived", "Options", "Plan", "Rule", "Source", "TensorMove", "from_choices", "get", "register"]
