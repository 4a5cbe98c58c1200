"""The ``specfmt`` command line: a thin layer over the package, one module per command group.

* :mod:`~specfmt.cli.convert`: ``convert``, ``upgrade``;
* :mod:`~specfmt.cli.export`: ``export --to sglang``;
* :mod:`~specfmt.cli.validate`: ``validate`` (and ``--run``), ``inspect``, ``serve-command``;
* :mod:`~specfmt.cli.pad_vocab`: ``pad-vocab`` (a draft model's vocabulary rows made the verifier's);
* :mod:`~specfmt.cli.push`: ``push``;
* :mod:`~specfmt.cli.train`: ``train ALGORITHM``, ``train fill``;
* :mod:`~specfmt.cli.datagen`: ``datagen``;
* :mod:`~specfmt.cli.regenerate`: ``regenerate`` (the verifier rewrites the assistant turns);
* :mod:`~specfmt.cli.common`: consoles, the one-line error, tables;
* :mod:`~specfmt.cli.output`: ``@writes``, the declaration every command with ``-o`` wears (its OUT and its
  inputs), checked before the command runs: OUT is never an input, never inside one, never around one.

User errors (:class:`specfmt.errors.SpecfmtError`) print one line and exit 2; a failed
validation exits 1; Ctrl-C prints one line and exits 130 (:mod:`specfmt.interrupt`); anything else
is a bug and keeps its traceback. Heavy modules (torch, transformers) are imported only inside the
commands that need them.
"""

from __future__ import annotations

import sys

import typer

from .. import __version__, interrupt
from ..errors import Interrupted, SpecfmtError
from . import compare, convert, datagen, export, pad_vocab, push, regenerate, train, validate
from .common import NOTHING_WRITTEN, out, print_error, reported

app = typer.Typer(
    name="specfmt",
    help="Convert research speculative-decoding drafts to the standard speculators format, validate them, and serve them with `vllm serve DIR`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,  # click's help: option names never cut, no type placeholder for a flag, at any width (issue 35)
)

def _version(value: bool) -> None:
    if value:
        out.print(f"specfmt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    pass


app.command(name="convert")(convert.convert)
app.command(name="upgrade")(convert.upgrade)
app.command(name="export")(export.export)
app.command(name="validate")(validate.validate)
app.command(name="inspect")(validate.inspect)
app.command(name="serve-command")(validate.serve_command)
app.command(name="compare")(compare.compare)
app.command(name="pad-vocab")(pad_vocab.pad_vocab)
app.command(name="push")(push.push)
app.add_typer(train.train_app, name="train")
app.command(name="datagen")(datagen.datagen)
app.command(name="regenerate")(regenerate.regenerate)


def main() -> None:
    """Console entry point: usage errors exit 2 (click); user errors print one line and exit 2; Ctrl-C prints one
    line and exits 130, at once after the line (:func:`specfmt.interrupt.exit_now`: no library's exit-time handler
    runs, and no child process outlives the command)."""
    try:
        app()  # standalone: click handles --help, usage errors and typer.Exit itself
    except SpecfmtError as e:  # raised outside a command (never, today): the same one line
        print_error(e)
        sys.exit(e.exit_code)
    except SystemExit as e:
        if e.code == Interrupted.exit_code:  # typer turns a KeyboardInterrupt outside a command into exit 130, silently
            if not reported["error"]:
                print_error(Interrupted(f"interrupted; {NOTHING_WRITTEN}"))
            interrupt.exit_now(Interrupted.exit_code)
        raise
    except KeyboardInterrupt:
        if not reported["error"]:
            print_error(Interrupted(f"interrupted; {NOTHING_WRITTEN}"))
        interrupt.exit_now(Interrupted.exit_code)


if __name__ == "__main__":  # pragma: no cover
    main()
