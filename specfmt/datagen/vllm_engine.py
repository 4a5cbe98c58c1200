"""The vLLM hidden-state engine: vLLM's ``extract_hidden_states`` method and its hidden-states connector.

The verifier runs in an offline ``vllm.LLM`` with ``speculative_config={"method": "extract_hidden_states",
"num_speculative_tokens": 1, "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids":
layers}}}`` (``vllm/config/speculative.py``; ``vllm/v1/spec_decode/extract_hidden_states.py`` asserts k = 1)
and a ``kv_transfer_config`` naming the connector that writes each request's file:

- on vLLM's CPU build, specfmt's :class:`~specfmt.datagen.cpu_connector.SyncHiddenStatesConnector`, loaded
  by module path (the stock connector's pinned-memory copy fails there);
- on a GPU build, vLLM's stock ``ExampleHiddenStatesConnector``.

What vLLM writes, checked against its source (vLLM 0.32):

- ``hidden_states`` [T, n_layers, H] in the model's dtype: the verifier's forward hands the drafter its
  aux hidden states, one per id in ``eagle_aux_hidden_state_layer_ids`` *in layer order*
  (``llama.py``/``qwen2.py`` ``forward`` call ``_maybe_add_hidden_state`` as the layers run;
  ``interfaces.py``: id l is ``hidden_states + residual`` after l layers, so id L is the last layer's
  output before the final norm), stacked on dim 1 and stored in a cache-only attention layer with
  n_layers heads of size H (``model_executor/models/extract_hidden_states.py``). Hence the ids must be
  strictly increasing here: vLLM would silently store them sorted and once each.
- ``token_ids`` [T] int64: the request's ``prompt_token_ids`` (connector ``request_finished``; the
  ``include_output_tokens`` option is not used). With ``max_tokens=1`` the one sampled token is never
  fed back through the model, so T is exactly the prompt's length and nothing needs fixing up
  (``specfmt datagen`` checks every placed file all the same: :func:`specfmt.datagen.layout.check_sample`).

The engine core runs in specfmt's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as ``validate --run``'s host
and ``benchmarks/datagen_throughput.py`` run it; on the CPU build no other process is started): the terminal's Ctrl-C
then reaches specfmt alone, which stops (:mod:`specfmt.interrupt`). With vLLM's engine-core process, Ctrl-C also
reaches that process, which prints a traceback while it imports, and vLLM 0.32's client swallows the
``KeyboardInterrupt`` while it waits for the engine core to start (``zmq_socket_ctx`` in
``vllm/utils/network_utils.py``), then waits ``VLLM_ENGINE_READY_TIMEOUT_S`` (600 s) for an engine that is gone.

Each request's file path reaches the connector in ``SamplingParams.extra_args["kv_transfer_params"]
["hidden_states_path"]`` (honoured with ``allow_custom_save_path``), as speculators' client expects it
back (``speculators/data_generation/vllm_client.py::extract_output``). The files are written into
``FOLDER/.vllm-staging/`` (same filesystem), waited for through vLLM's ``.lock`` protocol, and placed with ``os.replace`` as ``FOLDER/hs_{index}.safetensors``, with the mode the umask gives a new file
(:func:`specfmt.checkpoint.output.apply_umask`; the connector's ``save_file`` makes 0600). Prefix caching is off: every stored
row comes from the request's own forward.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..checkpoint.output import apply_umask
from .. import interrupt
from ..errors import InputError
from .engine import check_layers, sample_path

#: the sub-folder of the output folder vLLM writes into before files are placed
STAGING = ".vllm-staging"
#: vLLM's stock connector (GPU builds), from vLLM's registry
STOCK_CONNECTOR = "ExampleHiddenStatesConnector"


def engine_arguments(verifier: str, layers: list[int], staging: Path, *, cpu: bool, tensor_parallel_size: int,
                     dtype: str, max_model_len: int | None, enforce_eager: bool, gpu_memory_utilization: float | None,
                     max_num_seqs: int | None = None) -> dict[str, Any]:
    """``vllm.LLM(**arguments)`` for hidden-state extraction (module docstring)."""
    connector: dict[str, Any] = {
        "kv_connector": STOCK_CONNECTOR,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(staging), "allow_custom_save_path": True},
    }
    if cpu:
        from .cpu_connector import CONNECTOR, MODULE

        connector.update(kv_connector=CONNECTOR, kv_connector_module_path=MODULE)
    args: dict[str, Any] = {
        "model": verifier,
        "dtype": dtype,
        "tensor_parallel_size": tensor_parallel_size,
        "enforce_eager": enforce_eager,
        "enable_prefix_caching": False,
        "disable_log_stats": True,
        "seed": 0,
        "speculative_config": {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                               "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layers)}}},
        "kv_transfer_config": connector,
    }
    if max_model_len is not None:
        args["max_model_len"] = max_model_len
    if max_num_seqs is not None:
        args["max_num_seqs"] = max_num_seqs
    if gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = gpu_memory_utilization
    elif cpu:
        args["gpu_memory_utilization"] = 0.2  # the KV cache's share of CPU memory (specfmt/validation/vllm_run.py)
    return args


class VllmEngine:
    """A :class:`~specfmt.datagen.engine.HiddenStateEngine` on vLLM (module docstring).

    The engine starts at the first :meth:`extract` (the layer ids are part of vLLM's configuration) and
    serves every later call with the same ids.

    Args:
        verifier: the verifier's folder or Hub id, as ``vllm.LLM(model=...)`` takes it.
        tensor_parallel_size: GPUs per engine (vLLM's ``tensor_parallel_size``).
        dtype: vLLM's ``dtype`` (``"auto"``: the checkpoint's; ``"float32"`` for the equality checks).
        max_model_len: the longest sample (tokens) + 1 (vLLM refuses a prompt that leaves no room for the
            one generated token); vLLM's default (the verifier's) when None.
        cpu: use specfmt's CPU connector; None: vLLM's CPU build (``current_platform.is_cpu()``).
        batch_size: samples handed to vLLM per ``generate`` call (vLLM schedules them as it fits; the
            staging folder holds at most this many files).
        enforce_eager: vLLM's ``enforce_eager``; None: True on the CPU build, False on a GPU.
        gpu_memory_utilization: vLLM's; None: 0.2 on the CPU build (its share of CPU memory), vLLM's default on a GPU.
        max_num_seqs: vLLM's ``max_num_seqs`` (None: vLLM's default).

    Raises:
        InputError: ``batch_size`` or ``tensor_parallel_size`` below 1.
    """

    name = "vllm"

    def __init__(self, verifier: str | Path, *, tensor_parallel_size: int = 1, dtype: str = "auto",
                 max_model_len: int | None = None, cpu: bool | None = None, batch_size: int = 256,
                 enforce_eager: bool | None = None, gpu_memory_utilization: float | None = None,
                 max_num_seqs: int | None = None) -> None:
        if batch_size < 1 or tensor_parallel_size < 1:
            raise InputError(f"batch_size and tensor_parallel_size must be at least 1, got {batch_size} and {tensor_parallel_size}")
        self.verifier = str(verifier)
        self.tensor_parallel_size = tensor_parallel_size
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.cpu = cpu
        self.batch_size = batch_size
        self.enforce_eager = enforce_eager
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_num_seqs = max_num_seqs
        self.layers: list[int] | None = None
        self._llm: Any = None
        self._staging: Path | None = None
        self._stagings: list[Path] = []  #: every staging folder made, removed by close()
        self._cleanup = interrupt.on_hard_exit(self._remove_stagings)  # when Ctrl-C ends the process before close()

    # ------------------------------------------------------------------ the engine

    def _start(self, layers: list[int], staging: Path) -> None:
        from vllm import LLM
        from vllm.platforms import current_platform

        cpu = current_platform.is_cpu() if self.cpu is None else self.cpu
        args = engine_arguments(self.verifier, layers, staging, cpu=cpu, tensor_parallel_size=self.tensor_parallel_size,
                                dtype=self.dtype, max_model_len=self.max_model_len,
                                enforce_eager=cpu if self.enforce_eager is None else self.enforce_eager,
                                gpu_memory_utilization=self.gpu_memory_utilization, max_num_seqs=self.max_num_seqs)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process (module docstring)
        with interrupt.library_call():
            self._llm = LLM(**args)
        self.layers, self._staging = layers, staging

    def _engine_for(self, layers: list[int], folder: Path) -> Any:
        """The running engine for ``layers``, started at the first call; ``folder``'s staging folder made."""
        staging = folder / STAGING
        if self._llm is None:
            from transformers import AutoConfig

            hf = AutoConfig.from_pretrained(self.verifier)
            hf = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
            layers = check_layers(layers, int(hf.num_hidden_layers))
            shutil.rmtree(staging, ignore_errors=True)  # what an interrupted run left: never a placed file
            staging.mkdir(parents=True)
            self._stagings.append(staging)
            self._start(layers, staging)
        elif list(layers) != self.layers:
            raise InputError(f"this engine extracts layers {self.layers}, not {list(layers)}", where="layers",
                             hint="start another engine for other layers")
        elif staging != self._staging:
            staging.mkdir(parents=True, exist_ok=True)
            self._staging = staging
            self._stagings.append(staging)
        return self._llm

    def _wait(self, path: Path) -> None:
        """Return once vLLM has written ``path`` (or given up): vLLM's lock protocol
        (``example_hidden_states_connector.py::load_hidden_states``). An engine core in this process
        (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) is stepped meanwhile: the write happens in the step after
        the request finished, which ``LLM.generate`` does not run."""
        from vllm.v1.engine.core_client import InprocClient

        lock = Path(str(path) + ".lock")
        if not lock.exists():
            return
        inproc = isinstance(self._llm.llm_engine.engine_core, InprocClient)
        fd = os.open(lock, os.O_RDONLY)
        try:
            for _ in range(100_000):
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | (fcntl.LOCK_NB if inproc else 0))
                    break
                except BlockingIOError:
                    self._llm.llm_engine.step()
            else:  # pragma: no cover - an engine that never writes
                raise RuntimeError(f"vLLM never finished writing {path}")
        finally:
            os.close(fd)
        lock.unlink(missing_ok=True)

    def extract(self, samples: Sequence[tuple[int, list[int]]], layers: list[int], folder: Path) -> Iterator[tuple[int, Path]]:
        """Write ``folder/hs_{index}.safetensors`` for each ``(index, token ids)``; yield ``(index, path)`` as each
        is placed (``HiddenStateEngine.extract``). Samples go to vLLM ``batch_size`` at a time.

        Raises:
            InputError: bad layer ids (:func:`check_layers`), other ids than the engine's, a sample longer
                than ``max_model_len - 1`` or empty.
            RuntimeError: vLLM never finished a file.
        """
        folder = Path(folder)
        llm = self._engine_for(layers, folder)
        limit = llm.llm_engine.vllm_config.model_config.max_model_len
        for index, ids in samples:
            if not 0 < len(ids) < limit:
                raise InputError(f"sample {index} has {len(ids)} tokens; vLLM takes 1 to {limit - 1} here", where=f"sample {index}",
                                 hint=f"raise max_model_len above {len(ids)} or cut the samples shorter")
        for start in range(0, len(samples), self.batch_size):
            yield from self._batch(list(samples[start:start + self.batch_size]), folder)

    def _batch(self, batch: list[tuple[int, list[int]]], folder: Path) -> Iterator[tuple[int, Path]]:
        from vllm import SamplingParams

        assert self._staging is not None and self.layers is not None
        staged = {index: self._staging / sample_path(Path(""), index).name for index, _ in batch}
        params = [SamplingParams(max_tokens=1, temperature=0.0,
                                 extra_args={"kv_transfer_params": {"hidden_states_path": str(staged[index])}})
                  for index, _ in batch]
        with interrupt.library_call():
            self._llm.generate([{"prompt_token_ids": list(ids)} for _, ids in batch], params, use_tqdm=False)
        for index, _ in batch:
            self._wait(staged[index])
            final = sample_path(folder, index)
            os.replace(staged[index], final)
            apply_umask(final)  # vLLM's connector writes with safetensors' save_file: 0600 whatever the umask
            yield index, final

    def _remove_stagings(self) -> None:
        for staging in self._stagings:
            shutil.rmtree(staging, ignore_errors=True)
        self._staging, self._stagings = None, []

    def close(self) -> None:
        """Shut vLLM's engine down, free its memory and remove the staging folders (empty unless an extraction
        stopped midway: then what they hold was never placed). After a Ctrl-C the engine is not shut down (the
        process is ending: :func:`specfmt.interrupt.exit_now`); the staging folders are removed all the same."""
        llm, self._llm = self._llm, None
        try:
            if llm is not None and not interrupt.interrupted():
                import gc

                try:
                    llm.llm_engine.engine_core.shutdown()
                except Exception:  # pragma: no cover - already down
                    pass
                del llm
                gc.collect()
                try:
                    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

                    cleanup_dist_env_and_memory()
                except ImportError:  # pragma: no cover - older vLLM
                    pass
        finally:
            self._remove_stagings()
            interrupt.forget(self._cleanup)


__all__ = ["STAGING", "VllmEngine", "engine_arguments"]
