"""``specfmt validate`` (static checks, and ``--run``) and ``specfmt inspect``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import InputError
from .common import beside_table, checks_table, ctrl_c_ends_in_one_line, diagnosis_tables, err, figures_table, json_option, out, report, reports_errors, verdict


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
    no_transformers: bool = typer.Option(False, "--no-transformers", help="With --run on a draft model: leave out transformers' assisted generation."),
    timeout: float = typer.Option(900, "--timeout", help="Seconds allowed for each vLLM engine."),
    device: Optional[str] = typer.Option(None, "--device", help="With --run: where the reference runs the verifier and the drafts: cpu, cuda or cuda:N (default: cuda when available)."),
    verifier_dtype: Optional[str] = typer.Option(None, "--verifier-dtype", help="With --run: the verifier's run dtype in the reference, float32, bfloat16 or float16 (default: bfloat16 on a GPU, float32 on the CPU)."),
    device_map: Optional[str] = typer.Option(None, "--device-map", help="With --run: spread the verifier over every visible GPU (auto, balanced, sequential; needs accelerate)."),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help="With --device-map: per-device caps, e.g. 0=70GiB,1=70GiB."),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", help="With --run: GPUs vLLM spreads the verifier over (GPU build of vLLM)."),
    gpu_memory_utilization: Optional[float] = typer.Option(None, "--gpu-memory-utilization", help="With --run: vLLM's share of each GPU (default: vLLM's; the CPU build always uses 0.2 of CPU memory)."),
    free_methods: bool = typer.Option(True, "--free-methods/--no-free-methods", help="With --run: n-gram and suffix decoding beside the draft on the same prompts, and whether one beats it."),
    temperature: float = typer.Option(0.0, "--temperature", help="With --run: sample at this temperature (each prompt once per --seed); the reference's expected acceptance against vLLM's measured one. 0: greedy."),
    seeds: list[int] = typer.Option(None, "--seed", help="With --run --temperature: the sampling seeds (repeatable; default 0 1 2 3)."),
) -> None:
    """Check a specfmt checkpoint: schema, tensors, dtypes, NaN/Inf, vocabulary map, verifier; with --run, run the draft. Exit 0 only if all pass."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from ..methods import resolve

    if not run:
        if any(x is not None for x in (prompts, num_speculative_tokens, min_acceptance_length, device, verifier_dtype, device_map, max_memory,
                                       gpu_memory_utilization)) or no_vllm or no_transformers or tensor_parallel_size != 1 or temperature or seeds:
            raise InputError("--prompts, --num-speculative-tokens, --min-acceptance-length, --no-vllm, --no-transformers, --temperature, --seed and the device options need --run")
        rep = resolve(path).static_checks(verifier)  # a speculators draft's checks, or a draft model's pair checks
        report(**rep.to_json())
        out.print(checks_table(rep, f"specfmt validate {rep.path}"))
        out.print(verdict(rep))
        raise typer.Exit(0 if rep.ok else 1)
    from ..sources.placement import resolve_placement
    from ..validation.method_run import validate as validate_run
    from ..validation.run import describe_causes

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
                           tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization, progress=tell,
                           use_transformers=not no_transformers, free_methods=free_methods,
                           **({"temperature": temperature, "seeds": seeds or [0, 1, 2, 3]} if temperature else {}))
    rep = res.report
    report(**res.to_json(), ok=rep.ok, written=res.written, notes=res.notes, likely_causes_explained=describe_causes(res))
    out.print(checks_table(rep, f"specfmt validate --run {rep.path}"))
    if res.reference or res.vllm:
        out.print(figures_table(res))
    for shown in diagnosis_tables(res) if res.diagnosis else []:
        out.print(shown)
    for shown in [beside_table(res), *res.beside["verdict"]] if res.beside else []:  # the free methods on the same prompts
        out.print(shown, markup=False, highlight=False, soft_wrap=True)
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
    path: str = typer.Argument(..., help="The draft: a specfmt folder, a draft model's folder (or a Hub id)."),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version", help="The vLLM release to serve it with (default: the installed vLLM, else the newest specfmt knows)."),
    engine: str = typer.Option("vllm", "--engine", help="vllm: the serve line; sglang: SGLang's server for an export written by `specfmt export --to sglang`; transformers: the Python of generate(assistant_model=...) (a draft model)."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="The verifier, for a draft model or a method without files (a speculators draft names its own)."),
    as_json: bool = json_option(),
) -> None:
    """Print the one line that serves this draft: `vllm serve ...` on a vLLM release, or SGLang's server (for scripts).

    stdout is that one line; a release specfmt has not checked gets the line of the nearest
    checked one, with a note on stderr saying so. A speculators draft passes the static checks of
    `specfmt validate` first (a truncated or NaN weight gets no serve line).
    With `--engine sglang` the draft is an SGLang export (`specfmt export --to sglang`) and the line is SGLang's server;
    with `--engine transformers`, stdout is the Python that runs a draft-model pair with transformers.
    """
    from ..algorithms import get, validate_config
    from ..checkpoint.files import CONFIG_FILE, read_json
    from ..errors import InputError
    from ..methods import resolve as resolve_method
    from ..serving import CHECKED_RELEASES, NEWEST_VLLM, build_for, checked_release, installed_vllm, sglang_serve_command
    from ..sources.resolve import resolve
    from ..validation.static import validate_static

    if engine not in ("vllm", "sglang", "transformers"):
        raise InputError(f"--engine must be vllm, sglang or transformers, not {engine!r}")
    if engine == "sglang":
        res = resolve(path, allow_patterns=[CONFIG_FILE], what="draft")
        line = sglang_serve_command(read_json(res.folder / CONFIG_FILE), res.name_or_path)
        report(line=line.line, argv=list(line.argv), form=line.form, engine="sglang", notes=[])
        out.print(line.line, markup=False, highlight=False, soft_wrap=True)
        return
    version = vllm_version if vllm_version is not None else installed_vllm() or NEWEST_VLLM
    release, exact = checked_release(version)  # an unparsable --vllm-version fails before anything is read
    distribution, gpu_only = build_for(version)
    method = resolve_method(path)
    cfg = method.speculators_config()
    if cfg is not None:  # a speculators draft: its static checks and a valid config first
        rep = validate_static(path)
        failed = [c for c in rep.checks if c.status == "fail"]
        if failed:
            raise InputError(f"{path} fails specfmt's static checks ({', '.join(c.name for c in failed)}): {failed[0].summary}",
                             hint=f"`specfmt validate {path}` shows every check")
        validate_config(cfg, where=str(method.folder / CONFIG_FILE))
    if engine == "transformers":
        part = method.transformers
        if part is None:
            raise InputError(f"transformers does not run a {method.title}", hint="--engine vllm prints its serve line")
        call = part.generate_call(verifier or method.verifier_ref(), method.default_k())
        report(line=call, engine="transformers", notes=[])
        out.print(call, markup=False, highlight=False, soft_wrap=True)
        return
    line = method.serve_command(str(release), verifier=verifier, distribution=distribution)
    which = "" if exact else f" (the nearest checked release to {version})"
    if line is None:
        what = f"this {cfg['speculators_model_type']} draft" if cfg is not None else f"this {method.title} pair"
        hint = get(cfg["speculators_model_type"]).serving_note() if cfg is not None else method.serving_note(verifier)
        raise InputError(f"vLLM {release}{which} cannot serve {what}", hint=hint or None)
    if not exact:
        err.print(f"note: vLLM {version} is not a release specfmt has checked ({', '.join(CHECKED_RELEASES)}); "
                  f"this is the line for the nearest checked release, {release}", markup=False, highlight=False, soft_wrap=True)
    if gpu_only:
        err.print(f"note: {gpu_only}", markup=False, highlight=False, soft_wrap=True)
    report(line=line.line, argv=list(line.argv), form=line.form, release=str(release), exact=exact, build=distribution,
           notes=[n for n in (None if exact else f"the line of the nearest checked release, {release}", gpu_only) if n])
    out.print(line.line, markup=False, highlight=False, soft_wrap=True)
