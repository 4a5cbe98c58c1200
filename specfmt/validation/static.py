"""``specfmt validate`` (static level): is a folder a correct specfmt checkpoint?

Checks, in order; a check that cannot run because an earlier one failed is
``skip`` with the reason:

=================  ==========================================================
``config``         config.json exists and is a JSON object
``schema``         v1 JSON Schema and cross-field rules, each violation with its JSON path
``version``        ``speculators_version`` known (older: warn; newer: fail)
``weights``        safetensors weight files readable (headers, sizes)
``tensors``        names and shapes exactly those the config implies
``dtypes``         one floating dtype matching the config's ``dtype``; d2t int64, t2d bool
``finite``         no NaN/Inf in any floating tensor (reads the data, one tensor at a time)
``vocab_map``      ``d2t``/``t2d`` consistency (the algorithm's ``vocab_map_check``)
``verifier``       against the verifier's config when reachable: hidden size,
                   vocabulary, tap ids within its layer count, architectures
``serving``        which vLLM releases serve it, and how (:mod:`specfmt.serving`); ``warn``
                   when a checked release cannot (Medusa on vLLM 0.33)
=================  ==========================================================

A config of an algorithm speculators writes and vLLM serves but this specfmt does not
validate (:mod:`specfmt.algorithms.recognised`: P-EAGLE, DFlash, DSpark ...) is named as
such: ``schema`` is ``warn`` ("recognised, not validated by this version"), the checks that
need its tensor layout are skipped, and the generic ones (weights, NaN/Inf) still run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..algorithms import get, schema_findings
from ..algorithms.inventory import float_dtype_problems, inventory_findings
from ..checkpoint.dtypes import kind_of
from ..checkpoint.files import CONFIG_FILE, read_json
from ..checkpoint.finite import nonfinite_in
from ..checkpoint.reader import CheckpointReader
from ..errors import Finding, HubAuthError, HubGatedRepoError, HubOfflineError, HubUnavailableError, SpecfmtError
from ..format.versions import check_speculators_version
from ..algorithms.recognised import recognised
from ..sources.resolve import relative_to, resolve
from ..serving import serving_summary
from ..sources.verifier import Verifier
from .report import FAIL, PASS, SKIP, WARN, Report

if TYPE_CHECKING:  # pragma: no cover
    from ..checkpoint.reader import TensorInfo
    from .report import Check


#: the kinds of the ``verifier`` check's finding when the verifier's config cannot be read: the Hub could not be asked
#: (offline, failing, gated: the check could not be made), or the verifier is not there (a missing folder, no such repo)
UNREACHABLE, UNREADABLE = "unreachable", "unreadable"

#: the checks of :func:`validate_static`, in order
CHECKS = ("config", "schema", "version", "weights", "tensors", "dtypes", "finite", "vocab_map", "verifier", "serving")


def validate_static(folder: str | Path, verifier: str | Verifier | None = None) -> Report:
    """Run the static checks on a local checkpoint folder.

    Args:
        folder: the checkpoint folder (a Hub id is resolved through the cache/Hub).
        verifier: verifier folder or Hub id, or a :class:`~specfmt.sources.verifier.Verifier` already
            resolved; default: ``speculators_config.verifier.name_or_path`` when reachable (the
            verifier check is skipped otherwise).

    Returns:
        A :class:`Report`; it never raises for problems in the checkpoint itself. The ``schema``,
        ``tensors`` and ``verifier`` checks carry their findings (:class:`~specfmt.errors.Finding`: the
        config path and keys, the tensor) beside the printed details.

    Raises:
        InputError, HubError: ``folder`` itself cannot be found.
    """
    res = resolve(str(folder), allow_patterns=["*.json", "*.safetensors"], what="checkpoint")
    rep = Report(res.name_or_path)
    try:
        cfg = read_json(res.folder / CONFIG_FILE)
    except SpecfmtError as e:
        rep.add("config", FAIL, e.one_line())
        return _skip_from(rep, "schema", "no config")
    rep.add("config", PASS, "config.json is a JSON object")
    known = recognised(cfg.get("speculators_model_type"))
    valid = _schema_check(rep, cfg, known, res.folder, res.name_or_path)
    _version_check(rep, cfg)
    try:
        reader = CheckpointReader(res.folder)
    except SpecfmtError as e:
        rep.add("weights", FAIL, e.one_line())
        return _skip_from(rep, "tensors", "weights unreadable")
    with reader:
        _weights_check(rep, reader)
        if not valid or known:
            why = known.skip_reason if known else "the config is not schema-valid, so the expected tensors are unknown"
            rep.add("tensors", SKIP, why)
            rep.add("dtypes", SKIP, why)
            _finite(rep, reader, reader.infos)
            return _skip_from(rep, "vocab_map", why)
        _tensor_checks(rep, cfg, reader)
    _verifier_check(rep, cfg, verifier, res.folder)
    rep.add("serving", *serving_summary(cfg))
    return rep


def _skip_from(rep: Report, first: str, why: str) -> Report:
    """Every check from ``first`` on (:data:`CHECKS`) skipped, with ``why``."""
    for n in CHECKS[CHECKS.index(first):]:
        rep.add(n, SKIP, why)
    return rep


def _schema_check(rep: Report, cfg: dict[str, Any], known: Any, folder: Path, name: str) -> bool:
    """The ``schema`` check (its findings: :func:`specfmt.algorithms.schema_findings`); True when the
    config is schema-valid. A config of an algorithm specfmt recognises but does not validate (``known``)
    is ``warn``, and not valid."""
    if known:
        rep.add("schema", WARN, known.summary)
        return False
    findings = schema_findings(cfg)
    if not findings:
        rep.add("schema", PASS, f"valid specfmt v1 ({cfg['speculators_model_type']})")
        return True
    details = [f"{f.path}: {f.message}" for f in findings] + _upgrade_hint(cfg, folder)
    summary = f"{len(findings)} violation(s) of the specfmt v1 schema" + ("; `specfmt upgrade` rewrites it" if details[len(findings):] else "")
    other = _what_else(cfg, folder, name)
    if other:
        summary = f"not a specfmt checkpoint but {other[0]} ({summary}); {other[1]}"
        details.append(f"{other[0]}: {other[1]}")
    rep.add("schema", FAIL, summary, details, findings)
    return False


def _version_check(rep: Report, cfg: dict[str, Any]) -> None:
    """The ``version`` check: ``speculators_version`` current (pass), older (warn) or newer (fail)."""
    try:
        vs = check_speculators_version(cfg.get("speculators_version"))
        rep.add("version", {"current": PASS, "older": WARN, "newer": FAIL}[vs.status], vs.message)
    except SpecfmtError as e:
        rep.add("version", FAIL, e.one_line())


def _weights_check(rep: Report, reader: CheckpointReader) -> None:
    """The ``weights`` check: safetensors files, their tensors and size."""
    infos = reader.infos
    if reader.format != "safetensors":
        rep.add("weights", FAIL, f"weights are {reader.format} files {reader.files}; the format stores safetensors")
    else:
        total = sum(i.nbytes for i in infos.values())
        rep.add("weights", PASS, f"{len(infos)} tensors, {total / 2**20:.1f} MiB in {', '.join(reader.files)}", [f"{k} ignored: {v}" for k, v in reader.ignored.items()])


#: how the ``tensors`` check prints each kind of finding of :func:`~specfmt.algorithms.inventory.inventory_findings`
_TENSOR_LABELS = {"missing": "missing", "unexpected": "unexpected", "misshaped": "shape"}


def _tensor_checks(rep: Report, cfg: dict[str, Any], reader: CheckpointReader) -> None:
    """The ``tensors``, ``dtypes``, ``finite`` and ``vocab_map`` checks of a schema-valid config."""
    infos = reader.infos
    found = inventory_findings(cfg, {n: (i.shape, i.dtype) for n, i in infos.items()})
    inv = [f for kind in _TENSOR_LABELS for f in found if f.kind == kind]
    if inv:
        count = {kind: sum(f.kind == kind for f in inv) for kind in _TENSOR_LABELS}
        rep.add("tensors", FAIL, f"{count['missing']} missing, {count['unexpected']} unexpected, {count['misshaped']} mis-shaped",
                [f"{_TENSOR_LABELS[f.kind]}: {f.message}" for f in inv], inv)
    else:
        rep.add("tensors", PASS, f"all {len(infos)} tensors present with the shapes the config implies")
    dt = [f.message for f in found if f.kind == "wrong_dtype"] + float_dtype_problems(cfg, infos)
    floats = sorted({i.dtype for i in infos.values() if kind_of(i.dtype) == "float"})
    rep.add("dtypes", FAIL if dt else PASS, "; ".join(dt) if dt else f"floating tensors {'/'.join(floats)}; index tensors as expected", dt)
    _finite(rep, reader, infos)
    status, summary, details = get(cfg["speculators_model_type"]).vocab_map_check(cfg, reader)
    rep.add("vocab_map", status, summary, details)


def _upgrade_hint(cfg: dict[str, Any], folder: Path) -> list[str]:
    """For a speculators checkpoint specfmt did not write: how to make it current."""
    if isinstance(cfg.get("specfmt"), dict) or not isinstance(cfg.get("speculators_config"), dict):
        return []
    return [f"written by speculators {cfg.get('speculators_version', '(no version)')}, not by specfmt: "
            f"`specfmt upgrade {folder} -o OUT` writes it in the current format, the tap layers and the verifier made explicit"]


def _what_else(cfg: dict[str, Any], folder: Path, name: str) -> tuple[str, str] | None:
    """For a folder that is not a speculators checkpoint at all: ``(what it is, what to run)``
    (:func:`specfmt.detect.detect`), e.g. an EAGLE-3 research draft and its ``specfmt convert --from
    eagle3`` line; None when it is one, or when detection does not know it either."""
    if isinstance(cfg.get("speculators_config"), dict):
        return None
    from ..detect import detect  # detect imports the converters

    try:
        d = detect(folder)
    except SpecfmtError:
        return None
    refusal = d.refusal("validate", src=name)
    return None if refusal is None else (d.what, refusal[1])


def _finite(rep: Report, reader: CheckpointReader, infos: dict[str, "TensorInfo"]) -> None:
    bad = []
    for name, info in sorted(infos.items()):
        if kind_of(info.dtype) != "float":
            continue
        n = nonfinite_in(reader, name)
        if n:
            bad.append(f"{name}: {n} NaN/Inf")
    rep.add("finite", FAIL if bad else PASS, f"{len(bad)} tensor(s) with NaN/Inf" if bad else "no NaN/Inf", bad)


def verifier_check(folder: str | Path, verifier: str | None = None) -> "Check":
    """The ``verifier`` check of :func:`validate_static` alone, for a folder whose other checks passed: against
    ``verifier``, else the verifier its config names (``skip`` when that cannot be read).

    Raises:
        InputError: the folder's config.json cannot be read.
    """
    folder = Path(folder)
    rep = Report(str(folder))
    _verifier_check(rep, read_json(folder / CONFIG_FILE), verifier, folder)
    return rep.checks[0]


def _verifier_check(rep: Report, cfg: dict[str, Any], verifier: str | Verifier | None, folder: Path) -> None:
    """The ``verifier`` check: the draft's config against the verifier's (width, vocabulary, the
    algorithm's :meth:`~specfmt.algorithms.base.Algorithm.verifier_problems`, architectures); each
    problem a :class:`~specfmt.errors.Finding` at the config field it concerns."""
    if isinstance(verifier, Verifier):
        ref, v = verifier.ref, verifier.info
    else:
        # a relative path in the config is the draft folder's (sources.resolve.relative_to)
        ref = verifier or relative_to(cfg["speculators_config"]["verifier"]["name_or_path"], folder)
        try:
            v = Verifier.load(ref).info
        except SpecfmtError as e:
            # the reason as data: the Hub could not be asked (offline, failing, gated) or the verifier is not there
            kind = UNREACHABLE if isinstance(e, (HubOfflineError, HubUnavailableError, HubGatedRepoError, HubAuthError)) else UNREADABLE
            rep.add("verifier", FAIL if verifier else SKIP, f"verifier config not reachable: {e.one_line()}", findings=[Finding(e.one_line(), kind=kind)])
            return
    algo = get(cfg["speculators_model_type"])
    tlc = cfg["transformer_layer_config"]
    found = []
    ht = algo.verifier_hidden_size(cfg)
    if ht != v.hidden_size:
        found.append(Finding(f"the draft takes verifier states of width {ht}, the verifier's hidden_size is {v.hidden_size}", kind="rule"))
    if tlc["vocab_size"] != v.vocab_size:
        found.append(Finding.at("$.transformer_layer_config.vocab_size", f"transformer_layer_config.vocab_size {tlc['vocab_size']} != verifier vocab_size {v.vocab_size}", kind="rule"))
    found += [p if isinstance(p, Finding) else Finding(p, kind="rule") for p in algo.verifier_problems(cfg, v)]
    archs = cfg["speculators_config"]["verifier"]["architectures"]
    if list(archs) != list(v.architectures):
        found.append(Finding.at("$.speculators_config.verifier.architectures", f"verifier.architectures {archs} != the verifier's {list(v.architectures)}", kind="rule"))
    where = f"{ref} ({v.num_hidden_layers} layers, H={v.hidden_size}, V={v.vocab_size})"
    lines = [f.message for f in found]
    rep.add("verifier", FAIL if found else PASS, "; ".join(lines) if found else f"matches {where}", lines, found)
