"""The one error hierarchy of specfmt.

Every error a *user* can cause (bad input, an existing output folder, an
unreachable Hub id, a checkpoint that cannot be converted exactly) is a
:class:`SpecfmtError`. The CLI prints it as one line -- what went wrong, where,
and how to fix it -- and exits non-zero without a traceback. Anything else that
escapes is a bug in specfmt and keeps its traceback.

Modelled on ``huggingface_hub/errors.py``: callers catch the class they can
handle; the message is written for the person at the terminal, and what a caller
may decide on is data: the class, and fields such as :attr:`HubError.repo_id` or
:attr:`ConversionError.tensors`. A check that finds problems without raising
reports each as a :class:`Finding`, whose fields (the config path and keys, the
tensor) say what it concerns, so no caller reads a message's words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


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
    unsupported options). Nothing is written when this is raised.

    Args:
        message, where, hint: as :class:`SpecfmtError`.
        tensors: the tensors concerned, by what is wrong with them (:data:`TENSOR_KINDS`), e.g.
            ``{"missing": ["norm.weight"], "misshaped": ["fc.weight"]}``; only kinds with names.
        config_path: the config field concerned, as a JSON path (``$.num_hidden_layers``); None
            when the error is about no one field.

    Attributes:
        tensors: as given (``{}`` when none).
        config_path: as given.
    """

    #: what can be wrong with a tensor a conversion refuses: the output names the config implies and the
    #: weights lack (``missing``), hold without the config implying them (``unexpected``), hold with another
    #: shape (``misshaped``) or another kind of dtype (``wrong_dtype``); the source names no rule of the
    #: layout knows (``unknown``); two source names that map to one output name (``conflicting``); a
    #: tensor whose values disagree with the config (``inconsistent``)
    TENSOR_KINDS = ("missing", "unexpected", "misshaped", "wrong_dtype", "unknown", "conflicting", "inconsistent")

    def __init__(self, message: str, *, tensors: dict[str, list[str]] | None = None, config_path: str | None = None, **kw):
        super().__init__(message, **kw)
        unknown = set(tensors or {}) - set(self.TENSOR_KINDS)
        if unknown:
            raise ValueError(f"ConversionError: unknown tensor kinds {sorted(unknown)} (known: {', '.join(self.TENSOR_KINDS)})")
        self.tensors = {kind: list(names) for kind, names in (tensors or {}).items() if names}
        self.config_path = config_path


class ExportRefusal(SpecfmtError):
    """``specfmt export --to ENGINE`` cannot write this draft so that the engine runs it exactly as specfmt and vLLM do.

    Attributes:
        engine: the engine asked for (``sglang``).
        reason: which rule refused, a key the caller may decide on (``norm_before_residual``, ``taps``,
            ``own_embedding``, ``unserved``, ...); the message says it in words.
    """

    def __init__(self, message: str, *, engine: str, reason: str, **kw):
        super().__init__(message, **kw)
        self.engine = engine
        self.reason = reason


class OutputExistsError(SpecfmtError):
    """The output folder exists and is not empty, and ``--force`` was not given."""


class HubError(SpecfmtError):
    """A call to the Hugging Face Hub failed: a download (:mod:`specfmt.sources.failures`) or a push
    (:mod:`specfmt.hub.failures`). The subclasses below say what failed; this class itself is any
    other failure (an unexpected answer, a refusal specfmt makes before writing).

    Modelled on ``huggingface_hub.errors``, whose exceptions are mapped to these in those two modules
    only: a caller decides on the class and the fields, never on the words of the message.

    Args:
        message, where, hint: as :class:`SpecfmtError`.
        repo_id: the repo concerned (``OWNER/NAME``), when there is one.
        revision: the branch, tag or commit asked for (None: the default branch, or none concerned).
        repo_type: ``model`` (the only kind specfmt reads or writes), or what the Hub said.
        status: the HTTP status the Hub answered (None: no answer, or none concerned).

    Attributes:
        repo_id, revision, repo_type, status: as given.
    """

    def __init__(self, message: str, *, repo_id: str | None = None, revision: str | None = None, repo_type: str = "model",
                 status: int | None = None, **kw):
        super().__init__(message, **kw)
        self.repo_id = repo_id
        self.revision = revision
        self.repo_type = repo_type
        self.status = status


class HubRepoNotFoundError(HubError):
    """No repo has that id, or the token may not see it (the Hub answers a private repo as missing)."""


class HubGatedRepoError(HubRepoNotFoundError):
    """The repo is gated: its terms must be accepted on the Hub, and the token be of a user who did."""


class HubRevisionNotFoundError(HubError):
    """The repo exists but has no such branch, tag or commit (``revision``)."""


class HubEntryNotFoundError(HubError):
    """The repo and revision exist but hold no such file."""


class HubOfflineError(HubError):
    """The Hub cannot be used: ``HF_HUB_OFFLINE`` is set or the Hub is unreachable, and for a download
    the files are not in the local cache."""


class HubAuthError(HubError):
    """No Hugging Face token, or the Hub rejected it (401)."""


class HubPermissionError(HubError):
    """The token is valid but may not do this, e.g. write to another namespace (403)."""


class HubUnavailableError(HubError):
    """The Hub failed (5xx, ``status``) or the connection dropped (``status`` None), after ``attempts``
    tries; worth retrying.

    Attributes:
        attempts: how many times the call was tried.
        outcome: what the failure left on the Hub, in words (e.g. "no commit was made ...").
    """

    def __init__(self, message: str, *, attempts: int = 1, outcome: str | None = None, **kw):
        super().__init__(message, **kw)
        self.attempts = attempts
        self.outcome = outcome


class VersionError(SpecfmtError):
    """A checkpoint's ``speculators_version`` is unreadable or newer than this specfmt knows."""


class VLLMRunError(SpecfmtError):
    """vLLM is missing, crashed, or timed out while loading or generating."""


class Interrupted(SpecfmtError):
    """The user stopped the command (Ctrl-C, SIGINT); the message says what was kept (:mod:`specfmt.interrupt`).
    Exit status 130, as a shell reports a process ended by SIGINT."""

    exit_code = 130


class TrainInterrupted(Interrupted):
    """Training stopped by the user (Ctrl-C); the state was saved for ``--resume``."""


class DataInterrupted(Interrupted):
    """Training-data generation (``specfmt datagen``, ``specfmt regenerate``) stopped by the user (Ctrl-C); what was
    written is whole, and running again resumes it.

    Attributes:
        done: the samples or conversations written, when the command counts them (None otherwise).
    """

    def __init__(self, message: str, *, done: int | None = None, where: str | None = None, hint: str | None = None):
        super().__init__(message, where=where, hint=hint)
        self.done = done


#: one step of a JSON path as specfmt writes them: ``.key`` or ``[index]``
_PATH_STEP = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")


def path_keys(path: str | None) -> tuple[str, ...]:
    """The keys named along a JSON path as specfmt writes them (``$.a.b[0].c`` -> ``("a", "b", "c")``;
    ``$`` -> ``()``); list indices are left out.

    Raises:
        ValueError: ``path`` does not start with ``$`` or has a step that is neither ``.key`` nor ``[index]``.
    """
    if not path:
        return ()
    if not path.startswith("$"):
        raise ValueError(f"not a JSON path: {path!r}")
    rest, keys, at = path[1:], [], 0
    while at < len(rest):
        m = _PATH_STEP.match(rest, at)
        if m is None:
            raise ValueError(f"not a JSON path: {path!r}")
        if m.group(1) is not None:
            keys.append(m.group(1))
        at = m.end()
    return tuple(keys)


@dataclass(frozen=True)
class Finding:
    """One problem a check found, as data (what :mod:`specfmt.validation` reports and decides on).

    Attributes:
        message: the problem in the rule's own words, one line (``str(finding)``).
        path: the config field concerned, as a JSON path (``$.eagle_aux_hidden_state_layer_ids[0]``);
            None when it concerns no one field.
        keys: the config keys it concerns: those named along ``path``, and those the rule itself names
            (a required key that is absent is reported at its parent, ``$``, with ``keys`` naming it).
        tensor: the tensor concerned, when one is.
        kind: what is wrong, in the words of the check that found it: for tensors ``missing``,
            ``unexpected``, ``misshaped``, ``wrong_dtype``; for a JSON Schema violation its keyword
            (``required``, ``type``, ``not`` ...); ``rule`` for a rule across fields.
    """

    message: str
    path: str | None = None
    keys: tuple[str, ...] = ()
    tensor: str | None = None
    kind: str | None = None

    @classmethod
    def at(cls, path: str | None, message: str, *, kind: str | None = None, named: tuple[str, ...] = (),
           along: tuple[str, ...] | None = None) -> "Finding":
        """A finding about the config field at ``path``: its :attr:`keys` are those along the path, then ``named``.

        ``along`` gives the keys along the path where the caller holds them (a path built from a
        config's own keys, which may be empty or hold ``.`` or ``[``, cannot be read back); else they
        are read from ``path`` (:func:`path_keys`).

        Raises:
            ValueError: ``along`` is None and ``path`` is not a JSON path :func:`path_keys` reads.
        """
        keys = path_keys(path) if along is None else tuple(along)
        return cls(message, path=path, keys=tuple(dict.fromkeys(keys + tuple(named))), kind=kind)

    def __str__(self) -> str:
        return self.message
