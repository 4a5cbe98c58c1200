"""Checks shared by ``convert`` (before anything is written) and ``validate`` (after).

Each function returns a list of one-line problems; an empty list means the check holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .checkpoint import TORCH_TO_ST, TensorInfo, kind_of
from .format import expected_tensors

if TYPE_CHECKING:  # pragma: no cover
    import torch


def inventory_problems(cfg: dict, shapes: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, list[str]]:
    """Compare tensors against the names, shapes and kinds the config implies.

    Args:
        cfg: a schema-valid config.
        shapes: ``{name: (shape, safetensors dtype code)}`` of the tensors present.

    Returns:
        ``{"missing": [...], "unexpected": [...], "shape": [...], "dtype": [...]}``,
        each a list of one-line problems.
    """
    spec = expected_tensors(cfg)
    out: dict[str, list[str]] = {"missing": [], "unexpected": [], "shape": [], "dtype": []}
    for name, s in spec.items():
        if s.required and name not in shapes:
            out["missing"].append(name + (f" ({s.why})" if s.why else ""))
    for name, (shape, code) in sorted(shapes.items()):
        s = spec.get(name)
        if s is None:
            out["unexpected"].append(name)
            continue
        if tuple(shape) != s.shape:
            out["shape"].append(f"{name}: {list(shape)}, expected {list(s.shape)}")
        if kind_of(code) != s.kind:
            out["dtype"].append(f"{name}: {code}, expected {s.kind}")
    if "d2t" in shapes and "t2d" not in shapes or "t2d" in shapes and "d2t" not in shapes:
        out["missing"].append("d2t and t2d come together; only one is present")
    return out


def float_dtype_problems(cfg: dict, infos: dict[str, TensorInfo]) -> list[str]:
    """All floating tensors share one dtype, and it is the config's ``dtype`` (``torch_dtype`` in older files)."""
    floats = sorted({i.dtype for i in infos.values() if kind_of(i.dtype) == "float"})
    want = TORCH_TO_ST.get(cfg.get("dtype") or cfg.get("torch_dtype") or "")
    problems = []
    if len(floats) > 1:
        problems.append(f"floating tensors mix dtypes {floats}")
    if want and floats and floats != [want]:
        problems.append(f"config dtype is {cfg.get('dtype') or cfg.get('torch_dtype')} but tensors are {floats}")
    return problems


def vocab_map_problems(d2t, t2d, vocab_size: int, draft_vocab_size: int) -> list[str]:
    """Consistency of an EAGLE-3 draft vocabulary map.

    ``d2t`` [Vd] int64 holds offsets (``target_id = draft_id + d2t[draft_id]``), ``t2d`` [V]
    bool marks the target ids in the draft vocabulary (SafeAILab/EAGLE
    ``traineagle3/cnets.py::scandata``). The rules:

    * ``t2d.sum() == Vd``;
    * ``arange(Vd) + d2t`` is strictly increasing, in ``[0, V)``, and equals the
      positions where ``t2d`` is true.

    Args:
        d2t, t2d: numpy arrays or CPU torch tensors.
    """
    import numpy as np

    d2t, t2d = np.asarray(d2t), np.asarray(t2d)
    problems = []
    if d2t.dtype != np.int64:
        problems.append(f"d2t has dtype {d2t.dtype}, expected int64 offsets")
    if t2d.dtype != np.bool_:
        problems.append(f"t2d has dtype {t2d.dtype}, expected bool")
    if problems:
        return problems
    if d2t.shape != (draft_vocab_size,) or t2d.shape != (vocab_size,):
        return [f"d2t {list(d2t.shape)} / t2d {list(t2d.shape)} do not match Vd={draft_vocab_size}, V={vocab_size}"]
    n = int(t2d.sum())
    if n != draft_vocab_size:
        problems.append(f"t2d marks {n} target ids, but the draft vocabulary has {draft_vocab_size}")
    with np.errstate(over="ignore"):
        target = np.arange(draft_vocab_size, dtype=np.int64) + d2t
    if draft_vocab_size > 1 and not bool((target[1:] > target[:-1]).all()):
        problems.append("arange(Vd) + d2t is not strictly increasing (are these absolute ids instead of offsets?)")
    outside = (target < 0) | (target >= vocab_size)
    if outside.any():
        problems.append(f"{int(outside.sum())} draft ids map outside the verifier vocabulary [0, {vocab_size})")
    if not problems and not np.array_equal(target, np.flatnonzero(t2d)):
        problems.append("arange(Vd) + d2t differs from the positions marked in t2d")
    return problems


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


def nonfinite_in(reader, name: str) -> int:
    """NaN/Inf count of one tensor of a :class:`specfmt.checkpoint.CheckpointReader`, read in
    chunks from its byte range when it has one (never whole in memory), else through torch."""
    from .checkpoint import mapped_windows

    info = reader.infos[name]
    where = reader.raw(name)
    if where is None:
        return nonfinite_count(reader.get(name))
    counter = NonfiniteCounter(info.dtype)
    if counter.spec is None:
        return 0
    bad = 0
    with open(where[0], "rb", buffering=0) as f:
        for _, view in mapped_windows(f, where[1], info.nbytes):  # a truncated file is the weights check's finding
            bad += counter(view)
    return bad


def nonfinite_count(t: "torch.Tensor") -> int:
    """Number of NaN or ±Inf values in a floating tensor (0 for other dtypes)."""
    import torch

    if not t.is_floating_point():
        return 0
    return int((~torch.isfinite(t)).sum())
