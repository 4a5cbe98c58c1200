"""Resolve a model reference -- a local folder or a Hugging Face Hub id -- to files on disk.

Downloads go through huggingface_hub, which honours ``HF_HUB_OFFLINE``,
``HF_HOME`` / ``HF_HUB_CACHE`` and the stored token. Offline, a Hub id resolves
from the local cache or fails with a clear message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .failures import download_failure


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


def looks_like_path(ref: str) -> bool:
    """A reference a Hub id can never be: starts with . / ~, has a backslash or more than one slash."""
    return ref.startswith((".", "/", "~")) or "\\" in ref or ref.count("/") > 1


def relative_to(ref: str, base: str | Path) -> str:
    """``ref`` as a file in the local folder ``base`` names it: a relative path that exists from ``base`` becomes
    that absolute path (a draft's config naming ``../verifier`` means the folder beside the draft, wherever the
    command runs; issue 35); anything else (an absolute path, a Hub id, a path that is not there, ``base`` not a
    local folder) is returned as given."""
    p = Path(ref).expanduser()
    base = Path(base)
    if not ref or p.is_absolute() or not base.is_dir():
        return ref
    there = base / p
    return str(there.resolve()) if there.exists() else ref


def _validate_repo_id(ref: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(ref)
    except HFValidationError as e:
        raise InputError(
            f"{ref!r} is neither an existing folder nor a valid Hub repo id ({str(e).splitlines()[0]})",
            hint="check the path, or give a Hub id as OWNER/NAME",
        ) from None


def is_hub_id(ref: str) -> bool:
    """``ref`` is a valid Hub repo id ``OWNER/NAME`` (and could not be a path)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if looks_like_path(ref) or ref.count("/") != 1:
        return False
    try:
        validate_repo_id(ref)
    except HFValidationError:
        return False
    return True


def hub_cache_folder(repo_id: str) -> Path:
    """The folder a download of the model ``repo_id`` goes to in the Hugging Face cache
    (``HF_HUB_CACHE/models--OWNER--NAME``: its snapshots, blobs and refs), whether or not it is there yet."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")


def check_repo_id(repo_id: str, option: str = "--repo-id") -> None:
    """Refuse a repo id that is not ``OWNER/NAME`` before any network call.

    Raises:
        InputError: with the reason huggingface_hub's ``validate_repo_id`` gives.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if repo_id.count("/") != 1:
        raise InputError(f"{option} {repo_id!r} is not OWNER/NAME", hint="e.g. --repo-id my-org/Llama-3.1-8B-eagle3")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise InputError(f"{option} {repo_id!r} is not a valid Hub repo id: {str(e).splitlines()[0]}", hint="use letters, digits, '-', '_' and '.'") from None


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
    if looks_like_path(ref):
        raise InputError(f"{what} folder not found", where=ref, hint="check the path")
    _validate_repo_id(ref)
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(ref, revision=revision, allow_patterns=allow_patterns)
    except Exception as e:  # huggingface_hub raises many classes; all become one clear line
        raise download_failure(ref, revision, e) from None
    return Resolved(Path(folder), ref, revision, True)


def fetch(res: Resolved, allow_patterns: list[str]) -> Path:
    """More files of an already resolved Hub id (same revision): ``snapshot_download`` with
    ``allow_patterns``; files already in the cache are not downloaded again.

    Raises:
        HubError: the files cannot be fetched (offline and not cached, ...).
    """
    from huggingface_hub import snapshot_download

    if not res.is_hub:
        return res.folder
    try:
        return Path(snapshot_download(res.name_or_path, revision=res.revision, allow_patterns=allow_patterns))
    except Exception as e:  # huggingface_hub raises many classes; all become one clear line
        raise download_failure(res.name_or_path, res.revision, e) from None
