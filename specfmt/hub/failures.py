"""Every failed upload to the Hugging Face Hub as one clear line: what, the status, how to fix it.

huggingface_hub (and httpx below it) raise many classes. Uploads (:func:`hub_failure`, for
:mod:`specfmt.hub.transport`) map them here, in one place, to the :class:`~specfmt.errors.HubError`
subclasses, which carry the repo id, the revision and the HTTP status; downloads are mapped beside
the code that downloads (:mod:`specfmt.sources.failures`). The token never appears in a message.

================================================  ==============================================
the failure                                       specfmt raises
================================================  ==============================================
``OfflineModeIsEnabled`` (``HF_HUB_OFFLINE``)     :class:`~specfmt.errors.HubOfflineError`
401                                               :class:`~specfmt.errors.HubAuthError`
403                                               :class:`~specfmt.errors.HubPermissionError`
``RevisionNotFoundError``                         :class:`~specfmt.errors.HubRevisionNotFoundError`
``RepositoryNotFoundError``, any other 404        :class:`~specfmt.errors.HubRepoNotFoundError`
5xx, a dropped connection (after the retries)     :class:`~specfmt.errors.HubUnavailableError`
any other status, anything else                   :class:`~specfmt.errors.HubError`
================================================  ==============================================
"""

from __future__ import annotations

from ..errors import (
    HubAuthError,
    HubError,
    HubOfflineError,
    HubPermissionError,
    HubRepoNotFoundError,
    HubRevisionNotFoundError,
    HubUnavailableError,
)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of the answer ``exc`` carries (None: no answer)."""
    resp = getattr(exc, "response", None)
    return getattr(resp, "status_code", None)


def _server_message(exc: BaseException) -> str:
    resp = getattr(exc, "response", None)
    msg = (getattr(resp, "headers", None) or {}).get("X-Error-Message") if resp is not None else None
    return f": {msg}" if msg else ""


def is_transport(exc: BaseException) -> bool:
    """A network failure: refused, dropped, timed out (httpx2's or httpx's ``TransportError``, or the OS's)."""
    return isinstance(exc, (ConnectionError, TimeoutError)) or any(c.__name__ == "TransportError" for c in type(exc).__mro__)


def cause_of(exc: BaseException) -> BaseException:
    """The HTTP or network error behind ``exc`` (huggingface_hub wraps LFS upload failures in RuntimeError)."""
    seen = exc
    while seen is not None:
        if status_of(seen) is not None or is_transport(seen):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: a network failure, a 5xx answer or 429 (too many requests)."""
    status = status_of(exc)
    return is_transport(exc) or (status is not None and (status >= 500 or status == 429))


def hub_failure(exc: BaseException, repo_id: str, stage: str, attempts: int = 1, outcome: str = "no commit was made",
                revision: str | None = None) -> HubError:
    """One clear line for a failed Hub call (what, status, how to fix); the token never appears.

    Args:
        exc: what huggingface_hub (or httpx below it) raised.
        repo_id: the repo the call was about.
        stage: what was being done ("creating the repo", "uploading", ...).
        attempts: how many times it was tried.
        outcome: what the failure left on the Hub, for 5xx answers and dropped connections.
        revision: the branch the call was about (None: ``main``, or none).

    Returns:
        The subclass of the table above, with ``repo_id``, ``revision`` and the HTTP status (None when
        there was no answer).
    """
    from huggingface_hub.errors import OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError

    exc = cause_of(exc)
    status = status_of(exc)
    data = {"repo_id": repo_id, "revision": revision, "status": status}
    tried = f" after {attempts} attempts" if attempts > 1 else ""
    again = "re-run the same command: files the Hub already has are not sent again"
    if isinstance(exc, OfflineModeIsEnabled):
        return HubOfflineError("HF_HUB_OFFLINE is set; a push needs the network", hint="unset HF_HUB_OFFLINE (or use --dry-run)", **data)
    if status == 401:
        return HubAuthError(f"the Hub rejected the token (401 Unauthorized) while {stage}",
                            hint="log in with `hf auth login`, or set HF_TOKEN to a valid token with write access", **data)
    if status == 403:
        return HubPermissionError(f"the token may not write to {repo_id} (403 Forbidden{_server_message(exc)}) while {stage}",
                                  hint="use a token with write access to that namespace, or push to your own namespace", **data)
    if isinstance(exc, RevisionNotFoundError):
        return HubRevisionNotFoundError(f"the revision does not exist in {repo_id} (404) while {stage}", hint="check --revision", **data)
    if isinstance(exc, RepositoryNotFoundError) or status == 404:
        return HubRepoNotFoundError(f"{repo_id} does not exist, or the token cannot see it (404) while {stage}",
                                    hint="check --repo-id and that the token may read the repo (`hf auth whoami`)", **data)
    if status is not None and status >= 500:
        return HubUnavailableError(f"the Hub failed with {status}{_server_message(exc)} while {stage}{tried}; {outcome}", hint=again,
                                   attempts=attempts, outcome=outcome, **data)
    if is_transport(exc):
        return HubUnavailableError(f"the connection to the Hub dropped while {stage}{tried} ({type(exc).__name__}); {outcome}", hint=again,
                                   attempts=attempts, outcome=outcome, **data)
    if status is not None:
        return HubError(f"the Hub answered {status}{_server_message(exc)} while {stage}", hint="check --repo-id and --revision", **data)
    return HubError(f"{stage} failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", **data)
