"""Training samples from ``--data``: text with a loss on every token, chat with a loss on the assistant turns only.

Chat follows speculators 0.9's ``prepare-data`` (``speculators/data_generation/preprocessing.py``,
``_render_boundary_rows``), with the verifier's chat template rendered by transformers where
speculators asks a vLLM server's ``/render`` endpoint (the same template, tokenized without added
special tokens). For assistant turn j (j > 0) one row is made:

* ``prompt`` = render(turns[:j], generation prompt), ``full`` = render(turns[:j+1]), each cut to
  ``seq_len`` tokens (vLLM's ``truncate_prompt_tokens``, right side);
* if ``prompt`` fills ``seq_len`` the turn is skipped (only that turn);
* the boundary is ``len(prompt)`` when ``full`` starts with ``prompt``; otherwise (a template that
  pre-fills a reasoning scaffold) the common prefix of the two, valid only if ``full`` starts with
  render(turns[:j]) and the boundary is not inside it -- else the conversation is refused;
* ``input_ids`` = ``full``, ``loss_mask`` = 0 before the boundary, 1 from it: the assistant's
  tokens and what the template closes its turn with, not the turn header the generation prompt
  already holds. Earlier assistant turns are context (0) in later rows, rendered the way inference
  sees them; rows with no 1 left after the cut are dropped (``_append_row``'s "unsupervised").

So a conversation with k assistant turns makes k rows (speculators' "per-turn fan-out"), each row's
mask covering exactly its last assistant turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint.files import jsonl_objects, sha256_file
from ..errors import InputError
from ..training.data import read_data_file
from .layout import Sample

#: role names mapped as speculators' ``_normalize_conversation`` maps them (ShareGPT's ``from``)
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system", "tool": "tool"}


@dataclass
class DataSamples:
    """The samples read from ``--data``.

    Attributes:
        samples: the rows, in file and line order.
        files: sha256 of every data file read, by path (provenance).
        chat: some rows come from chat data.
        unsupervised: rows dropped because the cut to ``seq_len`` left no token with loss.
        skipped_turns: assistant turns skipped because their prompt alone fills ``seq_len``.
    """

    samples: list[Sample] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    chat: bool = False
    unsupervised: int = 0
    skipped_turns: int = 0


def normalize_turns(messages: list[Any], where: str) -> list[dict]:
    """``{"role", "content"}`` turns (``from``/``value`` accepted, roles mapped by :data:`ROLES`).

    Raises:
        InputError: a turn is not an object, or has a role outside :data:`ROLES` (``where`` names the line).
    """
    out = []
    for n, turn in enumerate(messages):
        if not isinstance(turn, dict):
            raise InputError(f"turn {n} is not an object", where=where)
        given = turn.get("role", turn.get("from", ""))
        role = ROLES.get(given) if isinstance(given, str) else None
        if role is None:
            raise InputError(f"turn {n} has role {turn.get('role', turn.get('from'))!r}", where=where,
                             hint="roles are " + ", ".join(sorted(set(ROLES))))
        out.append({**{k: v for k, v in turn.items() if k not in ("from", "value")}, "role": role,
                    "content": turn.get("content", turn.get("value")) or ""})
    return out


def _render(tokenizer: Any, turns: list[dict], generation_prompt: bool, seq_len: int, where: str) -> list[int]:
    try:
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as e:  # noqa: BLE001 - jinja errors: a malformed turn
        raise InputError(f"the chat template cannot render these messages: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                         where=where) from None
    return list(tokenizer.encode(text, add_special_tokens=False, verbose=False))[:seq_len]


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def assistant_rows(tokenizer: Any, messages: list[Any], seq_len: int, where: str = "messages") -> tuple[list[Sample], int, int]:
    """One row per assistant turn, masked at its render boundary (see the module docstring).

    Args:
        tokenizer: the verifier's transformers tokenizer, with a chat template.
        messages: the conversation's turns.
        seq_len: the longest row, in tokens.
        where: the data line, for errors.

    Returns:
        ``(rows, unsupervised, skipped_turns)``.

    Raises:
        InputError: the template cannot render the turns; the renders diverge inside the history
            (speculators' ``BoundaryUnstableError``, where speculators skips the conversation).
    """
    turns = normalize_turns(messages, where)
    rows: list[Sample] = []
    unsupervised = skipped = 0
    for j, turn in enumerate(turns):
        if turn["role"] != "assistant" or j == 0:
            continue
        prompt = _render(tokenizer, turns[:j], True, seq_len, where)
        if len(prompt) >= seq_len:
            skipped += 1
            continue
        full = _render(tokenizer, turns[:j + 1], False, seq_len, where)
        if full[:len(prompt)] == prompt:
            boundary = len(prompt)
        else:
            boundary = _common_prefix_len(prompt, full)
            history = _render(tokenizer, turns[:j], False, seq_len, where)
            if full[:len(history)] != history or boundary < len(history):
                raise InputError(f"the chat template renders assistant turn {j}'s history differently with and without it; "
                                 "no loss-mask boundary can be derived", where=where)
        if boundary >= len(full):
            unsupervised += 1
            continue
        rows.append(Sample(full, [0] * boundary + [1] * (len(full) - boundary)))
    return rows, unsupervised, skipped


def text_sample(tokenizer: Any, text: str, seq_len: int) -> Sample:
    """A text document as ``specfmt train`` tokenizes it (the tokenizer's BOS when it adds one, the
    text, EOS), cut to ``seq_len`` tokens, with a loss on every token."""
    eos = getattr(tokenizer, "eos_token_id", None)
    ids = list(tokenizer.encode(text, add_special_tokens=True, verbose=False))
    if eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
    ids = ids[:seq_len]
    return Sample(ids, [1] * len(ids))


def _read_file(path: str, tokenizer: Any, seq_len: int, out: DataSamples) -> None:
    p = Path(path)
    text = read_data_file(path)
    out.files[str(path)] = sha256_file(p)
    if p.suffix != ".jsonl":
        if text.strip():
            out.samples.append(text_sample(tokenizer, text.replace("\r\n", "\n"), seq_len))
        return
    for where, obj in jsonl_objects(path, text):
        messages = obj.get("messages", obj.get("conversations")) if isinstance(obj, dict) else None
        if isinstance(obj, dict) and isinstance(obj.get("text"), str):
            out.samples.append(text_sample(tokenizer, obj["text"], seq_len))
        elif isinstance(messages, list):
            if not getattr(tokenizer, "chat_template", None):
                raise InputError("chat data (messages) but the verifier's tokenizer has no chat template", where=where,
                                 hint="give the text as {\"text\": ...}")
            rows, unsupervised, skipped = assistant_rows(tokenizer, messages, seq_len, where)
            out.samples.extend(rows)
            out.unsupervised += unsupervised
            out.skipped_turns += skipped
            out.chat = True
        else:
            raise InputError("each line needs a \"text\" string or a \"messages\" list", where=where)


def read_samples(paths: Sequence[str], tokenizer: Any, seq_len: int) -> DataSamples:
    """Read ``--data`` (the formats ``specfmt train --data`` reads) into samples of at most ``seq_len`` tokens.

    Text files and jsonl ``text`` make one row each, loss on every token; chat jsonl ``messages``
    (or speculators' ``conversations``) make one row per assistant turn (:func:`assistant_rows`).

    Raises:
        InputError: a file is missing or not UTF-8, a line is not JSON or has neither field
            (``file:line``), chat data when the tokenizer has no chat template, a turn the template
            cannot render, ``seq_len`` < 2, or no samples at all.
    """
    if seq_len < 2:
        raise InputError(f"--seq-len {seq_len} is too short", hint="give --seq-len 2 or more")
    out = DataSamples()
    for path in paths:
        _read_file(path, tokenizer, seq_len, out)
    if not out.samples:
        raise InputError("no training samples in " + ", ".join(paths),
                         hint="chat data needs an assistant turn after the first turn; a larger --seq-len keeps more")
    return out


__all__ = ["ROLES", "DataSamples", "assistant_rows", "normalize_turns", "read_samples", "text_sample"]
