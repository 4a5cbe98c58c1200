"""NaN/Inf detection: on raw bytes for a copy (no float conversion) and on torch tensors.

Every tensor ``convert`` writes and ``validate`` reads passes one of these tests; a
conversion stops at the first NaN/Inf with nothing written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .files import data_extents, mapped_windows

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .reader import CheckpointReader

#: dtype code -> (unsigned view, mask, threshold): a value is NaN or ±Inf iff ``bits & mask >= threshold``
#: (all exponent bits set; IEEE 754 binary16/32/64, bfloat16, float8 e5m2; e4m3fn has no Inf and
#: its only NaN is S.1111.111)
NONFINITE_BITS = {
    "F16": ("<u2", 0x7FFF, 0x7C00),
    "BF16": ("<u2", 0x7FFF, 0x7F80),
    "F32": ("<u4", 0x7FFF_FFFF, 0x7F80_0000),
    "F64": ("<u8", 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000),
    "F8_E5M2": ("u1", 0x7F, 0x7C),
    "F8_E4M3": ("u1", 0x7F, 0x7F),
}


class NonfiniteCounter:
    """Counts NaN/Inf in raw little-endian bytes of one dtype, chunk by chunk, with numpy bit
    tests (no float conversion, one reused scratch buffer): the check a byte-for-byte copy runs.

    Args:
        dtype: safetensors dtype code; non-floating codes count nothing.
    """

    def __init__(self, dtype: str):
        self.spec = NONFINITE_BITS.get(dtype)
        self._scratch = None

    def __call__(self, chunk) -> int:
        if self.spec is None or not len(chunk):
            return 0
        import numpy as np

        view, mask, threshold = self.spec
        bits = np.frombuffer(chunk, dtype=view)
        if self._scratch is None or self._scratch.size < bits.size:
            self._scratch = np.empty(bits.size, dtype=bits.dtype)
        masked = np.bitwise_and(bits, bits.dtype.type(mask), out=self._scratch[: bits.size])
        if masked.max() < threshold:
            return 0
        return int(np.count_nonzero(masked >= threshold))


def nonfinite_in(reader: "CheckpointReader", name: str) -> int:
    """NaN/Inf count of one tensor of a :class:`~specfmt.checkpoint.reader.CheckpointReader`, read in
    chunks from its byte range when it has one (never whole in memory; the holes of a sparse file,
    zeros, are skipped), else through torch."""
    info = reader.infos[name]
    where = reader.raw(name)
    if where is None:
        return nonfinite_count(reader.get(name))
    counter = NonfiniteCounter(info.dtype)
    if counter.spec is None:
        return 0
    bad = 0
    with open(where[0], "rb", buffering=0) as f:
        for start, n in data_extents(f, where[1], info.nbytes):  # holes of a sparse file read as zeros: finite
            for _, view in mapped_windows(f, start, n):  # a truncated file is the weights check's finding
                bad += counter(view)
    return bad


def nonfinite_count(t: "torch.Tensor") -> int:
    """Number of NaN or ±Inf values in a floating tensor (0 for other dtypes)."""
    import torch

    if not t.is_floating_point():
        return 0
    return int((~torch.isfinite(t)).sum())
