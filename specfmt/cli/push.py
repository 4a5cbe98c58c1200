"""``specfmt push``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from .common import ctrl_c_ends_in_one_line, err, json_option, out, print_serving, report, reports_errors


@ctrl_c_ends_in_one_line
@reports_errors
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
    as_json: bool = json_option(),
) -> None:
    """Publish a draft (a speculators folder, or a draft model's) to the Hugging Face Hub in one commit, with a model card (README.md) naming the verifier as base_model.

    The token comes from HF_TOKEN or `hf auth login` and is never printed.
    """
    from ..hub.method_push import plan as plan_push  # a speculators draft's plan, or a draft model's
    from ..hub.transport import preview_remote
    from ..hub.transport import push as run_push

    if no_validate:
        err.print("[yellow]warning:[/] --no-validate: uploading without checking the checkpoint")
    plan = plan_push(folder, repo_id, revision=revision, create_pr=create_pr, private=private, verifier_id=verifier_id, license=license,
                     overwrite_card=overwrite_card, validate=not no_validate, commit_message=commit_message)
    target = f"{plan.repo_id}@{plan.revision or 'main'}" + (" as a pull request" if plan.create_pr else "")
    report(folder=str(plan.folder), repo_id=plan.repo_id, revision=plan.revision, create_pr=plan.create_pr, private=plan.private,
           verifier=plan.verifier, dry_run=dry_run, files=[{"path": f.path_in_repo, "size": f.size, "note": f.note} for f in plan.files],
           total_bytes=plan.total_bytes, commit_message=plan.commit_message,
           checks=None if plan.checks is None else [{"name": n, "status": st, "summary": su} for n, st, su in plan.checks],
           not_checked=[{"check": n, "why": why} for n, why in plan.unchecked], notes=plan.notes, card_origin=plan.card_origin, card=plan.card)
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
        remote = preview_remote(plan)
        report(remote=remote)
        for line in remote:  # what it could not look at on the Hub says "not checked (why)"
            out.print(line, markup=False, highlight=False)
        for name, why in plan.unchecked:
            out.print(f"not checked: {name}: {why}", markup=False, highlight=False, soft_wrap=True)
        out.print(f"model card ({plan.card_origin}):")
        out.print(plan.card, markup=False, highlight=False, soft_wrap=True)
        out.print("dry run: nothing uploaded")
        return
    res = run_push(plan, log=lambda s: err.print(s, markup=False, highlight=False))
    report(commit_url=res.commit_url, pr_url=res.pr_url, unchanged=res.unchanged)
    if res.unchanged:
        out.print(f"{target} already has these {len(plan.files)} files; nothing committed: {res.commit_url}", markup=False, soft_wrap=True)
    elif res.pr_url:
        out.print(f"opened a pull request on {plan.repo_id} with {len(plan.files)} files ({plan.total_bytes / 2**20:.2f} MiB): {res.pr_url}", markup=False, soft_wrap=True)
    else:
        out.print(f"pushed {len(plan.files)} files ({plan.total_bytes / 2**20:.2f} MiB) to {target}: {res.commit_url}", markup=False, soft_wrap=True)
    if not plan.revision and not plan.create_pr:
        print_serving(plan.config, plan.repo_id)
