"""What the commands share: the consoles, the error line, tables and option parsing.

A user error (:class:`specfmt.errors.SpecfmtError`) becomes one line on stderr --
``specfmt: error: what [where]; how to fix`` -- and the exit code of its class (2; 130 for an
interrupted run), in every command (:func:`reports_errors`), so the same holds under
``typer.testing.CliRunner`` as at the terminal. Anything else is a bug and keeps its traceback.

``--json`` (every command has it; :data:`JSON_OPTION`) goes through the same wrapper: stdout is then one JSON
object of one shape, ``{"command", "ok", "error", ...}`` (:data:`JSON_KEYS`; the command's own fields, which it
gives with :func:`report`, follow), whatever the outcome, and nothing else; stderr keeps the error line, notes and
progress.
Ctrl-C at any point of every command ends in one such line and exit 130 (:func:`ctrl_c_ends_in_one_line`,
:mod:`specfmt.interrupt`).
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any, Callable, Optional, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import interrupt
from ..errors import InputError, Interrupted, SpecfmtError

out = Console()
err = Console(stderr=True)

STATUS_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim"}
DTYPES = ("float16", "bfloat16", "float32")

F = TypeVar("F", bound=Callable[..., Any])

#: set once a command has printed its error line (main() then prints nothing more)
reported = {"error": False}


def print_error(e: SpecfmtError) -> None:
    err.print(f"specfmt: error: {e.one_line()}", markup=False, highlight=False, soft_wrap=True)
    reported["error"] = True


#: the keys of every command's ``--json`` object, first: the command (``convert``, ``train eagle3``), whether it
#: succeeded (exit code 0), and the error (None, or ``{type, message, where, hint, exit_code}``); the command's own
#: fields follow (docs/commands/index.md, "JSON output")
JSON_KEYS = ("command", "ok", "error")
#: the ``--json`` option every command declares as ``as_json``
JSON_OPTION_HELP = "Print one JSON object on stdout instead of the human output: {\"command\", \"ok\", \"error\", ...}."

#: the fields the running command reports for ``--json`` (:func:`report`), None outside a ``--json`` run
_reported: dict[str, Any] | None = None


def json_option() -> Any:
    """The ``--json`` option (``as_json: bool = json_option()``)."""
    return typer.Option(False, "--json", help=JSON_OPTION_HELP)


def report(**fields: Any) -> None:
    """Give the running command's fields for its ``--json`` object (later calls add to and replace earlier ones);
    nothing without ``--json``. ``ok`` may be given, when the command knows better than its exit code.

    Raises:
        ValueError: a field named ``command`` or ``error`` (the wrapper's own; a bug of the command).
    """
    if {"command", "error"} & set(fields):
        raise ValueError(f"report(): {sorted({'command', 'error'} & set(fields))} are the --json object's own keys")
    if _reported is not None:
        _reported.update(fields)


def error_json(e: SpecfmtError) -> dict[str, Any]:
    """A user error as the ``error`` field of a ``--json`` object."""
    return {"type": type(e).__name__, "message": e.message, "where": e.where, "hint": e.hint, "exit_code": e.exit_code}


def reports_errors(fn: F) -> F:
    """Wrap a command: a :class:`SpecfmtError` prints one line and exits with its code.

    With ``--json`` (the ``as_json`` argument) stdout is one JSON object instead of the human output: :data:`JSON_KEYS`
    and what the command :func:`report` ed. The command is named by ``wrapper.command`` where its name is not its
    function's (``train eagle3``), else by the function's name with ``-`` for ``_``. The error line still goes to
    stderr."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _reported
        if not kwargs.get("as_json"):
            try:
                return fn(*args, **kwargs)
            except SpecfmtError as e:
                print_error(e)
                raise typer.Exit(e.exit_code) from None
        # the command's name: set on the wrapper where it is not the function's (``train eagle3``), else the function's
        command = getattr(wrapper, "command", None) or fn.__name__.replace("_", "-")
        saved, _reported = out.quiet, {}
        out.quiet = True  # stdout holds the JSON object alone (it says what the human output says); stderr as ever
        code, error = 0, None
        try:
            fn(*args, **kwargs)
        except SpecfmtError as e:
            print_error(e)
            code, error = e.exit_code, error_json(e)
        except typer.Exit as e:
            code = e.exit_code
        finally:
            fields, _reported = _reported, None
            out.quiet = saved
        ok = fields.pop("ok", code == 0) and code == 0
        sys.stdout.write(json.dumps({"command": command, "ok": ok, "error": error, **fields}, default=str) + "\n")
        sys.stdout.flush()
        if code:
            raise typer.Exit(code)
        return None

    return wrapper  # type: ignore[return-value]


#: the line of a Ctrl-C no code of the command turned into its own (it stopped before writing anything)
NOTHING_WRITTEN = "nothing was written"


def _interrupted_line() -> None:
    """Print the one line of an interruption, unless the command printed its own."""
    if not reported["error"]:
        print_error(interrupt.interruption() or Interrupted(f"interrupted; {NOTHING_WRITTEN}"))


def name_command(fn: Any, name: str) -> Any:
    """Name a command for its ``--json`` object (``train fill``, where the callback is ``fill``): the name is set on
    every wrapper of the callback (the ``__wrapped__`` chain), so :func:`reports_errors` finds it whichever decorators
    are outside it."""
    layer = fn
    while layer is not None:
        layer.command = name
        layer = getattr(layer, "__wrapped__", None)
    return fn


def ctrl_c_ends_in_one_line(fn: F) -> F:
    """Wrap a command: Ctrl-C (SIGINT) at any point ends it in one line on stderr and exit 130, within a bound, with no
    half-written file and no engine process left (:mod:`specfmt.interrupt`: the handler, the watchdog, the engine
    groups). A ``KeyboardInterrupt`` the command's own code did not turn into an
    :class:`~specfmt.errors.Interrupted` (which says what was kept, and :func:`reports_errors` prints) prints
    "interrupted; nothing was written", or the error :func:`specfmt.interrupt.describe` registered.

    Every command callback wears it (``tests/test_ctrl_c.py`` walks the typer app's command tree)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with interrupt.guard(_interrupted_line):
            try:
                return fn(*args, **kwargs)
            except KeyboardInterrupt:
                _interrupted_line()
                raise typer.Exit(Interrupted.exit_code) from None

    wrapper.ctrl_c_ends_in_one_line = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def print_serving(cfg: dict[str, Any], draft: str) -> None:
    """The ``vllm serve`` line(s) for a draft just written (:func:`specfmt.serving.serving_lines`);
    nothing for a config that is not schema-valid (``push --no-validate``)."""
    from ..algorithms import schema_violations
    from ..serving import serving_lines

    if schema_violations(cfg):
        return
    for line in serving_lines(cfg, draft):
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def parse_layers(text: Optional[str], option: str = "--aux-layers") -> Optional[list[int]]:
    """``"2,16,29"`` -> ``[2, 16, 29]``.

    Raises:
        InputError: not a comma-separated list of integers.
    """
    if text is None:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise InputError(f"{option} {text!r} is not a comma-separated list of layer ids, e.g. 2,16,29") from None


def checks_table(rep, title: str) -> Table:
    table = Table(title=title)
    table.add_column("check")
    table.add_column("status")
    table.add_column("result", overflow="fold")
    for c in rep.checks:
        detail = c.summary
        if c.details and c.status in ("fail", "warn"):
            detail += "".join(f"\n  - {d}" for d in c.details[:20]) + (f"\n  ... {len(c.details) - 20} more" if len(c.details) > 20 else "")
        # findings quote paths and config values ("[/tmp/x]", "[1, 2]"): never rich markup
        table.add_row(c.name, f"[{STATUS_STYLE[c.status]}]{c.status}[/]", escape(detail))
    return table


def figures_table(res) -> Table:
    """Reference and vLLM side by side: acceptance rate per position, mean acceptance length, counts."""
    ref, vl = res.reference or {}, res.vllm or {}
    hf = getattr(res, "transformers", None)  # a method transformers runs (a draft model) has a third column
    cols = [ref, vl] + ([hf] if hf else [])
    table = Table(title=f"acceptance, k={res.k}, {len(res.prompts.ids) if res.prompts else 0} prompts x {res.max_tokens} tokens")
    table.add_column("")
    table.add_column(f"reference ({ref.get('dtype', '-')})", justify="right")
    table.add_column(f"vLLM ({vl.get('dtype', '-')})", justify="right")
    if hf:
        table.add_column(f"transformers ({hf.get('dtype', '-')})", justify="right")

    def cell(d, key, i=None):
        v = d.get(key)
        if v is None:
            return "-"
        if i is not None:
            return f"{v[i]:.3f}" if i < len(v) else "-"
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    for i in range(max([res.k] + [len(d.get("acceptance_rate_per_position") or []) for d in cols])):
        table.add_row(f"acceptance rate, position {i + 1}", *[cell(d, "acceptance_rate_per_position", i) for d in cols])
    table.add_row("mean acceptance length", *[cell(d, "mean_acceptance_length") for d in cols])
    if any(d.get("steps") for d in cols):  # per verifier pass over every step: below the line above when steps go undrafted
        table.add_row("tokens per verifier pass (every step)", *[cell(d, "tokens_per_step") for d in cols])
    table.add_row("drafts", *[cell(d, "num_drafts") for d in cols])
    table.add_row("accepted / draft tokens", *[f"{d.get('num_accepted_tokens', '-')} / {d.get('num_draft_tokens', '-')}" for d in cols])
    return table


def beside_table(res) -> Table:
    """The draft and the free methods on the same prompts, per verifier forward pass over every step (``res.beside``)."""
    b = res.beside
    table = Table(title=f"beside the draft: the same prompts, per verifier pass over every step (reference, k={res.k})",
                  caption=escape(f"estimated speedup: {b['cost_model']}"))
    for col in ("method", "acceptance rate per position", "tokens per pass", "drafted steps", "est. speedup"):
        table.add_column(col)
    d = b["draft"]
    table.add_row("the draft", " ".join(f"{r:.3f}" for r in d["rate_per_step"]), f"{d['tokens_per_step']:.3f}", "-",
                  "-" if d["estimated_speedup"] is None else f"{d['estimated_speedup']:.2f}x")
    for m in b["methods"]:
        if "not_measured" in m:
            table.add_row(escape(m["title"]), "not measured on this machine (below)", "", "", "")
        else:
            table.add_row(escape(m["title"]), " ".join(f"{r:.3f}" for r in m["rate_per_step"]), f"{m['tokens_per_step']:.3f}",
                          f"{m['drafted_steps']} of {m['steps']}", "-" if m["estimated_speedup"] is None else f"{m['estimated_speedup']:.2f}x")
    return table


#: the prompts of lowest mean acceptance length ``validate --run`` lists (validation.json holds every prompt's)
WORST_PROMPTS = 3


def diagnosis_tables(res: Any) -> list[Any]:
    """``validate --run``'s diagnosis (:mod:`specfmt.validation.diagnosis`), printed after the figures: acceptance per
    position beside the training log's figures ("n/a" where the provenance records none), the verifier's greedy tokens
    outside the draft vocabulary with the top offenders, the prompts of lowest acceptance, and the hint."""
    diag, ref = res.diagnosis, res.reference or {}
    logs = diag["training_log"]
    pos = Table(title="acceptance per position, and the training log")
    pos.add_column("position")
    pos.add_column("reference acceptance rate", justify="right")
    for log in logs or [{"label": "training log", "per_position": []}]:
        pos.add_column(escape(log["label"]), justify="right")
    rates = ref.get("acceptance_rate_per_position") or []
    for i, rate in enumerate(rates):
        logged = [log["per_position"] for log in logs]
        pos.add_row(str(i + 1), f"{rate:.3f}", *([f"{v[i]:.3f}" if i < len(v) else "n/a" for v in logged] or ["n/a"]))
    cov = diag["vocab_coverage"]
    shown: list[Any] = [pos, f"draft vocabulary: {cov['draft_vocab_size']} of {cov['vocab_size']} ids; {cov['outside']} of the verifier's "
                        f"{cov['tokens']} greedy tokens ({100 * cov['share_outside']:.1f} %) are outside it"]
    if cov["offenders"]:
        off = Table(title="greedy tokens the draft cannot propose")
        for col in ("id", "text", "count"):
            off.add_column(col, justify="left" if col == "text" else "right")
        for o in cov["offenders"]:
            off.add_row(str(o["id"]), escape(repr(o["text"])) if o["text"] is not None else "-", str(o["count"]))
        shown.append(off)
    worst = sorted(diag["per_prompt"], key=lambda p: (p["mean_acceptance_length"], p["index"]))[:WORST_PROMPTS]
    if worst:
        tab = Table(title=f"lowest acceptance: {len(worst)} of {len(diag['per_prompt'])} prompts")
        for col in ("prompt", "mean acceptance length", "accepted / drafts", "outside vocabulary", "begins"):
            tab.add_column(col, justify="left" if col == "begins" else "right")
        for p in worst:
            tab.add_row(str(p["index"]), f"{p['mean_acceptance_length']:.3f}", f"{p['accepted']} / {p['drafts']}", str(p.get("outside", "-")), escape(" ".join(p["prompt"].split())[:30]))
        shown.append(tab)
    if diag.get("hint"):
        shown.append(f"[yellow]hint:[/] {escape(diag['hint'])}")
    return shown


def verdict(rep: Any) -> str:
    """The last line of ``specfmt validate``: passed, failed, or recognised without being validated."""
    if any(c.name == "schema" and c.status == "warn" for c in rep.checks):
        return "[yellow]recognised, not validated by this specfmt version[/] (see schema)"
    return "[green]all checks passed[/]" if rep.ok else "[bold red]validation failed[/]"
