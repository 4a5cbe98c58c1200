"""The prompts of a validation run: built in, or a jsonl file, tokenized once for both runs."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint.files import jsonl_objects
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


def read_prompt_file(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """The records of a jsonl prompts file, checked without a tokenizer (``validate --run`` reads
    them before it loads anything): ``(where, record)`` per prompt, ``where`` = ``path:line``, each
    record with a ``prompt`` string or a ``messages`` list.

    Raises:
        InputError: the file is missing or not UTF-8 text, a line is not JSON or has neither
            field, or no line holds a prompt.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"prompts file {path} not found", hint="give a jsonl file with one {\"prompt\": ...} or {\"messages\": [...]} per line")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError("the prompts file is not UTF-8 text", where=str(path)) from None
    records = []
    for where, obj in jsonl_objects(path, text):
        if not (isinstance(obj, dict) and (isinstance(obj.get("prompt"), str) or isinstance(obj.get("messages"), list))):
            raise InputError("each line needs a \"prompt\" string or a \"messages\" list", where=where)
        records.append((where, obj))
    if not records:
        raise InputError(f"no prompts in {path}", hint="one {\"prompt\": ...} per line")
    return records


def load_prompts(path: str | None, tokenizer: Any) -> Prompts:
    """Read prompts (:func:`read_prompt_file`) and tokenize them with the verifier's tokenizer.

    Args:
        path: a jsonl file, one object per line with ``prompt`` (text) or ``messages``
            (chat turns ``{"role", "content"}``, rendered with the tokenizer's chat template
            and a generation prompt); None for :data:`BUILTIN_PROMPTS`.
        tokenizer: a transformers tokenizer.

    Raises:
        InputError: the file is missing, a line is not JSON, or has neither field; a chat
            prompt when the tokenizer has no chat template.
    """
    if path is None:
        texts = list(BUILTIN_PROMPTS)
        return Prompts("built-in", texts, [tokenizer.encode(t) for t in texts])
    texts, ids, chat = [], [], False
    for where, obj in read_prompt_file(path):
        if isinstance(obj.get("prompt"), str):
            texts.append(obj["prompt"])
            ids.append(tokenizer.encode(obj["prompt"]))
        else:
            if not getattr(tokenizer, "chat_template", None):
                raise InputError("a chat prompt (messages) but the verifier's tokenizer has no chat template", where=where,
                                 hint="give the prompt as {\"prompt\": text}")
            text = tokenizer.apply_chat_template(obj["messages"], tokenize=False, add_generation_prompt=True)
            texts.append(text)
            ids.append(tokenizer.encode(text, add_special_tokens=False))
            chat = True
    return Prompts(str(path), texts, ids, chat)
