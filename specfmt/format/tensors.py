"""What a config implies of one tensor (:class:`TensorSpec`); each algorithm's table lives in its module."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    """A tensor the config implies.

    Attributes:
        shape: exact shape.
        kind: ``"float"`` (any floating dtype, one dtype for the whole checkpoint),
            ``"int64"`` or ``"bool"``.
        required: False for tensors that may be absent (e.g. ``embed_tokens.weight``
            when vLLM can share the verifier's).
        why: where the rule comes from, shown when the tensor is missing.
    """

    shape: tuple[int, ...]
    kind: str = "float"
    required: bool = True
    why: str = ""
