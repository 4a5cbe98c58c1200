"""The proposal-method interface: what proposes the draft tokens a verifier checks, and all specfmt does with one.

vLLM serves many kinds of drafts behind one call: ``vllm/v1/spec_decode/`` has ``EagleProposer``,
``DFlashProposer``, ``MedusaProposer``, ``DraftModelProposer``, ``NgramProposer``, ``SuffixDecodingProposer``,
each with a ``propose`` method, and the method's name is read once, where the proposer is built
(``gpu_model_runner.py``). specfmt is built the same way. ``validate --run``, ``serve-command`` and ``push``
talk to a :class:`ProposalMethod`, and the name is read in one place, the registry
(:func:`specfmt.methods.resolve`). Shared code never branches on a method's name; it asks a method
for a part (``method.transformers is None``), as it asks an algorithm (``algo.training is None``).

A speculators algorithm (EAGLE-3, Medusa, DFlash, ...) is one kind of proposal method
(:class:`~specfmt.methods.speculators.SpeculatorsMethod`, an adapter over
:class:`specfmt.algorithms.base.Algorithm`). A small causal LM used as the draft is another
(:class:`~specfmt.methods.draft_lm.DraftLM`). n-gram and suffix decoding are proposal methods
without weights, and plug in the same way.

What a method provides, each part stated once:

========================  ==========================================================================
``static_checks``         its checks against a verifier, as a :class:`~specfmt.validation.report.Report`
                          (a speculators draft: schema, tensors, ...; a draft LM: the pair checks)
``default_k``/``check_k``  the speculative tokens per step it is served with, and the most it can propose
``readings``/``proposer``  the reference: the method as written (and its plausible misreadings), each a
                          :data:`~specfmt.algorithms.reference.Proposer` ``propose(tokens, states, k)``
                          that returns **at most** k verifier ids, and may return none: a step without a
                          proposal is a verifier forward pass all the same
                          (:func:`specfmt.validation.acceptance.run_chains` counts it)
``vllm_engine``           how ``validate --run`` starts vLLM to run it (:class:`EngineRun`: the model,
                          the speculative config, the method vLLM must attach)
``serve_command(s)``      the serve line per vLLM release (the CPU build's launcher on the CPU build)
``transformers``          optional part: how transformers runs it (``generate`` kwargs, the printed call)
``cost``                  what one verification step's drafting reads, against one verifier pass
                          (:class:`Cost`: parameters read per draft pass; a chain pays k passes, a
                          parallel draft one)
``card_rows``             its rows of the model card, and what the card says of the verifier
========================  ==========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..algorithms.base import Variant

if TYPE_CHECKING:  # pragma: no cover
    from ..algorithms.reference import Proposer
    from ..serving import ServeCommand
    from ..sources.placement import Placement
    from ..sources.resolve import Resolved
    from ..sources.verifier import Verifier
    from ..validation.report import Report


@dataclass(frozen=True)
class Cost:
    """The cost of one verification step's drafting, relative to one verifier forward pass.

    At batch size 1 decoding is memory-bound: a forward pass costs about the bytes of the parameters it
    reads (Leviathan et al. 2023, arXiv 2211.17192, section 3.4; the cost coefficient c). Both models run in the
    served dtype (vLLM runs a draft in the verifier's), so the byte ratio is the ratio of parameters read.
    An input-embedding table is not counted: a pass reads one row per token, not the table.

    Attributes:
        draft_parameters: parameters one draft pass reads (0 for a method without weights).
        verifier_parameters: parameters one verifier pass reads.
        parallel: True when the k tokens come from one draft pass (P-EAGLE, DFlash, Medusa heads);
            False for a chain, which pays one pass per drafted token (EAGLE, a draft LM).
    """

    draft_parameters: int
    verifier_parameters: int
    parallel: bool

    @property
    def ratio(self) -> float:
        """c: one draft pass over one verifier pass (parameters read)."""
        return self.draft_parameters / self.verifier_parameters if self.verifier_parameters else 0.0

    def passes(self, k: int) -> int:
        """Draft passes per verification step: 1 for a parallel draft, k for a chain."""
        return 1 if self.parallel else k

    def per_step(self, k: int) -> float:
        """The drafting of one verification step, in verifier passes: ``c * passes(k)``."""
        return self.ratio * self.passes(k)

    def to_json(self) -> dict[str, Any]:
        return {"draft_parameters": self.draft_parameters, "verifier_parameters": self.verifier_parameters,
                "ratio": round(self.ratio, 6), "parallel": self.parallel}


@dataclass(frozen=True)
class EngineRun:
    """How ``validate --run`` starts vLLM so that it runs a method as the release serves it.

    Attributes:
        model: what ``LLM(model=...)`` loads: a speculators folder (vLLM attaches the draft itself) or the verifier.
        speculative_config: the ``speculative_config`` given (None: none, as ``vllm serve OUT``).
        form: ``auto`` (vLLM reads the method from the folder) or ``explicit``.
        method: the speculative method vLLM must attach (the ``vllm`` check compares).
    """

    model: str
    speculative_config: dict[str, Any] | None
    form: str
    method: str


@dataclass
class ReferenceContext:
    """What a reference proposer is built from, loaded once per run and shared by every reading.

    Attributes:
        verifier: the verifier, resolved.
        model: the verifier as a transformers causal LM (eval mode), in ``placement``.
        placement: where and in what dtype the verifier runs; drafts run beside it, in its dtype.
    """

    verifier: "Verifier"
    model: Any
    placement: "Placement"


class Transformers:
    """The optional part of a method that transformers runs (``model.generate(...)`` with an assistant)."""

    def generate_kwargs(self, verifier: "Verifier", placement: "Placement", k: int) -> dict[str, Any]:
        """The ``generate`` keyword arguments beyond the inputs and the length: the assistant, loaded in
        ``placement``, with k drafted tokens per step.

        Raises:
            SpecfmtError: the assistant cannot be loaded.
        """
        raise NotImplementedError

    def generate_call(self, verifier: str, k: int) -> str:
        """The Python that runs the pair with transformers, for a person to paste (``serve-command --engine transformers``)."""
        raise NotImplementedError

    def mapping(self, verifier: "Verifier") -> str:
        """How transformers maps tokens between the verifier and the method, in words (``validation.json``)."""
        return "the verifier's ids"

    def agreement_note(self, verifier: "Verifier") -> str:
        """Why transformers' acceptance may legitimately differ from the reference's for this verifier (empty: it may not)."""
        return ""


class ProposalMethod:
    """Base class of a proposal method (see the module's table for the parts).

    Subclasses register with :func:`specfmt.methods.register`; the registry builds one from what the user
    named (:meth:`claim`, :meth:`builtin`).

    Attributes:
        name: the registry's name of the kind (``speculators``, ``draft_model``, ``ngram``); the registry reads it, no one else.
        named: what the user named (a folder, a Hub id or a built-in name).
        resolved: where its files are (None for a method without files).
    """

    name: ClassVar[str] = ""
    #: built-in names the user types for a method without files (``ngram``); empty for a method read from a folder
    builtin_names: ClassVar[tuple[str, ...]] = ()
    #: True for the kind that takes any folder no other kind claims (asked last by the registry)
    fallback: ClassVar[bool] = False

    def __init__(self, named: str, resolved: "Resolved | None" = None) -> None:
        self.named = named
        self.resolved = resolved

    # -- the registry ------------------------------------------------------------------------------

    @classmethod
    def claim(cls, resolved: "Resolved", config: dict[str, Any] | None) -> "ProposalMethod | None":
        """This kind of method read from a folder (``config`` its config.json, None when it has none), or None
        when the folder is not of this kind."""
        return None

    @classmethod
    def builtin(cls, name: str) -> "ProposalMethod":
        """The method a built-in name stands for (one of :attr:`builtin_names`)."""
        raise NotImplementedError

    # -- what it is ------------------------------------------------------------------------------

    @property
    def title(self) -> str:
        """What people call it (``EAGLE-3 draft``, ``draft model (llama)``)."""
        raise NotImplementedError

    @property
    def folder(self) -> Path | None:
        """The local folder holding its files (None for a method without files)."""
        return None if self.resolved is None else self.resolved.folder

    @property
    def ref(self) -> str:
        """How it is named in commands and configs: the Hub id or the absolute folder path (else :attr:`named`)."""
        return self.named if self.resolved is None else self.resolved.name_or_path

    def verifier_ref(self) -> str | None:
        """The verifier the method names itself (a speculators config names one), or None: ``--verifier`` must."""
        return None

    def speculators_config(self) -> dict[str, Any] | None:
        """The config.json of a speculators-format draft, whose run adds the format's own checks
        (:func:`specfmt.validation.run.validate_run`); None for any other method."""
        return None

    def describe(self, verifier: "Verifier") -> dict[str, Any]:
        """What ``validation.json`` records of the method against ``verifier`` beyond its cost (a draft LM: the pair)."""
        return {}

    @property
    def transformers(self) -> Transformers | None:
        """The transformers part, or None when transformers cannot run this method."""
        return self if isinstance(self, Transformers) else None

    # -- static checks -----------------------------------------------------------------------------

    def static_checks(self, verifier: "str | Verifier | None") -> "Report":
        """Its checks against ``verifier`` (None: the one it names, when it names one).

        Returns:
            A report; problems of the method's files are failed checks, not exceptions.

        Raises:
            InputError, HubError: a folder cannot be found at all.
        """
        raise NotImplementedError

    def runnable(self, report: "Report") -> str | None:
        """Why ``validate --run`` cannot run the method after these static checks, or None when it can."""
        return None

    # -- k -----------------------------------------------------------------------------------------

    def default_k(self) -> int:
        """The speculative tokens per step it is served with when none are asked for."""
        return 3

    def check_k(self, k: int) -> None:
        """Refuse a k the method cannot propose.

        Raises:
            InputError: more tokens than the method can propose per step.
        """
        return None

    # -- the reference -------------------------------------------------------------------------------

    def readings(self, ctx: ReferenceContext) -> list[Variant]:
        """The method as written first, then the misreadings it is known for (none by default)."""
        return [Variant(None, "as written", {})]

    def proposer(self, reading: Variant, ctx: ReferenceContext) -> "Proposer":
        """The reference proposer of ``reading``: ``propose(tokens, states, k)`` -> at most k verifier ids (none:
        no proposal at this step), run as the engines run the method."""
        raise NotImplementedError

    def explain(self, cause: str) -> str:
        """The one-line explanation of a misreading cause of :meth:`readings`."""
        return cause

    def reference_notes(self, ctx: ReferenceContext, result: Any) -> dict[str, Any]:
        """Figures of the reference run (a :class:`~specfmt.validation.acceptance.ChainResult`) the method adds to
        ``validation.json`` (a draft LM with its own tokenizer: the verifier's greedy tokens inside the intersection)."""
        return {}

    # -- vLLM ----------------------------------------------------------------------------------------

    def vllm_engine(self, verifier: str, version: str | None, k: int) -> EngineRun:
        """How ``validate --run`` starts vLLM ``version`` (None: not installed) on ``verifier`` (a resolved
        folder or Hub id) with k speculative tokens."""
        raise NotImplementedError

    def serve_command(self, version: str, *, verifier: str | None = None, distribution: str | None = None) -> "ServeCommand | None":
        """The serve line for vLLM ``version`` (None: that release cannot serve it).

        Args:
            verifier: the verifier (None: the one the method names).
            distribution: the build that runs it (None: the installed one; :data:`specfmt.serving.LAUNCHERS`).

        Raises:
            InputError: the method names no verifier and none was given.
        """
        raise NotImplementedError

    def serving_note(self, verifier: "str | Verifier | None" = None) -> str:
        """What to tell a user whose vLLM cannot serve the method (beside ``verifier``, for a method that names none);
        empty when every checked release can."""
        return ""

    def cpu_build_refusal(self) -> str:
        """Why vLLM's CPU build cannot run it, with where vLLM says so; empty when it can."""
        return ""

    # -- cost and card -------------------------------------------------------------------------------

    def cost(self, verifier: "Verifier") -> Cost:
        """The cost of its drafting per verification step against ``verifier`` (:class:`Cost`)."""
        raise NotImplementedError

    def card_rows(self) -> list[tuple[str, str]]:
        """Rows of the model card's table that say what the method is."""
        return []


#: the registered kinds, in the order they are asked to claim a folder (a ``fallback`` kind after the others)
REGISTRY: list[type[ProposalMethod]] = []

#: the files a method read from a Hub id needs to run: configs, tokenizer files, weights (:func:`specfmt.sources.resolve.fetch`)
PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]


def register(cls: type[ProposalMethod]) -> type[ProposalMethod]:
    """Class decorator: make a kind of proposal method findable by :func:`resolve`.

    Raises:
        ValueError: the kind has no name, or its name or a built-in name is taken.
    """
    taken = {c.name for c in REGISTRY} | {n for c in REGISTRY for n in c.builtin_names}
    if not cls.name or cls.name in taken or set(cls.builtin_names) & taken:
        raise ValueError(f"proposal method {cls.name!r} missing or taken")
    REGISTRY.append(cls)
    return cls



__all__ = ["Cost", "EngineRun", "PATTERNS", "ProposalMethod", "REGISTRY", "ReferenceContext", "Transformers", "Variant", "register"]
