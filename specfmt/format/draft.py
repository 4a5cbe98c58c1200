"""A draft in memory: its specfmt config and tensors (no I/O, no torch import).

What converters produce (:func:`specfmt.convert.load_draft` loads a plan's tensor stream), what
the algorithms' fill-ins and the trainer change, and what :func:`specfmt.draft.save_draft` writes
(as a tensor stream too, :func:`specfmt.draft.draft_stream`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import CONFIG_FILE, WEIGHTS_FILE

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass
class Draft:
    """A draft checkpoint in memory.

    Attributes:
        config: the specfmt ``config.json`` (schema-valid).
        tensors: specfmt tensor names -> tensors (CPU).
        source: the provenance ``source`` block of where it was read from (None: new).
        notes: what reading it did that the user should know.
    """

    config: dict[str, Any]
    tensors: dict[str, "torch.Tensor"]
    source: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def algorithm(self) -> str:
        return self.config["speculators_model_type"]


def is_specfmt_folder(folder: Path) -> bool:
    """A folder written by specfmt: a config with the ``specfmt`` provenance block and ``model.safetensors``."""
    cfg_path = folder / CONFIG_FILE
    if not cfg_path.is_file() or not (folder / WEIGHTS_FILE).is_file():
        return False
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and isinstance(cfg.get("specfmt"), dict) and "speculators_model_type" in cfg
