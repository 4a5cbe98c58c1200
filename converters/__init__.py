"""Converters from research checkpoint layouts to the specfmt format (``specfmt.converters``).

One module per source format, each registering a :class:`~specfmt.converters.base.Converter`
under its ``--from`` name: :mod:`.eagle3`, :mod:`.eagle` (EAGLE-1/2 and HASS), :mod:`.medusa`
and :mod:`.speculators` (older speculators checkpoints, handed to the others), :mod:`.peagle` (P-EAGLE, on EAGLE-3's converter), :mod:`.dflash` (DFlash: speculators', z-lab's and SpecForge's), :mod:`.dspark` and :mod:`.dflash2` (speculators' DSpark and DFlash2 outputs, on DFlash's converter). :mod:`.taps` holds
the tap convention that drafts fusing verifier layers share (EAGLE-3 and DFlash).
"""

from __future__ import annotations

from typing import Iterable

from specfmt.errors import InputError

from . import dflash, dspark, dflash2, eagle3, medusa, eagle, speculators, peagle  # noqa: F401, I001  (each registers itself; this order is --from auto's: dflash first, its config decides)
from .base import REGISTRY, Converter, Derived, Options, Plan, Rule, Source, TensorMove, register


def get(name: str) -> Converter:
    """The converter registered as ``name``.

    Raises:
        InputError: no converter has that name.
    """
    if name not in REGISTRY:
        raise InputError(f"unknown source format {name!r}", hint=f"choose --from from: {', '.join(sorted(REGISTRY))}, or auto")
    return REGISTRY[name]


def from_choices(*extra: str, algorithms: "Iterable[str] | None" = None) -> str:
    """The ``--from`` values for a command's help, from the registry (a new converter appears by registering):
    ``"eagle3, medusa, eagle (EAGLE-1/2), ..."`` followed by ``extra`` (e.g. ``"auto"``). With ``algorithms``, only the
    converters that write one of them, or whose source decides (:attr:`~.base.Converter.algorithm` None:
    ``speculators``); ``specfmt train`` offers only those (issue 35)."""
    wanted = None if algorithms is None else set(algorithms)
    labels = {name: vars(type(c)).get("label", "") for name, c in REGISTRY.items()  # a subclass (hass) names its own
              if wanted is None or c.algorithm is None or c.algorithm in wanted}
    names = [f"{name} ({label})" if label else name for name, label in labels.items()]
    return ", ".join([*names, *extra])


__all__ = ["REGISTRY", "Converter", "Derived", "Options", "Plan", "Rule", "Source", "TensorMove", "from_choices", "get", "register"]
