"""The ``specfmt`` command line: a thin layer over convert, validate and detect.

User errors (:class:`specfmt.errors.SpecfmtError`) print one line and exit 2;
a failed validation exits 1; anything else is a bug and keeps its traceback.
Heavy modules (torch, transformers) are imported only inside the commands that need them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from .errors import SpecfmtError

app = typer.Typer(
    name="specfmt",
    help="Convert research speculative-decoding drafts to the standard speculators format, validate them, and serve them with `vllm serve DIR`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
out = Console()
err = Console(stderr=True)

STATUS_STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim"}


def _version(value: bool) -> None:
    if value:
        out.print(f"specfmt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    pass


def _parse_layers(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a comma-separated list of layer ids, e.g. 2,16,29") from None


DTYPES = ("float16", "bfloat16", "float32")


def _run_convert(source_format: str, src: str, output: Optional[Path], verifier: str, opts, *, force: bool, dry_run: bool, revision: Optional[str]):
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from .convert import convert as run

    if opts.dtype not in (None, *DTYPES):
        raise typer.BadParameter(f"--dtype must be float16, bfloat16 or float32, not {opts.dtype!r}")
    if output is None and not dry_run:
        raise typer.BadParameter("-o OUT is required (or use --dry-run)")
    progress = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal)
    with progress:
        task = progress.add_task("writing tensors", total=None)
        result = run(source_format, src, output, verifier, opts=opts, force=force, dry_run=dry_run, revision=revision, progress=lambda done, total: progress.update(task, completed=done, total=total))
    plan = result.plan
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
    counts = {a: sum(m.action == a for m in plan.moves) for a in ("rename", "keep", "drop", "fold")}
    folded = f", {counts['fold']} folded into {len(plan.derived)} derived" if counts["fold"] or plan.derived else ""
    out.print(
        f"converted {src} ({plan.source_format}, {plan.layout}) -> {result.out}: {len(plan.written) + len(plan.derived)} tensors "
        f"({counts['rename']} renamed, {counts['keep']} kept, {counts['drop']} dropped{folded}), {result.bytes_written / 2**20:.1f} MiB"
    )
    out.print(f"serve it with: vllm serve {result.out}", markup=False)
    return result


@app.command()
def convert(
    src: str = typer.Argument(..., help="Source checkpoint: a folder or a Hub id (OWNER/NAME)."),
    source_format: str = typer.Option(..., "--from", help="Source format: eagle3, eagle (EAGLE-1/2), hass, medusa, speculators (older speculators/ModelOpt checkpoints), or auto."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Output folder (created atomically)."),
    verifier: str = typer.Option(..., "--verifier", help="The verifier (target) model: a folder or a Hub id. Written as a Hub id or an absolute path."),
    speculative_tokens: Optional[int] = typer.Option(None, "--speculative-tokens", min=1, max=64, help="Speculative tokens vLLM drafts per step (default: 3; Medusa: its number of heads)."),
    aux_layers: Optional[str] = typer.Option(None, "--aux-layers", help="EAGLE-3 tap layer ids, e.g. 2,16,29 (default: from the source, else (2, N//2, N-3))."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Cast floating tensors to float16, bfloat16 or float32 (default: keep)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision of the source."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty output folder."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (tensor mapping, output config); write nothing."),
) -> None:
    """Convert a research draft checkpoint into the specfmt format that `vllm serve OUT` runs."""
    from specfmt.converters import Options

    opts = Options(speculative_tokens=speculative_tokens, aux_layers=_parse_layers(aux_layers), dtype=dtype)
    _run_convert(source_format, src, output, verifier, opts, force=force, dry_run=dry_run, revision=revision)


@app.command()
def upgrade(
    src: str = typer.Argument(..., help="A speculators-format checkpoint (speculators 0.1-0.9, NVIDIA ModelOpt): folder or Hub id."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Output folder (created atomically)."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="The verifier (default: speculators_config.verifier.name_or_path of SRC)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision of the source."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty output folder."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the changes; write nothing."),
) -> None:
    """Rewrite an older speculators checkpoint in the current format and print what changed (= convert --from speculators)."""
    from specfmt.converters import Options

    from .convert import config_changes, source_config

    from .convert import load_verifier
    from .errors import InputError

    old = source_config(src, revision=revision)
    if verifier is None:
        verifier = ((old.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
        if not isinstance(verifier, str) or not verifier:
            raise typer.BadParameter("SRC names no verifier (speculators_config.verifier.name_or_path); pass --verifier")
        try:
            load_verifier(verifier)
        except SpecfmtError as e:
            raise InputError(f"the verifier SRC names ({verifier}) is not reachable: {e.message}", hint="pass --verifier FOLDER_OR_HUB_ID") from None
    result = _run_convert("speculators", src, output, verifier, Options(), force=force, dry_run=dry_run, revision=revision)
    changes = config_changes(old, result.config)
    out.print(f"config.json: {len(changes)} change(s)" + (":" if changes else " (already current)"))
    for line in changes:
        out.print(f"  {line}", markup=False, highlight=False)


def _checks_table(rep, title: str) -> Table:
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


def _figures_table(res) -> Table:
    """Reference and vLLM side by side: acceptance rate per position, mean acceptance length, counts."""
    ref, vl = res.reference or {}, res.vllm or {}
    table = Table(title=f"acceptance, k={res.k}, {len(res.prompts.ids) if res.prompts else 0} prompts x {res.max_tokens} tokens")
    table.add_column("")
    table.add_column(f"reference ({ref.get('dtype', '-')})", justify="right")
    table.add_column(f"vLLM ({vl.get('dtype', '-')})", justify="right")

    def cell(d, key, i=None):
        v = d.get(key)
        if v is None:
            return "-"
        if i is not None:
            return f"{v[i]:.3f}" if i < len(v) else "-"
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    for i in range(res.k):
        table.add_row(f"acceptance rate, position {i + 1}", cell(ref, "acceptance_rate_per_position", i), cell(vl, "acceptance_rate_per_position", i))
    table.add_row("mean acceptance length", cell(ref, "mean_acceptance_length"), cell(vl, "mean_acceptance_length"))
    table.add_row("drafts", cell(ref, "num_drafts"), cell(vl, "num_drafts"))
    table.add_row("accepted / draft tokens", f"{ref.get('num_accepted_tokens', '-')} / {ref.get('num_draft_tokens', '-')}",
                  f"{vl.get('num_accepted_tokens', '-')} / {vl.get('num_draft_tokens', '-')}")
    return table


@app.command()
def validate(
    path: str = typer.Argument(..., help="Checkpoint folder (or Hub id)."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="Verifier to check against (default: the one named in config.json, when reachable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    run: bool = typer.Option(False, "--run", help="Also run the draft: the reference forward pass and vLLM, acceptance per position compared; writes validation.json into PATH."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="jsonl prompts ({\"prompt\": ...} or chat {\"messages\": [...]}) (default: a small built-in set)."),
    max_tokens: int = typer.Option(32, "--max-tokens", help="Tokens generated per prompt."),
    num_speculative_tokens: Optional[int] = typer.Option(None, "--num-speculative-tokens", help="Speculative tokens per step (default: the config's)."),
    min_acceptance_length: Optional[float] = typer.Option(None, "--min-acceptance-length", help="Fail below this mean acceptance length (tokens per step, counting the verifier's own)."),
    tolerance: float = typer.Option(0.1, "--tolerance", help="Largest allowed gap between vLLM's and the reference's acceptance rate at any position."),
    no_vllm: bool = typer.Option(False, "--no-vllm", help="With --run: the reference run only."),
    timeout: float = typer.Option(900, "--timeout", help="Seconds allowed for each vLLM engine."),
) -> None:
    """Check a specfmt checkpoint: schema, tensors, dtypes, NaN/Inf, vocabulary map, verifier; with --run, run the draft. Exit 0 only if all pass."""
    from .validate import validate_static

    if not run:
        if any(x is not None for x in (prompts, num_speculative_tokens, min_acceptance_length)) or no_vllm:
            raise typer.BadParameter("--prompts, --num-speculative-tokens, --min-acceptance-length and --no-vllm need --run")
        rep = validate_static(path, verifier)
        if as_json:
            out.print_json(json.dumps(rep.to_json()))
        else:
            out.print(_checks_table(rep, f"specfmt validate {rep.path}"))
            out.print("[green]all checks passed[/]" if rep.ok else "[bold red]validation failed[/]")
        raise typer.Exit(0 if rep.ok else 1)
    from .validate_run import validate_run

    res = validate_run(path, verifier=verifier, prompts=str(prompts) if prompts else None, max_tokens=max_tokens,
                       num_speculative_tokens=num_speculative_tokens, min_acceptance_length=min_acceptance_length,
                       tolerance=tolerance, use_vllm=not no_vllm, timeout=timeout)
    rep = res.report
    if as_json:
        out.print_json(json.dumps({**res.to_json(), "written": res.written}))
    else:
        out.print(_checks_table(rep, f"specfmt validate --run {rep.path}"))
        if res.reference or res.vllm:
            out.print(_figures_table(res))
        if res.causes:
            from .validate_run import CAUSES

            out.print("[bold red]likely causes:[/] " + "; ".join(f"{c} ({CAUSES.get(c, '')})" for c in res.causes))
        if res.written:
            out.print(f"wrote {res.written}", markup=False)
        out.print("[green]all checks passed[/]" if rep.ok else "[bold red]validation failed[/]")
    raise typer.Exit(0 if rep.ok else 1)


@app.command()
def inspect(path: str = typer.Argument(..., help="Checkpoint folder (or Hub id)."), as_json: bool = typer.Option(False, "--json", help="Print as JSON.")) -> None:
    """Detect which format a checkpoint folder is in (from tensor names and config fields) and summarise it."""
    from dataclasses import asdict

    from .detect import detect

    d = detect(path)
    if as_json:
        out.print_json(json.dumps(asdict(d)))
        return
    out.print(f"[bold]{d.format}[/] ({d.layout})")
    for e in d.evidence:
        out.print(f"  evidence: {e}", markup=False)
    table = Table(show_header=False)
    for k, v in d.summary.items():
        table.add_row(escape(k), escape(str(v)))
    out.print(table)
    if d.convert_hint:
        out.print(f"next: {d.convert_hint}", markup=False)


@app.command()
def push(
    folder: Path = typer.Argument(..., help="The checkpoint folder to publish (what `specfmt convert -o` or `specfmt train -o` wrote)."),
    repo_id: str = typer.Option(..., "--repo-id", help="OWNER/NAME on the Hub; created when missing."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Branch to commit to (default: main; created from main when missing)."),
    create_pr: bool = typer.Option(False, "--create-pr", help="Open a pull request instead of committing to the branch."),
    private: bool = typer.Option(False, "--private", help="Create the repo private (a push into an existing public repo is refused)."),
    verifier_id: Optional[str] = typer.Option(None, "--verifier-id", help="The verifier's Hub id, when config.json names it by a local path; written into the uploaded config.json and the card's base_model."),
    license: Optional[str] = typer.Option(None, "--license", help="The card's license, a Hub license id (e.g. apache-2.0, llama3.1)."),
    overwrite_card: bool = typer.Option(False, "--overwrite-card", help="Replace the folder's own README.md with a generated model card."),
    no_validate: bool = typer.Option(False, "--no-validate", help="Upload without the static validation and the validation.json check."),
    commit_message: Optional[str] = typer.Option(None, "--commit-message", "-m", help="The commit's summary (default: what the draft is)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (files, sizes, the card) and upload nothing."),
) -> None:
    """Publish a checkpoint folder to the Hugging Face Hub in one commit, with a model card (README.md) naming the verifier as base_model.

    The token comes from HF_TOKEN or `hf auth login` and is never printed.
    """
    from .push import plan_push, preview_remote
    from .push import push as run_push

    if no_validate:
        err.print("[yellow]warning:[/] --no-validate: uploading without checking the checkpoint")
    plan = plan_push(folder, repo_id, revision=revision, create_pr=create_pr, private=private, verifier_id=verifier_id, license=license,
                     overwrite_card=overwrite_card, validate=not no_validate, commit_message=commit_message)
    target = f"{plan.repo_id}@{plan.revision or 'main'}" + (" as a pull request" if plan.create_pr else "")
    for note in plan.notes:
        err.print(f"note: {note}", markup=False, highlight=False)
    if plan.checks is not None:
        out.print(f"static validation: {sum(c[1] == 'pass' for c in plan.checks)} passed, {sum(c[1] == 'warn' for c in plan.checks)} warnings, "
                  f"{sum(c[1] == 'skip' for c in plan.checks)} skipped")
    if dry_run:
        table = Table(title=f"push plan: {plan.folder} -> {target}")
        for col, just in (("file", "left"), ("size", "right"), ("note", "left")):
            table.add_column(col, justify=just, overflow="fold")
        for f in plan.files:
            table.add_row(f.path_in_repo, f"{f.size:,}", f.note)
        out.print(table)
        out.print(f"{len(plan.files)} files, {plan.total_bytes / 2**20:.2f} MiB; commit message: {plan.commit_message}", markup=False, soft_wrap=True)
        for line in preview_remote(plan):
            out.print(line, markup=False, highlight=False)
        out.print(f"model card ({plan.card_origin}):")
        out.print(plan.card, markup=False, highlight=False, soft_wrap=True)
        out.print("dry run: nothing uploaded")
        return
    res = run_push(plan, log=lambda s: err.print(s, markup=False, highlight=False))
    if res.unchanged:
        out.print(f"{target} already has these {len(plan.files)} files; nothing committed: {res.commit_url}", markup=False, soft_wrap=True)
    elif res.pr_url:
        out.print(f"opened a pull request on {plan.repo_id} with {len(plan.files)} files ({plan.total_bytes / 2**20:.2f} MiB): {res.pr_url}", markup=False, soft_wrap=True)
    else:
        out.print(f"pushed {len(plan.files)} files ({plan.total_bytes / 2**20:.2f} MiB) to {target}: {res.commit_url}", markup=False, soft_wrap=True)
    if not plan.revision and not plan.create_pr:
        out.print(f"serve it with: vllm serve {plan.repo_id}", markup=False)


def _add_train() -> None:
    from .cli_train import train_app

    app.add_typer(train_app, name="train")


_add_train()


def main() -> None:
    """Console entry point: usage errors exit 2 (click); user errors print one line and exit 2."""
    try:
        app()  # standalone: click handles --help, usage errors and typer.Exit itself
    except SpecfmtError as e:
        err.print(f"specfmt: error: {e.one_line()}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except SystemExit as e:
        if e.code == 130:  # typer turns Ctrl-C (KeyboardInterrupt) into exit 130, silently
            err.print("interrupted; nothing was written to the output folder")
        raise
    except KeyboardInterrupt:
        err.print("interrupted; nothing was written to the output folder")
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
