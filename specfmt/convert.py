"""``specfmt convert``: run a converter's plan, checked, streamed and atomic.

Order of work (nothing is written before step 5, and SRC is only ever read):

1. resolve SRC and the verifier (local folder or Hub id);
2. read SRC's config and the tensor headers;
3. the converter plans: output config and the fate of every source tensor;
4. the plan is checked: config against the v1 schema, the tensors it would write
   against the names and shapes that config implies; any problem is an error
   that lists every offending tensor;
5. tensors are streamed one at a time into a temporary folder beside OUT, with
   NaN/Inf and ``d2t``/``t2d`` checks on the way; the folder is renamed to OUT
   only once complete.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from .checkpoint import ST_DTYPES, CheckpointReader, SafetensorsStreamWriter, TensorInfo, install_folder, sha256_file
from .checks import inventory_problems, nonfinite_count, vocab_map_problems
from .errors import ConversionError, InputError, OutputExistsError
from .format import CONFIG_FILE, WEIGHTS_FILE, VerifierInfo, provenance_block, read_json, validate_config
from .hub import resolve

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

    plan: object
    config: dict
    out: Path | None
    bytes_written: int


def load_verifier(ref: str, revision: str | None = None) -> VerifierInfo:
    """Resolve a verifier reference and read its config.json (the only file EAGLE-3 needs).

    Raises:
        InputError, HubError: the verifier cannot be found or its config is unusable.
    """
    res = resolve(ref, allow_patterns=["config.json"], revision=revision, what="verifier")
    cfg_path = res.folder / CONFIG_FILE
    return VerifierInfo.from_config(read_json(cfg_path), res.name_or_path, str(cfg_path))


def source_config(ref: str, revision: str | None = None) -> dict:
    """A source checkpoint's config.json (folder or Hub id).

    Raises:
        InputError, HubError: it cannot be found or read.
    """
    res = resolve(ref, allow_patterns=["config.json"], revision=revision, what="source")
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
    from .detect import detect

    d = detect(folder)
    if len(d.candidates) == 1:
        return d.candidates[0]
    if not d.candidates:
        raise InputError(
            f"--from auto: detected {d.format} ({d.layout}), which no converter reads",
            where=str(folder),
            hint="; ".join(d.evidence) + "; run `specfmt inspect` for details",
        )
    flags = ", ".join(f"--from {c}" for c in d.candidates)
    raise InputError(
        f"--from auto: the files fit {len(d.candidates)} formats ({', '.join(d.candidates)}): {'; '.join(d.evidence)}",
        where=str(folder),
        hint=f"pick one with {flags}",
    )


def open_verifier_tensor(ref: str, names: list[str], revision: str | None = None) -> tuple[CheckpointReader, str]:
    """Open the verifier weight file holding the first of ``names`` it has, headers only.

    Only that one file is fetched for a Hub id: the shard index first, then the one
    shard named there (a 70B verifier's other shards are never downloaded).

    Args:
        ref: verifier folder or Hub id.
        names: candidate tensor names, in order of preference (e.g. ``lm_head.weight``).

    Returns:
        ``(reader, name)``: a reader whose :meth:`~CheckpointReader.get` loads the tensor.

    Raises:
        InputError, HubError: the verifier's weights cannot be read or hold none of ``names``.
    """
    from .checkpoint import PICKLE_INDEX, SAFETENSORS_INDEX

    res = resolve(ref, allow_patterns=["config.json", "*.index.json"], revision=revision, what="verifier")
    for index_name in (SAFETENSORS_INDEX, PICKLE_INDEX):
        index_path = res.folder / index_name
        if index_path.is_file():
            weight_map = read_json(index_path).get("weight_map")
            if not isinstance(weight_map, dict):
                raise InputError("invalid shard index (needs a 'weight_map' object)", where=str(index_path))
            hit = next((n for n in names if n in weight_map), None)
            if hit is None:
                raise InputError(f"the verifier holds none of {names}", where=str(index_path))
            shard = weight_map[hit]
            res = resolve(ref, allow_patterns=["config.json", "*.index.json", shard], revision=revision, what="verifier")
            # only that shard is local for a Hub id; the index names shards never downloaded
            reader = CheckpointReader(res.folder, only=[shard])
            break
    else:
        res = resolve(ref, allow_patterns=["config.json", "*.safetensors", "pytorch_model*.bin"], revision=revision, what="verifier")
        reader = CheckpointReader(res.folder)
    hit = next((n for n in names if n in reader.infos), None)
    if hit is None:
        raise InputError(f"the verifier's weights hold none of {names}", where=str(res.folder), hint="--verifier must name the full verifier model, weights included")
    return reader, hit


def check_output(out: Path, force: bool, sources: tuple[Path, ...] = ()) -> None:
    """OUT may be written: not a file, empty unless ``force``, and apart from every input folder.

    Raises:
        OutputExistsError: OUT is a file, or a non-empty folder without ``force``.
        InputError: OUT is, contains or lies inside one of ``sources``.
    """
    if out.exists() and not out.is_dir():
        raise OutputExistsError("the output path exists and is a file", where=str(out), hint="choose a folder path for -o")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise OutputExistsError("the output folder is not empty", where=str(out), hint="choose another -o or pass --force to replace it")
    o = out.resolve()
    for src_folder in sources:
        src = src_folder.resolve()
        if o == src or src in o.parents or o in src.parents:
            raise InputError("the output folder overlaps the source folder", where=str(out), hint="write the output elsewhere; the source is never modified")


def cleanup_stale(out: Path) -> None:
    """Remove temporary folders of earlier runs on the same OUT that were killed."""
    for p in out.parent.glob(f".{out.name}.specfmt-*"):
        try:
            pid = int(p.name.rsplit("-", 2)[-2])
        except (ValueError, IndexError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except PermissionError:
            pass


def convert(
    source_format: str,
    src_ref: str,
    out: str | Path | None,
    verifier_ref: str,
    *,
    opts=None,
    force: bool = False,
    dry_run: bool = False,
    revision: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    allow_missing: frozenset[str] = frozenset(),
) -> ConvertResult:
    """Convert the research checkpoint ``src_ref`` into the specfmt format at ``out``.

    Args:
        source_format: the ``--from`` name (``eagle3``, ``eagle``, ``hass``, ``medusa``,
            ``speculators``), or ``auto`` to detect it (:func:`detect_source_format`).
        src_ref: source folder or Hub id.
        out: output folder (ignored for a dry run).
        verifier_ref: verifier folder or Hub id; written into the config as a Hub id
            or an absolute path.
        opts: :class:`specfmt.converters.Options`.
        force: replace a non-empty ``out``.
        dry_run: plan and check only; write nothing.
        revision: Hub revision of the source.
        progress: called as ``progress(bytes_done, bytes_total)`` while writing.
        allow_missing: tensor names the output may lack (the trainer's fill-ins compute
            them next, :mod:`specfmt.draft`); empty for a servable conversion.

    Raises:
        InputError, HubError: inputs cannot be read.
        ConversionError: the source cannot be converted exactly (the message lists
            every offending tensor); nothing was written.
        OutputExistsError: ``out`` is not empty and ``force`` is False.
    """
    from specfmt.converters import Options, Source, get

    opts = opts or Options()
    if source_format != "auto":
        get(source_format)  # an unknown --from fails before any download
    src_res = resolve(src_ref, allow_patterns=SOURCE_PATTERNS, revision=revision, what="source")
    if source_format == "auto":
        source_format = detect_source_format(src_res.folder)
    converter = get(source_format)
    out_path = Path(out).expanduser().resolve() if out is not None else None
    if not dry_run:
        if out_path is None:
            raise InputError("no output folder given", hint="pass -o OUT")
        check_output(out_path, force, (src_res.folder,))
    verifier = load_verifier(verifier_ref)
    src_cfg = read_json(src_res.folder / CONFIG_FILE)
    with CheckpointReader(src_res.folder, pickle_names=converter.pickle_names, ignore=converter.ignore_files) as reader:
        plan = converter.plan(Source(src_res, src_cfg, reader, verifier_ref), verifier, opts)
        _check_plan(plan, allow_missing)
        files_read = [CONFIG_FILE, *reader.files]
        digests = _Digests(src_res.folder, files_read)  # hashed on a second thread while the tensors are copied
        plan.notes.extend(f"{name} not read: {why}" for name, why in reader.ignored.items())
        config = dict(plan.config)
        config["specfmt"] = provenance_block(
            source_format=plan.source_format,
            layout=plan.layout,
            name_or_path=src_res.name_or_path,
            revision=src_res.revision,
            files={f: "0" * 64 for f in files_read},  # the digests' shape, for validation; filled in below
            renamed={m.src: m.dst for m in plan.moves if m.action == "rename"},
            kept=[m.src for m in plan.moves if m.action == "keep"],
            dropped={m.src: m.reason for m in plan.moves if m.action == "drop"},
            folded={m.src: m.reason for m in plan.moves if m.action == "fold"},
            derived={d.dst: d.how for d in plan.derived},
            created=datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        )
        validate_config(config, where="output config.json (a specfmt bug if this fails)")
        if dry_run:
            digests.fill(config)
            return ConvertResult(plan, config, None, 0)
        written = _write_atomic(out_path, plan, config, reader, force, progress, finish_config=digests.fill)
    return ConvertResult(plan, config, out_path, written)


class _Digests:
    """sha256 of the source files, computed on a daemon thread (hashlib and file reads release
    the GIL, so it runs beside the tensor copy on a second core; an aborted conversion does not wait for it)."""

    def __init__(self, folder: Path, names: list[str]):
        import threading

        self._result: dict[str, str] = {}
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._result = {n: sha256_file(folder / n) for n in names}
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


def _check_plan(plan, allow_missing: frozenset[str] = frozenset()) -> None:
    """The plan's config is schema-valid and its tensors are exactly what that config implies
    (``allow_missing`` aside)."""
    validate_config(plan.config, where="planned config.json")
    problems = inventory_problems(plan.config, plan.output_shapes())
    problems["missing"] = [m for m in problems["missing"] if m.split(" ")[0] not in allow_missing]
    parts = [f"not part of the {plan.source_format} layout: {', '.join(plan.unknown)}"] if plan.unknown else []
    for key, label in (("missing", "missing"), ("unexpected", "unexpected"), ("shape", "wrong shape"), ("dtype", "wrong dtype")):
        if problems[key]:
            parts.append(f"{label}: {', '.join(problems[key])}")
    if parts:
        raise ConversionError("the source does not hold the tensors its config implies -- " + "; ".join(parts), hint="nothing was written")


def _write_atomic(out: Path, plan, config: dict, reader: CheckpointReader, force: bool, progress, finish_config: Callable[[dict], dict] = lambda c: c) -> int:
    """Write the plan into a temporary folder next to ``out`` and swap it in.

    A tensor kept in its dtype and not transformed is copied byte for byte from its range in
    the source file (:meth:`CheckpointReader.raw`), chunk by chunk, with the NaN/Inf check run
    on the raw bits (:class:`specfmt.checks.NonfiniteCounter`): no torch, one chunk in memory.
    Casts, transforms, derived tensors and tensors without a plain byte range go through torch.
    ``finish_config`` completes the config once the tensors are written (the source digests).
    """
    from .checks import NonfiniteCounter

    out.parent.mkdir(parents=True, exist_ok=True)
    cleanup_stale(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.specfmt-{os.getpid()}-", dir=out.parent))
    try:
        moves = plan.written
        layout = [(m.dst, m.out_dtype, m.info.shape) for m in moves] + [(d.dst, d.out_dtype, d.shape) for d in plan.derived]
        total = sum(m.info.nbytes for m in moves) + sum(TensorInfo(d.dst, d.shape, d.out_dtype, "").nbytes for d in plan.derived)
        writer = SafetensorsStreamWriter(tmp / WEIGHTS_FILE, layout)
        done = 0
        vocab = {}

        def finite(bad: int, what: str, cast: bool, hint: str) -> None:
            if bad:
                raise ConversionError(f"{what} has {bad} NaN/Inf value(s)" + (" after the cast" if cast else ""), hint=hint)

        try:
            for m in moves:
                cast = m.out_dtype != m.info.dtype
                where = None if cast or m.dst in plan.transforms else reader.raw(m.src)
                if where is not None:
                    bad = writer.copy(m.dst, where[0], where[1], m.info.nbytes, NonfiniteCounter(m.info.dtype))
                    finite(bad, f"tensor {m.src}", False, "the checkpoint is damaged")
                    if m.dst in ("d2t", "t2d"):
                        vocab[m.dst] = reader.array(m.src)
                else:
                    import torch

                    t = reader.get(m.src)
                    if cast:
                        t = t.to(getattr(torch, ST_DTYPES[m.out_dtype][0]))
                    if m.dst in plan.transforms:
                        t = plan.transforms[m.dst](t)
                    finite(nonfinite_count(t), f"tensor {m.src}", cast, "keep the source dtype (drop --dtype)" if cast else "the checkpoint is damaged")
                    if m.dst in ("d2t", "t2d"):
                        vocab[m.dst] = t.clone().numpy()
                    writer.write(m.dst, t)
                    del t
                done += m.info.nbytes
                if progress:
                    progress(done, total)
            for d in plan.derived:
                import torch

                t = d.compute(reader.get).to(getattr(torch, ST_DTYPES[d.out_dtype][0])).contiguous()
                finite(nonfinite_count(t), f"derived tensor {d.dst} ({d.how})", True, "the value does not fit the output dtype; convert with --dtype float32 (or bfloat16)")
                writer.write(d.dst, t)
                done += t.numel() * t.element_size()
                if progress:
                    progress(done, total)
                del t
            writer.close()
        except BaseException:
            writer.abort()
            raise
        if vocab:
            tlc = config["transformer_layer_config"]
            problems = vocab_map_problems(vocab["d2t"], vocab["t2d"], tlc["vocab_size"], config["draft_vocab_size"])
            if problems:
                raise ConversionError("the draft vocabulary map is inconsistent: " + "; ".join(problems), hint="the source's d2t/t2d are damaged")
        config = finish_config(config)
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        _verify_written(tmp, layout)
        install_folder(tmp, out)
        return total
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _verify_written(folder: Path, layout) -> None:
    """Re-open the written file with the safetensors library and compare its header with the plan."""
    from safetensors import safe_open

    with safe_open(str(folder / WEIGHTS_FILE), framework="numpy") as f:  # header only; numpy keeps torch unimported
        got = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    want = {name: tuple(shape) for name, _, shape in layout}
    if got != want:  # a bug in the writer, not a user error
        raise RuntimeError(f"written safetensors header differs from the plan: {set(got) ^ set(want)}")
