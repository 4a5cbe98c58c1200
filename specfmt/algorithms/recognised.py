"""Algorithms speculators writes and vLLM serves that this specfmt recognises but does not validate.

speculators 0.9.0 registers ``eagle3``, ``peagle``, ``dflash``, ``dflash2``, ``dspark``, ``mtp``
and ``xpress`` (``speculators/config.py``, the discriminated union on ``speculators_model_type``);
vLLM 0.30-0.33 read ``eagle3``, ``peagle``, ``dflash``, ``dflash2`` and ``dspark``
(``vllm/transformers_utils/configs/speculators/algos.py``, ``SUPPORTED_SPECULATORS_TYPES``).
specfmt has a schema branch, a tensor table and a reference run only for the algorithms of this
package; a checkpoint of one of the others is named for what it is -- never "unknown
algorithm" -- and ``specfmt validate`` says it is recognised, not validated
(:func:`specfmt.validation.static.validate_static`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Recognised:
    """An algorithm specfmt recognises without validating it.

    Attributes:
        name: its ``speculators_model_type``.
        title: what it is.
        served: how vLLM serves it (method, or that it does not).
        source: where the layout is defined.
    """

    name: str
    title: str
    served: str
    source: str

    @property
    def summary(self) -> str:
        from .. import __version__

        return (f"speculators_model_type {self.name!r}: {self.title}; recognised, not validated by specfmt {__version__} "
                f"(no schema branch or tensor table for it yet; layout: {self.source}). {self.served}")

    @property
    def skip_reason(self) -> str:
        return f"{self.name} is recognised, not validated by this specfmt version"


RECOGNISED: dict[str, Recognised] = {r.name: r for r in (
    Recognised("dflash2", "DFlash2, DFlash over the full vocabulary", "vLLM serves it through its dflash2 reader (update_dflash2).",
               "speculators models/dflash2/config.py, core.py"),
    Recognised("dspark", "DSpark, DFlash with Markov and confidence heads", "vLLM serves it as method dspark (update_dspark).",
               "speculators models/dspark/config.py, core.py"),
    Recognised("mtp", "a multi-token-prediction draft trained by speculators", "vLLM's speculators reader has no mtp type (0.30-0.33).",
               "speculators models/mtp/config.py, core.py"),
    Recognised("xpress", "an XPress draft (speculators 0.9)", "vLLM's speculators reader has no xpress type (0.30-0.33).",
               "speculators models/xpress"),
)}


def recognised(name: Any) -> Recognised | None:
    """The :class:`Recognised` entry of a ``speculators_model_type``, or None."""
    return RECOGNISED.get(name) if isinstance(name, str) else None


__all__ = ["RECOGNISED", "Recognised", "recognised"]
