"""A failed download from the Hugging Face Hub as one clear line: what, and how to fix it.

huggingface_hub raises many classes; :func:`specfmt.sources.resolve.resolve` and
:func:`~specfmt.sources.resolve.fetch` map them here to :class:`~specfmt.errors.HubError`
(upload failures are mapped in :mod:`specfmt.hub.failures`). The token never appears in a message.
"""

from __future__ import annotations

import os

from ..errors import HubError


def download_failure(ref: str, revision: str | None, exc: Exception) -> HubError:
    """A failed download of ``ref`` (``snapshot_download``) as one :class:`HubError` line."""
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, LocalEntryNotFoundError):
        return HubError(
            f"{ref!r} is not a local folder, not in the local Hugging Face cache, and the Hub cannot be reached"
            + (" (HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on") else ""),
            hint="download it once with network access, or pass a local folder",
        )
    if isinstance(exc, GatedRepoError):
        return HubError(f"{ref!r} is gated on the Hub", hint="accept its terms on the Hub and log in with `hf auth login`")
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(f"{ref!r} is not a local folder, and no Hub repo has that id (or it is private)", hint="check the path or id; log in with `hf auth login` for private repos")
    if isinstance(exc, RevisionNotFoundError):
        return HubError(f"revision {revision!r} not found in {ref!r}", hint="check --revision")
    return HubError(f"could not fetch {ref!r} from the Hub: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
