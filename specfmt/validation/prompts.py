"""The prompts of a validation run: built in, or a jsonl file, tokenized once for both runs."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..sources.records import LINE_FORMAT, Record, read_records
from ..errors import InputError

#: Prompts used when ``--prompts`` is not given: short openings of prose, code and chat-like text.
BUILTIN_PROMPTS = [
    "The history of the printing press begins in",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Here is a short list of tips for writing clear documentation:\n1.",
    "import json\n\nwith open(\"config.json\") as f:\n",
    "Question: Why is the sky blue?\nAnswer:",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "Once upon a time, in a small village by the sea, there lived",
]


@dataclass
class Prompts:
    """Prompts of one run. ``ids`` are what both runs receive, unchanged."""

    source: str
    texts: list[str]
    ids: list[list[int]]
    chat_template: bool = False

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(json.dumps(self.ids).encode()).hexdigest()


def read_prompt_file(path: str | Path) -> list[Record]:
    """The records of a prompts file, checked without a tokenizer (``validate --run`` reads them before it loads
    anything): the data-file format every command reads (:mod:`specfmt.sources.records`): a text (``text`` or
    ``prompt``) is continued, a chat (``messages``) answered.

    Raises:
        InputError: the file is missing or not UTF-8, a line is not JSON or is no record (each named ``path:line``),
            or the file holds no prompt.
    """
    records = list(read_records(path, what="prompts file"))
    if not records:
        raise InputError(f"no prompts in {path}", hint=f"one {LINE_FORMAT} per line")
    return records


def load_prompts(path: str | None, tokenizer: Any) -> Prompts:
    """Read prompts (:func:`read_prompt_file`) and tokenize them with the verifier's tokenizer.

    Args:
        path: a data file (:mod:`specfmt.sources.records`): each ``text``/``prompt`` is continued, each
            ``messages`` (chat turns ``{"role", "content"}``) rendered with the tokenizer's chat template and a
            generation prompt; a plain-text file is one prompt; None for :data:`BUILTIN_PROMPTS`.
        tokenizer: a transformers tokenizer.

    Raises:
        InputError: the file is missing, a line is not JSON, or has neither field; a chat
            prompt when the tokenizer has no chat template.
    """
    if path is None:
        texts = list(BUILTIN_PROMPTS)
        return Prompts("built-in", texts, [tokenizer.encode(t) for t in texts])
    texts, ids, chat = [], [], False
    for rec in read_prompt_file(path):
        if rec.text is not None:
            texts.append(rec.text)
            ids.append(tokenizer.encode(rec.text))
        else:
            if not getattr(tokenizer, "chat_template", None):
                raise InputError("a chat prompt (messages) but the verifier's tokenizer has no chat template", where=rec.where,
                                 hint="give the prompt as {\"text\": ...}")
            try:
                text = tokenizer.apply_chat_template(rec.turns(), tokenize=False, add_generation_prompt=True)
            except Exception as e:  # jinja errors: a malformed turn
                raise InputError(f"the chat template cannot render these messages: {str(e).splitlines()[0]}", where=rec.where) from None
            texts.append(text)
            ids.append(tokenizer.encode(text, add_special_tokens=False))
            chat = True
    return Prompts(str(path), texts, ids, chat)
