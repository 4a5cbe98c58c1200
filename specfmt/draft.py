"""Reading and writing a draft folder in the specfmt format (:class:`specfmt.format.draft.Draft` in memory).

:func:`write_folder` is the one way a draft folder is written, by ``convert`` and by
:func:`save_draft` alike: a tensor stream (:mod:`specfmt.checkpoint.stream`), checked on the way,
then ``config.json``, in a temporary folder renamed into place
(:func:`specfmt.checkpoint.output.atomic_folder`), so OUT is never half-written.
:func:`read_draft` reads a specfmt folder back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from .algorithms import of, validate_config
from .algorithms.inventory import inventory_problems
from .checkpoint.dtypes import TORCH_TO_ST, torch_dtype_code
from .checkpoint.files import CONFIG_FILE, read_json
from .checkpoint.finite import nonfinite_count
from .checkpoint.reader import CheckpointReader
from .checkpoint.output import Input, atomic_folder, check_output, real_path
from .checkpoint.stream import OutTensor, Refusals, TensorStream, write_stream
from .checkpoint.writer import save_file_order
from .errors import InputError
from .format import WEIGHTS_FILE
from .format.draft import Draft, is_specfmt_folder
from .format.provenance import provenance_block, utc_now

if TYPE_CHECKING:  # pragma: no cover
    import torch


def read_draft(folder: Path) -> Draft:
    """A specfmt folder (:func:`is_specfmt_folder`) into memory.

    Raises:
        InputError: not a specfmt folder; model.safetensors is not a valid safetensors file, or its
            tensors disagree with the config (missing, misshaped, NaN/Inf, a map outside the vocabulary).
        ConfigSchemaError: its config is invalid.
    """
    from safetensors.torch import load_file

    if not is_specfmt_folder(folder):
        raise InputError(f"{folder} is not a specfmt folder (config.json with a specfmt block, model.safetensors)",
                         hint="give a research checkpoint with --from FORMAT")
    cfg = read_json(folder / CONFIG_FILE)
    validate_config(cfg, where=str(folder / CONFIG_FILE))
    CheckpointReader(folder, only=[WEIGHTS_FILE])  # its header checked against the file first: truncated or corrupt -> InputError
    tensors = load_file(str(folder / WEIGHTS_FILE))
    bad = _problems(cfg, tensors)  # what save_draft checks on the way out, checked on the way in: a damaged input is the user's
    if bad:
        raise InputError(f"the draft is damaged: {'; '.join(bad[:3])}" + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""),
                         where=str(folder), hint=f"see `specfmt validate {folder}`")
    return Draft(cfg, tensors, (cfg.get("specfmt") or {}).get("source"))


def _problems(cfg: dict[str, Any], tensors: dict[str, Any]) -> list[str]:
    """How ``tensors`` disagree with a schema-valid ``cfg``: the tensor inventory (names, shapes,
    dtypes), NaN/Inf, and the algorithm's own checks of its maps (e.g. ``d2t`` inside the vocabulary)."""
    problems = inventory_problems(cfg, {n: (tuple(t.shape), TORCH_TO_ST[str(t.dtype).removeprefix("torch.")]) for n, t in tensors.items()})
    bad = [f"{k}: {', '.join(v)}" for k, v in problems.items() if v]
    bad += [f"{n} has {c} NaN/Inf values" for n, t in tensors.items() if (c := nonfinite_count(t))]
    algo = of(cfg)
    return bad + algo.tensor_problems(cfg, {n: tensors[n] for n in algo.map_tensors if n in tensors})


def save_draft(out: str | Path, draft: Draft, *, train: dict[str, Any], force: bool = False, inputs: Iterable[Input] = ()) -> Path:
    """Write ``draft`` as a specfmt folder at ``out``, atomically (:func:`write_folder`).

    The config gets a ``specfmt`` provenance block: the source's (or, for a new draft, the
    training data as the source files) and ``train``, what the trainer did. The tensors are
    written in the order safetensors' ``save_file`` writes them (:func:`draft_stream`), checked
    on the way as ``convert`` checks its own.

    Args:
        out: output folder; must not exist or be empty unless ``force``.
        draft: config and tensors; floating tensors are cast to ``config["dtype"]``.
        train: the provenance ``train`` block (filled tensors, trained tensors, steps, data).
        force: replace a non-empty ``out``.
        inputs: what the command read (:class:`specfmt.checkpoint.output.Input`); ``out`` must
            be none of them, nor inside or around one.

    Returns:
        The absolute output path.

    Raises:
        OutputExistsError: ``out`` is not empty and ``force`` is False.
        OutputOverlapError: ``out`` is, lies inside or contains one of ``inputs``.
        RuntimeError: the tensors are not what the config implies, or are not finite
            (a specfmt bug: the trainer built them); every problem is listed, and ``out`` is left as it was.
    """
    import torch

    out = real_path(out)
    check_output(out, force, inputs)
    cfg = json.loads(json.dumps(draft.config))
    dtype = getattr(torch, cfg.get("dtype") or cfg["transformer_layer_config"].get("dtype") or "float32")
    tensors = {n: (t.detach().to("cpu", dtype) if t.is_floating_point() else t.detach().cpu()).contiguous() for n, t in draft.tensors.items()}
    cfg["specfmt"] = _trained_provenance(draft, sorted(tensors), train)
    validate_config(cfg, where="trained config.json (a specfmt bug if this fails)")
    problems = inventory_problems(cfg, {n: (tuple(t.shape), TORCH_TO_ST[str(t.dtype).removeprefix("torch.")]) for n, t in tensors.items()})
    found = _Collect()
    stream = draft_stream(cfg, tensors, found)

    def checked_config() -> dict[str, Any]:
        bad = [f"{k}: {', '.join(v)}" for k, v in problems.items() if v] + found.lines(list(tensors))
        if bad:
            raise RuntimeError("the trained draft is not what its config implies: " + "; ".join(bad))
        return cfg

    write_folder(out, stream, checked_config)
    return out


def _trained_provenance(draft: Draft, kept: list[str], train: dict[str, Any]) -> dict[str, Any]:
    """The ``specfmt`` block of a trained draft: its source's (a new draft: ``specfmt-train``), its
    per-tensor record and upgrades kept, and ``train``."""
    src = draft.source or {"format": "specfmt-train", "layout": "new draft", "files": {}}
    prov = provenance_block(source_format=src["format"], layout=src["layout"], name_or_path=src.get("name_or_path") or "",
                            revision=src.get("revision"), files=src.get("files") or {}, renamed={}, kept=kept, dropped={},
                            created=utc_now())
    prov["tensors"] = ((draft.config.get("specfmt") or {}).get("tensors")) or prov["tensors"]
    prov["train"] = train
    if (draft.config.get("specfmt") or {}).get("upgrades"):  # rewrites by `specfmt upgrade` since the source (provenance.carry_provenance)
        prov["upgrades"] = draft.config["specfmt"]["upgrades"]
    return prov


def draft_stream(config: dict[str, Any], tensors: dict[str, "torch.Tensor"], refusals: Refusals) -> TensorStream:
    """Tensors in memory as a :class:`~specfmt.checkpoint.stream.TensorStream`, in the order
    safetensors' ``save_file`` writes them (:func:`specfmt.checkpoint.writer.save_file_order`), each
    checked for NaN/±Inf and the algorithm's map tensors together
    (:meth:`~specfmt.algorithms.base.Algorithm.tensor_problems`).

    Args:
        config: the draft's specfmt config (names the algorithm).
        tensors: name -> CPU tensor, already in the dtype to write.
        refusals: what a failed check does.
    """
    algo = of(config)
    layout = save_file_order([(n, torch_dtype_code(t), tuple(t.shape)) for n, t in tensors.items()])
    items = [OutTensor(n, code, shape, (lambda t=tensors[n]: t), label=n) for n, code, shape in layout]
    return TensorStream(items, refusals, together=tuple(algo.map_tensors), check_together=lambda kept: algo.tensor_problems(config, kept))


class _Collect(Refusals):
    """A trained draft's failed checks, recorded so that the refusal lists every problem at once."""

    def __init__(self) -> None:
        self.nonfinite_counts: dict[str, int] = {}
        self.problems: list[str] = []

    def nonfinite(self, tensor: OutTensor, count: int) -> None:
        self.nonfinite_counts[tensor.name] = count

    def inconsistent(self, problems: list[str]) -> None:
        self.problems += problems

    def lines(self, order: list[str]) -> list[str]:
        """One line per problem: the NaN/Inf counts in ``order`` of tensor names, then the joint check's."""
        return [f"{n} has {self.nonfinite_counts[n]} NaN/Inf values" for n in order if n in self.nonfinite_counts] + self.problems


def write_folder(out: Path, stream: TensorStream, config: Callable[[], dict[str, Any]],
                 on_written: Callable[[OutTensor], None] | None = None) -> None:
    """The one way a draft folder is written: ``model.safetensors`` from ``stream``
    (:func:`specfmt.checkpoint.stream.write_stream`, checks included), then ``config.json`` (two-space
    indented, newline-terminated) from ``config()``, called once the tensors are written and checked,
    all in a temporary folder that becomes ``out`` only when complete (:func:`specfmt.checkpoint.output.atomic_folder`).

    The caller has checked ``out`` (:func:`specfmt.checkpoint.output.check_output`).

    Raises:
        Exception: what the stream's refusals or ``config()`` raise; ``out`` is then left as it was.
    """
    with atomic_folder(out) as tmp:
        write_stream(tmp / WEIGHTS_FILE, stream, on_written)
        (tmp / CONFIG_FILE).write_text(json.dumps(config(), indent=2) + "\n", encoding="utf-8")


__all__ = ["Draft", "draft_stream", "is_specfmt_folder", "read_draft", "save_draft", "write_folder"]
