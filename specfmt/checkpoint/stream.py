"""The one stream of output tensors: what a draft is made of on its way out, checked on the way.

A :class:`TensorStream` is the tensors of one safetensors file, in file order. Each
:class:`OutTensor` is either a byte range of a source file that is written as it is (copied,
never decoded) or a tensor computed when it is needed (a cast, a fold, a trained weight), and
the stream states the checks each tensor passes. Two producers make streams: a conversion plan
(:meth:`specfmt.converters.base.Plan.stream`) and a draft in memory (:func:`specfmt.draft.draft_stream`).
Two consumers take them, and run the same checks:

* :func:`write_stream`: a safetensors file, header first, one tensor in memory at a time, byte
  ranges copied by the kernel (:meth:`SafetensorsStreamWriter.copy`); ``convert`` and
  ``save_draft`` write through it, and nothing else writes a draft's safetensors file;
* :func:`load_stream`: every tensor in memory (the trainer's way of reading a research draft,
  :func:`specfmt.convert.load_draft`).

The checks, decided here once (:meth:`TensorStream.passed` and :meth:`TensorStream.finished`):

* no NaN or ±Inf in a floating tensor: counted on the raw bits of a copied range, window by
  window without torch (:class:`~specfmt.checkpoint.finite.NonfiniteCounter`), or on the values
  of a computed tensor before it is written (:func:`~specfmt.checkpoint.finite.nonfinite_count`);
* the tensors named in :attr:`TensorStream.together` (an algorithm's vocabulary map, e.g. the
  EAGLE-3 ``d2t``/``t2d``) are kept and checked together by :attr:`TensorStream.check_together`
  once every tensor has passed.

What a failed check does is the producer's (:class:`Refusals`): a conversion refuses at the first
problem, a trained draft reports every problem at once. Nothing here knows about algorithms.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .dtypes import nbytes
from .finite import NonfiniteCounter, nonfinite_count
from .writer import SafetensorsStreamWriter

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True)
class OutTensor:
    """One output tensor of a stream.

    Attributes:
        name: its name in the output file.
        dtype: safetensors dtype code written (``F16``, ``I64``, ...).
        shape: shape written.
        compute: returns the tensor as written: CPU, ``dtype``, ``shape`` (a consumer makes it
            C-contiguous). Called once per consumer, when the tensor's turn comes.
        copy_from: ``(file, byte offset)`` where the exact bytes written already lie (little-endian,
            C order, :attr:`nbytes` long): :func:`write_stream` copies them instead of calling
            :attr:`compute`. None: the tensor is computed.
        array: the values without torch (a numpy array), for a copied tensor that is checked
            together with others (:attr:`TensorStream.together`); None: :attr:`compute` is used.
        shared: :attr:`compute` may return memory its source still holds (a tensor of a loaded
            pickle), so a consumer that keeps the tensor keeps a clone.
        label: how a refusal names the tensor (``tensor fc.weight``, ``derived tensor t2d (...)``).
        cast: the values passed through a dtype cast (a refusal says so).
        hint: the hint of a refusal of this tensor's values.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    compute: Callable[[], "torch.Tensor"]
    copy_from: tuple[Path, int] | None = None
    array: Callable[[], Any] | None = None
    shared: bool = False
    label: str = ""
    cast: bool = False
    hint: str = ""

    @property
    def nbytes(self) -> int:
        """Bytes written: the element size of :attr:`dtype` times the element count."""
        return nbytes(self.dtype, self.shape)


class Refusals:
    """What a stream's producer does with a failed check. The base class refuses nothing; a
    producer overrides both methods (raise at once, or record and raise later)."""

    def nonfinite(self, tensor: OutTensor, count: int) -> None:
        """``tensor`` holds ``count`` (> 0) NaN/±Inf values."""

    def inconsistent(self, problems: list[str]) -> None:
        """The tensors checked together (:attr:`TensorStream.together`) have ``problems`` (non-empty)."""


@dataclass
class TensorStream:
    """The output tensors of one safetensors file, in file order, with the checks they pass.

    Attributes:
        tensors: the tensors, in the order they are written.
        refusals: what a failed check does (:class:`Refusals`).
        together: names of tensors kept in memory as they pass and checked together at the end.
        check_together: ``check_together(kept) -> problems``, where ``kept`` maps each name of
            :attr:`together` present in the stream to its values (numpy array or CPU tensor).
            Called once per consumer, after the last tensor, even when nothing was kept.
    """

    tensors: list[OutTensor]
    refusals: Refusals
    together: tuple[str, ...] = ()
    check_together: Callable[[dict[str, Any]], list[str]] = lambda kept: []

    def layout(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """``[(name, dtype code, shape)]`` in file order: the header of the file written."""
        return [(t.name, t.dtype, tuple(t.shape)) for t in self.tensors]

    def passed(self, tensor: OutTensor, nonfinite: int, values: Any, kept: dict[str, Any]) -> None:
        """The checks of one tensor as it goes by: its NaN/±Inf count (refused when non-zero), and
        its values kept in ``kept`` when it is checked together with others. ``values`` is the
        tensor, or a callable that reads it (only called when it is kept)."""
        if nonfinite:
            self.refusals.nonfinite(tensor, nonfinite)
        if tensor.name in self.together:
            kept[tensor.name] = values() if callable(values) else values

    def finished(self, kept: dict[str, Any]) -> None:
        """The check of the tensors kept together, once every tensor has passed."""
        problems = self.check_together(kept)
        if problems:
            self.refusals.inconsistent(problems)


def write_stream(path: Path, stream: TensorStream, on_written: Callable[[OutTensor], None] | None = None) -> None:
    """Write ``stream`` as the safetensors file ``path``: header first (from :meth:`TensorStream.layout`),
    then each tensor in order, one in memory at a time, each checked as it goes
    (:meth:`TensorStream.passed`); the tensors checked together are checked after the last
    (:meth:`TensorStream.finished`), and the header of the file is read back and compared with the layout.

    A tensor with :attr:`OutTensor.copy_from` is copied from that range by the kernel, window by
    window, with the NaN/Inf bit test on each window (no torch); any other is computed, checked,
    then written. The caller writes into a temporary folder (:func:`specfmt.checkpoint.output.atomic_folder`):
    an exception leaves a partial file there, never at OUT.

    Args:
        path: the file to write (created or truncated).
        stream: what to write.
        on_written: called with each tensor once its bytes are written (progress).

    Raises:
        Exception: what ``stream.refusals`` raises for a failed check (a conversion's: ``ConversionError``).
        InputError: a copied range runs past the end of its file.
        RuntimeError: the written header differs from the layout (a specfmt bug).
    """
    layout = stream.layout()
    writer = SafetensorsStreamWriter(path, layout)
    kept: dict[str, Any] = {}
    try:
        for t in stream.tensors:
            if t.copy_from is not None:
                bad = writer.copy(t.name, t.copy_from[0], t.copy_from[1], t.nbytes, NonfiniteCounter(t.dtype))
                stream.passed(t, bad, t.array or t.compute, kept)
            else:
                values = t.compute()
                stream.passed(t, nonfinite_count(values), (lambda v=values: v.clone()) if t.shared else values, kept)
                writer.write(t.name, values)
                del values
            if on_written is not None:
                on_written(t)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    stream.finished(kept)
    _verify_header(path, layout)


def load_stream(stream: TensorStream) -> dict[str, "torch.Tensor"]:
    """Every tensor of ``stream`` in memory, by name, checked exactly as :func:`write_stream` checks
    them (the values are those it writes; a shared tensor is cloned).

    Raises:
        Exception: what ``stream.refusals`` raises for a failed check (a conversion's: ``ConversionError``).
    """
    out: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    for t in stream.tensors:
        values = t.compute()
        if t.shared:
            values = values.clone()
        stream.passed(t, nonfinite_count(values), values, kept)
        out[t.name] = values
    stream.finished(kept)
    return out


def _verify_header(path: Path, layout: list[tuple[str, str, tuple[int, ...]]]) -> None:
    """Re-open the written file with the safetensors library and compare its header with the layout."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:  # header only; numpy keeps torch unimported
        got = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    want = {name: tuple(shape) for name, _, shape in layout}
    if got != want:  # a bug in the writer, not a user error
        raise RuntimeError(f"written safetensors header differs from the plan: {set(got) ^ set(want)}")
