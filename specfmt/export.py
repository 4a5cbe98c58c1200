"""``specfmt export --to sglang``: a specfmt draft written in the layout SGLang's own draft class reads.

What SGLang does with each algorithm lives with the algorithm (its SGLang part,
:mod:`specfmt.algorithms.sglang`); this module is the shared pipeline: read the draft
(:func:`specfmt.draft.read_draft`: config, tensors, their checks), ask the algorithm for its SGLang layout
(exact, or an :class:`~specfmt.errors.ExportRefusal` naming its reason), check that the converter that reads
SGLang's layout maps every written name back (the round trip ``convert --from auto`` is exact), and write the
folder the one way specfmt writes folders (:func:`specfmt.draft.write_folder`: a tensor stream into a temporary
folder renamed into place, after :func:`specfmt.checkpoint.output.check_output` with every input).

The written ``config.json`` carries a ``specfmt_export`` block (SGLang ignores it): the source draft and its
files' sha256, the SGLang release, k, every tensor's fate, and what ``convert --from auto`` needs to read the
folder back as the original draft (the tap-id convention written, the meaning of ``norm_output``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .algorithms import of
from .algorithms.sglang import EXPORT_KEY, SGLANG_VERSION, SGLangLayout
from .checkpoint.dtypes import torch_dtype_code
from .checkpoint.files import CONFIG_FILE, sha256_file
from .checkpoint.output import Input, check_output, real_path
from .checkpoint.stream import OutTensor, Refusals, TensorStream
from .checkpoint.writer import save_file_order
from .draft import read_draft, write_folder
from .errors import ExportRefusal, InputError
from .format import WEIGHTS_FILE
from .format.config import speculative_tokens, verifier_ref
from .format.provenance import utc_now

if TYPE_CHECKING:  # pragma: no cover
    from .format.draft import Draft
    from .sources.verifier import Verifier

#: the engines ``specfmt export --to`` writes for
ENGINES = ("sglang",)


@dataclass
class ExportResult:
    """What :func:`export` wrote (or, with ``dry_run``, would write).

    Attributes:
        out: the output folder (None on a dry run).
        layout: the SGLang layout: config, names, dropped tensors, notes.
        config: the config.json written, provenance included.
        draft: the folder or Hub id exported.
    """

    out: Path | None
    layout: SGLangLayout
    config: dict[str, Any]
    draft: str
    notes: list[str] = field(default_factory=list)


def _verifier(draft: "Draft", given: str | None) -> "Verifier":
    """The verifier the draft names (or ``--verifier``), its config read.

    Raises:
        InputError: the draft names none and ``--verifier`` is not given, or it cannot be read.
    """
    from .errors import SpecfmtError
    from .sources.verifier import Verifier

    ref = given or verifier_ref(draft.config)
    if not ref:
        raise InputError("the draft names no verifier (speculators_config.verifier.name_or_path)", hint="pass --verifier")
    try:
        return Verifier.load(ref)
    except SpecfmtError as e:
        if given:
            raise
        raise InputError(f"the verifier the draft names ({ref}) is not reachable: {e.message}", hint="pass --verifier FOLDER_OR_HUB_ID") from None


def sglang_layout(draft: "Draft", verifier: "Verifier") -> SGLangLayout:
    """The draft in SGLang's layout (its algorithm's SGLang part), checked to read back through the converter.

    Raises:
        ExportRefusal: the algorithm has no SGLang layout (``reason="unserved"``), or its part refuses the draft.
    """
    algo = of(draft.config)
    part = algo.sglang
    if part is None:
        raise ExportRefusal(f"{algo.title} drafts: {algo.sglang_unserved}", engine="sglang", reason="unserved",
                            hint="serve it with vLLM (`specfmt serve-command DRAFT`)")
    shapes = {n: tuple(t.shape) for n, t in draft.tensors.items()}
    layout = part.sglang_layout(draft.config, shapes, verifier.info, draft.tensors.__getitem__, verifier.embedding)
    _check_reads_back(algo.name, layout)
    return layout


def _check_reads_back(algorithm: str, layout: SGLangLayout) -> None:
    """Every name written maps back to its specfmt name through the rules of the converter that reads the
    algorithm's research layouts (``converters/<algo>.py``): the same table, read the other way.

    Raises:
        RuntimeError: it does not (a specfmt bug: the export and the converter disagree).
    """
    from .converters import REGISTRY

    conv = next((c for c in REGISTRY.values() if c.upgrades == algorithm), None)
    for ours, theirs in ([] if conv is None else layout.names.items()):
        back = next((rule.apply(theirs)[1] for rule in conv.rules if rule.apply(theirs)[0]), "(no rule)")
        if back != ours:
            raise RuntimeError(f"the SGLang name {theirs} reads back as {back}, not {ours}, through converters/{conv.name}.py")


class _Bug(Refusals):
    """The draft was checked when read (:func:`read_draft`): a failed check here is a specfmt bug."""

    def nonfinite(self, tensor: OutTensor, count: int) -> None:
        raise RuntimeError(f"{tensor.name} has {count} NaN/Inf values after reading checked them")


def _stream(draft: "Draft", layout: SGLangLayout) -> TensorStream:
    """The written tensors, renamed, in safetensors' ``save_file`` order."""
    tensors = {layout.names[n]: t.contiguous() for n, t in draft.tensors.items() if n in layout.names}
    tensors.update({name: make().contiguous() for name, (_, make) in layout.derived.items()})
    order = save_file_order([(n, torch_dtype_code(t), tuple(t.shape)) for n, t in tensors.items()])
    return TensorStream([OutTensor(n, code, shape, (lambda t=tensors[n]: t), label=n) for n, code, shape in order], _Bug())


def provenance(draft: "Draft", folder: Path, ref: str, verifier: "Verifier", layout: SGLangLayout) -> dict[str, Any]:
    """The ``specfmt_export`` block: what was exported, by which specfmt, for which SGLang, and every tensor's fate."""
    algo = of(draft.config)
    return {"specfmt_version": __version__, "created": utc_now(), "engine": "sglang", "engine_version": SGLANG_VERSION,
            "algorithm": algo.name, "speculative_algorithm": algo.sglang.sglang_algorithm,  # type: ignore[union-attr]
            "speculative_tokens": speculative_tokens(draft.config), "verifier": verifier.name_or_path,
            "source": {"name_or_path": ref, "files": {f: sha256_file(folder / f) for f in (CONFIG_FILE, WEIGHTS_FILE)}},
            "tensors": {"renamed": {a: b for a, b in sorted(layout.names.items()) if a != b},
                        "kept": sorted(a for a, b in layout.names.items() if a == b), "dropped": dict(sorted(layout.dropped.items())),
                        **({"derived": {n: why for n, (why, _) in sorted(layout.derived.items())}} if layout.derived else {})},
            **layout.recorded}


def export(src: str, out: Path | None, *, to: str = "sglang", verifier: str | None = None, force: bool = False,
           dry_run: bool = False, revision: str | None = None) -> ExportResult:
    """Write the specfmt draft ``src`` as SGLang's draft class reads it.

    Args:
        src: a specfmt draft folder or Hub id.
        out: the output folder (created atomically; None only with ``dry_run``).
        to: the engine (:data:`ENGINES`).
        verifier: the verifier (default: the one the draft's config names); its architecture decides how the
            tap ids are written (:func:`specfmt.algorithms.sglang.sglang_tap_ids`).
        force: replace a non-empty ``out``; never an input.
        dry_run: decide everything, write nothing.
        revision: Hub revision of ``src``.

    Returns:
        What was (or would be) written.

    Raises:
        InputError: an unknown engine, no ``-o``, ``src`` not a specfmt draft, or an unreachable verifier.
        ExportRefusal: SGLang would not run the draft exactly (``reason`` names the rule).
        OutputExistsError, OutputOverlapError: ``out`` cannot be written (:func:`check_output`).
    """
    from .sources.resolve import resolve

    if to not in ENGINES:
        raise InputError(f"--to {to!r} is not an engine specfmt exports to", hint=f"choose from: {', '.join(ENGINES)}")
    if out is None and not dry_run:
        raise InputError("-o OUT is required (or use --dry-run)")
    res = resolve(src, revision=revision, what="draft")
    draft = read_draft(res.folder)
    vf = _verifier(draft, verifier)
    if out is not None:
        out = real_path(out)
        check_output(out, force, [*Input.of("DRAFT", src, res), *Input.of("--verifier", verifier, vf.resolved)])
    layout = sglang_layout(draft, vf)
    config = {**layout.config, EXPORT_KEY: provenance(draft, res.folder, res.name_or_path, vf, layout)}
    if not dry_run:
        write_folder(out, _stream(draft, layout), lambda: config)  # type: ignore[arg-type]
    return ExportResult(None if dry_run else out, layout, config, res.name_or_path, list(layout.notes))


__all__ = ["ENGINES", "EXPORT_KEY", "ExportResult", "export", "provenance", "sglang_layout"]
