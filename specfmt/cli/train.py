"""``specfmt train``: the command-line layer over :mod:`specfmt.training.pipeline`.

``specfmt train eagle3|eagle|medusa|dflash`` trains a draft (new, or ``--init`` from any source): one command
per trainable algorithm, built from the shared options and the algorithm's own
(:attr:`specfmt.algorithms.base.Training.train_options`), so that ``train medusa --help`` offers no
EAGLE-3 option, and an option of another algorithm is a usage error naming it.
``specfmt train fill SRC`` fills a draft's gaps without training.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
import inspect
from typing import Any, Callable, Optional, get_args, get_origin, get_type_hints

import typer
from typer.core import TyperCommand

from ..algorithms import trainable
from ..algorithms.base import Algorithm, AlgorithmOptions, owners_of
from ..converters import from_choices
from ..training.loop import SCHEDULES, TrainOptions
from ..training.optim import OPTIMIZERS
from .common import checks_table, ctrl_c_ends_in_one_line, err, figures_table, json_option, name_command, out, parse_layers, print_serving, report, reports_errors
from .output import writes

#: the shared options' defaults (:class:`~specfmt.training.loop.TrainOptions`: one place, chosen by the trainer benchmark)
_DEFAULTS = TrainOptions()

train_app = typer.Typer(
    help="Train drafts against a frozen verifier, or fill in what a research checkpoint lacks; writes the specfmt format.",
    no_args_is_help=True,
    rich_markup_mode=None,  # as the app's (specfmt/cli/__init__.py)
)

def _json(result) -> dict:
    """``train``'s ``--json`` fields: what was written, trained and filled, the figures, and the validation run."""
    s, v = result.stats, result.validation
    return {"output": None if result.out is None else str(result.out), "cache_filled": None if result.cache_filled is None else str(result.cache_filled),
            "filled": dict(result.filled), "trained": list(result.trained), "notes": list(result.notes),
            "steps": None if s is None else s.steps, "recent_steps": None if s is None else s.recent_steps,
            "loss": None if s is None else s.loss, "top1_agreement": None if s is None else list(s.accuracy),
            "heldout": None if s is None or s.kept is None else s.kept.to_json(),
            "validation": None if v is None else {"ok": v.report.ok, **v.to_json()}}


def _report(result, *, dry_run: bool) -> None:
    report(**_json(result))
    if result.cache_filled is not None:
        out.print(f"filled the feature cache {result.cache_filled} (verifier in {result.placement.dtype} on {result.placement.device}); "
                  "train from it with the same options and --cache: the verifier is not loaded", markup=False, highlight=False)
        return
    if result.out is None:
        return
    for note in result.notes:
        err.print(f"note: {note}", markup=False)
    for name, how in result.filled.items():
        out.print(f"filled {name}: {how}", markup=False, highlight=False)
    s = result.stats
    if s is not None:
        acc = " / ".join(f"{a:.3f}" for a in s.accuracy)
        out.print(f"trained {len(result.trained)} tensors: {s.steps} steps"
                  + (f" (resumed at step {s.resumed_from})" if s.resumed_from else "")
                  + f", {s.tokens:,} tokens in {s.seconds:.0f} s ({s.tokens_per_second:,.0f} tokens/s); "
                  f"{_recent(s)}: loss {s.loss:.3f}, top-1 agreement per position {acc}" + _conditional(s.conditional_accuracy, s.coverage))
        if s.kept is not None:
            k = s.kept
            out.print(f"held-out: the draft holds the weights of step {k.step} ({'the last' if len(s.evaluations) and k is s.evaluations[-1] else 'the best'}"
                      f" of {len(s.evaluations)} evaluations): loss {k.loss:.3f}, top-1 agreement per position "
                      + " / ".join(f"{a:.3f}" for a in k.accuracy) + _conditional(k.conditional_accuracy, k.coverage)
                      + f", estimated acceptance length {k.estimated_acceptance_length:.3f}", markup=False, highlight=False)
    out.print(f"wrote {result.out}" + (" (initialised, not trained)" if dry_run else ""), markup=False)
    v = result.validation
    if v is not None:
        out.print(checks_table(v.report, f"validation of {result.out} (reference run, no vLLM)"))
        if v.reference:
            out.print(figures_table(v))
        out.print("[green]all checks passed[/]" if v.report.ok else "[bold red]validation failed[/] (the draft was written)")
    print_serving(result.draft.config, str(result.out))


def _recent(stats) -> str:
    """What the summary's figures average over: ``last 50 steps``, or ``all 5 steps`` of a shorter run."""
    n = stats.recent_steps
    if n < stats.steps + stats.resumed_from:
        return f"last {n} steps"
    return "its one step" if n == 1 else f"all {n} steps"


def _conditional(conditional: list[float], coverage: list[float], sep: str = " / ", digits: int = 3) -> str:
    """The in-vocabulary agreement and the draft vocabulary's coverage, when it misses some of the verifier's top-1
    tokens (nothing for a draft without a vocabulary, or one that covers every counted position)."""
    if all(c >= 1.0 for c in coverage):
        return ""
    return (f"; in the draft vocabulary {sep.join(f'{a:.{digits}f}' for a in conditional)}"
            f" (coverage {sep.join(f'{c:.{digits}f}' for c in coverage)})")


def _run(req, opts) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from ..training.loop import acceptance_estimate
    from ..training.pipeline import train_draft

    progress = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[figures]}"),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=err, disable=not err.is_terminal)
    task = None
    per_step = opts.batch_size * opts.seq_len * int(os.environ.get("WORLD_SIZE", "1"))  # trained tokens per step, all processes
    first: list[float] = []  # (time, step) of the first step seen: throughput counts from there

    def log(step: int, loss: float, acc: list[float]) -> None:
        nonlocal task
        now = time.perf_counter()
        if not first:
            first.extend([now, step])
        rate = per_step * (step - first[1]) / (now - first[0]) if step > first[1] else 0.0
        figures = (f"loss {loss:.3f}  top-1 {' '.join(f'{a:.2f}' for a in acc)}"
                   + _conditional(getattr(acc, "conditional", acc), getattr(acc, "coverage", []), " ", 2)
                   + f"  ~τ {acceptance_estimate(acc):.2f}" + (f"  {rate:,.0f} tok/s" if rate else ""))
        if task is None:
            task = progress.add_task("training", total=opts.steps, completed=step, figures="")
        progress.update(task, completed=step + 1, figures=figures)
        if not err.is_terminal and ((step + 1) % max(1, opts.steps // 10) == 0 or step + 1 == opts.steps):
            err.print(f"step {step + 1}/{opts.steps}  {figures}", markup=False, highlight=False)

    def evaluated(e) -> None:
        err.print(f"held-out at step {e.step}: loss {e.loss:.3f}  top-1 {' '.join(f'{a:.2f}' for a in e.accuracy)}"
                  + _conditional(e.conditional_accuracy, e.coverage, " ", 2) + f"  ~τ {e.estimated_acceptance_length:.2f}",
                  markup=False, highlight=False)

    with progress:
        result = train_draft(req, opts, log=log, status=lambda msg: err.print(msg, markup=False, highlight=False), evaluated=evaluated)
    _report(result, dry_run=req.dry_run)
    if result.validation is not None and not result.validation.report.ok:
        raise typer.Exit(1)


def _shared_before(algo: Algorithm) -> list[inspect.Parameter]:
    """The options every ``specfmt train ALGORITHM`` has, before the algorithm's own (help order); ``--from`` offers
    the formats whose drafts are ``algo``'s (:func:`specfmt.converters.from_choices`); ``--lr`` and ``--optimizer`` default to
    ``algo``'s own (:meth:`specfmt.training.loop.TrainOptions.resolved`)."""
    own = _DEFAULTS.resolved(algo.name)
    return _params(
        ("output", Path, typer.Option(..., "-o", "--output", help="Output folder (written atomically at the end).")),
        ("verifier", str, typer.Option(..., "--verifier", help="The verifier (target) model: a folder or a Hub id; frozen.")),
        ("data", Optional[list[Path]], typer.Option(None, "--data", help="Training data, repeatable: text files, or jsonl with \"text\" or chat \"messages\".")),
        ("init", Optional[str], typer.Option(None, "--init", help="Start from this draft: a specfmt folder or a research checkpoint (default: a new draft).")),
        ("source_format", str, typer.Option("auto", "--from", help=f"Format of --init ({from_choices('specfmt', 'auto', algorithms=[algo.name])}).")),
        ("steps", int, typer.Option(_DEFAULTS.steps, "--steps", help="Optimizer steps.")),
        ("batch_size", int, typer.Option(_DEFAULTS.batch_size, "--batch-size", help="Windows per step (per process).")),
        ("seq_len", int, typer.Option(_DEFAULTS.seq_len, "--seq-len", help="Tokens per window.")),
        ("lr", float, typer.Option(own.lr, "--lr", help="Peak learning rate of both optimizer groups (warmup, then the schedule's decay).")),
        ("optimizer", str, typer.Option(own.optimizer, "--optimizer",
                                        help=f"{' or '.join(OPTIMIZERS)}. muon: Muon on the draft's 2-D weight matrices, AdamW on norms, biases, embeddings and the output head "
                                             "(speculators' split); adamw: AdamW on everything.")),
        ("schedule", str, typer.Option(own.schedule, "--schedule", help=f"The rate after the warmup: {' or '.join(SCHEDULES)}. cosine: cosine decay to 10 % of the peak rate; "
                                                                       "linear: linear decay to 0 (speculators' default).")),
        ("warmup", Optional[int], typer.Option(None, "--warmup", help="Warmup steps (default: 5 % of --steps with cosine, 1 % with linear).")),
        ("seed", int, typer.Option(0, "--seed", help="Seed of the data order, the noise and a new draft's weights.")),
    )


def _shared_after() -> list[inspect.Parameter]:
    """The options every ``specfmt train ALGORITHM`` has, after the algorithm's own (help order)."""
    return _params(
        ("embed", bool, typer.Option(False, "--embed", help="Copy the verifier's embedding into the draft (embed_tokens.weight).")),
        ("speculative_tokens", Optional[int], typer.Option(None, "--speculative-tokens", help="Speculative tokens written into the config (default: 3; Medusa: K).")),
        ("device", Optional[str], typer.Option(None, "--device", help="cpu, cuda or cuda:N (default: cuda when available). Several GPUs: run under torchrun.")),
        ("verifier_dtype", Optional[str], typer.Option(None, "--verifier-dtype", help="The verifier's run dtype: float32, bfloat16 or float16 (default: bfloat16 on a GPU, float32 on the CPU); 16-bit trains the draft under autocast with float32 weights.")),
        ("device_map", Optional[str], typer.Option(None, "--device-map", help="Spread the verifier over every visible GPU (auto, balanced, sequential; needs accelerate); one process.")),
        ("max_memory", Optional[str], typer.Option(None, "--max-memory", help="With --device-map: per-device caps, e.g. 0=70GiB,1=70GiB.")),
        ("cache", Optional[Path], typer.Option(None, "--cache", help="Keep the verifier's features in this folder (safetensors shards) and reuse them every epoch; a filled cache trains without loading the verifier.")),
        ("hidden_states", Optional[Path], typer.Option(None, "--hidden-states", help="Train on hidden-states data in speculators' layout (specfmt datagen's or speculators' own output: a preprocessed dataset with hidden_states/hs_{i}.safetensors), its loss mask included, instead of --data; the verifier's layers are not loaded.")),
        ("fill_cache_only", bool, typer.Option(False, "--fill-cache-only", help="Fill --cache with the verifier's features and stop (under torchrun each process fills its share).")),
        ("resume", bool, typer.Option(False, "--resume", help="Continue the run saved in OUT.train-state/ (same options).")),
        ("save_every", int, typer.Option(100, "--save-every", help="Steps between saved training states (0: only at the end or on Ctrl-C).")),
        ("heldout", Optional[float], typer.Option(None, "--heldout", help="Share of the --data documents (with --cache: of the windows; with --hidden-states: of the samples) set aside and evaluated during training; the draft written is the best evaluation's (default: 0.05 with at least 20 documents and no --cache, else 0).")),
        ("eval_every", Optional[int], typer.Option(None, "--eval-every", help="Steps between held-out evaluations (default: a tenth of --steps); one also runs at the end.")),
        ("keep_last", bool, typer.Option(False, "--keep-last", help="Write the last step's weights, not the best held-out evaluation's (by estimated acceptance length).")),
        ("dtype", Optional[str], typer.Option(None, "--dtype", help="Dtype of the written tensors: float32, bfloat16 or float16 (default: the --init draft's, else float32).")),
        ("dry_run", bool, typer.Option(False, "--dry-run", help="Write the initialised draft (fill-ins done, no training); vLLM loads it.")),
        ("validate", bool, typer.Option(True, "--validate/--no-validate", help="End with the static checks and a reference run.")),
        ("prompts", Optional[Path], typer.Option(None, "--prompts", help="Prompts of the validation run (jsonl; default: built-in).")),
        ("force", bool, typer.Option(False, "--force", help="Replace a non-empty output folder; never an input (OUT may not be, contain or lie inside one).")),
        ("as_json", bool, json_option()),
    )


def _params(*specs: tuple[str, Any, Any]) -> list[inspect.Parameter]:
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind) for name, kind, default in specs]


def _own_params(options: type[AlgorithmOptions]) -> list[inspect.Parameter]:
    """The algorithm's own options as command-line parameters: each declared field's flag, help and
    default, its type the field's (a list of ints is given as ``2,16,29``)."""
    hints = get_type_hints(options)
    out = []
    for f in options.declared():
        kind = _cli_type(hints[f.name])
        out.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=kind,
                                     default=typer.Option(f.default, f.metadata["flag"], help=f.metadata["help"])))
    return out


def _cli_type(hint: Any) -> Any:
    """The command-line type of an option field's type: ``X | None`` -> ``Optional[X]``, lists -> text."""
    args = [a for a in get_args(hint) if a is not type(None)]
    optional = type(None) in get_args(hint)
    base = args[0] if optional and len(args) == 1 else hint
    if get_origin(base) is list:
        base = str
    return Optional[base] if optional else base


def _own_values(options: type[AlgorithmOptions], given: dict[str, Any]) -> dict[str, Any]:
    """The algorithm's own option values out of a command's arguments (lists parsed from ``2,16,29``)."""
    hints = get_type_hints(options)
    out = {}
    for f in options.declared():
        value = given.pop(f.name)
        out[f.name] = parse_layers(value, f.metadata["flag"]) if value is not None and _is_list(hints[f.name]) else value
    return out


def _is_list(hint: Any) -> bool:
    return any(get_origin(a) is list for a in (hint, *get_args(hint)))


class _TrainCommand(TyperCommand):
    """``specfmt train ALGORITHM``: an option of another algorithm is a usage error (exit 2) that names the
    algorithm it belongs to, instead of click's "no such option"."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        own = {name for p in self.params for name in (*p.opts, *p.secondary_opts)}
        for arg in args:
            if arg == "--":
                break
            flag = arg.split("=", 1)[0]
            owners = owners_of(flag) if flag.startswith("--") and flag not in own else []
            if owners:
                names = " / ".join(f"specfmt train {a.name}" for a in owners)
                raise typer.BadParameter(f"{flag} applies to {' and '.join(a.title for a in owners)} drafts ({names}), not {self.name}", ctx=ctx)
        return super().parse_args(ctx, args)


def train_command(algo: Algorithm) -> Callable[..., None]:
    """The ``specfmt train NAME`` command of a trainable algorithm: the shared options and the
    algorithm's own (:attr:`~specfmt.algorithms.base.Training.train_options`), nothing of other algorithms."""
    training = algo.training
    assert training is not None
    options = training.train_options
    params = _shared_before(algo) + _own_params(options) + _shared_after()

    def command(**given: Any) -> None:
        from ..training.loop import TrainOptions
        from ..training.pipeline import TrainRequest

        given.pop("as_json")  # reports_errors' (--json)
        own = _own_values(options, given)
        opts = TrainOptions(**{k: given.pop(k) for k in ("steps", "batch_size", "seq_len", "lr", "optimizer", "schedule", "warmup", "seed", "save_every", "heldout",
                                                          "eval_every", "keep_last")})
        data, cache, prompts, hs = given.pop("data"), given.pop("cache"), given.pop("prompts"), given.pop("hidden_states")
        req = TrainRequest(out=str(given.pop("output")), algorithm=algo.name, options=own, data=[str(d) for d in data or []],
                           cache=str(cache) if cache else None, prompts=str(prompts) if prompts else None,
                           hidden_states=str(hs) if hs else None, **given)
        _run(req, opts)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = training.train_summary
    command.__name__ = f"train_{algo.name}"
    #: OUT.train-state, the saved training state (specfmt.training.pipeline.state_dir), is written beside OUT
    wrapped = reports_errors(writes("output", inputs=("verifier", "data", "init", "cache", "hidden_states", "prompts"), force="force",
                                    beside=(".train-state",))(command))
    return name_command(ctrl_c_ends_in_one_line(wrapped), f"train {algo.name}")


for _algo in trainable():
    train_app.command(name=_algo.name, cls=_TrainCommand)(train_command(_algo))


@train_app.command()
@ctrl_c_ends_in_one_line
@reports_errors
@writes("output", inputs=("src", "verifier", "data"), force="force")
def fill(
    src: str = typer.Argument(..., help="The draft: a research checkpoint (folder or Hub id) or a specfmt folder."),
    output: Path = typer.Option(..., "-o", "--output", help="Output folder (written atomically)."),
    verifier: str = typer.Option(..., "--verifier", help="The verifier (target) model: a folder or a Hub id."),
    source_format: str = typer.Option("auto", "--from", help=f"Format of SRC ({from_choices('specfmt', 'auto', algorithms=[a.name for a in trainable()])})."),
    data: Optional[list[Path]] = typer.Option(None, "--data", help="Corpus for d2t/t2d token frequencies (text or jsonl), repeatable."),
    vocab_map: Optional[bool] = typer.Option(None, "--vocab-map/--no-vocab-map", help="EAGLE-3: build d2t/t2d from --data (default: when the draft lacks them)."),
    embed: bool = typer.Option(False, "--embed", help="Copy the verifier's embedding into embed_tokens.weight (EAGLE-3 with H = H_t, EAGLE-1)."),
    lm_heads: bool = typer.Option(False, "--lm-heads", help="Medusa: give heads that share the verifier's lm_head their own copies (lm_heads.{i})."),
    heads: Optional[int] = typer.Option(None, "--heads", help="Medusa: add heads up to this many (new heads: zero blocks, the verifier's lm_head); train them next."),
    speculative_tokens: Optional[int] = typer.Option(None, "--speculative-tokens", help="Speculative tokens written into the config."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Dtype of the written tensors: float32, bfloat16 or float16 (default: the source's)."),
    validate: bool = typer.Option(True, "--validate/--no-validate", help="End with the static checks and a reference run."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty output folder; never an input (OUT may not be, contain or lie inside one)."),
    as_json: bool = json_option(),
) -> None:
    """Fill in what a draft lacks, without training: d2t/t2d from corpus frequencies, embed_tokens and lm_heads copied from the verifier, new Medusa heads."""
    from ..training.loop import TrainOptions
    from ..training.pipeline import TrainRequest

    req = TrainRequest(out=str(output), verifier=verifier, data=[str(d) for d in data or []], init=src, source_format=source_format,
                       fill_only=True, vocab_map=vocab_map, embed=embed, lm_heads=lm_heads, options={"heads": heads} if heads is not None else None,
                       speculative_tokens=speculative_tokens, dtype=dtype, force=force, validate=validate)
    _run(req, TrainOptions(steps=0))


name_command(fill, "train fill")  # its --json object's name
