"""``specfmt convert`` and ``specfmt upgrade``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from typing import TYPE_CHECKING

from ..converters import Options, from_choices
from ..errors import InputError, SpecfmtError
from .common import DTYPES, ctrl_c_ends_in_one_line, err, json_option, out, parse_layers, print_serving, report, reports_errors
from .output import writes

if TYPE_CHECKING:  # pragma: no cover
    from ..convert import ConvertResult
    from ..sources.verifier import Verifier


def _run_convert(source_format: str, src: str, output: Optional[Path], verifier: "str | Verifier", opts: Options, *, force: bool, dry_run: bool,
                 revision: Optional[str]) -> "ConvertResult":
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from ..convert import convert as run

    if opts.dtype not in (None, *DTYPES):
        raise InputError(f"--dtype must be float16, bfloat16 or float32, not {opts.dtype!r}")
    if output is None and not dry_run:
        raise InputError("-o OUT is required (or use --dry-run)")
    progress = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal)
    with progress:
        task = progress.add_task("writing tensors", total=None)
        result = run(source_format, src, output, verifier, opts=opts, force=force, dry_run=dry_run, revision=revision, progress=lambda done, total: progress.update(task, completed=done, total=total))
    plan = result.plan
    counts = {a: sum(m.action == a for m in plan.moves) for a in ("rename", "keep", "drop", "fold")}
    report(source=src, source_format=plan.source_format, layout=plan.layout, output=None if dry_run else str(result.out), dry_run=dry_run,
           tensors={"written": len(plan.written) + len(plan.derived), "renamed": counts["rename"], "kept": counts["keep"],
                    "dropped": counts["drop"], "folded": counts["fold"], "derived": len(plan.derived)},
           bytes=None if dry_run else result.bytes_written, notes=list(plan.notes), config=result.config, serve=_serve_lines(result.config, result.out))
    if dry_run:
        table = Table(title=f"plan: {plan.source_format} ({plan.layout}) -> specfmt", show_lines=False)
        for col in ("source tensor", "action", "output tensor", "shape", "dtype"):
            table.add_column(col, overflow="fold")
        for m in plan.moves:
            dt = m.info.dtype if m.out_dtype == m.info.dtype else f"{m.info.dtype}->{m.out_dtype}"
            action = f"{m.action}: {m.reason}" if m.action in ("drop", "fold") else m.action
            table.add_row(escape(m.src), escape(action), escape(m.dst or "-"), str(list(m.info.shape)), dt)
        for d in plan.derived:
            table.add_row("-", f"derive: {d.how}", d.dst, str(list(d.shape)), d.out_dtype)
        out.print(table)
        for note in plan.notes:
            out.print(f"note: {note}", markup=False)
        out.print("output config.json:")
        out.print_json(json.dumps(result.config))
        out.print("dry run: nothing written")
        return result
    for note in plan.notes:
        err.print(f"note: {note}", markup=False)
    folded = f", {counts['fold']} folded into {len(plan.derived)} derived" if counts["fold"] or plan.derived else ""
    out.print(
        f"converted {src} ({plan.source_format}, {plan.layout}) -> {result.out}: {len(plan.written) + len(plan.derived)} tensors "
        f"({counts['rename']} renamed, {counts['keep']} kept, {counts['drop']} dropped{folded}), {result.bytes_written / 2**20:.1f} MiB"
    )
    print_serving(result.config, str(result.out))
    return result



def _serve_lines(cfg: dict, out_folder: "Path | None") -> list[str]:
    """The serving lines printed after a write (:func:`specfmt.serving.serving_lines`), for ``--json``."""
    from ..algorithms import schema_violations
    from ..serving import serving_lines

    return [] if out_folder is None or schema_violations(cfg) else serving_lines(cfg, str(out_folder))


@ctrl_c_ends_in_one_line
@reports_errors
@writes("output", inputs=("src", "verifier"), force="force")
def convert(
    src: str = typer.Argument(..., help="Source checkpoint: a folder or a Hub id (OWNER/NAME)."),
    source_format: str = typer.Option(..., "--from", help=f"Source format: {from_choices()}, or auto."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Output folder (created atomically)."),
    verifier: str = typer.Option(..., "--verifier", help="The verifier (target) model: a folder or a Hub id. Written as a Hub id or an absolute path."),
    speculative_tokens: Optional[int] = typer.Option(None, "--speculative-tokens", min=1, max=64, help="Speculative tokens vLLM drafts per step (default: 3; Medusa: its number of heads)."),
    aux_layers: Optional[str] = typer.Option(None, "--aux-layers", help="EAGLE-3 tap layer ids in vLLM's convention (the state entering layer j), e.g. 2,16,29 (default: from the source, else (2, N//2, N-3))."),
    tap_ids: Optional[str] = typer.Option(None, "--tap-ids", help="EAGLE-3, SpecForge/ModelOpt eagle_config tap ids: layer-output (SGLang/SpecForge; written +1) or layer-input (vLLM; written as given). Required when the source has such ids."),
    mask_token_id: Optional[int] = typer.Option(None, "--mask-token-id", min=0, help="P-EAGLE/DFlash: the mask token the draft was trained with, where the source does not record it (SpecForge's P-EAGLE)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Cast floating tensors to float16, bfloat16 or float32 (default: keep)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision of the source."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty output folder; never an input (OUT may not be, contain or lie inside one)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (tensor mapping, output config); write nothing."),
    as_json: bool = json_option(),
) -> None:
    """Convert a research draft checkpoint into the specfmt format that `vllm serve OUT` runs."""
    opts = Options(speculative_tokens=speculative_tokens, aux_layers=parse_layers(aux_layers), dtype=dtype, tap_ids=tap_ids, mask_token_id=mask_token_id)
    _run_convert(source_format, src, output, verifier, opts, force=force, dry_run=dry_run, revision=revision)


@ctrl_c_ends_in_one_line
@reports_errors
@writes("output", inputs=("src", "verifier"), force="force")
def upgrade(
    src: str = typer.Argument(..., help="A speculators-format checkpoint (speculators 0.1-0.9, NVIDIA ModelOpt): folder or Hub id."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Output folder (created atomically)."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="The verifier (default: speculators_config.verifier.name_or_path of SRC)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision of the source."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty output folder; never an input (OUT may not be, contain or lie inside one)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the changes; write nothing."),
    as_json: bool = json_option(),
) -> None:
    """Rewrite an older speculators checkpoint in the current format and print what changed (= convert --from speculators)."""
    from ..convert import check_upgradable, config_changes, source_config
    from ..format.config import verifier_ref
    from ..sources.resolve import relative_to
    from ..sources.verifier import Verifier

    old = source_config(src, revision=revision)
    check_upgradable(src, old, revision=revision, out=None if output is None else str(output), verifier=verifier)
    resolved: "str | Verifier | None" = verifier
    if resolved is None:
        named = verifier_ref(old)
        if named is None:
            raise InputError("SRC names no verifier (speculators_config.verifier.name_or_path); pass --verifier")
        named = relative_to(named, src)  # a relative path in SRC's config is SRC's, not the working directory's
        try:
            resolved = Verifier.load(named)
        except SpecfmtError as e:
            raise InputError(f"the verifier SRC names ({named}) is not reachable: {e.message}", hint="pass --verifier FOLDER_OR_HUB_ID") from None
    result = _run_convert("speculators", src, output, resolved, Options(), force=force, dry_run=dry_run, revision=revision)
    changes = config_changes(old, result.config)
    report(changes=changes)
    out.print(f"config.json: {len(changes)} change(s)" + (":" if changes else " (already current)"))
    for line in changes:
        out.print(f"  {line}", markup=False, highlight=False)
