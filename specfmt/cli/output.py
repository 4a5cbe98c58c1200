"""The one output mechanism of the command line: a command that writes declares its OUT and its inputs.

Every command with an output option wears :func:`writes`, directly under
:func:`~specfmt.cli.common.reports_errors` (so that a refusal is one line and exit 2)::

    @reports_errors
    @writes("output", inputs=("src", "verifier"), force="force")
    def convert(src: str = typer.Argument(...), output: Optional[Path] = typer.Option(None, "-o", "--output"),
                verifier: str = typer.Option(..., "--verifier"), force: bool = typer.Option(False, "--force"), ...):
        ...

The declaration names parameters of the command, never flags: ``out`` is the OUT parameter,
``inputs`` every parameter that names something the command reads (a folder, a file, a Hub id; a
repeatable option counts each value), ``force`` the flag that allows replacing an earlier output,
``continues`` the check that lets a command continue its own earlier output instead (``datagen``,
``regenerate --resume``), ``beside`` the suffixes of what it writes next to OUT (``OUT.train-state``,
``OUT.provenance.json``). Before the body runs, before any model, tokenizer or Hub download is
touched, OUT is checked against every input by :func:`specfmt.checkpoint.output.check_output`:

* OUT is never an input, never inside one, and never contains one; no option (``--force`` included)
  lifts this. An input that is a Hub id counts as its whole folder in the Hugging Face cache.
* OUT is of its kind (a folder, or a file), and is new, empty, replaced with ``force``, or this
  command's own earlier output that ``continues`` accepts.

The refusal is one line naming the input (``the output folder lies inside --verifier V``), and
nothing has been written. The library functions behind the commands check OUT again against what
only they learn (the verifier a config names, a Hub id's snapshot): the CLI's check is the minimum
every command gets.

``tests/test_outputs.py`` walks the typer app (:func:`typer.main.get_command`), finds every command
with an output option (``-o``), fails on one that does not wear :func:`writes`, and tries OUT = each
declared input, OUT inside it, OUT around it, and each path beside OUT on each input.
"""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

from ..checkpoint.output import Input, check_output

F = TypeVar("F", bound=Callable[..., Any])

#: the attribute :func:`writes` sets on a command's callback (kept through ``functools.wraps``: reports_errors, typer)
MARK = "__specfmt_writes__"

#: ``continues`` of a declaration: ``(OUT, the command's arguments by parameter name)``; raises a SpecfmtError unless OUT
#: (which exists: a non-empty folder, or a file) is this command's own earlier output, which it may continue
Continues = Callable[[Path, Mapping[str, Any]], None]


@dataclass(frozen=True)
class Writes:
    """A command's output declaration (:func:`writes`).

    Attributes:
        out: the OUT parameter's name. out_label: how the command line names it (``-o``).
        kind: ``folder`` or ``file``.
        inputs: each input parameter's name, with the label a refusal quotes (``SRC``, ``--verifier``).
        force: the parameter that allows replacing an earlier OUT (None: the command has none).
        continues: see :data:`Continues` (None: an existing OUT is replaced with ``force``, or refused).
        beside: suffixes of the paths written next to OUT.
    """

    out: str
    out_label: str
    kind: str
    inputs: dict[str, str]
    force: Optional[str] = None
    continues: Optional[Continues] = None
    beside: tuple[str, ...] = field(default=())

    def inputs_of(self, args: Mapping[str, Any]) -> list[Input]:
        """The inputs the arguments name, in declaration order (a repeatable option: each value)."""
        found: list[Input] = []
        for name, label in self.inputs.items():
            value = args.get(name)
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if v is not None and str(v) != "":  # an empty value names nothing (the command refuses it)
                    found.append(input_of(label, v))
        return found

    def check(self, args: Mapping[str, Any]) -> None:
        """Refuse OUT as :func:`specfmt.checkpoint.output.check_output` does; nothing when OUT is not given (a dry run).

        Raises:
            OutputOverlapError, OutputExistsError: see :func:`~specfmt.checkpoint.output.check_output`;
            SpecfmtError: what ``continues`` raises.
        """
        out = args.get(self.out)
        if out is None:
            return
        force = bool(args.get(self.force)) if self.force else False
        continues = (lambda o: self.continues(o, args)) if self.continues else None  # type: ignore[misc]
        check_output(Path(str(out)), force, self.inputs_of(args), kind=self.kind, continues=continues, beside=self.beside)


def input_of(label: str, ref: "str | os.PathLike[str]") -> Input:
    """The input behind one argument, known before anything is read: the path as given, or for a Hub id
    (``OWNER/NAME`` naming no local path) its repo folder in the Hugging Face cache, where a download goes."""
    from ..sources.resolve import hub_cache_folder, is_hub_id

    text = str(ref)
    path = Path(text).expanduser()
    if os.path.lexists(path) or not is_hub_id(text):
        return Input(label, path)
    return Input(label, hub_cache_folder(text), hub=text)


def label_of(param: inspect.Parameter) -> str:
    """How the command line names a parameter: an option by its first long flag (``--verifier``), an argument
    by its metavar or its name in capitals (``SRC``)."""
    from typer.models import ArgumentInfo, OptionInfo

    info = param.default
    if isinstance(info, OptionInfo):
        decls = [d for d in (info.param_decls or ()) if d.startswith("-")]
        longs = [d.split("/")[0] for d in decls if d.startswith("--")]
        return (longs or decls or [f"--{param.name.replace('_', '-')}"])[0]
    if isinstance(info, ArgumentInfo):
        return info.metavar or param.name.upper()
    return param.name


def writes(out: str = "output", *, inputs: Sequence[str], kind: str = "folder", force: Optional[str] = None,
           continues: Optional[Continues] = None, beside: Sequence[str] = ()) -> Callable[[F], F]:
    """Declare what a command writes and reads; OUT is checked (:meth:`Writes.check`) before the command's body runs.

    Args:
        out: the name of the OUT parameter.
        inputs: the names of every parameter that names an input.
        kind: ``folder`` or ``file``: what OUT is.
        force: the name of the flag that allows replacing an existing OUT.
        continues: accepts an existing OUT this command may continue (:data:`Continues`).
        beside: suffixes of the paths written next to OUT (``.train-state``).

    Raises:
        TypeError: (at import, a specfmt bug) a name is not a parameter of the command, or ``kind`` is unknown.
    """
    if kind not in ("folder", "file"):
        raise TypeError(f"kind must be folder or file, not {kind!r}")

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)
        missing = [n for n in (out, *inputs, *([force] if force else [])) if n not in sig.parameters]
        if missing:
            raise TypeError(f"@writes on {fn.__name__}: {missing} are not parameters of the command")
        spec = Writes(out, label_of(sig.parameters[out]), kind, {n: label_of(sig.parameters[n]) for n in inputs}, force, continues,
                      tuple(beside))

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind_partial(*args, **kwargs)
            spec.check(bound.arguments)
            return fn(*args, **kwargs)

        setattr(checked, MARK, spec)
        return checked  # type: ignore[return-value]

    return decorate


def declaration(callback: Optional[Callable[..., Any]]) -> Optional[Writes]:
    """The :class:`Writes` a command's callback wears (through any ``functools.wraps`` wrapper), or None."""
    return getattr(callback, MARK, None)


__all__ = ["MARK", "Continues", "Writes", "declaration", "input_of", "label_of", "writes"]
