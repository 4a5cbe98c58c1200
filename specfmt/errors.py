"""The one error hierarchy of specfmt.

Every error a *user* can cause (bad input, an existing output folder, an
unreachable Hub id, a checkpoint that cannot be converted exactly) is a
:class:`SpecfmtError`. The CLI prints it as one line -- what went wrong, where,
and how to fix it -- and exits non-zero without a traceback. Anything else that
escapes is a bug in specfmt and keeps its traceback.

Modelled on ``huggingface_hub/errors.py``: callers catch the class they can
handle; the message is written for the person at the terminal.
"""

from __future__ import annotations


class SpecfmtError(Exception):
    """Base class of every user-facing error.

    Args:
        message: what went wrong, in one sentence.
        where: the file, folder, tensor or config field concerned (optional).
        hint: how to fix it (optional).
    """

    exit_code = 2

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.where = where
        self.hint = hint

    def one_line(self) -> str:
        """The message as the CLI prints it: ``what (where); hint``, on one line."""
        text = self.message
        if self.where:
            text += f" [{self.where}]"
        if self.hint:
            text += f"; {self.hint}"
        return " ".join(text.split())

    def __str__(self) -> str:
        return self.one_line()


class InputError(SpecfmtError):
    """An input (folder, file, config field, option) is missing, unreadable or malformed."""


class ConfigSchemaError(SpecfmtError):
    """A config does not satisfy the specfmt JSON Schema.

    Attributes:
        violations: ``[(json_path, message), ...]``, one per schema violation.
    """

    def __init__(self, message: str, violations: list[tuple[str, str]], **kw):
        super().__init__(message, **kw)
        self.violations = violations


class ConversionError(SpecfmtError):
    """The source cannot be converted *exactly* (missing, unexpected or mis-shaped tensors,
    unsupported options). Nothing is written when this is raised."""


class OutputExistsError(SpecfmtError):
    """The output folder exists and is not empty, and ``--force`` was not given."""


class HubError(SpecfmtError):
    """A Hugging Face Hub id could not be resolved (offline and not cached, not found, no access)."""


class VersionError(SpecfmtError):
    """A checkpoint's ``speculators_version`` is unreadable or newer than this specfmt knows."""


class VLLMRunError(SpecfmtError):
    """vLLM is missing, crashed, or timed out while loading or generating."""


class TrainInterrupted(SpecfmtError):
    """Training stopped by the user (Ctrl-C); the state was saved for ``--resume``."""

    exit_code = 130
