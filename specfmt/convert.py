"""``specfmt convert``: run a converter's plan, checked, streamed and atomic.

Order of work (nothing is written before step 5, and SRC is only ever read):

1. resolve SRC and the verifier (local folder or Hub id), the verifier once
   (:class:`specfmt.sources.verifier.Verifier`), and check OUT against both
   (:func:`specfmt.checkpoint.output.check_output`: never an input, inside one or around one);
2. read SRC's config and the tensor headers;
3. the converter plans (:meth:`specfmt.converters.base.Converter.plan`): output config and
   the fate of every source tensor;
4. the plan is checked: config against the v1 schema, the tensors it would write
   against the names and shapes that config implies; any problem is an error
   that lists every offending tensor;
5. the plan's tensor stream (:meth:`specfmt.converters.base.Plan.stream`) is written one
   tensor at a time into a temporary folder beside OUT, with NaN/Inf and the algorithm's own
   checks (the ``d2t``/``t2d`` map) on the way; the folder is renamed to OUT only once
   complete (:func:`specfmt.draft.write_folder`).

:func:`load_draft` runs steps 1-4 and loads the same stream into memory instead, with the same
checks (:func:`specfmt.checkpoint.stream.load_stream`): the trainer's way of reading any draft,
with no temporary folder.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from .algorithms import validate_config
from .algorithms.inventory import inventory_findings
from .checkpoint.files import CONFIG_FILE, read_json, sha256_file
from .checkpoint.output import Input, check_output, real_path
from .checkpoint.reader import CheckpointReader
from .checkpoint.stream import OutTensor, load_stream
from .converters import Options, Plan, Source, get
from .draft import read_draft, write_folder
from .format.config import speculators_section
from .format.draft import Draft, is_specfmt_folder
from .errors import ConversionError, InputError, SpecfmtError
from .format.provenance import carry_provenance, provenance_block, provenance_violations, utc_now
from .sources.resolve import Resolved, resolve
from .sources.verifier import Verifier

#: files of a source checkpoint fetched from the Hub
SOURCE_PATTERNS = ["*.json", "*.safetensors", "*.bin", "*.pt"]


@dataclass
class ConvertResult:
    """What a conversion did.

    Attributes:
        plan: the plan that was executed (or only printed, for a dry run).
        config: the output config.json, provenance included.
        out: the output folder (None for a dry run).
        bytes_written: size of the tensors written.
    """

    plan: Plan
    config: dict[str, Any]
    out: Path | None
    bytes_written: int


def source_config(ref: str, revision: str | None = None) -> dict[str, Any]:
    """A source checkpoint's config.json (folder or Hub id).

    Raises:
        InputError, HubError: it cannot be found or read.
    """
    res = resolve(ref, allow_patterns=[CONFIG_FILE], revision=revision, what="source")
    return read_json(res.folder / CONFIG_FILE)


def config_changes(old: dict, new: dict) -> list[str]:
    """What an upgrade changed in config.json, one line per JSON path (the provenance block aside).

    Lines read ``+ path = value`` (added), ``- path (was value)`` (removed) and
    ``~ path: old -> new`` (changed).
    """

    def flat(obj, prefix="$"):
        if isinstance(obj, dict) and obj:
            for k, v in obj.items():
                yield from flat(v, f"{prefix}.{k}")
        else:
            yield prefix, obj

    a = dict(flat({k: v for k, v in old.items() if k != "specfmt"}))
    b = dict(flat({k: v for k, v in new.items() if k != "specfmt"}))
    lines = []
    for path in sorted(a.keys() | b.keys()):
        if path not in b:
            lines.append(f"- {path} (was {json.dumps(a[path])})")
        elif path not in a:
            lines.append(f"+ {path} = {json.dumps(b[path])}")
        elif a[path] != b[path]:
            lines.append(f"~ {path}: {json.dumps(a[path])} -> {json.dumps(b[path])}")
    return lines


def detect_source_format(folder: Path) -> str:
    """The one ``--from`` name whose converter accepts ``folder`` (``--from auto``).

    Raises:
        InputError: no converter fits (the detected format is named), or several do
            (each is listed with the flag that picks it).
    """
    from .detect import detect  # detect imports the converters; only --from auto needs it

    d = detect(folder)
    if len(d.candidates) == 1:
        return d.candidates[0]
    if not d.candidates:
        raise InputError(
            f"--from auto: detected {d.format} ({d.layout}), which no converter reads" + (f": {d.served}" if d.served else ""),
            where=str(folder),
            hint="; ".join(d.evidence) + "; run `specfmt inspect` for details",
        )
    flags = ", ".join(f"--from {c}" for c in d.candidates)
    raise InputError(
        f"--from auto: the files fit {len(d.candidates)} formats ({', '.join(d.candidates)}): {'; '.join(d.evidence)}",
        where=str(folder),
        hint=f"pick one with {flags}",
    )


def _refuse_named(source_format: str, cfg: dict[str, Any], reader: CheckpointReader, folder: Path) -> None:
    """An explicit ``--from`` on a format no converter reads but :mod:`specfmt.detect` names (an MTP
    verifier, a P-EAGLE, DFlash or MLA draft) is refused with that name, not with its tensors.

    Raises:
        ConversionError: the source is one of those formats.
    """
    from .converters.base import Seen
    from .detect import named

    if isinstance(cfg.get("speculators_config"), dict):
        return  # a speculators checkpoint names its algorithm itself (--from speculators says which it reads)
    seen = Seen.of(cfg, reader)
    foreign = named(seen)
    if foreign is not None:
        raise ConversionError(f"--from {source_format}: the source is {foreign.format} ({foreign.layout or cfg.get('model_type')}), "
                              f"which no converter reads: {foreign.serving(seen)}", where=str(folder), hint=foreign.evidence)


@dataclass
class Opened:
    """A source opened and planned: what :func:`convert` writes and :func:`load_draft` materialises.

    Attributes:
        src: where the source is.
        config: the source's config.json as read.
        plan: the checked plan.
        reader: the source's weights (open until the ``with`` block of :func:`open_plan` ends).
    """

    src: Resolved
    config: dict[str, Any]
    plan: Plan
    reader: CheckpointReader


@contextmanager
def open_plan(source_format: str, src_ref: str, verifier: "str | Verifier", *, opts: Options | None = None, revision: str | None = None,
              allow_missing: frozenset[str] = frozenset(),
              before_plan: "Callable[[Resolved, Verifier], None]" = lambda res, ver: None) -> Iterator[Opened]:
    """Resolve, read and plan a conversion, checked against the format; nothing is written.

    Args:
        source_format: a ``--from`` name, or ``auto`` (:func:`detect_source_format`).
        src_ref: source folder or Hub id.
        verifier: the verifier (folder, Hub id or an already resolved :class:`Verifier`).
        opts: :class:`specfmt.converters.Options`.
        revision: Hub revision of the source.
        allow_missing: tensor names the plan may lack (the trainer's fill-ins compute them).
        before_plan: called with the resolved source and verifier before anything else is read (the output check).

    Raises:
        InputError, HubError: inputs cannot be read.
        ConversionError: the source cannot be converted exactly (every offending tensor listed).
    """
    opts = opts or Options()
    if source_format != "auto":
        get(source_format)  # an unknown --from fails before any download
    src_res = resolve(src_ref, allow_patterns=SOURCE_PATTERNS, revision=revision, what="source")
    if source_format == "auto":
        source_format = detect_source_format(src_res.folder)
    converter = get(source_format)
    ver = verifier if isinstance(verifier, Verifier) else Verifier.load(verifier)
    before_plan(src_res, ver)
    with _refusal_names_the_source(f"--from {source_format}", source_format, src_res.folder, src_ref, ver.ref):
        src_cfg = read_json(src_res.folder / CONFIG_FILE)
        reader = CheckpointReader(src_res.folder, pickle_names=converter.pickle_names, ignore=converter.ignore_files)
    with reader:
        _check_earlier_provenance(src_cfg, src_res.folder)
        _refuse_named(source_format, src_cfg, reader, src_res.folder)  # says what the source is already
        with _refusal_names_the_source(f"--from {source_format}", source_format, src_res.folder, src_ref, ver.ref):
            plan = converter.plan(Source(src_res, src_cfg, reader, ver), opts)
            _check_plan(plan, allow_missing)
        plan.notes.extend(f"{name} not read: {why}" for name, why in reader.ignored.items())
        yield Opened(src_res, src_cfg, plan, reader)


def wrong_format(asked: str, reads: str, folder: Path, src: str, out: str = "OUT", verifier: str = "VERIFIER") -> tuple[str, str] | None:
    """When a command refuses a source, what the source is instead (:func:`specfmt.detect.detect`),
    as ``(message, hint)`` naming the command that reads it; None when detection finds nothing
    else (the format is ``unknown``, or ``reads`` is among the ``--from`` names that read it), so
    the refusing command's own complaint stands.

    Args:
        asked: the refusing command as the message names it (``--from eagle3``, ``specfmt upgrade``).
        reads: the ``--from`` name of the converter that refused it.
        folder: the source's local folder (a Hub id already resolved).
        src, out, verifier: the words of the suggested command.
    """
    from .detect import detect  # detect imports the converters

    try:
        cfg = read_json(folder / CONFIG_FILE) if (folder / CONFIG_FILE).is_file() else {}
        if "speculators_config" in cfg and not isinstance(cfg["speculators_config"], dict):
            return None  # a malformed speculators config: the refusal of it stands
        d = detect(folder)
    except SpecfmtError:
        return None
    if reads in d.candidates:
        return None
    return d.refusal(asked, src, out, verifier)


def check_upgradable(src: str, cfg: dict[str, Any], *, revision: str | None = None, out: str | None = None, verifier: str | None = None) -> None:
    """``specfmt upgrade`` reads speculators-format checkpoints only; refuse anything else before
    the verifier is looked for, naming what SRC is and the ``specfmt convert --from X SRC -o OUT
    --verifier V`` line that reads it (:func:`wrong_format`).

    Args:
        src: SRC as given; cfg: its config.json; revision: its Hub revision;
        out, verifier: ``-o`` and ``--verifier`` as given, for the suggested command.

    Raises:
        InputError: ``speculators_config`` is missing or not an object.
        HubError: a Hub SRC cannot be fetched (to read its tensor names).
    """
    if cfg.get("speculators_config") is not None and speculators_section(cfg, where=f"{src}/config.json") is not None:
        return  # an object (anything else present is refused by speculators_section)
    res = resolve(src, allow_patterns=SOURCE_PATTERNS, revision=revision, what="source")
    better = wrong_format("specfmt upgrade", "speculators", res.folder, src, out or "OUT", verifier or "VERIFIER")
    if better is not None:
        raise InputError(better[0], where=src, hint=better[1])
    raise InputError("specfmt upgrade reads speculators-format checkpoints; this config.json has no speculators_config", where=src,
                     hint=f"`specfmt inspect {src}` names what the folder holds; a research draft is read by `specfmt convert --from FORMAT`")


@contextmanager
def _refusal_names_the_source(asked: str, reads: str, folder: Path, src: str, verifier: str) -> Iterator[None]:
    """A converter's refusal (:class:`ConversionError` or :class:`InputError`) of a source that
    detection recognises as another format says what the source is and which ``--from`` reads it
    (:func:`wrong_format`), instead of the first field or tensor that the wrong converter missed
    (``hidden_size must be a positive integer, got None`` on Medusa heads read ``--from eagle3``)."""
    try:
        yield
    except (ConversionError, InputError) as e:
        better = wrong_format(asked, reads, folder, src, verifier=verifier)
        if better is None:
            raise
        raise type(e)(better[0], where=src, hint=better[1]) from None


def convert(
    source_format: str,
    src_ref: str,
    out: str | Path | None,
    verifier_ref: "str | Verifier",
    *,
    opts: Options | None = None,
    force: bool = False,
    dry_run: bool = False,
    revision: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ConvertResult:
    """Convert the research checkpoint ``src_ref`` into the specfmt format at ``out``.

    Args:
        source_format: the ``--from`` name (``eagle3``, ``eagle``, ``hass``, ``medusa``,
            ``speculators``), or ``auto`` to detect it (:func:`detect_source_format`).
        src_ref: source folder or Hub id.
        out: output folder (ignored for a dry run).
        verifier_ref: verifier folder or Hub id (or a resolved :class:`Verifier`); written
            into the config as a Hub id or an absolute path.
        opts: :class:`specfmt.converters.Options`.
        force: replace a non-empty ``out``.
        dry_run: plan and check only; write nothing.
        revision: Hub revision of the source.
        progress: called as ``progress(bytes_done, bytes_total)`` while writing.

    Raises:
        InputError, HubError: inputs cannot be read.
        ConversionError: the source cannot be converted exactly (the message lists
            every offending tensor); nothing was written.
        OutputExistsError: ``out`` is not empty and ``force`` is False.
        OutputOverlapError: ``out`` is, lies inside or contains the source or the verifier
            (:func:`specfmt.checkpoint.output.check_output`; ``force`` does not lift it).
    """
    out_path = real_path(out) if out is not None else None

    def check_out(res: Resolved, ver: Verifier) -> None:
        if not dry_run:
            if out_path is None:
                raise InputError("no output folder given", hint="pass -o OUT")
            check_output(out_path, force, [*Input.of("SRC", src_ref, res), *Input.of("--verifier", ver.ref, ver.resolved)])

    with open_plan(source_format, src_ref, verifier_ref, opts=opts, revision=revision, before_plan=check_out) as opened:
        plan, reader = opened.plan, opened.reader
        files_read = [CONFIG_FILE, *reader.files]
        digests = _Digests(opened.src.folder, files_read)  # hashed on a second thread while the tensors are copied
        # the digests' shape, for validation; filled in once the tensors are copied
        config = with_provenance(plan, opened.src, {f: "0" * 64 for f in files_read})

        def finish(config: dict[str, Any]) -> dict[str, Any]:
            return keep_provenance(digests.fill(config), opened)

        try:
            if dry_run:
                return ConvertResult(plan, finish(config), None, 0)
            assert out_path is not None
            written = _write_atomic(out_path, plan, config, reader, progress, finish_config=finish)
        except BaseException:
            digests.stop()
            raise
    return ConvertResult(plan, config, out_path, written)


def with_provenance(plan: Plan, src: Resolved, files: dict[str, str]) -> dict[str, Any]:
    """The plan's config with its ``specfmt`` provenance block (:func:`specfmt.format.provenance.provenance_block`):
    the source, the sha256 of its ``files``, and what happened to every source tensor.

    Raises:
        ConfigSchemaError: the result is not schema-valid (a specfmt bug).
    """
    config = dict(plan.config)
    config["specfmt"] = provenance_block(
        source_format=plan.source_format,
        layout=plan.layout,
        name_or_path=src.name_or_path,
        revision=src.revision,
        files=files,
        renamed={m.src: m.dst for m in plan.moves if m.action == "rename"},
        kept=[m.src for m in plan.moves if m.action == "keep"],
        dropped={m.src: m.reason for m in plan.moves if m.action == "drop"},
        folded={m.src: m.reason for m in plan.moves if m.action == "fold"},
        derived={d.dst: d.how for d in plan.derived},
        created=utc_now(),
    )
    validate_config(config, where="output config.json (a specfmt bug if this fails)")
    return config


def _check_earlier_provenance(cfg: dict[str, Any], folder: Path) -> None:
    """A source that has a ``specfmt`` block (a folder specfmt wrote) keeps it through the rewrite
    (:func:`keep_provenance`), so the block must be valid provenance.

    Raises:
        ConversionError: the block is there but is not what the schema defines.
    """
    if "specfmt" not in cfg:
        return
    bad = provenance_violations(cfg["specfmt"])
    if bad:
        path, why = bad[0]
        raise ConversionError(f"the source's specfmt provenance block is not valid ({path}: {why}" + (f"; {len(bad) - 1} more" if len(bad) > 1 else "") + ")",
                              where=str(folder / CONFIG_FILE), config_path=path,
                              hint="a rewrite keeps the original provenance; restore the block, or delete it to record this folder as the source")


def keep_provenance(config: dict[str, Any], opened: Opened) -> dict[str, Any]:
    """Keep the original provenance of a source specfmt wrote (``upgrade`` of a converted or trained
    folder), in place in ``config``, by :func:`specfmt.format.provenance.carry_provenance`: an
    upgrade that changes nothing (no config change, every tensor kept byte for byte under its
    name) leaves the source's block as it was; one that changes something adds an ``upgrades``
    entry to it. A source without a block is left to :func:`with_provenance`'s.

    Raises:
        ConfigSchemaError: the result is not schema-valid (a specfmt bug).
    """
    earlier = opened.config.get("specfmt")
    if earlier is None:
        return config
    plan = opened.plan
    changes = config_changes(opened.config, config)
    unchanged = not changes and not plan.derived and all(
        m.action == "keep" and m.dst == m.src and m.out_dtype == m.info.dtype for m in plan.moves)
    config["specfmt"] = carry_provenance(earlier, config["specfmt"], unchanged=unchanged, changes=changes)
    validate_config(config, where="output config.json (a specfmt bug if this fails)")
    return config


def load_draft(ref: str, *, source_format: str = "auto", verifier: "str | Verifier | None" = None, revision: str | None = None,
               allow_missing: frozenset[str] = frozenset()) -> Draft:
    """Read a draft into memory, converting a research checkpoint on the way (nothing is written).

    Args:
        ref: a specfmt folder, or a research checkpoint (folder or Hub id).
        source_format: the ``--from`` name of a research checkpoint, ``auto`` to detect it,
            or ``specfmt``; a specfmt folder is read as such under ``auto``.
        verifier: the verifier (needed for a research checkpoint, as for ``convert``).
        revision: Hub revision of ``ref``.
        allow_missing: tensors a research checkpoint may lack (the fill-ins compute them).

    Raises:
        InputError, HubError: ``ref`` cannot be read.
        ConversionError: the research checkpoint cannot be converted exactly (tensors in
            ``allow_missing`` aside, which may be missing).
        ConfigSchemaError: a specfmt folder's config is invalid.
    """
    local = Path(ref).expanduser()
    if source_format == "specfmt" or (source_format == "auto" and is_specfmt_folder(local)):
        return read_draft(local)
    if verifier is None:
        raise InputError(f"{ref} is a research checkpoint; reading it needs the verifier", hint="pass --verifier")
    with open_plan(source_format, ref, verifier, revision=revision, allow_missing=allow_missing) as opened:
        plan, reader = opened.plan, opened.reader
        tensors = load_stream(plan.stream(reader))
        config = with_provenance(plan, opened.src, {f: sha256_file(opened.src.folder / f) for f in [CONFIG_FILE, *reader.files]})
        keep_provenance(config, opened)
    return Draft(config, tensors, config["specfmt"]["source"], list(plan.notes))


class _Digests:
    """sha256 of the source files, computed on a daemon thread (hashlib and file reads release
    the GIL, so it runs beside the tensor copy on a second core). An aborted conversion stops it
    (:meth:`stop`: at most one 16 MiB piece more is read), so nothing reads the source once
    :func:`convert` has returned or raised."""

    def __init__(self, folder: Path, names: list[str]):
        import threading

        self._result: dict[str, str] = {}
        self._error: BaseException | None = None
        self._stop = threading.Event()

        def run() -> None:
            try:
                self._result = {n: sha256_file(folder / n, stop=self._stop) for n in names}
            except BaseException as e:  # re-raised in the caller's thread by fill()
                self._error = e

        self._thread = threading.Thread(target=run, name="specfmt-sha256", daemon=True)
        self._thread.start()

    def fill(self, config: dict) -> dict:
        """Wait for the digests and put them into ``config["specfmt"]["source"]["files"]``."""
        self._thread.join()
        if self._error is not None:
            raise InputError(f"cannot read a source file to hash it: {self._error}")
        config["specfmt"]["source"]["files"] = dict(sorted(self._result.items()))
        return config

    def stop(self) -> None:
        """Stop hashing and wait for the thread (the conversion was aborted)."""
        self._stop.set()
        self._thread.join()


#: the tensor problems :func:`_check_plan` refuses, in the order its message lists them: the
#: :attr:`~specfmt.errors.Finding.kind` of :func:`~specfmt.algorithms.inventory.inventory_findings`, and its label
_PLAN_PROBLEMS = (("missing", "missing"), ("unexpected", "unexpected"), ("misshaped", "wrong shape"), ("wrong_dtype", "wrong dtype"))


def _check_plan(plan: Plan, allow_missing: frozenset[str] = frozenset()) -> None:
    """The plan's config is schema-valid and its tensors are exactly what that config implies
    (``allow_missing`` aside).

    Raises:
        ConfigSchemaError: the planned config is not schema-valid.
        ConversionError: tensors do not fit; :attr:`~specfmt.errors.ConversionError.tensors` names them
            (``missing``, ``unexpected``, ``misshaped``, ``wrong_dtype``: output names; ``unknown``: the
            source names no rule of the layout knows).
    """
    validate_config(plan.config, where="planned config.json")
    found = [f for f in inventory_findings(plan.config, plan.output_shapes()) if not (f.kind == "missing" and f.tensor in allow_missing)]
    parts = [f"not part of the {plan.source_format} layout: {', '.join(plan.unknown)}"] if plan.unknown else []
    for kind, label in _PLAN_PROBLEMS:
        lines = [f.message for f in found if f.kind == kind]
        if lines:
            parts.append(f"{label}: {', '.join(lines)}")
    if parts:
        tensors = {kind: [f.tensor for f in found if f.kind == kind] for kind, _ in _PLAN_PROBLEMS}
        raise ConversionError("the source does not hold the tensors its config implies -- " + "; ".join(parts), hint="nothing was written",
                              tensors={"unknown": list(plan.unknown), **tensors})


def _write_atomic(out: Path, plan: Plan, config: dict[str, Any], reader: CheckpointReader, progress: Callable[[int, int], None] | None,
                  finish_config: Callable[[dict[str, Any]], dict[str, Any]] = lambda c: c) -> int:
    """Write the plan's tensor stream (:meth:`Plan.stream`) and ``config`` as the folder ``out``
    (:func:`specfmt.draft.write_folder`: a temporary folder beside ``out``, swapped in).

    A tensor kept in its dtype and not transformed is copied byte for byte from its range in
    the source file, chunk by chunk, with the NaN/Inf check run on the raw bits: no torch, one
    chunk in memory. Casts, derived tensors and tensors without a plain byte range go through
    torch. ``finish_config`` completes the config once the tensors are written (the source digests).

    Returns:
        The bytes counted by ``progress``: a written move counts its source bytes, a derived tensor its output bytes.
    """
    stream = plan.stream(reader)
    counted = {m.dst: m.info.nbytes for m in plan.written}
    sizes = [counted.get(t.name, t.nbytes) for t in stream.tensors]
    total, done = sum(sizes), 0

    def on_written(t: OutTensor) -> None:
        nonlocal done
        done += counted.get(t.name, t.nbytes)
        if progress:
            progress(done, total)

    write_folder(out, stream, lambda: finish_config(config), on_written)
    return total
