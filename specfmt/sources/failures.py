"""A failed download from the Hugging Face Hub as one clear line: what, and how to fix it.

huggingface_hub raises many classes; :func:`specfmt.sources.resolve.resolve` and
:func:`~specfmt.sources.resolve.fetch` map them here, in one place, to the
:class:`~specfmt.errors.HubError` subclasses, which carry the repo id and revision
(upload failures are mapped in :mod:`specfmt.hub.failures`). The token never appears in a message.

======================================  ==========================================
huggingface_hub raises                  specfmt raises
======================================  ==========================================
``LocalEntryNotFoundError``             :class:`~specfmt.errors.HubOfflineError`
``GatedRepoError``                      :class:`~specfmt.errors.HubGatedRepoError`
``RepositoryNotFoundError``             :class:`~specfmt.errors.HubRepoNotFoundError`
``RevisionNotFoundError``               :class:`~specfmt.errors.HubRevisionNotFoundError`
``EntryNotFoundError`` (remote)         :class:`~specfmt.errors.HubEntryNotFoundError`
anything else                           :class:`~specfmt.errors.HubError`
======================================  ==========================================
"""

from __future__ import annotations

import os

from ..errors import (
    HubEntryNotFoundError,
    HubError,
    HubGatedRepoError,
    HubOfflineError,
    HubRepoNotFoundError,
    HubRevisionNotFoundError,
)


def download_failure(ref: str, revision: str | None, exc: Exception) -> HubError:
    """A failed download of ``ref`` (``snapshot_download``) as one :class:`~specfmt.errors.HubError` line.

    Args:
        ref: the Hub id asked for.
        revision: the revision asked for (None: the default branch).
        exc: what huggingface_hub raised.

    Returns:
        The subclass of the table above, with ``repo_id=ref``, ``revision``, the repo type and HTTP
        status huggingface_hub reports (``model`` and None when it reports none).
    """
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    resp = getattr(exc, "response", None)
    data = {"repo_id": ref, "revision": revision, "repo_type": getattr(exc, "repo_type", None) or "model",
            "status": getattr(resp, "status_code", None)}
    if isinstance(exc, LocalEntryNotFoundError):
        return HubOfflineError(
            f"{ref!r} is not a local folder, not in the local Hugging Face cache, and the Hub cannot be reached"
            + (" (HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on") else ""),
            hint="download it once with network access, or pass a local folder", **data,
        )
    if isinstance(exc, GatedRepoError):
        return HubGatedRepoError(f"{ref!r} is gated on the Hub", hint="accept its terms on the Hub and log in with `hf auth login`", **data)
    if isinstance(exc, RepositoryNotFoundError):
        return HubRepoNotFoundError(f"{ref!r} is not a local folder, and no Hub repo has that id (or it is private)",
                                    hint="check the path or id; log in with `hf auth login` for private repos", **data)
    if isinstance(exc, RevisionNotFoundError):
        return HubRevisionNotFoundError(f"revision {revision!r} not found in {ref!r}", hint="check --revision", **data)
    cls = HubEntryNotFoundError if isinstance(exc, EntryNotFoundError) else HubError
    return cls(f"could not fetch {ref!r} from the Hub: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", **data)
