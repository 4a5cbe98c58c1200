"""``specfmt validate --run`` for any proposal method, through the interface (:mod:`specfmt.methods.base`).

:func:`validate` reads what the user named once (:func:`specfmt.methods.resolve`). A speculators-format draft
runs :func:`specfmt.validation.run.validate_run`, which adds the format's own checks (vLLM's held weights
against the file, the misreadings of a config, the draft vocabulary's diagnosis). Any other method -- a draft
LM; n-gram and suffix decoding in issue 37 -- runs :func:`run_method`, built from the interface alone:

================  ==============================================================================
(static)          the method's checks against the verifier (a draft LM: the pair checks); a failed one
                  stops the run before anything is loaded (:meth:`~specfmt.methods.base.ProposalMethod.runnable`)
``reference``     the method's reference proposer against the verifier's greedy paths (the readings'
                  figures, :func:`~specfmt.validation.acceptance.run_chains`)
``variants``      no misreading the method declares beats it (none for a draft LM)
``vllm``          vLLM attached the method's speculative method (its :class:`~specfmt.methods.base.EngineRun`)
                  and proposed drafts
``vllm_exact``    vLLM's tokens equal the verifier alone
``agreement``     vLLM's per-position acceptance within the tolerance of the reference's
``transformers``  transformers ran the method (its optional part: ``generate`` with the assistant, k fixed)
``transformers_exact``  transformers' tokens equal the verifier's greedy path
``transformers_agreement``  transformers' per-position acceptance within the tolerance of the reference's; for
                  two tokenizers a measured difference, explained (transformers maps through text, vLLM and the
                  reference through the token-level intersection), is a warning
``acceptance``    mean acceptance length >= ``--min-acceptance-length`` (when given)
================  ==============================================================================

``validation.json`` holds the figures of each engine, the method (``method``: for a draft LM the pair and the cost
of a draft step) and ``transformers``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError, SpecfmtError, VLLMRunError
from ..methods import ProposalMethod, ReferenceContext, resolve
from ..serving import CPU_BUILD, installed_distribution, installed_vllm
from ..sources.placement import Placement, resolve_placement
from ..sources.verifier import Verifier
from . import vllm_run
from .acceptance import ChainResult
from .report import FAIL, PASS, SKIP, WARN
from .run import (RunResult, _acceptance_check, _agreement_check, _chains, _device_name, _exact_check, _figures, _finish, _give_back_gpu, _load_verifier,
                  corrected, sampling_kwargs, sampling_of,
                  _run_chains, _skip, _variants_check, agreement_tolerance, check_inputs, validate_run)

if TYPE_CHECKING:  # pragma: no cover
    from .run import ProgressFn

#: the checks :func:`run_method` adds to the method's static ones
RUN_CHECKS = ("reference", "variants", "vllm", "vllm_exact", "agreement", "transformers", "transformers_exact", "transformers_agreement", "acceptance")
_VLLM = ("vllm", "vllm_exact", "agreement")
_HF = ("transformers", "transformers_exact", "transformers_agreement")


def validate(named: str | Path, *, verifier: "str | Verifier | None" = None, use_transformers: bool = True, **kw: Any) -> RunResult:
    """``validate --run`` on whatever ``named`` is: a speculators draft (:func:`~specfmt.validation.run.validate_run`) or
    any other proposal method (:func:`run_method`). Arguments as :func:`~specfmt.validation.run.validate_run`'s.

    Raises:
        InputError, HubError: as :func:`~specfmt.validation.run.validate_run`.
    """
    check_inputs(named, prompts=kw.get("prompts"), max_tokens=kw.get("max_tokens", 32), num_speculative_tokens=kw.get("num_speculative_tokens"),
                 min_acceptance_length=kw.get("min_acceptance_length"), tolerance=kw.get("tolerance", 0.1), use_vllm=kw.get("use_vllm", True),
                 timeout=kw.get("timeout", 900), write=kw.get("write", True), tensor_parallel_size=kw.get("tensor_parallel_size", 1),
                 gpu_memory_utilization=kw.get("gpu_memory_utilization"))
    method = resolve(str(named))
    if method.speculators_config() is not None:  # the speculators format's own run
        return validate_run(named, verifier=verifier, **kw)
    return run_method(method, verifier=verifier, use_transformers=use_transformers, **kw)


def run_method(
    method: ProposalMethod, *, verifier: "str | Verifier | None" = None, prompts: str | None = None, max_tokens: int = 32,
    num_speculative_tokens: int | None = None, min_acceptance_length: float | None = None, tolerance: float = 0.1, use_vllm: bool = True,
    use_transformers: bool = True, timeout: float = 900, write: bool = True, placement: Placement | None = None,
    tensor_parallel_size: int = 1, gpu_memory_utilization: float | None = None, progress: "ProgressFn | None" = None,
    free_methods: bool = True, temperature: float = 0.0, seeds: "list[int] | None" = None,
) -> RunResult:
    """The method's static checks, then its reference run, vLLM and transformers on the same prompts, compared.

    Args: as :func:`specfmt.validation.run.validate_run`'s, and
        method: the method (:func:`specfmt.methods.resolve`).
        verifier: the verifier (default: the one the method names; a draft LM names none).
        use_transformers: run transformers too, when the method has a transformers part.
        free_methods: run the other free methods (n-gram, suffix decoding) beside it on the same paths (:mod:`.beside`).
        temperature / seeds: sample (:func:`specfmt.validation.run.validate_run`'s); transformers then does not run.

    Returns:
        A :class:`~specfmt.validation.run.RunResult`; problems are failed checks, not exceptions.

    Raises:
        InputError: k beyond what the method proposes, a ``--min-acceptance-length`` above k + 1, prompts longer than
            the verifier's positions.
    """
    tell = progress or (lambda phase, done, total: None)
    placement = placement or resolve_placement()
    vref = verifier.ref if isinstance(verifier, Verifier) else verifier or method.verifier_ref()
    ver, ver_error = _verifier(verifier, vref)
    rep = method.static_checks(ver if ver is not None else vref)
    result = RunResult(rep, k=num_speculative_tokens or 0, max_tokens=max_tokens, verifier=ver.name_or_path if ver is not None else vref,
                       sampling=sampling_of(temperature, seeds))
    result.method = {"kind": method.name, "title": method.title}
    why = method.runnable(rep) or (None if ver is not None else "no verifier")
    if why:
        _skip(rep, RUN_CHECKS, why)
        return _finish(method.folder or "", result, write and method.folder is not None)
    result.k = k = num_speculative_tokens or method.default_k()
    method.check_k(k)
    if min_acceptance_length is not None and min_acceptance_length > k + 1:
        raise InputError(f"--min-acceptance-length {min_acceptance_length} cannot be reached with k={k}: at most {k + 1} tokens per step")
    result.method.update(_describe(method, ver))
    model = _load_verifier(result, ver, ver_error, vref, prompts, placement, tell)
    if model is None:
        _skip(rep, RUN_CHECKS[1:], "no verifier")
        return _finish(method.folder or "", result, write and method.folder is not None)
    ctx = ReferenceContext(ver, model, placement)
    ref_res = _reference(result, method, ctx, tell, free_methods)
    if use_transformers and method.transformers is not None and ref_res is not None and result.sampling is None:
        _transformers_checks(result, method, ctx, ref_res, tolerance)
    else:
        _skip(rep, _HF, "no reference run" if ref_res is None else "--no-transformers" if use_transformers is False
              else "sampled: transformers' assisted generation is checked greedy" if result.sampling else f"transformers does not run {method.title}s")
    if not use_vllm:
        _skip(rep, _VLLM, "--no-vllm")
    elif method.cpu_build_refusal() and (installed_distribution() or ("",))[0] == CPU_BUILD:
        _skip(rep, _VLLM, f"vLLM's CPU build cannot run it: {method.cpu_build_refusal()}")
    else:
        _give_back_gpu(placement, ver)
        _vllm_checks(result, method, ver, ref_res, tolerance, timeout, {"tensor_parallel_size": tensor_parallel_size,
                                                                       "gpu_memory_utilization": gpu_memory_utilization}, tell)
    _acceptance_check(result, min_acceptance_length)
    return _finish(method.folder or "", result, write and method.folder is not None)


def _verifier(verifier: "str | Verifier | None", vref: str | None) -> tuple["Verifier | None", SpecfmtError | None]:
    if isinstance(verifier, Verifier):
        return verifier, None
    if not vref:
        return None, None
    try:
        return Verifier.load(vref), None
    except SpecfmtError as e:
        return None, e


def _describe(method: ProposalMethod, ver: Verifier) -> dict[str, Any]:
    """What ``validation.json`` records of the method against the verifier: the cost of a draft step, and what the
    method adds (a draft LM: the pair, :meth:`~specfmt.methods.base.ProposalMethod.describe`)."""
    out: dict[str, Any] = {}
    try:
        out["cost"] = method.cost(ver).to_json()
    except SpecfmtError:
        pass
    out.update(method.describe(ver))
    return out


def _reference(result: RunResult, method: ProposalMethod, ctx: ReferenceContext, tell: "ProgressFn", free_methods: bool = False) -> ChainResult | None:
    """The ``reference`` and ``variants`` checks: each reading's proposer against the verifier's greedy paths; with
    ``free_methods``, the other free methods on the same paths (``result.beside``, :mod:`.beside`)."""
    from .beside import beside, companions

    import torch
    import transformers

    rep, k = result.report, result.k
    try:
        readings = method.readings(ctx)[:1 if result.sampling else None]  # misreadings: greedy only
        proposers = [method.proposer(r, ctx) for r in readings]
        free = companions(ctx, k, exclude=method) if free_methods else []
        chains = _chains(result, ctx.model, proposers + [c.proposer for c in free if c.proposer is not None], tell)
        runs = list(zip(readings, chains))
    except SpecfmtError as e:
        rep.add("reference", FAIL, f"the reference cannot run the method: {e.one_line()}")
        rep.add("variants", SKIP, "no reference run")
        return None
    except (RuntimeError, KeyError, IndexError, ValueError) as e:
        rep.add("reference", FAIL, f"the reference forward pass failed: {str(e).splitlines()[0][:300]}")
        rep.add("variants", SKIP, "no reference run")
        return None
    ref = runs[0][1]
    result.reference = {"engine": f"transformers {transformers.__version__}, torch {torch.__version__}", "device": _device_name(ctx.placement),
                        "dtype": ctx.placement.dtype, "device_map": ctx.placement.device_map,
                        "seconds": {"verifier": round(ref.verifier_seconds, 2), "drafts": round(sum(r.draft_seconds for _, r in runs), 2)},
                        **_figures(ref), "steps": ref.steps, "tokens_per_step": round(ref.tokens_per_step, 4)}
    if free_methods:
        try:
            cost = method.cost(ctx.verifier)
        except SpecfmtError:
            cost = None
        result.beside = beside(free, chains[len(proposers):], ref, cost, k, title=f"this {method.title}")
    extra = method.reference_notes(ctx, ref)
    if extra:
        result.method = {**(result.method or {}), **extra}
    rep.add("reference", PASS, f"{ref.prompts} prompts x {result.max_tokens} tokens, k={k}: mean acceptance length {ref.mean_acceptance_length:.3f}"
            + (f", {ref.tokens_per_step:.3f} tokens per verifier pass over {ref.steps} steps" if ref.steps != ref.num_drafts else ""))
    if result.sampling:
        rep.add("variants", SKIP, "sampled: the misreadings are compared greedy (run without --temperature)")
    else:
        _variants_check(result, method, runs)
    return ref


def _vllm_checks(result: RunResult, method: ProposalMethod, ver: Verifier, ref: ChainResult | None, tolerance: float, timeout: float,
                 gpu: dict[str, Any], tell: "ProgressFn") -> None:
    """``vllm``, ``vllm_exact``, ``agreement``: the method in vLLM (its :class:`~specfmt.methods.base.EngineRun`) beside the verifier alone,
    in one engine host."""
    rep, ids = result.report, result.prompts.ids
    engine = method.vllm_engine(ver.name_or_path, installed_vllm(), result.k)
    max_len = vllm_run.context_limit(ids, result.max_tokens, result.k)
    try:
        with vllm_run.engines():
            tell("vLLM", 0, 2)
            run = vllm_run.generate(engine.model, ids, max_tokens=result.max_tokens, max_model_len=max_len, timeout=timeout,
                                    speculative_config=engine.speculative_config, **gpu, **sampling_kwargs(result))
            tell("vLLM", 1, 2)
            alone = None if result.sampling else vllm_run.generate(ver.name_or_path, ids, max_tokens=result.max_tokens, max_model_len=max_len,
                                                                    timeout=timeout, **gpu)
            tell("vLLM", 2, 2)
    except VLLMRunError as e:
        rep.add("vllm", FAIL, e.one_line())
        _skip(rep, _VLLM[1:], "vLLM did not run")
        return
    line = method.serve_command(run.vllm_version, verifier=ver) if run.vllm_version else None
    result.vllm = {"engine": f"vllm {run.vllm_version}", "dtype": run.dtype, "method": run.speculative_method, "draft_class": run.draft_class,
                   "form": engine.form, "command": line.line if line else None, "speculative_config": engine.speculative_config, **_figures(run)}
    if run.speculative_method != engine.method or not run.num_drafts:
        rep.add("vllm", FAIL, f"vLLM attached method {run.speculative_method!r} (expected {engine.method!r}) and proposed {run.num_drafts} drafts")
    else:
        rep.add("vllm", WARN if run.corrections else PASS, f"vLLM {run.vllm_version} ({run.dtype}) ran {run.draft_class} as {engine.method}, k={run.num_speculative_tokens}: "
                              f"{run.num_drafts} drafts, mean acceptance length {run.mean_acceptance_length:.3f}", corrected(run))
    _exact_check(result, run, alone)
    if ref is None:
        rep.add("agreement", SKIP, "no reference figures")
    else:
        _agreement_check(result, run, ref, tolerance)


def _transformers_checks(result: RunResult, method: ProposalMethod, ctx: ReferenceContext, ref: ChainResult, tolerance: float) -> None:
    """``transformers``, ``transformers_exact``, ``transformers_agreement``: ``generate(assistant_model=...)`` with k fixed."""
    import transformers

    from .hf_assisted import assisted

    rep, k = result.report, result.k
    part = method.transformers
    assert part is not None
    try:
        kwargs = part.generate_kwargs(ctx.verifier, ctx.placement, k)
        run = assisted(ctx.model, result.prompts.ids, result.max_tokens, kwargs)
    except SpecfmtError as e:
        rep.add("transformers", SKIP, f"transformers cannot run it: {e.one_line()}")
        _skip(rep, _HF[1:], "transformers did not run")
        return
    run.accepted_per_position += [0] * (k - len(run.accepted_per_position))  # positions never accepted count 0, as vLLM's counter does
    figures = _figures(run)
    result.transformers = {"engine": f"transformers {transformers.__version__}", "dtype": ctx.placement.dtype, "call": part.generate_call(ctx.verifier.ref, k),
                           "mapping": part.mapping(ctx.verifier), **figures, "steps": run.steps, "longest_proposal": run.longest}
    rep.add("transformers", PASS if run.num_drafts else FAIL, f"transformers {transformers.__version__} generate(assistant_model=...) with k={k} "
            f"({result.transformers['mapping']}): {run.num_drafts} drafts, mean acceptance length {run.mean_acceptance_length:.3f}")
    diff = [i for i, (a, b) in enumerate(zip(run.token_ids, ref.token_ids)) if a != b]
    rep.add("transformers_exact", FAIL if diff else PASS, f"{len(diff)} of {len(ref.token_ids)} prompts differ from the verifier's greedy path" if diff
            else f"tokens equal the verifier's greedy path ({len(ref.token_ids)} prompts x {result.max_tokens})", [f"prompt {i}" for i in diff])
    _transformers_agreement(result, method, ctx, run, ref, tolerance)


def _transformers_agreement(result: RunResult, method: ProposalMethod, ctx: ReferenceContext, run: Any, ref: ChainResult, tolerance: float) -> None:
    rates = _figures(run)["acceptance_rate_per_position"]
    want = _figures(ref)["acceptance_rate_per_position"]
    n = max(len(rates), len(want))
    rates, want = rates + [0.0] * (n - len(rates)), want + [0.0] * (n - len(want))
    gaps = [abs(a - b) for a, b in zip(rates, want)]
    allowed = agreement_tolerance(tolerance, ctx.placement.dtype, ctx.placement.dtype)
    detail = [f"position {i + 1}: reference {b:.3f}, transformers {a:.3f}" for i, (a, b) in enumerate(zip(rates, want))]
    if max(gaps, default=0) <= allowed:
        result.report.add("transformers_agreement", PASS, f"per-position acceptance within {max(gaps, default=0):.3f} of the reference (tolerance {allowed})")
        return
    why = method.transformers.agreement_note(ctx.verifier)  # type: ignore[union-attr]
    other = "".join(f"; the reference {v['reading']}: mean acceptance length {v['mean_acceptance_length']:.3f}" for v in result.variants)
    result.report.add("transformers_agreement", WARN if why else FAIL,
                      f"transformers and the reference differ by up to {max(gaps):.3f} per position (tolerance {allowed})" + (f": {why}" if why else "")
                      + (f" (transformers {run.mean_acceptance_length:.3f}{other})" if other else ""), detail)


__all__ = ["RUN_CHECKS", "run_method", "validate"]
