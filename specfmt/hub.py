"""Resolve a model reference -- a local folder or a Hugging Face Hub id -- to files on disk.

Downloads go through huggingface_hub, which honours ``HF_HUB_OFFLINE``,
``HF_HOME`` / ``HF_HUB_CACHE`` and the stored token. Offline, a Hub id resolves
from the local cache or fails with a clear message.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import HubError, InputError


@dataclass(frozen=True)
class Resolved:
    """A model reference resolved to a local folder.

    Attributes:
        folder: where the files are (a snapshot folder in the HF cache for Hub ids).
        name_or_path: the Hub id, or the absolute local path (never relative).
        revision: the Hub revision asked for (None for local folders or the default branch).
        is_hub: True when it came from the Hub (or its cache).
    """

    folder: Path
    name_or_path: str
    revision: str | None
    is_hub: bool


def _looks_like_path(ref: str) -> bool:
    """A reference a Hub id can never be: starts with . / ~, has a backslash or more than one slash."""
    return ref.startswith((".", "/", "~")) or "\\" in ref or ref.count("/") > 1


def _validate_repo_id(ref: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(ref)
    except HFValidationError as e:
        raise InputError(
            f"{ref!r} is neither an existing folder nor a valid Hub repo id ({str(e).splitlines()[0]})",
            hint="check the path, or give a Hub id as OWNER/NAME",
        ) from None


_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


def check_revision(revision: str | None, option: str = "--revision") -> None:
    """Refuse a revision git or the Hub would reject (``..``, spaces, a leading ``-`` or ``.``,
    a trailing ``/`` or ``.lock``) before any network call: a branch, tag, ``refs/pr/N`` or commit sha.

    Raises:
        InputError: naming the rule broken.
    """
    if revision is None:
        return
    bad = (not isinstance(revision, str) or not _REVISION.fullmatch(revision) or ".." in revision or "//" in revision
           or revision.endswith(("/", ".lock", ".")) or any(part.startswith(".") for part in revision.split("/")))
    if bad:
        raise InputError(f"{option} {revision!r} is not a valid revision", hint="use a branch, tag or commit: letters, digits, '.', '_', '-' and '/' (e.g. v1 or refs/pr/3)")


def _hub_error(ref: str, revision: str | None, exc: Exception) -> HubError:
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


def resolve(ref: str, *, allow_patterns: list[str] | None = None, revision: str | None = None, what: str = "model") -> Resolved:
    """Resolve ``ref`` to a local folder.

    Args:
        ref: a local folder (absolute or relative) or a Hub id ``OWNER/NAME``.
        allow_patterns: for Hub ids, the files to download (e.g. ``["config.json"]``).
        revision: Hub branch, tag or commit.
        what: what the reference is, for messages ("source", "verifier").

    Returns:
        A :class:`Resolved` whose ``name_or_path`` is the Hub id or the absolute path.

    Raises:
        InputError: ``ref`` is a path that does not exist or not a folder, or neither a
            folder nor a valid repo id.
        HubError: the Hub id cannot be fetched (offline and not cached, not found, gated).
    """
    check_revision(revision)
    path = Path(ref).expanduser()
    if path.exists():
        if not path.is_dir():
            raise InputError(f"the {what} must be a folder, not a file", where=str(path))
        return Resolved(path.resolve(), str(path.resolve()), None, False)
    if _looks_like_path(ref):
        raise InputError(f"{what} folder not found", where=ref, hint="check the path")
    _validate_repo_id(ref)
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(ref, revision=revision, allow_patterns=allow_patterns)
    except Exception as e:  # huggingface_hub raises many classes; all become one clear line
        raise _hub_error(ref, revision, e) from None
    return Resolved(Path(folder), ref, revision, True)
