"""``specfmt validate`` (static checks, and ``--run``) and ``specfmt inspect``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import InputError
from .common import checks_table, ctrl_c_ends_in_one_line, diagnosis_tables, err, figures_table, json_option, out, report, reports_errors, verdict


@ctrl_c_ends_in_one_line
@reports_errors
def validate(
    path: str = typer.Argument(..., help="Checkpoint folder (or Hub id)."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="Verifier to check against (default: the one named in config.json, when reachable)."),
    as_json: bool = json_option(),
    run: bool = typer.Option(False, "--run", help="Also run the draft: the reference forward pass and vLLM, acceptance per position compared; writes validation.json into PATH."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="jsonl prompts ({\"prompt\": ...} or chat {\"messages\": [...]}) (default: a small built-in set)."),
    max_tokens: int = typer.Option(32, "--max-tokens", help="Tokens generated per prompt."),
    num_speculative_tokens: Optional[int] = typer.Option(None, "--num-speculative-tokens", help="Speculative tokens per step (default: the config's)."),
    min_acceptance_length: Optional[float] = typer.Option(None, "--min-acceptance-length", help="Fail below this mean acceptance length (tokens per step, counting the verifier's own)."),
    tolerance: float = typer.Option(0.1, "--tolerance", help="Largest allowed gap between vLLM's and the reference's acceptance rate at any position."),
    no_vllm: bool = typer.Option(False, "--no-vllm", help="With --run: the reference run only."),
    timeout: float = typer.Option(900, "--timeout", help="Seconds allowed for each vLLM engine."),
    device: Optional[str] = typer.Option(None, "--device", help="With --run: where the reference runs the verifier and the drafts: cpu, cuda or cuda:N (default: cuda when available)."),
    verifier_dtype: Optional[str] = typer.Option(None, "--verifier-dtype", help="With --run: the verifier's run dtype in the reference, float32, bfloat16 or float16 (default: bfloat16 on a GPU, float32 on the CPU)."),
    device_map: Optional[str] = typer.Option(None, "--device-map", help="With --run: spread the verifier over every visible GPU (auto, balanced, sequential; needs accelerate)."),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help="With --device-map: per-device caps, e.g. 0=70GiB,1=70GiB."),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", help="With --run: GPUs vLLM spreads the verifier over (GPU build of vLLM)."),
    gpu_memory_utilization: Optional[float] = typer.Option(None, "--gpu-memory-utilization", help="With --run: vLLM's share of each GPU (default: vLLM's; the CPU build always uses 0.2 of CPU memory)."),
) -> None:
    """Check a specfmt checkpoint: schema, tensors, dtypes, NaN/Inf, vocabulary map, verifier; with --run, run the draft. Exit 0 only if all pass."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from ..validation.static import validate_static

    if not run:
        if any(x is not None for x in (prompts, num_speculative_tokens, min_acceptance_length, device, verifier_dtype, device_map, max_memory,
                                       gpu_memory_utilization)) or no_vllm or tensor_parallel_size != 1:
            raise InputError("--prompts, --num-speculative-tokens, --min-acceptance-length, --no-vllm and the device options need --run")
        rep = validate_static(path, verifier)
        report(**rep.to_json())
        out.print(checks_table(rep, f"specfmt validate {rep.path}"))
        out.print(verdict(rep))
        raise typer.Exit(0 if rep.ok else 1)
    from ..sources.placement import resolve_placement
    from ..validation.run import describe_causes, validate_run

    placement = resolve_placement(device, verifier_dtype, device_map, max_memory)  # a bad option fails before anything is read
    # one bar per phase (verifier load, greedy paths, readings, vLLM) on stderr, at a terminal only
    progress = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                        transient=True, disable=not err.is_terminal)
    tasks: dict[str, int] = {}

    def tell(phase: str, done: int, total: Optional[int]) -> None:
        if phase not in tasks:
            tasks[phase] = progress.add_task(phase, total=total)
        progress.update(tasks[phase], completed=done, total=total)

    with progress:
        res = validate_run(path, verifier=verifier, prompts=str(prompts) if prompts else None, max_tokens=max_tokens,
                           num_speculative_tokens=num_speculative_tokens, min_acceptance_length=min_acceptance_length,
                           tolerance=tolerance, use_vllm=not no_vllm, timeout=timeout, placement=placement,
                           tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization, progress=tell)
    rep = res.report
    report(**res.to_json(), ok=rep.ok, written=res.written, notes=res.notes, likely_causes_explained=describe_causes(res))
    out.print(checks_table(rep, f"specfmt validate --run {rep.path}"))
    if res.reference or res.vllm:
        out.print(figures_table(res))
    for shown in diagnosis_tables(res) if res.diagnosis else []:
        out.print(shown)
    if res.causes:
        out.print("[bold red]likely causes:[/] " + escape("; ".join(describe_causes(res))), soft_wrap=True)
    for note in res.notes:  # what became of an earlier validation.json's figures
        out.print(note, markup=False, highlight=False, soft_wrap=True)
    if res.written:
        out.print(f"wrote {res.written}", markup=False)
    out.print(verdict(rep))
    raise typer.Exit(0 if rep.ok else 1)


@ctrl_c_ends_in_one_line
@reports_errors
def inspect(path: str = typer.Argument(..., help="Checkpoint folder (or Hub id)."), as_json: bool = json_option()) -> None:
    """Detect which format a checkpoint folder is in (from tensor names and config fields) and summarise it."""
    from dataclasses import asdict

    from ..detect import detect

    d = detect(path)
    report(**asdict(d))
    out.print(f"[bold]{d.format}[/] ({d.layout})")
    for e in d.evidence:
        out.print(f"  evidence: {e}", markup=False)
    table = Table(show_header=False)
    for k, v in d.summary.items():
        table.add_row(escape(k), escape(str(v)))
    out.print(table)
    if d.served:
        out.print(f"not converted: {d.served}", markup=False)
    if d.convert_hint:
        out.print(f"next: {d.convert_hint}", markup=False)


@ctrl_c_ends_in_one_line
@reports_errors
def serve_command(
    path: str = typer.Argument(..., help="The draft: a specfmt folder (or Hub id)."),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version", help="The vLLM release to serve it with (default: the installed vLLM, else the newest specfmt knows)."),
    engine: str = typer.Option("vllm", "--engine", help="vllm (a specfmt draft) or sglang (an export written by `specfmt export --to sglang`)."),
    as_json: bool = json_option(),
) -> None:
    """Print the one line that serves this draft: `vllm serve ...` on a vLLM release, or SGLang's server (for scripts).

    stdout is that one line; a release specfmt has not checked gets the line of the nearest
    checked one, with a note on stderr saying so. The draft passes the static checks of
    `specfmt validate` first (a truncated or NaN weight gets no serve line).
    With `--engine sglang` the draft is an SGLang export (`specfmt export --to sglang`) and the line is SGLang's server.
    """
    from ..checkpoint.files import CONFIG_FILE, read_json
    from ..errors import InputError
    from ..algorithms import get, validate_config
    from ..sources.resolve import resolve
    from ..serving import CHECKED_RELEASES, NEWEST_VLLM, build_for, checked_release, installed_vllm, serve_command as command, sglang_serve_command
    from ..validation.static import validate_static

    if engine not in ("vllm", "sglang"):
        raise InputError(f"--engine must be vllm or sglang, not {engine!r}")
    if engine == "sglang":
        res = resolve(path, allow_patterns=[CONFIG_FILE], what="draft")
        line = sglang_serve_command(read_json(res.folder / CONFIG_FILE), res.name_or_path)
        report(line=line.line, argv=list(line.argv), form=line.form, engine="sglang", notes=[])
        out.print(line.line, markup=False, highlight=False, soft_wrap=True)
        return
    version = vllm_version if vllm_version is not None else installed_vllm() or NEWEST_VLLM
    release, exact = checked_release(version)  # an unparsable --vllm-version fails before anything is read
    distribution, gpu_only = build_for(version)
    rep = validate_static(path)
    failed = [c for c in rep.checks if c.status == "fail"]
    if failed:
        raise InputError(f"{path} fails specfmt's static checks ({', '.join(c.name for c in failed)}): {failed[0].summary}",
                         hint=f"`specfmt validate {path}` shows every check")
    res = resolve(path, allow_patterns=[CONFIG_FILE], what="draft")
    cfg = read_json(res.folder / CONFIG_FILE)
    validate_config(cfg, where=str(res.folder / CONFIG_FILE))
    line = command(cfg, res.name_or_path, release, distribution=distribution)
    which = "" if exact else f" (the nearest checked release to {version})"
    if line is None:
        raise InputError(f"vLLM {release}{which} cannot serve this {cfg['speculators_model_type']} draft", hint=get(cfg["speculators_model_type"]).serving_note())
    if not exact:
        err.print(f"note: vLLM {version} is not a release specfmt has checked ({', '.join(CHECKED_RELEASES)}); "
                  f"this is the line for the nearest checked release, {release}", markup=False, highlight=False, soft_wrap=True)
    if gpu_only:
        err.print(f"note: {gpu_only}", markup=False, highlight=False, soft_wrap=True)
    report(line=line.line, argv=list(line.argv), form=line.form, release=str(release), exact=exact, build=distribution,
           notes=[n for n in (None if exact else f"the line of the nearest checked release, {release}", gpu_only) if n])
    out.print(line.line, markup=False, highlight=False, soft_wrap=True)
