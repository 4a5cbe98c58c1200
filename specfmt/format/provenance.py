"""The ``specfmt`` provenance block of config.json: where a checkpoint came from and what happened
to every source tensor (vLLM ignores the block; ``specfmt push`` turns it into the model card)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from .. import FORMAT_VERSION, __version__


def utc_now() -> str:
    """The current UTC time as ISO 8601 with a ``Z`` and whole seconds (the ``created`` field)."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def provenance_block(
    *,
    source_format: str,
    layout: str,
    name_or_path: str,
    revision: str | None,
    files: dict[str, str],
    renamed: dict[str, str],
    kept: list[str],
    dropped: dict[str, str],
    created: str,
    folded: dict[str, str] | None = None,
    derived: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The ``specfmt`` provenance block (ignored by vLLM).

    Args:
        files: sha256 (hex) of every source file read, by file name.
        renamed / kept / dropped / folded: what happened to every source tensor
            (dropped and folded map a tensor to the reason).
        derived: output tensors computed rather than copied, with how.
        created: ISO 8601 UTC time.
    """
    return {
        "format_version": FORMAT_VERSION,
        "specfmt_version": __version__,
        "created": created,
        "source": {
            "format": source_format,
            "layout": layout,
            "name_or_path": name_or_path,
            "revision": revision,
            "files": dict(sorted(files.items())),
        },
        "tensors": {"renamed": renamed, "kept": kept, "dropped": dropped, "folded": dict(folded or {}), "derived": dict(derived or {})},
    }


def provenance_source(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg["specfmt"]["source"]`` when both are objects, else ``{}`` (what a config says it was
    converted from, for display; never raises)."""
    block = cfg.get("specfmt")
    source = block.get("source") if isinstance(block, dict) else None
    return source if isinstance(source, dict) else {}
