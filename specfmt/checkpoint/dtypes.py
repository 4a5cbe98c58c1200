"""Tensor dtypes: safetensors codes, their torch names and sizes, and the floats specfmt writes.

One table (:data:`ST_DTYPES`) serves the reader, the writer, the torch-free pickle index
(:mod:`specfmt.checkpoint.torchzip`) and the NaN/Inf bit test (:mod:`specfmt.checkpoint.finite`).
"""

from __future__ import annotations

from ..errors import InputError

#: safetensors dtype code -> (torch dtype name, bytes per element)
ST_DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}
TORCH_TO_ST = {name: code for code, (name, _) in ST_DTYPES.items()}


def nbytes(code: str, shape: "tuple[int, ...] | list[int]") -> int:
    """Bytes of a tensor of safetensors dtype ``code`` and ``shape``: element size times element count.

    Raises:
        KeyError: ``code`` is not a safetensors dtype code (:data:`ST_DTYPES`).
    """
    n = ST_DTYPES[code][1]
    for s in shape:
        n *= s
    return n

FLOAT_CODES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
#: floating dtypes a source may hold and be written from (float8 is never written)
SOURCE_FLOATS = ("F16", "BF16", "F32", "F64")
#: output float dtypes: safetensors code -> the name in config.json (``dtype``) and on the command line
DTYPE_NAMES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}
DTYPE_CODES = {v: k for k, v in DTYPE_NAMES.items()}


def kind_of(dtype_code: str) -> str:
    """``"float"``, ``"int64"``, ``"bool"`` or the lower-cased code, for matching a :class:`TensorSpec`."""
    if dtype_code in FLOAT_CODES:
        return "float"
    return {"I64": "int64", "BOOL": "bool"}.get(dtype_code, dtype_code.lower())



def torch_dtype_code(t) -> str:
    """The safetensors code of a torch tensor's dtype.

    Raises:
        InputError: a dtype safetensors has no code for (complex, quantized ...).
    """
    name = str(t.dtype).removeprefix("torch.")
    if name not in TORCH_TO_ST:
        raise InputError(f"unsupported tensor dtype {name}")
    return TORCH_TO_ST[name]
