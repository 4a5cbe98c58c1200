"""``specfmt regenerate``: the verifier rewrites the assistant turns of chat data with vLLM
(:mod:`specfmt.datagen.regenerate`; speculators 0.9's ``regenerate-responses``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from .common import ctrl_c_ends_in_one_line, err, json_option, out, report, reports_errors
from .output import writes


def _continues(output: Path, args: dict) -> None:
    """An existing OUT is continued only with --resume, and only when an earlier regenerate run wrote it (its provenance record)."""
    from ..datagen.regenerate import check_resumable

    check_resumable(output, args["resume"])


@ctrl_c_ends_in_one_line
@reports_errors
@writes("output", kind="file", inputs=("verifier", "data"), continues=_continues, beside=(".provenance.json",))
def regenerate(
    verifier: str = typer.Option(..., "--verifier", "--model", help="The verifier's folder (its tokenizer, chat template and weights)."),
    data: str = typer.Option(..., "--data", "--dataset", help="Input jsonl: chat lines {\"messages\": [...]} or prompts {\"text\"|\"prompt\": ...}."),
    output: str = typer.Option(..., "-o", "--output", "--out", "--outfile", help="Output chat jsonl (what `specfmt train --data` reads); OUT.provenance.json is written beside it."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0: greedy (default); above 0: sampled."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0, help="Nucleus sampling threshold (sampled runs)."),
    seed: int = typer.Option(0, "--seed", help="Base seed of sampled runs: conversation line n uses seed + n."),
    max_tokens: int = typer.Option(256, "--max-tokens", min=1, help="Most tokens per generated turn."),
    max_model_len: int = typer.Option(2048, "--max-model-len", min=16, help="vLLM's context limit (prompt + answer)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Stop after the first N conversations."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Conversations per engine call (and per block of lines written)."),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", min=1, help="GPUs vLLM spreads the verifier over (GPU build)."),
    dtype: str = typer.Option("auto", "--dtype", help="vLLM's dtype: auto (as `vllm serve`: 16 bits for a float32 checkpoint), float32, bfloat16, float16."),
    resume: bool = typer.Option(False, "--resume", help="Continue an output: skip the conversations already in it (same settings only)."),
    as_json: bool = json_option(),
) -> None:
    """Regenerate the assistant turns with the verifier (greedy or sampled), so a draft learns what the verifier says."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..datagen.regenerate import Settings, run

    settings = Settings(temperature=temperature, top_p=top_p, seed=seed, max_tokens=max_tokens)
    progress = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[figures]}"),
                        TimeElapsedColumn(), console=err, disable=not err.is_terminal)
    task = progress.add_task("regenerating", total=None, figures="")
    started = time.perf_counter()

    def show(done: int, total: int, tokens: int) -> None:
        rate = tokens / max(time.perf_counter() - started, 1e-9)
        progress.update(task, completed=done, total=total, figures=f"{tokens:,} tokens  {rate:,.0f} tok/s")

    with progress:
        figures = run(verifier, data, output, settings, resume=resume, limit=limit, batch=batch_size, max_model_len=max_model_len,
                      tensor_parallel_size=tensor_parallel_size, dtype=dtype, progress=show)
    report(output=output, **figures)
    out.print(f"wrote {figures['written']} conversations ({figures['skipped']} already done), {figures['generated_tokens']:,} generated tokens, "
              f"{figures['truncated_turns']} turns cut at --max-tokens: {output}", markup=False, highlight=False)
