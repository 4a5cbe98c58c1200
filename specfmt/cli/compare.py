"""``specfmt compare``: every proposal method measured on the same prompts, one table, JSON and a plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import InputError
from .common import ctrl_c_ends_in_one_line, json_option, out, report, reports_errors
from .output import writes

#: the files ``-o OUT`` holds
JSON_FILE, PLOT_FILE = "compare.json", "acceptance.png"


@ctrl_c_ends_in_one_line
@reports_errors
@writes("output", inputs=("methods", "verifier", "prompts"), force="force")
def compare(
    methods: list[str] = typer.Argument(None, metavar="METHOD...", help="Drafts (speculators-format folders, draft LMs; folders or Hub ids) and built-in methods (ngram, suffix)."),
    verifier: str = typer.Option(..., "--verifier", help="The verifier every method drafts for (folder or Hub id)."),
    free_methods: bool = typer.Option(True, "--free-methods/--no-free-methods", help="Add the methods without weights (n-gram, suffix decoding) that are not named."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="jsonl prompts (default: a small built-in set)."),
    max_tokens: int = typer.Option(32, "--max-tokens", help="Tokens generated per prompt (per prompt and seed when sampling)."),
    num_speculative_tokens: Optional[int] = typer.Option(None, "--num-speculative-tokens", help="k for every method (default: each method's own)."),
    temperature: float = typer.Option(0.0, "--temperature", help="0: greedy; above 0: sampled, each prompt once per --seed, the reference's expected acceptance against vLLM's."),
    seeds: list[int] = typer.Option(None, "--seed", help="Sampling seeds with --temperature (repeatable; default 0 1 2 3)."),
    no_vllm: bool = typer.Option(False, "--no-vllm", help="The reference only."),
    tolerance: float = typer.Option(0.1, "--tolerance", help="Largest gap of a per-position rate between the reference and vLLM at temperature 0."),
    timeout: float = typer.Option(900, "--timeout", help="Seconds allowed for each vLLM engine."),
    device: Optional[str] = typer.Option(None, "--device", help="Where the reference runs: cpu, cuda or cuda:N."),
    verifier_dtype: Optional[str] = typer.Option(None, "--verifier-dtype", help="The reference's run dtype: float32, bfloat16 or float16."),
    as_json: bool = json_option(),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help=f"A folder to write {JSON_FILE} and {PLOT_FILE} (acceptance per position per method) into."),
    force: bool = typer.Option(False, "--force", help="Replace an earlier -o folder."),
) -> None:
    """Which method should I serve? Measure drafts, draft LMs, n-gram and suffix decoding on the same prompts: acceptance
    per position per verifier pass (reference and vLLM), the drafting cost and the estimated speedup at batch size 1."""
    from ..methods import resolve
    from ..sources.placement import resolve_placement
    from ..validation.compare import SEEDS, compare as run_compare, free_methods as weightless

    names = list(methods or [])
    if output is not None:  # OUT was checked against every input by @writes
        _plotting()  # matplotlib is there before minutes of measuring
    placement = resolve_placement(device, verifier_dtype, None, None)
    chosen = [resolve(n) for n in names]
    if free_methods:
        given = {type(m) for m in chosen if m.folder is None}
        chosen += [m for m in weightless() if type(m) not in given]
    if not chosen:
        raise InputError("nothing to compare: name a draft or a method (ngram, suffix), or drop --no-free-methods")
    res = run_compare(verifier, chosen, prompts=str(prompts) if prompts else None, max_tokens=max_tokens,
                      num_speculative_tokens=num_speculative_tokens, temperature=temperature, seeds=seeds or SEEDS,
                      use_vllm=not no_vllm, tolerance=tolerance, timeout=timeout, placement=placement)
    data = res.to_json()
    if output is not None:
        from ..checkpoint.output import atomic_folder

        with atomic_folder(output) as tmp:
            (tmp / JSON_FILE).write_text(json.dumps(data, indent=2) + "\n")
            plot(data, tmp / PLOT_FILE)
    report(**data, written=[str(output / JSON_FILE), str(output / PLOT_FILE)] if output is not None else [])
    out.print(table(data))
    for line in verdict(data):
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    if output is not None:
        out.print(f"wrote {output / JSON_FILE} and {output / PLOT_FILE}", markup=False)


def _fmt(x: Any, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(data: dict[str, Any]) -> Table:
    """The comparison as one table: per method k, acceptance per position per verifier pass (reference / vLLM), tokens per
    pass, the share of steps with a proposal, the drafting cost per step and the estimated speedup."""
    t = data["temperature"]
    title = (f"specfmt compare: {len(data['methods'])} methods on {data['prompts']['count']} prompts x {data['max_tokens']} tokens"
             + (f", T = {t:g}, seeds {data['seeds']} (reference: expected)" if t > 0 else ", greedy"))
    tab = Table(title=escape(title), caption=escape(f"per verifier forward pass over every step; cost model: {data['cost_model']}"))
    timed = any(m.get("timing") for m in data["methods"])
    for col in ("method", "k", "acceptance per position (ref / vLLM)", "tokens per pass (ref / vLLM)", "drafted steps", "cost per step",
                "est. speedup (ref / vLLM)", "agree") + (("measured tokens/s (speedup)",) if timed else ()):
        tab.add_column(col)
    for m in data["methods"]:
        if not m["measured"]:
            tab.add_row(escape(f"{m['method']} ({m['title']})"), str(m["k"]), "not measured on this machine (below)", "", "", "", "", "",
                        *([""] if timed else []))
            continue
        ref, v = m["reference"] or {}, m["vllm"] or {}
        rates = " ".join(f"{_fmt(a)}/{_fmt(b) if v else '-'}" for a, b in zip(ref.get("rate_per_step", []), v.get("rate_per_step") or [None] * m["k"]))
        drafted = f"{ref['drafted_steps']}/{ref['steps']}" if ref else "-"
        cost = m.get("cost")
        sp = m["estimated_speedup"]
        agree = m.get("agreement") or {}
        tab.add_row(escape(f"{m['method']} ({m['title']})"), str(m["k"]), rates, f"{_fmt(ref.get('tokens_per_step'), 3)} / {_fmt(v.get('tokens_per_step'), 3)}",
                    drafted, "-" if cost is None else f"{cost['per_step']:.4f}", f"{_fmt(sp.get('reference'))} / {_fmt(sp.get('vllm'))}",
                    "-" if not agree else ("yes" if agree["ok"] else "NO") if "ok" in agree else "-",
                    *([f"{m['timing']['tokens_per_second']:.0f} ({m['timing']['measured_speedup']:.2f}x)" if m.get("timing") else "-"] if timed else []))
    return tab


def verdict(data: dict[str, Any]) -> list[str]:
    """Plain lines: the best method by estimated speedup, each method that could not run in vLLM, what the
    agreement test found, and what specfmt corrected in the installed vLLM build (:mod:`specfmt.validation.vllm_fixes`)."""
    lines = []
    measured = [m for m in data["methods"] if m["measured"]]
    best = max(measured, key=lambda m: (m["estimated_speedup"].get("vllm") or m["estimated_speedup"].get("reference") or 0), default=None)
    if best is not None:
        sp = best["estimated_speedup"]
        lines.append(f"fastest by the estimate: {best['method']} ({best['title']}), {_fmt(sp.get('vllm') or sp.get('reference'))}x the verifier alone")
    for m in data["methods"]:
        if not m["measured"]:
            lines.append(f"{m['method']}: not measured on this machine: {m['not_measured']}")
        if m.get("vllm_error"):
            lines.append(f"{m['method']}: vLLM did not measure it: {m['vllm_error']}")
        agree = m.get("agreement")
        if agree and not agree.get("ok", True):
            lines.append(f"{m['method']}: the reference and vLLM disagree beyond the tolerance (see --json: agreement)")
    said = {c for m in data["methods"] for c in ((m.get("vllm") or {}).get("corrections") or [])}
    lines += [f"corrected in vLLM for these figures: {c}" for c in sorted(said)]  # one line each, not one per method
    return lines


def _plotting() -> Any:
    """matplotlib's pyplot on a file backend.

    Raises:
        InputError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("the plot needs matplotlib", hint="pip install 'specfmt[plot]', or leave out -o") from None
    return plt


def _label(m: dict[str, Any]) -> str:
    """A method as the plot names it: its title, and the folder's name for a method read from a folder."""
    name = Path(m["method"]).name
    return m["title"] if name == m["title"] or m["kind"] == m["method"] else f"{m['title']} ({name})"


def plot(data: dict[str, Any], path: Path) -> None:
    """A PNG of the acceptance rate per position per verifier pass, one line per method: the reference solid, vLLM dashed
    in the same colour (the expected rates at a temperature)."""
    plt = _plotting()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for i, m in enumerate(x for x in data["methods"] if x["measured"]):
        color = f"C{i % 10}"
        for engine, style in (("reference", "-"), ("vllm", "--")):
            fig_data = m.get(engine)
            if not fig_data:
                continue
            rates = fig_data["rate_per_step"]
            ax.plot(range(1, len(rates) + 1), rates, style, marker="o", color=color,
                    label=f"{_label(m)}, {engine}: {fig_data['tokens_per_step']:.2f} tokens/pass")
    t = data["temperature"]
    ax.set_xlabel("draft position")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("acceptance rate per verifier pass")
    ax.set_title(f"{data['prompts']['count']} prompts x {data['max_tokens']} tokens, " + (f"T = {t:g}" if t > 0 else "greedy"), fontsize=10)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6.5, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
