"""The estimated speedup of a proposal method at batch size 1, under a stated memory-bound cost model.

**The model** (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", arXiv 2211.17192,
section 3.4 and Theorem 3.8). One verification step costs one verifier forward pass plus the drafting that fed it;
with ``c`` the cost of one draft pass over one verifier pass, a step costs ``1 + passes * c`` verifier passes, where
``passes`` is k for a chain draft (one draft pass per drafted token: EAGLE, EAGLE-3, a draft LM) and 1 for a parallel
draft (P-EAGLE, DFlash, Medusa heads). It yields on average ``tau`` tokens, so the walltime improvement over the
verifier alone is::

    speedup = tau / (1 + passes * c)

The paper writes ``tau`` for a draft whose tokens are each accepted with probability alpha as
``(1 - alpha^(k+1)) / (1 - alpha)``, giving its ``(1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))``
(:func:`leviathan_speedup`); here ``tau`` is measured: the tokens per verifier forward pass over every step, steps
without a proposal included (:attr:`specfmt.validation.acceptance.ChainResult.tokens_per_step`).

**c at batch size 1.** Decoding one sequence is bound by reading the weights: a forward pass costs about the bytes
of the parameters it reads, so ``c`` is the draft's parameters read per pass over the verifier's
(:class:`specfmt.methods.base.Cost`; both run in the served dtype, an input-embedding table is not counted: a pass
reads one row). A method without weights (n-gram, suffix decoding) has ``c = 0``. What the model leaves out, and
where it stops holding: the KV cache reads (they grow with the context and with batch size), the verification pass's
extra k positions (free while memory-bound, not at large batch), the host-side lookup of n-gram and suffix decoding,
and kernel launch overheads, which dominate tiny models (the example world's verifier has 2 M parameters: its
estimates state the model, not the CPU's measured times).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..methods.base import Cost

#: what every estimate says it assumes
ASSUMPTION = ("batch size 1, memory-bound: a pass costs the bytes of the parameters it reads; "
              "speedup = tokens per verifier pass / (1 + draft passes per step x c) (Leviathan et al. 2023, arXiv 2211.17192)")


def estimated_speedup(tokens_per_step: float, cost: "Cost", k: int) -> float:
    """``tokens_per_step / (1 + cost.per_step(k))`` (module docstring).

    Args:
        tokens_per_step: measured tokens per verifier forward pass over every step (at least 1).
        cost: the method's drafting cost (:class:`~specfmt.methods.base.Cost`: c and whether it drafts in parallel).
        k: speculative tokens per step (a chain pays k draft passes).

    Returns:
        The walltime improvement over the verifier alone (1.0: none; below 1: slower).
    """
    return tokens_per_step / (1.0 + cost.per_step(k))


def leviathan_speedup(alpha: float, k: int, c: float) -> float:
    """The paper's closed form for a chain draft accepted with probability ``alpha`` per token: ``(1 - alpha^(k+1)) /
    ((1 - alpha)(k c + 1))`` (Theorem 3.8; ``k + 1`` tokens per step as ``alpha`` -> 1)."""
    tau = float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tau / (k * c + 1)


__all__ = ["ASSUMPTION", "estimated_speedup", "leviathan_speedup"]
