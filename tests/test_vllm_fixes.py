"""specfmt.validation.vllm_fixes: the CPU build's per-request expansion in the rejection sampler, found by running the
installed build's own replacement kernel, and its correction (the Triton kernel's semantics in torch)."""

from __future__ import annotations

import pytest
import torch

from specfmt.validation import vllm_fixes


def triton_semantics(values: list, counts: list[int], replace_from, replace_to) -> list:
    """``expand_kernel`` (vllm/v1/sample/rejection_sampler.py) read by hand: request i's value, ``replace_from`` replaced."""
    return [replace_to if v == replace_from else v for v, n in zip(values, counts) for _ in range(n)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32])
def test_the_correction_expands_each_request_to_its_tokens_as_the_triton_kernel_does(dtype):
    values, counts = [0.5, -1, 2.0, 0.7], [2, 0, 3, 1]
    x = torch.tensor(values).to(dtype)
    cu = torch.tensor(counts).cumsum(0).to(torch.int32)
    out = torch.full((sum(counts) + 2,), 99).to(dtype)  # a longer buffer: the tail stays as it was
    vllm_fixes._expand(out, x, cu, -1, 1)
    want = triton_semantics(x.tolist(), counts, -1, 1)
    assert out.tolist() == want + [99, 99]


def test_a_greedy_run_and_a_gpu_build_change_nothing():
    assert vllm_fixes.correct(on_cpu=True, temperature=0.0) == []
    assert vllm_fixes.correct(on_cpu=False, temperature=1.0) == []


@pytest.mark.vllm
def test_the_installed_cpu_kernel_is_found_defective_exactly_when_it_expands_floats_wrongly(monkeypatch):
    """The probe's verdict is the installed build's own kernel against the Triton semantics (vLLM 0.32.0's CPU build:
    uninitialised memory comes back, 2026-11-29); the correction then stands in for it, in this process only, and is
    reported on every sampled run after it."""
    import vllm
    import vllm._custom_ops  # noqa: F401 - the build's C++ ops
    from vllm.platforms import current_platform
    from vllm.utils import cpu_triton_utils

    installed = cpu_triton_utils._expand_kernel_impl
    monkeypatch.setattr(cpu_triton_utils, "_expand_kernel_impl", installed)  # restored after the test
    out = torch.full((4,), -7.0)
    installed(out, torch.tensor([0.25, 3.0]), torch.tensor([3, 4], dtype=torch.int32), -1, 1)  # as the sampler calls it
    wrong = out.tolist() != [0.25, 0.25, 0.25, 3.0]
    if vllm.__version__ == "0.32.0" and current_platform.is_cpu():  # the build this was found in (2026-11-29)
        assert wrong, out
    assert vllm_fixes.expand_defect() == wrong
    said = vllm_fixes.correct(on_cpu=current_platform.is_cpu(), temperature=1.0)
    assert said == ([vllm_fixes.EXPAND] if wrong and current_platform.is_cpu() else [])
    if said:
        assert cpu_triton_utils._expand_kernel_impl is vllm_fixes._expand and not vllm_fixes.expand_defect()
        assert vllm_fixes.correct(on_cpu=True, temperature=0.7) == said  # a later sampled run in the same host says it too
