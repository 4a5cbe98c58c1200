"""A speculators-format draft as a proposal method: an adapter over :class:`specfmt.algorithms.base.Algorithm`.

Everything an algorithm knows stays in its module (:mod:`specfmt.algorithms`); this adapter only answers the
:class:`~specfmt.methods.base.ProposalMethod` questions with it: the static checks are
:func:`specfmt.validation.static.validate_static`, the readings and proposers the algorithm's
:class:`~specfmt.algorithms.base.Reference` part, the engine and serve lines :mod:`specfmt.serving`'s.

It is the registry's fallback (:attr:`~specfmt.methods.base.ProposalMethod.fallback`): a folder no other kind
claims is read as one, so that its static checks say what the folder is instead (a research draft and its
``specfmt convert`` line, an older speculators checkpoint and ``specfmt upgrade``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..algorithms import find, schema_violations
from ..algorithms.base import Algorithm, Variant
from ..errors import InputError
from ..format.config import speculative_tokens, verifier_ref
from .base import Cost, EngineRun, ProposalMethod, ReferenceContext, register
from .weights import parameters_read

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ..algorithms.reference import Proposer
    from ..serving import ServeCommand
    from ..sources.resolve import Resolved
    from ..sources.verifier import Verifier
    from ..validation.report import Report


@register
class SpeculatorsMethod(ProposalMethod):
    """A draft in the speculators format, run by its algorithm (``speculators_model_type``).

    Attributes:
        config: its config.json (None when it has none or it is unreadable).
    """

    name = "speculators"
    fallback = True

    def __init__(self, named: str, resolved: "Resolved | None", config: dict[str, Any] | None) -> None:
        super().__init__(named, resolved)
        self.config = config
        self._tensors: dict[str, Any] | None = None
        self._near: tuple[int, dict[str, Any]] | None = None

    @classmethod
    def claim(cls, resolved: "Resolved", config: dict[str, Any] | None) -> "SpeculatorsMethod":
        return cls(resolved.name_or_path, resolved, config)

    # -- what it is ------------------------------------------------------------------------------

    @property
    def algorithm(self) -> Algorithm | None:
        """The algorithm its config names (``speculators_model_type``), or None (no config, or an unknown name)."""
        return find((self.config or {}).get("speculators_model_type"))

    def _algo(self) -> Algorithm:
        algo = self.algorithm
        if algo is None or schema_violations(self.config):
            raise InputError("not a valid speculators-format draft", where=str(self.folder), hint=f"see `specfmt validate {self.named}`")
        return algo

    @property
    def title(self) -> str:
        algo = self.algorithm
        return f"{algo.title} draft" if algo is not None else "speculators draft"

    def verifier_ref(self) -> str | None:
        return verifier_ref(self.config or {})

    def speculators_config(self) -> dict[str, Any]:
        return self.config if self.config is not None else {}

    # -- static checks -----------------------------------------------------------------------------

    def static_checks(self, verifier: "str | Verifier | None") -> "Report":
        from ..validation.static import validate_static

        return validate_static(self.named, verifier)

    def runnable(self, report: "Report") -> str | None:
        check = report.check("schema")
        return None if check is not None and check.status == "pass" else "the config is not schema-valid"

    def default_k(self) -> int:
        return speculative_tokens(self._algo_config())

    def _algo_config(self) -> dict[str, Any]:
        self._algo()
        return self.config  # type: ignore[return-value]

    def check_k(self, k: int) -> None:
        algo = self._algo()
        limit = algo.speculative_token_limit(self.config)  # type: ignore[arg-type]
        if limit is not None and k > limit[0]:
            raise InputError(f"--num-speculative-tokens {k}: this {algo.title} checkpoint has {limit[0]} {limit[1]}")

    # -- the reference -------------------------------------------------------------------------------

    def weights_folder(self):  # noqa: ANN201
        """The folder with the weights too (a Hub id's safetensors fetched now; a local folder as it is)."""
        from ..sources.resolve import fetch

        return fetch(self.resolved, ["*.json", "*.safetensors"])  # type: ignore[arg-type]

    def tensors(self) -> dict[str, "torch.Tensor"]:
        """The draft's tensors, read once (every safetensors file of the folder)."""
        if self._tensors is None:
            from safetensors.torch import load_file

            self._tensors = {}
            for f in sorted(self.weights_folder().glob("*.safetensors")):
                self._tensors.update(load_file(str(f)))
        return self._tensors

    def readings(self, ctx: ReferenceContext) -> list[Variant]:
        return self._algo().readings(self.config, ctx.model.config.num_hidden_layers)  # type: ignore[arg-type]

    def proposer(self, reading: Variant, ctx: ReferenceContext) -> "Proposer":
        algo = self._algo()
        model = ctx.model
        embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
        if self._near is None or self._near[0] != id(ctx):  # one copy beside the verifier's states, shared by every reading
            dt = ctx.placement.torch_dtype
            self._near = (id(ctx), {n: t.to(head.device, dt) if t.is_floating_point() else t.to(head.device) for n, t in self.tensors().items()})
        return algo.proposer(reading, self._near[1], embed, head)

    def explain(self, cause: str) -> str:
        return self._algo().explain(cause)

    # -- vLLM ----------------------------------------------------------------------------------------

    def vllm_engine(self, verifier: str, version: str | None, k: int) -> EngineRun:
        from ..serving import engine_args

        algo = self._algo()
        model, spec, form = engine_args(self.config, self.ref, verifier, version, k)  # type: ignore[arg-type]
        return EngineRun(model, spec, form, algo.vllm_method)

    def serve_command(self, version: str, *, verifier: str | None = None, distribution: str | None = None) -> "ServeCommand | None":
        from ..serving import serve_command

        self._algo()
        return serve_command(self.config, self.ref, version, distribution=distribution)  # type: ignore[arg-type]

    def serving_note(self, verifier: "str | Verifier | None" = None) -> str:
        return self._algo().serving_note()

    def cpu_build_refusal(self) -> str:
        return self._algo().cpu_build_refusal

    # -- cost and card -------------------------------------------------------------------------------

    def cost(self, verifier: "Verifier") -> Cost:
        algo = self._algo()
        return Cost(parameters_read(self.weights_folder()), parameters_read(verifier.model_folder(), tied=verifier.info.tie_word_embeddings),
                    algo.parallel_drafting)

    def card_rows(self) -> list[tuple[str, str]]:
        algo = self._algo()
        return algo.card.card_rows(self.config) if algo.card is not None else []  # type: ignore[arg-type]


__all__ = ["SpeculatorsMethod"]
