"""What validation reports: one :class:`Check` per thing checked, gathered in a :class:`Report`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import Finding

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"


@dataclass
class Check:
    """One check's outcome.

    Attributes:
        name: short id (``schema``, ``tensors``, ...).
        status: ``pass``, ``fail``, ``warn`` (does not fail the run) or ``skip``.
        summary: one line.
        details: every individual finding as the report prints it (JSON paths, tensor names).
        findings: the findings as data (:class:`~specfmt.errors.Finding`: the config path and keys, the
            tensor, the kind), for the code that decides on them (``validate --run``'s likely causes);
            not part of :meth:`Report.to_json`, which keeps the printed ``details``.
    """

    name: str
    status: str
    summary: str
    details: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """``{name, status, summary, details}``."""
        return {"name": self.name, "status": self.status, "summary": self.summary, "details": list(self.details)}


@dataclass
class Report:
    """All checks on one folder. ``ok`` is True when no check failed."""

    path: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    def add(self, name: str, status: str, summary: str, details: list[str] | None = None, findings: list[Finding] | None = None) -> Check:
        """Append a check. ``details`` default to the ``findings``' messages."""
        if details is None and findings:
            details = [f.message for f in findings]
        c = Check(name, status, summary, list(details or []), list(findings or []))
        self.checks.append(c)
        return c

    def check(self, name: str) -> Check | None:
        """The check named ``name`` (the first, if several have the name), or None."""
        return next((c for c in self.checks if c.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "ok": self.ok, "checks": [c.to_json() for c in self.checks]}
