"""The free methods beside the draft in every ``validate --run``: n-gram and suffix decoding on the same prompts.

A draft is worth serving only if it beats what costs nothing. So ``validate --run`` runs, beside the method it
validates, every method without weights (those named by a built-in name: :func:`free_methods`)
against the same greedy paths of the verifier, in the same :func:`~specfmt.validation.acceptance.run_chains` call as the
draft's readings (the verifier's passes are not repeated), and says plainly when one of them beats the draft. On by
default; ``--no-free-methods`` turns it off.

What is compared is the estimated speedup at batch size 1 (:mod:`specfmt.validation.speedup`): the tokens per verifier
pass over every step, over one plus the draft's cost per step. A free method's cost is 0, so it beats the draft when
its tokens per pass exceed the draft's divided by ``1 + cost``. These are the reference's figures; vLLM's for the free
methods come from ``specfmt compare`` (one more engine each) or ``specfmt validate ngram --verifier V --run``.
A method that cannot run here (arctic-inference missing for suffix decoding) has its reason instead of a number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import SpecfmtError
from .speedup import ASSUMPTION, estimated_speedup

if TYPE_CHECKING:  # pragma: no cover
    from ..algorithms.reference import Proposer
    from ..methods.base import Cost, ProposalMethod, ReferenceContext
    from .acceptance import ChainResult


def per_step(accepted_per_position: list[int] | list[float], steps: int, k: int) -> dict[str, Any]:
    """The figures per verifier forward pass: acceptance rate of each position (k of them) and tokens per pass."""
    acc = list(accepted_per_position)[:k] + [0] * max(0, k - len(accepted_per_position))
    rates = [a / steps if steps else 0.0 for a in acc]
    return {"steps": steps, "rate_per_step": [round(r, 4) for r in rates], "tokens_per_step": round(1.0 + sum(rates), 4)}


def free_methods() -> list["ProposalMethod"]:
    """Every method named by a built-in name (the methods without weights: n-gram, suffix decoding)."""
    from ..methods import builtin_names, resolve

    return [resolve(n) for n in builtin_names()]


@dataclass
class Companion:
    """A free method to run beside the draft: its proposer, or why it cannot run here."""

    method: "ProposalMethod"
    proposer: "Proposer | None" = None
    why: str | None = None
    cost: "Cost | None" = None


def companions(ctx: "ReferenceContext", k: int, exclude: "ProposalMethod | None" = None) -> list[Companion]:
    """Every free method but ``exclude``'s kind (validating n-gram itself), with its reference proposer at ``k``."""
    out = []
    for m in free_methods():
        if exclude is not None and type(m) is type(exclude):
            continue
        try:
            why = m.runnable(m.static_checks(ctx.verifier))
            if why is None:
                m.check_k(k)
                out.append(Companion(m, m.proposer(m.readings(ctx)[0], ctx), cost=m.cost(ctx.verifier)))
            else:
                out.append(Companion(m, why=why))
        except SpecfmtError as e:
            out.append(Companion(m, why=e.one_line()))
    return out


def beside(found: list[Companion], runs: "list[ChainResult]", draft: "ChainResult", draft_cost: "Cost | None", k: int,
           title: str = "the draft") -> dict[str, Any]:
    """What ``validation.json`` and the report show: each free method's figures per verifier pass beside the draft's,
    its estimated speedup, and the plain verdict.

    Args:
        found: :func:`companions`; runs: the results of those with a proposer, in order.
        draft: the draft's reference figures (as written); draft_cost: its cost (None: unknown, no verdict).
        k: speculative tokens per step. title: what the verdict calls the draft.
    """
    draft_fig = per_step(draft.accepted_per_position, draft.steps, k)
    draft_speedup = estimated_speedup(draft_fig["tokens_per_step"], draft_cost, k) if draft_cost is not None else None
    rows, it = [], iter(runs)
    for c in found:
        row: dict[str, Any] = {"method": c.method.named, "title": c.method.title, "k": k}
        if c.proposer is None:
            row["not_measured"] = c.why
        else:
            r = next(it)
            fig = per_step(r.accepted_per_position, r.steps, k)
            row.update(fig, drafted_steps=r.num_drafts, mean_acceptance_length=round(r.mean_acceptance_length, 4),
                       estimated_speedup=round(estimated_speedup(fig["tokens_per_step"], c.cost, k), 4) if c.cost is not None else None)
        rows.append(row)
    lines = []
    for row in rows:
        if "not_measured" in row:
            lines.append(f"{row['title']}: not measured on this machine: {row['not_measured']}")
        elif draft_speedup is not None and row["estimated_speedup"] is not None and row["estimated_speedup"] >= draft_speedup:
            lines.append(f"{row['title']} beats {title} on these prompts: estimated speedup {row['estimated_speedup']:.2f}x against "
                         f"{draft_speedup:.2f}x ({row['tokens_per_step']:.3f} tokens per verifier pass for free, against "
                         f"{draft_fig['tokens_per_step']:.3f} at {draft_cost.per_step(k):.3f} verifier passes of drafting per step)")
    if draft_speedup is not None and rows and not any("beats" in line for line in lines):
        measured = [r for r in rows if r.get("estimated_speedup") is not None]
        if measured:
            lines.append(f"{title} beats {' and '.join(r['title'] for r in measured)} on these prompts: estimated speedup "
                         f"{draft_speedup:.2f}x against " + ", ".join(f"{r['estimated_speedup']:.2f}x" for r in measured))
    return {"draft": {**draft_fig, "estimated_speedup": None if draft_speedup is None else round(draft_speedup, 4),
                      "cost": None if draft_cost is None else draft_cost.to_json()},
            "methods": rows, "verdict": lines, "cost_model": ASSUMPTION}


__all__ = ["Companion", "beside", "companions", "free_methods", "per_step"]
