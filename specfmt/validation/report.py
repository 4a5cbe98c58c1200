"""What validation reports: one :class:`Check` per thing checked, gathered in a :class:`Report`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"


@dataclass
class Check:
    """One check's outcome.

    Attributes:
        name: short id (``schema``, ``tensors``, ...).
        status: ``pass``, ``fail``, ``warn`` (does not fail the run) or ``skip``.
        summary: one line.
        details: every individual finding (JSON paths, tensor names).
    """

    name: str
    status: str
    summary: str
    details: list[str] = field(default_factory=list)


@dataclass
class Report:
    """All checks on one folder. ``ok`` is True when no check failed."""

    path: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    def add(self, name: str, status: str, summary: str, details: list[str] | None = None) -> Check:
        c = Check(name, status, summary, list(details or []))
        self.checks.append(c)
        return c

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "ok": self.ok, "checks": [asdict(c) for c in self.checks]}
