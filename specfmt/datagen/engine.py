"""What a hidden-state engine is: the contract between ``specfmt datagen`` and the engines that
run the verifier (vLLM's ``extract_hidden_states``, and the transformers forward that is its reference).

Layer ids follow vLLM's ``eagle_aux_hidden_state_layer_ids`` (``vllm/model_executor/models/interfaces.py``,
``_maybe_add_hidden_state``; ``llama.py`` ``LlamaModel.forward``): id l in [0, L] is the residual stream
after l decoder layers. For l < L that is transformers' ``hidden_states[l]``; for l = L it is the last
layer's output *before* the verifier's final norm (transformers' ``hidden_states[L]`` is after it).
speculators 0.9 stores the taps and then layer L, and applies the verifier's norm when it trains
(``speculators/models/eagle3/core.py``: ``verifier_norm(verifier_last_hidden_states)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

#: one sample's file in the hidden-states folder (speculators/cli/generate_offline_data.py)
SAMPLE_FILE = "hs_{index}.safetensors"


def check_layers(layers: Sequence[int], num_layers: int) -> list[int]:
    """The layer ids as a list, or an InputError: each in [0, L] (L = ``num_layers``; speculators/models/utils.py
    ``resolve_target_layer_ids``) and strictly increasing, as every engine stores them (vLLM stores each id once,
    in layer order: ``interfaces.py::_maybe_add_hidden_state``).

    Raises:
        InputError: no ids, an id outside [0, L], or ids not strictly increasing.
    """
    from ..errors import InputError

    out = [int(x) for x in layers]
    bad = [x for x in out if not 0 <= x <= num_layers]
    if not out or bad:
        raise InputError(f"layer ids must be in [0, {num_layers}] (the verifier has {num_layers} layers), got {out}",
                         where="--layers", hint=f"id l is the residual stream after l layers; {num_layers} is the last layer before the final norm")
    if any(b <= a for a, b in zip(out, out[1:])):
        raise InputError(f"layer ids must be strictly increasing, got {out}", where="--layers",
                         hint="the hidden states are stored in layer order, once per id; list them in increasing order")
    return out


def sample_path(folder: Path, index: int) -> Path:
    """``folder/hs_{index}.safetensors``."""
    return folder / SAMPLE_FILE.format(index=index)


class HiddenStateEngine(Protocol):
    """Runs the verifier over token ids and writes each sample's hidden states.

    Every file an engine places holds ``hidden_states`` [T, len(layers), H] and ``token_ids`` [T]
    (int64), and is placed atomically (written beside, then ``os.replace``): an interrupted run
    leaves no half-written ``hs_{i}.safetensors``. A placed file has the mode the umask gives a file made
    with ``open()`` (:func:`specfmt.checkpoint.output.apply_umask`), whatever library wrote it.
    """

    #: shown in progress lines and recorded in the provenance ("vllm", "transformers")
    name: str

    def extract(self, samples: Sequence[tuple[int, list[int]]], layers: list[int], folder: Path) -> Iterator[tuple[int, Path]]:
        """Write ``sample_path(folder, index)`` for each ``(index, token ids)``, yielding ``(index, path)``
        as each file is in place (in any order)."""
        ...

    def close(self) -> None:
        """Free the engine (vLLM's engine core, the transformers model)."""
        ...


__all__ = ["SAMPLE_FILE", "HiddenStateEngine", "check_layers", "sample_path"]
