"""``specfmt export --to sglang``: a draft written in the layout another engine's own draft class reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .common import ctrl_c_ends_in_one_line, json_option, out, report, reports_errors
from .output import writes


@ctrl_c_ends_in_one_line
@reports_errors
@writes("output", inputs=("src", "verifier"), force="force")
def export(
    src: str = typer.Argument(..., help="The draft: a specfmt folder (or Hub id)."),
    to: str = typer.Option(..., "--to", help="The engine: sglang (SGLang 0.5.23's own draft classes)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Output folder (created atomically)."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="The verifier (default: the one the draft's config names); its architecture decides how SGLang reads the tap ids."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision of the draft."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty output folder; never an input (OUT may not be, contain or lie inside one)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the config and the tensor names; write nothing."),
    as_json: bool = json_option(),
) -> None:
    """Write a draft in the layout SGLang's own draft class loads, exactly, or refuse with the reason."""
    from ..export import export as run
    from ..serving import sglang_serve_command

    result = run(src, output, to=to, verifier=verifier, force=force, dry_run=dry_run, revision=revision)
    layout = result.layout
    report(engine=to, draft=str(result.draft), out=None if dry_run else str(result.out), names=dict(layout.names), dropped=dict(layout.dropped),
           config=result.config, notes=list(result.notes), dry_run=dry_run)
    for note in result.notes:
        out.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    if dry_run:
        for ours, theirs in sorted(layout.names.items()):
            out.print(f"{ours} -> {theirs}", markup=False, highlight=False)
        for name, why in sorted(layout.dropped.items()):
            out.print(f"{name} -> (not written: {why})", markup=False, highlight=False, soft_wrap=True)
        for name, (why, _) in sorted(layout.derived.items()):
            out.print(f"(made) -> {name}: {why}", markup=False, highlight=False, soft_wrap=True)
        out.print_json(json.dumps(result.config))
        out.print("dry run: nothing written")
        return
    made = f", {len(layout.derived)} made for SGLang's class" if layout.derived else ""
    out.print(f"exported {result.draft} -> {result.out} for SGLang: {len(layout.names)} tensors "
              f"({sum(a != b for a, b in layout.names.items())} renamed, {len(layout.dropped)} not written{made})", markup=False, highlight=False, soft_wrap=True)
    line = sglang_serve_command(result.config, str(result.out))
    report(serve_line=line.line)
    out.print(f"serve it with {line.releases}: {line.line}", markup=False, highlight=False, soft_wrap=True)
