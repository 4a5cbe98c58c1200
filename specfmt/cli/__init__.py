"""The ``specfmt`` command line: a thin layer over the package, one module per command group.

* :mod:`~specfmt.cli.convert`: ``convert``, ``upgrade``;
* :mod:`~specfmt.cli.validate`: ``validate`` (and ``--run``), ``inspect``, ``serve-command``;
* :mod:`~specfmt.cli.pad_vocab`: ``pad-vocab`` (a draft model's vocabulary rows made the verifier's);
* :mod:`~specfmt.cli.push`: ``push``;
* :mod:`~specfmt.cli.train`: ``train ALGORITHM``, ``train fill``;
* :mod:`~specfmt.cli.datagen`: ``datagen``;
* :mod:`~specfmt.cli.regenerate`: ``regenerate`` (the verifier rewrites the assistant turns);
* :mod:`~specfmt.cli.common`: consoles, the one-line error, tables.

User errors (:class:`specfmt.errors.SpecfmtError`) print one line and exit 2; a failed
validation exits 1; anything else is a bug and keeps its traceback. Heavy modules (torch,
transformers) are imported only inside the commands that need them.
"""

from __future__ import annotations

import sys

import typer

from .. import __version__
from ..errors import SpecfmtError
from . import compare, convert, datagen, pad_vocab, push, regenerate, train, validate
from .common import err, out, print_error, reported

app = typer.Typer(
    name="specfmt",
    help="Convert research speculative-decoding drafts to the standard speculators format, validate them, and serve them with `vllm serve DIR`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
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
    """Console entry point: usage errors exit 2 (click); user errors print one line and exit 2."""
    try:
        app()  # standalone: click handles --help, usage errors and typer.Exit itself
    except SpecfmtError as e:  # raised outside a command (never, today): the same one line
        print_error(e)
        sys.exit(e.exit_code)
    except SystemExit as e:
        if e.code == 130 and not reported["error"]:  # typer turns Ctrl-C (KeyboardInterrupt) into exit 130, silently
            err.print("interrupted; nothing was written to the output folder")
        raise
    except KeyboardInterrupt:
        err.print("interrupted; nothing was written to the output folder")
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
