"""What a draft pass reads: the parameters of a model folder, counted from the safetensors headers alone."""

from __future__ import annotations

from pathlib import Path

from ..checkpoint.dtypes import kind_of
from ..checkpoint.reader import CheckpointReader

#: an input-embedding table: a pass reads one row per token (a gather), not the table
EMBEDDING_SUFFIX = "embed_tokens.weight"


def parameters_read(folder: Path | None, *, tied: bool = False) -> int:
    """The floating parameters one forward pass of the model in ``folder`` reads, from its headers.

    Integer tensors (a vocabulary map) are not counted, nor an input-embedding table (``*embed_tokens.weight``),
    except when ``tied``: the output head is then that table, read whole.

    Raises:
        InputError: the folder's weights cannot be read.
    """
    if folder is None:
        return 0
    with CheckpointReader(folder) as reader:
        infos = reader.infos
    n = 0
    for name, info in infos.items():
        if kind_of(info.dtype) != "float" or (name.endswith(EMBEDDING_SUFFIX) and not tied):
            continue
        count = 1
        for d in info.shape:
            count *= d
        n += count
    return n


def parameter_count(folder: Path) -> int:
    """Every floating parameter of the model in ``folder`` (its size, embeddings included), from its headers."""
    return parameters_read(folder, tied=True)


__all__ = ["parameter_count", "parameters_read"]
