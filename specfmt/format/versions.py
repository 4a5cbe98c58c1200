"""``speculators_version``: which speculators layout a config follows, and how specfmt treats it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import VersionError

#: The ``speculators_version`` specfmt writes: the speculators release whose
#: config layout (and vLLM's reading of it) this format follows.
SPECULATORS_VERSION = "0.9.0"

#: Oldest ``speculators_version`` recognised on read: speculators 0.1.0 dev builds,
#: also written by NVIDIA ModelOpt's exporter (``0.1.0.dev14``).
OLDEST_SPECULATORS_VERSION = "0.1.0.dev0"


@dataclass(frozen=True)
class VersionStatus:
    """How a ``speculators_version`` relates to the one specfmt writes.

    Attributes:
        status: ``"current"``, ``"older"`` (recognised, readable; an upgrade will
            rewrite it) or ``"newer"`` (unknown to this specfmt).
        message: one line for the user.
    """

    status: str
    message: str


def check_speculators_version(version: Any) -> VersionStatus:
    """Classify a config's ``speculators_version``.

    Raises:
        VersionError: the value is not a string or not a PEP 440 version.
    """
    from packaging.version import InvalidVersion, Version

    if not isinstance(version, str):
        raise VersionError(f"speculators_version must be a string, got {version!r}", where="$.speculators_version")
    try:
        v = Version(version)
    except InvalidVersion:
        raise VersionError(f"speculators_version {version!r} is not a valid version", where="$.speculators_version") from None
    cur = Version(SPECULATORS_VERSION)
    if v.release[:2] == cur.release[:2] and v <= Version(f"{cur.major}.{cur.minor}.999"):
        return VersionStatus("current", f"speculators format {version} (current: {SPECULATORS_VERSION})")
    if Version(OLDEST_SPECULATORS_VERSION) <= v < cur:
        return VersionStatus(
            "older",
            f"older speculators format {version} (current {SPECULATORS_VERSION}); readable, "
            f"re-convert from the research checkpoint to get the current layout",
        )
    return VersionStatus(
        "newer",
        f"speculators format {version} is newer than this specfmt knows ({SPECULATORS_VERSION}); upgrade specfmt",
    )
