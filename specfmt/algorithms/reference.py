"""What every reference proposer is built on: the verifier's states it reads, and the batched,
cached drafting the EAGLE proposers share.

An algorithm's proposer (:meth:`specfmt.algorithms.base.Reference.proposer`) is a :data:`Proposer`;
:func:`specfmt.validation.acceptance.run_chains` runs it against the verifier's greedy path.
The EAGLE proposers are :class:`DecoderChain` subclasses (a :class:`ChainDrafter` keeping one
:class:`DraftCache` per sequence), so that they run as vLLM's proposer runs (see
:mod:`specfmt.validation.acceptance`): several sequences in one pass, each over its own KV cache.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from . import layers

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
#: ``tokens[:-1]``. Each algorithm builds its own (:meth:`specfmt.algorithms.base.Reference.proposer`).
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


class DecoderChain(ChainDrafter):
    """Chain drafting of a decoder draft (an :class:`~specfmt.algorithms.nn_layers.Decoder`: EAGLE-3,
    EAGLE-1) as vLLM's ``EagleProposer`` runs it, for several sequences in one pass.

    Position j of the draft reads the embedding of token j+1 and what the draft reads of the verifier's
    states at j (:meth:`read`, then :meth:`first_hidden`); each drafted position reads the draft's
    fed-back state of the position before it. A call runs the positions verified since the last call on
    the same sequence (its :class:`DraftCache` holds the draft's (k, v) per layer of the others), then
    one position per further drafted token; drafted positions are never kept. The draft runs on the
    verifier states' device, in ``dtype`` (default: theirs). Subclasses say what the draft reads and
    how a pass's output becomes proposals (:meth:`step`).

    Args:
        draft: the draft module (eval mode), whose ``forward(embeds, hidden, positions, rows=...)``
            takes :class:`~specfmt.algorithms.layers.Rows`.
        embed: [V, H] the embedding the draft reads.
        dtype: compute dtype (None: the verifier states').
    """

    def __init__(self, draft: Any, embed: "torch.Tensor", dtype: Any = None) -> None:
        super().__init__()
        self.draft, self.embed, self.dtype = draft, embed, dtype

    def read(self, draft: Any, states: VerifierStates, start: int, end: int) -> "torch.Tensor":
        """[end - start, W] what the draft reads of the verifier's states at positions ``start..end-1``."""
        raise NotImplementedError

    def first_hidden(self, draft: Any, features: "torch.Tensor") -> "torch.Tensor":
        """[T, W] verifier features -> [T, H] the draft's hidden input at verified positions (default: as read)."""
        return features

    def step(self, draft: Any, embeds: "torch.Tensor", hidden: "torch.Tensor", positions: "torch.Tensor",
             rows: "layers.Rows") -> tuple[list[int], "torch.Tensor", list[Any]]:
        """One draft pass: ``(the verifier id proposed after each row, feedback [1, rows, H], kv per layer)``."""
        raise NotImplementedError

    def propose_many(self, requests: list[tuple[list[int], VerifierStates]], k: int) -> list[list[int]]:
        import torch

        first = requests[0][1].hidden[0]
        dt, dev = self.dtype or first.dtype, first.device  # the draft runs where the verifier's states are
        d = self.draft.to(dev, dt)
        caches = self.caches(requests)
        with torch.no_grad():
            rows, ids, features, positions = self._verified(d, requests, caches, dev)
            drafted, feedback, kv = self._pass(d, ids, self.first_hidden(d, torch.cat(features).to(dt))[None], positions, rows, dev, dt)
            self._keep(requests, caches, rows, kv)
            return self._chains(d, requests, rows, drafted, feedback, k, dev, dt)

    def _verified(self, d: Any, requests: list, caches: list[DraftCache], dev: Any) -> tuple["layers.Rows", list[int], list[Any], list[int]]:
        """The positions each sequence has verified since its cache: rows, token ids, features and positions."""
        import torch

        rows = layers.Rows([], [], [])
        ids: list[int] = []
        features: list[Any] = []
        positions: list[int] = []
        for (tokens, states), cache in zip(requests, caches):
            n = len(tokens) - 1
            c = cache.reusable(tokens, states)
            rows.lengths.append(n - c)
            rows.past.append([[(K[:, :, :c], V[:, :, :c])] for K, V in cache.state] if c else [])
            rows.key_positions.append(torch.arange(n, device=dev))
            ids += tokens[c + 1:]
            positions += range(c, n)
            features.append(self.read(d, states, c, n))
        return rows, ids, features, positions

    def _pass(self, d: Any, ids: list[int], hidden: Any, positions: list[int], rows: "layers.Rows", dev: Any, dt: Any) -> tuple[list[int], Any, list[Any]]:
        import torch

        e = self.embed[torch.tensor(ids, device=self.embed.device)].to(dev, dt)[None]
        return self.step(d, e, hidden, torch.tensor(positions, device=dev), rows)

    def _keep(self, requests: list, caches: list[DraftCache], rows: "layers.Rows", kv: list[Any]) -> None:
        """Each sequence's cache: its earlier (k, v) and those of the positions just run, per layer."""
        import torch

        for r, ((tokens, _), cache) in enumerate(zip(requests, caches)):
            new = [layer_kv[r] for layer_kv in kv]
            kept = [(torch.cat([b[0][0], k_[0]], 2), torch.cat([b[0][1], k_[1]], 2)) for b, k_ in zip(rows.past[r], new)] if rows.past[r] else new
            cache.keep(tokens, kept)
            rows.past[r] = [[pair] for pair in kept]  # the drafted positions' (k, v) are added per layer, never kept

    def _chains(self, d: Any, requests: list, rows: "layers.Rows", drafted: list[int], feedback: Any, k: int, dev: Any, dt: Any) -> list[list[int]]:
        """``k`` proposals per sequence: the first from the verified pass, then one draft pass per token."""
        import torch

        out: list[list[int]] = [[] for _ in requests]
        for i in range(k):
            for o, t in zip(out, drafted):
                o.append(t)
            if i + 1 == k:
                break
            rows.lengths = [1] * len(requests)
            positions = [len(tokens) - 1 + i for tokens, _ in requests]
            rows.key_positions = [torch.arange(p + 1, device=dev) for p in positions]
            drafted, feedback, kv = self._pass(d, drafted, feedback, positions, rows, dev, dt)
            for r, blocks in enumerate(rows.past):
                for layer_blocks, layer_kv in zip(blocks, kv):
                    layer_blocks.append(layer_kv[r])
        return out


__all__ = ["ChainDrafter", "DecoderChain", "DraftCache", "Proposer", "VerifierStates"]
