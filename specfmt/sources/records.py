"""The one reader of prompt and data files, for every command that takes them (issue 35).

``validate --prompts``, ``train --data`` (and ``train fill --data``), ``datagen --data`` and ``regenerate --data``
read their files here, so that a line one command accepts, every command accepts, and every error names the same
place. The format (``docs/data.md``, the one page the commands link to):

* a ``.jsonl`` file holds one JSON object per line (blank lines are skipped), each with exactly one of

  - ``"text"`` (or ``"prompt"``): a string, plain text: a document to train on, a prompt to continue;
  - ``"messages"`` (or ShareGPT's ``"conversations"``): a list of chat turns ``{"role", "content"}``
    (``{"from", "value"}`` too), rendered with the verifier's chat template;

  any other key (``id``, ``uuid``, metadata) is kept with the record;
* any other file is one plain-text document (UTF-8; ``\\r\\n`` read as ``\\n``).

What each command makes of a record is its own: ``train`` and ``datagen`` train on a text with a loss on every token
and on a chat's assistant turns; ``validate --run`` continues a text and answers a chat's last turn;
``regenerate`` answers a chat's user turns and continues a text.

Errors are :class:`~specfmt.errors.InputError` with the exact position: ``path:line`` (and the column of a line that
is not JSON), the byte of a file that is not UTF-8.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError

#: the keys that hold a record's plain text, then its chat turns, in the order they are read (the first of each
#: pair is the name the docs use; the second an alias other tools write)
TEXT_KEYS = ("text", "prompt")
CHAT_KEYS = ("messages", "conversations")
#: the one-line description of a jsonl line, for hints
LINE_FORMAT = '{"text": ...} (or "prompt"), or chat {"messages": [...]}'


#: role names mapped as speculators' ``_normalize_conversation`` maps them (ShareGPT's ``from``)
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system", "tool": "tool"}


def normalize_turns(messages: list[Any], where: str) -> list[dict]:
    """``{"role", "content"}`` turns (``from``/``value`` accepted, roles mapped by :data:`ROLES`, other keys kept).

    Raises:
        InputError: a turn is not an object, or has a role outside :data:`ROLES` (``where`` names the line).
    """
    out = []
    for n, turn in enumerate(messages):
        if not isinstance(turn, dict):
            raise InputError(f"turn {n} is not an object", where=where)
        given = turn.get("role", turn.get("from", ""))
        role = ROLES.get(given) if isinstance(given, str) else None  # a list or dict role is no role (fuzz, issue 35)
        if role is None:
            raise InputError(f"turn {n} has role {turn.get('role', turn.get('from'))!r}", where=where,
                             hint="roles are " + ", ".join(sorted(set(ROLES))))
        out.append({**{k: v for k, v in turn.items() if k not in ("from", "value")}, "role": role,
                    "content": turn.get("content", turn.get("value")) or ""})
    return out


@dataclass(frozen=True)
class Record:
    """One document or prompt of a data file.

    Attributes:
        where: ``path:line`` for a jsonl line, ``path`` for a text file.
        text: the plain text (``text``/``prompt``, or the whole text file); None for chat.
        messages: the chat turns as written (``messages``/``conversations``); None for text.
        fields: the line's JSON object as written (empty for a text file): ``id``, ``uuid`` and the rest.
    """

    where: str
    text: str | None = None
    messages: list[Any] | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def chat(self) -> bool:
        return self.messages is not None

    def turns(self) -> list[dict]:
        """The chat turns as ``{"role", "content"}`` (:func:`normalize_turns`); [] for a text.

        Raises:
            InputError: a malformed turn, named at :attr:`where`.
        """
        return [] if self.messages is None else normalize_turns(self.messages, self.where)


def read_text(path: str | Path, what: str = "data file") -> str:
    """The text of one file (UTF-8).

    Raises:
        InputError: the file is missing, or not UTF-8 (the byte where decoding failed).
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} {path} not found", hint=f"give a text file, or jsonl with one {LINE_FORMAT} per line (docs: data files)")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"the {what} is not UTF-8 text ({e.reason} at byte {e.start})", where=str(path)) from None


def parse_line(line: str, where: str) -> Any:
    """One jsonl line's JSON value.

    Raises:
        InputError: the line is not JSON: its message and the column (``where`` is ``path:line``).
    """
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"line is not JSON ({e.msg} at column {e.colno})", where=where) from None


def record(obj: Any, where: str) -> Record:
    """The record of one jsonl line's JSON value.

    Raises:
        InputError: not an object, or not exactly one of a text string and a chat list (:data:`TEXT_KEYS`,
            :data:`CHAT_KEYS`), or one of a wrong type.
    """
    if not isinstance(obj, dict):
        raise InputError(f"each line needs a JSON object, {LINE_FORMAT}; this one is a {type(obj).__name__}", where=where)
    text_key = next((k for k in TEXT_KEYS if k in obj), None)
    chat_key = next((k for k in CHAT_KEYS if k in obj), None)
    if text_key is None and chat_key is None:
        raise InputError(f"each line needs {LINE_FORMAT}; this one has {', '.join(map(repr, obj)) or 'no key'}", where=where)
    if text_key is not None and chat_key is not None:
        raise InputError(f"the line has both {text_key!r} and {chat_key!r}: a record is a text or a chat, not both", where=where,
                         hint="keep one of them")
    if text_key is not None:
        if not isinstance(obj[text_key], str):
            raise InputError(f"{text_key!r} must be a string, not {type(obj[text_key]).__name__}", where=where)
        return Record(where, text=obj[text_key], fields=obj)
    if not isinstance(obj[chat_key], list):
        raise InputError(f"{chat_key!r} must be a list of turns, not {type(obj[chat_key]).__name__}", where=where,
                         hint='write each turn as {"role": "user", "content": "..."}')
    return Record(where, messages=obj[chat_key], fields=obj)


def read_records(path: str | Path, text: str | None = None, *, what: str = "data file") -> Iterator[Record]:
    """The records of one data file, in file order (the module's format).

    Args:
        path: a ``.jsonl`` file (one record per non-blank line) or any other file (one plain-text record; none
            when it is blank).
        text: the file's text, when the caller has read it already (:func:`read_text`).
        what: what the file is, for the messages (``prompts file``, ``training data``).

    Raises:
        InputError: :func:`read_text`, :func:`parse_line`, :func:`record`; each names ``path:line``.
    """
    text = read_text(path, what) if text is None else text
    if Path(path).suffix != ".jsonl":
        if text.strip():
            yield Record(str(path), text=text.replace("\r\n", "\n"))
        return
    for n, line in enumerate(text.split("\n"), 1):  # not splitlines(): U+2028 inside a JSON string is no line break
        line = line.removesuffix("\r")
        if line.strip():
            where = f"{path}:{n}"
            yield record(parse_line(line, where), where)


__all__ = ["CHAT_KEYS", "LINE_FORMAT", "ROLES", "Record", "normalize_turns", "TEXT_KEYS", "parse_line", "read_records", "read_text", "record"]
