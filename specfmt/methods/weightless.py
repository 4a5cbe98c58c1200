"""What the proposal methods without weights share: n-gram (:mod:`.ngram`) and suffix decoding (:mod:`.suffix`).

Both are served by naming them in vLLM's speculative config on the verifier
(``vllm serve VERIFIER --speculative-config '{"method": "ngram", ...}'``), read nothing but the tokens of the
sequence (and, for suffix decoding, earlier responses), and cost no draft forward pass: a step's drafting reads
no parameters (:class:`~specfmt.methods.base.Cost` with ``draft_parameters`` 0). They propose a varying number
of tokens, up to k, and none at a step where they find no match: such a step is a verifier forward pass all the
same (:func:`specfmt.validation.acceptance.run_chains` counts it; vLLM's ``num_drafts`` does not).

A subclass states what differs: its name, its title, the keys of its speculative config
(:meth:`WeightlessMethod.method_config`), its reference proposer and what it needs installed
(:meth:`WeightlessMethod.unavailable`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import InputError
from ..serving import CHECKED_RELEASES, ServeCommand, _launcher, _releases
from .base import Cost, EngineRun, ProposalMethod

if TYPE_CHECKING:  # pragma: no cover
    from ..sources.verifier import Verifier
    from ..validation.report import Report

#: k a method without weights is served with when none is asked for (the drafts of the example world are served with 3)
DEFAULT_K = 3


class WeightlessMethod(ProposalMethod):
    """A proposal method without files, named by a built-in name (``ngram``, ``suffix``).

    Attributes:
        k: the speculative tokens per step when set (:meth:`default_k` otherwise).
    """

    #: the method's name in vLLM's speculative config (``SpeculativeConfig.method``)
    vllm_method: ClassVar[str] = ""

    def __init__(self, named: str) -> None:
        super().__init__(named, None)

    @classmethod
    def builtin(cls, name: str) -> "WeightlessMethod":
        return cls(name)

    # -- what it needs ------------------------------------------------------------------------------

    def unavailable(self) -> str | None:
        """Why the method cannot run on this machine (a package missing), with how to fix it; None when it can."""
        return None

    def method_config(self) -> dict[str, Any]:
        """The keys of vLLM's speculative config beyond ``method`` and ``num_speculative_tokens``."""
        return {}

    def summary(self) -> str:
        """One line: what the method is, with its settings."""
        return self.title

    # -- static checks -----------------------------------------------------------------------------

    def static_checks(self, verifier: "str | Verifier | None") -> "Report":
        """One check, ``method``: the method can run here (its packages import), and what it is."""
        from ..validation.report import FAIL, PASS, Report

        rep = Report(self.named)
        why = self.unavailable()
        rep.add("method", FAIL if why else PASS, why or f"{self.summary()}: no weights to check")
        return rep

    def runnable(self, report: "Report") -> str | None:
        return self.unavailable()

    def default_k(self) -> int:
        return DEFAULT_K

    def check_k(self, k: int) -> None:
        if k < 1:
            raise InputError(f"--num-speculative-tokens {k}: must be at least 1")

    # -- vLLM ----------------------------------------------------------------------------------------

    def speculative_config(self, k: int) -> dict[str, Any]:
        """vLLM's ``speculative_config``: the method, k and :meth:`method_config`."""
        return {"method": self.vllm_method, "num_speculative_tokens": k, **self.method_config()}

    def vllm_engine(self, verifier: str, version: str | None, k: int) -> EngineRun:
        return EngineRun(verifier, self.speculative_config(k), "explicit", self.vllm_method)

    def serve_command(self, version: str, *, verifier: "str | Verifier | None" = None, distribution: str | None = None) -> ServeCommand | None:
        """``vllm serve VERIFIER --speculative-config {...}`` (every checked release has the method).

        Raises:
            InputError: no verifier given (a method without files names none).
        """
        if verifier is None:
            raise InputError(f"{self.title} names no verifier", hint="pass --verifier FOLDER_OR_HUB_ID")
        ref = verifier if isinstance(verifier, str) else verifier.name_or_path
        spec = self.speculative_config(self.default_k())
        return ServeCommand((*_launcher(distribution), ref, "--speculative-config", json.dumps(spec)), "explicit",
                            _releases(list(CHECKED_RELEASES)), spec)

    # -- cost ----------------------------------------------------------------------------------------

    def cost(self, verifier: "Verifier") -> Cost:
        """No draft pass: 0 parameters read (the lookup runs on the host beside the verifier's pass)."""
        from .weights import parameters_read

        return Cost(0, parameters_read(verifier.model_folder(), tied=verifier.info.tie_word_embeddings), True)

    def describe(self, verifier: "Verifier") -> dict[str, Any]:
        return {"method": self.vllm_method, "summary": self.summary(), "speculative_config": self.method_config()}

    def card_rows(self) -> list[tuple[str, str]]:
        return [("proposal method", self.summary())]


__all__ = ["DEFAULT_K", "WeightlessMethod"]
