"""What every reference proposer is built on: the verifier's states it reads, and the batched,
cached drafting the EAGLE proposers share.

An algorithm's proposer (:meth:`specfmt.algorithms.base.Algorithm.proposer`) is a :data:`Proposer`;
:func:`specfmt.validation.acceptance.run_chains` runs it against the verifier's greedy path.
The EAGLE proposers subclass :class:`ChainDrafter`, keeping one :class:`DraftCache` per sequence,
so that they run as vLLM's proposer runs (see :mod:`specfmt.validation.acceptance`).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    import torch

_passes = itertools.count()


@dataclass
class VerifierStates:
    """One verifier forward pass over a token sequence of length T.

    Attributes:
        hidden: ``output_hidden_states`` of a transformers causal LM: N+1 tensors [T, H_t];
            ``hidden[j]`` is the residual stream entering decoder layer j (what vLLM taps
            for ``eagle_aux_hidden_state_layer_ids``) and ``hidden[N]`` is the last
            layer's output after the final norm (what EAGLE-1 and Medusa read).
        logits: [T, V].
        source: which verifier pass the states come from (unique per pass; the prefixes
            :func:`~specfmt.validation.acceptance.run_chains` hands a proposer keep their pass's), so that a proposer may
            keep the draft's KV cache over the positions it has run (:class:`DraftCache`).
    """

    hidden: list["torch.Tensor"]
    logits: "torch.Tensor"
    source: int = field(default_factory=lambda: next(_passes))

    def prefix(self, n: int) -> "VerifierStates":
        """The states of the first ``n`` positions (views, same ``source``)."""
        return VerifierStates([h[:n] for h in self.hidden], self.logits[:n], self.source)


#: ``propose(tokens, states, k) -> k draft token ids (verifier vocabulary)``.
#: ``tokens`` ends with the verifier's newest token x; ``states`` (:class:`VerifierStates`) covers
#: ``tokens[:-1]``. Each algorithm builds its own (:meth:`specfmt.algorithms.base.Algorithm.proposer`).
Proposer = Callable[[list[int], VerifierStates, int], list[int]]


class ChainDrafter:
    """A :data:`Proposer` that drafts for several sequences in one pass (:func:`~specfmt.validation.acceptance.run_chains` asks
    it once per round for every unfinished prompt). Subclasses implement :meth:`propose_many`
    and keep one :class:`DraftCache` per sequence (:meth:`caches`)."""

    #: sequences whose caches are kept (the least recently asked for go first): four groups of :func:`~specfmt.validation.acceptance.run_chains`
    KEPT = 64

    def __init__(self) -> None:
        self._caches: OrderedDict[int, DraftCache] = OrderedDict()

    def caches(self, requests: list[tuple[list[int], VerifierStates]]) -> list[DraftCache]:
        """The :class:`DraftCache` of each request's sequence (by its verifier pass), new ones empty;
        beyond :attr:`KEPT` sequences, those asked for least recently are forgotten."""
        out = []
        for _, states in requests:
            cache = self._caches.pop(states.source, None) or DraftCache()
            self._caches[states.source] = cache
            out.append(cache)
        while len(self._caches) > self.KEPT:
            self._caches.popitem(last=False)
        return out

    def propose_many(self, requests: list[tuple[list[int], VerifierStates]], k: int) -> list[list[int]]:
        """``k`` draft token ids (verifier vocabulary) for each ``(tokens, states)`` request, as
        :data:`Proposer` defines them; the requests' states come from distinct verifier passes."""
        raise NotImplementedError

    def __call__(self, tokens: list[int], states: VerifierStates, k: int) -> list[int]:
        return self.propose_many([(tokens, states)], k)[0]


class DraftCache:
    """What a drafting proposer keeps between calls: the draft's KV cache over the verified
    positions it has already run, with the tokens and verifier pass they came from.

    A draft's input at position j (the embedding of ``tokens[j+1]`` and the verifier's states at
    j) depends only on ``tokens[:j+2]``, the verifier being causal. A call whose ``tokens`` extend
    the cached ones, with states of the same verifier pass (:attr:`VerifierStates.source`), so reuses
    the cached positions and runs only the new ones, as vLLM's proposer does after each
    verification step; anything else starts over. Drafted (unverified) positions are never kept.
    The figures equal a full pass over the prefix at every call up to floating-point rounding.

    Attributes:
        state: what the proposer cached for positions ``[0, len(tokens) - 1)`` (its own type).
    """

    def __init__(self) -> None:
        self.source: int | None = None
        self.tokens: list[int] = []
        self.state: Any = None

    def reusable(self, tokens: list[int], states: VerifierStates) -> int:
        """How many leading positions of ``tokens[:-1]`` the cache holds for this call (0: start over).

        At most ``len(tokens) - 2``: the newest position is always run again, so that its output
        (the first proposal) comes from this call. The proposer cuts its state to that length."""
        c = min(len(self.tokens) - 1, len(tokens) - 2)
        if self.state is None or c <= 0 or self.source != states.source or tokens[:c + 1] != self.tokens[:c + 1]:
            self.source, self.tokens, self.state = states.source, [], None
            return 0
        return c

    def keep(self, tokens: list[int], state: Any) -> None:
        """Record ``state``, covering the positions of ``tokens[:-1]``."""
        self.tokens, self.state = list(tokens), state


__all__ = ["ChainDrafter", "DraftCache", "Proposer", "VerifierStates"]
