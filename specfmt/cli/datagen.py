"""``specfmt datagen``: the command-line layer over :mod:`specfmt.datagen.pipeline`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from .common import ctrl_c_ends_in_one_line, err, json_option, out, parse_layers, report, reports_errors
from .output import writes


def _continues(output: Path, args: dict) -> None:
    """A non-empty OUT is continued only when an earlier datagen run made it (its manifest); the same inputs are the pipeline's check."""
    from ..datagen.layout import check_resumable

    check_resumable(output)


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[figures]}"),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=err, disable=not err.is_terminal)


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return ""  # pragma: no cover


@ctrl_c_ends_in_one_line
@reports_errors
@writes("output", inputs=("verifier", "data"), continues=_continues)
def datagen(
    output: Path = typer.Option(..., "-o", "--output", help="Output folder: speculators' layout (the preprocessed dataset, token_freq.pt, hidden_states/hs_{i}.safetensors)."),
    verifier: str = typer.Option(..., "--verifier", "--model", help="The verifier (target) model: a folder or a Hub id."),
    data: list[str] = typer.Option(..., "--data", help="Training data, repeatable: text files, or jsonl with \"text\" or chat \"messages\" (loss on the assistant turns only)."),
    layers: Optional[str] = typer.Option(None, "--layers", "--target-layer-ids", help="Layer ids to store, comma-separated; id L is the last layer before the final norm (default: the EAGLE-3 taps 2,N//2,N-3 and N, as speculators)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", "--seq-length", help="Longest sample in tokens; longer ones are cut (default: 8192, or the verifier's positions less one if fewer)."),
    max_samples: Optional[int] = typer.Option(None, "--max-samples", help="Make hidden states for the first N samples only."),
    engine: str = typer.Option("auto", "--engine", help="auto (vLLM when it imports, else transformers), vllm, or transformers."),
    world_size: int = typer.Option(1, "--world-size", help="Data-parallel runs sharing the samples (as speculators generate-offline-data)."),
    rank: int = typer.Option(0, "--rank", help="This run's rank in [0, --world-size)."),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", "--tp", help="vLLM's tensor parallelism."),
    dtype: str = typer.Option("auto", "--dtype", help="Run and stored dtype: auto (vLLM's choice; float32 for transformers), float32, bfloat16, float16."),
    as_json: bool = json_option(),
) -> None:
    """Generate offline training data: the verifier's hidden states at the tap layers, with loss masks, in speculators' on-disk layout.

    One run does speculators' prepare-data and generate-offline-data. Running it again resumes: finished samples are
    skipped, unreadable ones made again. `specfmt train --hidden-states DIR` and speculators' trainer read the output.
    """
    from ..datagen.pipeline import DatagenRequest, run_datagen

    req = DatagenRequest(verifier=verifier, data=list(data), output=str(output), layers=parse_layers(layers, "--layers"), seq_len=seq_len,
                         max_samples=max_samples, engine=engine, world_size=world_size, rank=rank, tensor_parallel_size=tensor_parallel_size,
                         dtype=dtype)
    progress = _progress()
    state: dict = {"task": None, "tokens": 0, "bytes": 0, "t0": 0.0, "total": 0}

    def on_start(res, tokens: int) -> None:
        state["t0"] = time.perf_counter()
        todo = len(res.shard) - res.resumed
        if res.resumed:
            err.print(f"resuming: {res.resumed} of this run's {len(res.shard)} samples are in place", markup=False)
        state["total"] = todo
        state["task"] = progress.add_task("hidden states", total=todo, figures="")

    def on_file(index: int, tokens: int, size: int) -> None:
        state["tokens"] += tokens
        state["bytes"] += size
        rate = state["tokens"] / max(time.perf_counter() - state["t0"], 1e-9)
        figures = f"{rate:,.0f} tok/s  {_size(state['bytes'])}"
        progress.advance(state["task"])
        progress.update(state["task"], figures=figures)
        state["done"] = state.get("done", 0) + 1
        if not err.is_terminal and (state["done"] % max(1, state["total"] // 10) == 0 or state["done"] == state["total"]):
            err.print(f"hidden states {state['done']}/{state['total']}  {figures}", markup=False, highlight=False)

    with progress:
        res = run_datagen(req, on_file=on_file, on_start=on_start)
    report(output=str(res.root), samples=res.samples, layers=list(res.layers), made=res.made, resumed=res.resumed, engine=res.engine,
           tokens=res.tokens, bytes=res.bytes, seconds=res.seconds, unsupervised=res.unsupervised, skipped_turns=res.skipped_turns,
           notes=list(res.notes))
    for note in res.notes:
        err.print(f"note: {note}", markup=False, soft_wrap=True)
    if res.unsupervised or res.skipped_turns:
        err.print(f"note: the cut to {res.seq_len} tokens dropped {res.unsupervised} rows with no assistant token and skipped "
                  f"{res.skipped_turns} assistant turns whose prompt fills it; a larger --seq-len keeps them", markup=False, soft_wrap=True)
    out.print(f"{res.samples} samples, layers {res.layers}; this run made {res.made} hidden-state files"
              + (f" with {res.engine}" if res.made else "") + " "
              f"({res.resumed} already in place): {res.tokens:,} tokens, {_size(res.bytes)}"
              + (f", {res.bytes_per_token:,.0f} bytes per token, {res.tokens / res.seconds:,.0f} tokens/s" if res.tokens and res.seconds else ""),
              markup=False, highlight=False, soft_wrap=True)
    out.print(f"wrote {res.root}", markup=False)
