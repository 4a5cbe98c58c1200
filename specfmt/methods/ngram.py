"""n-gram (prompt lookup) as a proposal method: vLLM's ``method: "ngram"``.

The draft is a copy: the longest n-gram (``prompt_lookup_min`` <= n <= ``prompt_lookup_max``) that ends the
sequence and occurred earlier in it (prompt and output so far) is found, and the k tokens that followed its
earliest occurrence are proposed -- fewer when the sequence ends sooner, none when no n-gram of at least
``prompt_lookup_min`` tokens recurs (Saxena 2023, "prompt lookup decoding"; vLLM's
``vllm/v1/spec_decode/ngram_proposer.py``, ``NgramProposer``, run through numba on the CPU build too).

**The reference proposer is vLLM's own code where it is installed**: ``_find_longest_matched_ngram_and_propose_tokens``
of the installed vLLM, compiled with numba as vLLM compiles it (:func:`vllm_lookup`). Without vLLM it is
:func:`longest_match_proposal`, a plain re-implementation that ``tests/test_free_methods.py`` holds equal to vLLM's
function on random sequences, and vLLM's ``NgramProposer`` class equal to the reference proposer step by step.

Settings: ``prompt_lookup_min`` 2 and ``prompt_lookup_max`` 4 (:data:`PROMPT_LOOKUP`), as issue 37 measured it. vLLM's own
default when neither is given is 5 and 5 (``SpeculativeConfig.__post_init__``), which finds far fewer matches
in short outputs.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable

from .base import ReferenceContext, Variant, register
from .weightless import WeightlessMethod

if TYPE_CHECKING:  # pragma: no cover
    from ..algorithms.reference import Proposer, VerifierStates

#: ``(prompt_lookup_min, prompt_lookup_max)`` specfmt serves n-gram with
PROMPT_LOOKUP = (2, 4)
#: a context limit no run reaches (vLLM caps k at ``max_model_len - len(tokens)``; validate --run leaves room for k)
UNLIMITED = 1 << 30

#: ``lookup(tokens, min_n, max_n, k) -> at most k proposed ids``
Lookup = Callable[[list[int], int, int, int], list[int]]


def longest_match_proposal(tokens: list[int], min_n: int, max_n: int, k: int, max_model_len: int = UNLIMITED) -> list[int]:
    """The n-gram proposal for ``tokens``, as vLLM's ``_find_longest_matched_ngram_and_propose_tokens`` makes it.

    For every start ``s`` of an earlier occurrence, ``v(s)`` is the longest ``v <= max_n`` with
    ``tokens[s:s+v] == tokens[-v:]`` and ``s + v < len(tokens)`` (not the suffix itself). The longest ``v`` wins, and
    among equal ones the earliest ``s`` (vLLM's KMP over the reversed tokens keeps the last, ``>=``, position);
    the proposal is the at most ``k`` tokens after it, none when ``v < min_n``.

    Args:
        tokens: the sequence so far, prompt and output (ids).
        min_n / max_n: ``prompt_lookup_min`` / ``prompt_lookup_max``.
        k: the most tokens proposed.
        max_model_len: vLLM's context limit (k is capped at ``max_model_len - len(tokens)``).

    Returns:
        Between 0 and ``k`` ids.
    """
    total = len(tokens)
    if total < min_n:
        return []
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    best_v, best_s = 0, -1
    last = tokens[-1]
    for s in range(total - 2, -1, -1):  # vLLM's reversed position i = total - 1 - s, ascending
        for v in range(min(max_n, total - 1 - s), 0, -1):
            if tokens[s + v - 1] == last and tokens[s:s + v] == tokens[total - v:]:
                if v >= best_v:
                    best_v, best_s = v, s
                break
    if best_v < min_n:
        return []
    start = best_s + best_v
    return list(tokens[start:start + min(k, total - start)])


#: the function of vLLM's n-gram proposer that searches (``vllm/v1/spec_decode/ngram_proposer.py``)
VLLM_FUNCTION = "_find_longest_matched_ngram_and_propose_tokens"


@lru_cache(maxsize=1)
def vllm_lookup() -> tuple[Lookup, str] | None:
    """vLLM's own n-gram search and where it comes from (``vllm 0.32.0 ...``), or None without vLLM or numba.

    The function's source is read from the installed vLLM's ``ngram_proposer.py`` and compiled with numba's ``jit`` as
    vLLM compiles it, without importing the module: that import pulls in ``vllm.config`` (about 9 s of CPU here) for
    a 60-line function. The first call compiles it (about 1 s)."""
    import ast
    import importlib.util
    from pathlib import Path

    from ..serving import installed_vllm

    try:
        found = importlib.util.find_spec("vllm")  # the package's folder; vllm itself is not imported
        path = Path(list(found.submodule_search_locations)[0]) / "v1" / "spec_decode" / "ngram_proposer.py"  # type: ignore[union-attr]
        fn = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == VLLM_FUNCTION)
        import numba
        import numpy as np

        scope: dict[str, Any] = {"np": np, "jit": numba.jit, "njit": numba.njit}
        exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), scope)  # noqa: S102 - vLLM's own source
    except Exception:  # noqa: BLE001 - no vLLM, no numba, or the function moved: the re-implementation
        return None
    find = scope[VLLM_FUNCTION]

    def lookup(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
        return find(np.asarray(tokens, dtype=np.int32), min_n, max_n, UNLIMITED, k).tolist()

    return lookup, f"vllm {installed_vllm() or '?'} ({path.parent.parent.parent.name}/v1/spec_decode/ngram_proposer.py, {VLLM_FUNCTION})"


class NgramProposer:
    """A :data:`~specfmt.algorithms.reference.Proposer`: the n-gram proposal over the tokens so far (the verifier's
    states are not read).

    Attributes:
        source: which code searches: vLLM's function or specfmt's re-implementation.
    """

    def __init__(self, min_n: int, max_n: int, lookup: Lookup | None = None, source: str = "") -> None:
        found = vllm_lookup() if lookup is None else (lookup, source)
        self.lookup, self.source = found or (lambda t, a, b, k: longest_match_proposal(t, a, b, k), "specfmt (a re-implementation of vLLM's)")
        self.min_n, self.max_n = min_n, max_n

    def __call__(self, tokens: list[int], states: "VerifierStates | None", k: int) -> list[int]:
        return self.lookup(list(tokens), self.min_n, self.max_n, k)


@register
class Ngram(WeightlessMethod):
    """n-gram (prompt lookup) decoding (vLLM ``method: "ngram"``).

    Attributes:
        prompt_lookup_min / prompt_lookup_max: the n-gram lengths searched (:data:`PROMPT_LOOKUP`).
    """

    name = "ngram"
    builtin_names = ("ngram",)
    vllm_method = "ngram"

    def __init__(self, named: str) -> None:
        super().__init__(named)
        self.prompt_lookup_min, self.prompt_lookup_max = PROMPT_LOOKUP

    @property
    def title(self) -> str:
        return "n-gram"

    def summary(self) -> str:
        return f"n-gram (prompt lookup), n from {self.prompt_lookup_min} to {self.prompt_lookup_max}"

    def method_config(self) -> dict[str, Any]:
        return {"prompt_lookup_min": self.prompt_lookup_min, "prompt_lookup_max": self.prompt_lookup_max}

    def proposer(self, reading: Variant, ctx: ReferenceContext | None) -> "Proposer":
        return NgramProposer(self.prompt_lookup_min, self.prompt_lookup_max)


__all__ = ["Ngram", "NgramProposer", "PROMPT_LOOKUP", "longest_match_proposal", "vllm_lookup"]
