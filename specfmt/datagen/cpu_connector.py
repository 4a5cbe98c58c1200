"""A hidden-states KV connector for vLLM's CPU build: vLLM's own, writing synchronously.

vLLM loads it by module path (``kv_connector_module_path="specfmt.datagen.cpu_connector"``,
``kv_connector="SyncHiddenStatesConnector"``; ``vllm/distributed/kv_transfer/kv_connector/factory.py``).
It is vLLM's ``ExampleHiddenStatesConnector``
(``vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py``) with one method
replaced: ``_submit_async_write``. The stock one copies the request's hidden states out of the cache on a
CUDA stream into pinned memory (``pin_memory=True``, which the CPU build refuses: "pin_memory=True
requires a CUDA or other accelerator backend") and writes the file from a thread pool. Here the cache
is host memory already, so the rows are gathered and the file is written at once, in the worker's
``get_finished``, before the request is reported done sending.

Everything else is vLLM's: which requests are saved and where (``hidden_states_path`` in the request's
``kv_transfer_params``, honoured with ``allow_custom_save_path``), the saved ``token_ids`` (the prompt's,
``request_finished``), the ``.lock`` file held with ``LOCK_EX`` from the step the request is first
scheduled until its file is written (``wait_for_save``; ``load_hidden_states`` waits on it), and the
layout: ``hidden_states`` [T, n_layers, H] in the model's dtype, ``token_ids`` [T] int64.

Two differences a reader of the file can see: the file is written beside its name (``NAME.part``) and
put in place with ``os.replace``, so a file under its name is always whole; and a failed write is not
only logged (as the stock connector's thread does) but raised in the worker, which stops the engine:
the client sees the engine die, never a missing or short file.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

#: what ``kv_transfer_config`` names: the class and the module vLLM imports it from
CONNECTOR = "SyncHiddenStatesConnector"
MODULE = __name__


class _Written:
    """Stands in for the stock connector's CUDA copy event (``get_finished`` polls ``query()``):
    the write is over when it is recorded."""

    @staticmethod
    def query() -> bool:
        return True


def write_hidden_states(kv_cache: torch.Tensor, block_size: int, pending: PendingSave) -> None:
    """Gather ``pending``'s rows of the hidden-states cache and write its file, whole or not at all.

    The cache is [num_blocks, n_layers, block_size, H] (vLLM's ``LBNHC`` layout for this connector); slot
    ``b * block_size + i`` is row i of block b, as the stock ``_submit_async_write`` computes it.

    Raises:
        OSError: the file could not be written (the partial ``NAME.part`` is removed first).
    """
    blocks = torch.tensor(pending.block_ids, dtype=torch.long)
    slots = (blocks.reshape(-1, 1) * block_size + torch.arange(block_size, dtype=torch.long)).flatten()
    hidden = extract_from_kv_cache(kv_cache, slots.to(kv_cache.device), int(pending.token_ids.shape[0]))
    tensors = {"hidden_states": hidden.to("cpu").contiguous(), "token_ids": pending.token_ids.to(torch.long).clone()}
    os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
    part = pending.filename + ".part"
    try:
        save_file(tensors, part)
        os.replace(part, pending.filename)
    except BaseException:
        if os.path.exists(part):
            os.remove(part)
        raise


class SyncHiddenStatesConnector(ExampleHiddenStatesConnector):
    """vLLM's ``ExampleHiddenStatesConnector`` with a synchronous, host-memory write (module docstring)."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        try:
            write_hidden_states(self._kv_cache, self._block_size, pending)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)  # releases LOCK_EX: readers waiting in load_hidden_states go on
        self._req_copy_events[pending.req_id] = _Written()  # type: ignore[assignment]


__all__ = ["CONNECTOR", "MODULE", "SyncHiddenStatesConnector", "write_hidden_states"]
