"""The transformers engine: the reference :class:`~specfmt.datagen.engine.HiddenStateEngine`.

It runs the verifier's transformers forward, one sample at a time (no padding), and stores
layer id l < L as ``output_hidden_states[l]`` (the residual stream after l layers) and l = L as the
last decoder layer's output before the final norm, taken by a forward pre-hook on the norm
(transformers' ``hidden_states[L]`` is after the norm; vLLM's id L is before it:
``vllm/model_executor/models/llama.py`` ``LlamaModel.forward`` appends ``hidden_states + residual``
before ``self.norm``). It is what the vLLM engine is checked against, and the engine for a verifier
vLLM cannot load.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..checkpoint.output import apply_umask
from ..errors import InputError
from ..sources.placement import Placement
from ..sources.verifier import Verifier
from .engine import sample_path


def check_layers(layers: Sequence[int], num_layers: int) -> list[int]:
    """The layer ids, checked: distinct, each in [0, L] (speculators/models/utils.py ``resolve_target_layer_ids``).

    Raises:
        InputError: no ids, an id outside [0, L], or an id twice.
    """
    ids = [int(x) for x in layers]
    if not ids or min(ids) < 0 or max(ids) > num_layers or len(set(ids)) != len(ids):
        raise InputError(f"layer ids {ids} must be distinct and within [0, {num_layers}] for a verifier with {num_layers} layers",
                         where="--layers")
    return ids


class TransformersEngine:
    """The verifier's transformers forward, writing ``hs_{i}.safetensors`` (the engine contract).

    Args:
        verifier: the resolved verifier.
        dtype: the dtype the verifier runs and the hidden states are stored in (float32: the reference).
        device: ``cpu`` or ``cuda[:N]``.
        tensor_parallel_size: must be 1 (transformers runs the verifier on one device).

    Raises:
        InputError: ``tensor_parallel_size`` other than 1.
    """

    name = "transformers"

    def __init__(self, verifier: Verifier, *, dtype: str = "float32", device: str = "cpu", tensor_parallel_size: int = 1) -> None:
        if tensor_parallel_size != 1:
            raise InputError(f"the transformers engine runs on one device; --tensor-parallel-size {tensor_parallel_size} needs --engine vllm")
        self.verifier = verifier
        self.placement = Placement(device=device, dtype=dtype)
        self._model: Any = None

    def _load(self) -> Any:
        if self._model is None:
            self._model = self.verifier.load_model(self.placement)
        return self._model

    def forward(self, ids: Sequence[int], layers: Sequence[int]) -> Any:
        """[T, len(layers), H] the hidden states of one sample at ``layers`` (contiguous, in the run dtype, on the CPU).

        Raises:
            InputError: bad layer ids (:func:`check_layers`); a decoder without a ``norm`` module.
        """
        import torch

        model = self._load()
        decoder = model.get_decoder()
        n = int(self.verifier.info.num_hidden_layers)
        layers = check_layers(layers, n)
        norm = getattr(decoder, "norm", None)
        if norm is None:
            raise InputError(f"the verifier's decoder ({type(decoder).__name__}) has no final norm to take layer {n} before",
                             hint="use --engine vllm")
        before_norm: list[Any] = []
        hook = norm.register_forward_pre_hook(lambda _m, args: before_norm.append(args[0]))
        try:
            with torch.no_grad():
                x = torch.tensor([list(ids)], dtype=torch.long, device=self.placement.device)
                out = decoder(input_ids=x, output_hidden_states=True, use_cache=False)
        finally:
            hook.remove()
        states = [before_norm[-1][0] if l == n else out.hidden_states[l][0] for l in layers]
        return torch.stack(states, dim=1).cpu().contiguous()

    def extract(self, samples: Sequence[tuple[int, list[int]]], layers: list[int], folder: Path) -> Iterator[tuple[int, Path]]:
        """Write ``folder/hs_{index}.safetensors`` (``hidden_states`` [T, len(layers), H], ``token_ids`` [T] int64) for each
        sample, written to ``*.tmp`` beside and ``os.replace``\\ d into place; yield ``(index, path)``.

        Raises:
            InputError: bad layer ids; an empty sample.
        """
        import torch
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for index, ids in samples:
            if not ids:
                raise InputError(f"sample {index} has no tokens", where=f"sample {index}")
            hs = self.forward(ids, layers)
            path = sample_path(folder, index)
            tmp = path.with_name(path.name + ".tmp")
            try:
                save_file({"hidden_states": hs, "token_ids": torch.tensor(list(ids), dtype=torch.int64)}, str(tmp))
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            apply_umask(path)
            yield index, path

    def close(self) -> None:
        """Drop the model."""
        self._model = None


__all__ = ["TransformersEngine", "check_layers"]
