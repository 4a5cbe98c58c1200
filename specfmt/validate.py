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
``vocab_map``      ``d2t``/``t2d`` consistency (:func:`specfmt.checks.vocab_map_problems`)
``verifier``       against the verifier's config when reachable: hidden size,
                   vocabulary, tap ids within its layer count, architectures
=================  ==========================================================
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import SpecfmtError

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"


@dataclass
class Check:
    """One check's outcome.

    Attributes:
        name: short id (``schema``, ``tensors``, ...).
        status: ``pass``, ``fail``, ``warn`` (does not fail the run) or ``skip``.
        summary: one line.
        details: every individual finding (JSON paths, tensor names).
    """

    name: str
    status: str
    summary: str
    details: list[str] = field(default_factory=list)


@dataclass
class Report:
    """All checks on one folder. ``ok`` is True when no check failed."""

    path: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    def add(self, name: str, status: str, summary: str, details: list[str] | None = None) -> Check:
        c = Check(name, status, summary, list(details or []))
        self.checks.append(c)
        return c

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "ok": self.ok, "checks": [asdict(c) for c in self.checks]}


def validate_static(folder: str | Path, verifier: str | None = None) -> Report:
    """Run the static checks on a local checkpoint folder.

    Args:
        folder: the checkpoint folder (a Hub id is resolved through the cache/Hub).
        verifier: verifier folder or Hub id; default: ``speculators_config.verifier.name_or_path``
            when reachable (the verifier check is skipped otherwise).

    Returns:
        A :class:`Report`; it never raises for problems in the checkpoint itself.

    Raises:
        InputError, HubError: ``folder`` itself cannot be found.
    """
    from .checkpoint import CheckpointReader, kind_of
    from .checks import float_dtype_problems, inventory_problems, vocab_map_problems
    from .format import CONFIG_FILE, check_speculators_version, read_json, schema_violations
    from .hub import resolve

    res = resolve(str(folder), allow_patterns=["*.json", "*.safetensors"], what="checkpoint")
    rep = Report(res.name_or_path)
    rest = ["schema", "version", "weights", "tensors", "dtypes", "finite", "vocab_map", "verifier"]

    def skip_rest(from_name: str, why: str) -> Report:
        for n in rest[rest.index(from_name):]:
            rep.add(n, SKIP, why)
        return rep

    # -- config & schema ----------------------------------------------------------
    try:
        cfg = read_json(res.folder / CONFIG_FILE)
    except SpecfmtError as e:
        rep.add("config", FAIL, e.one_line())
        return skip_rest("schema", "no config")
    rep.add("config", PASS, "config.json is a JSON object")
    violations = schema_violations(cfg)
    if violations:
        rep.add("schema", FAIL, f"{len(violations)} violation(s) of the specfmt v1 schema", [f"{p}: {m}" for p, m in violations])
    else:
        rep.add("schema", PASS, f"valid specfmt v1 ({cfg['speculators_model_type']})")
    try:
        vs = check_speculators_version(cfg.get("speculators_version"))
        rep.add("version", {"current": PASS, "older": WARN, "newer": FAIL}[vs.status], vs.message)
    except SpecfmtError as e:
        rep.add("version", FAIL, e.one_line())

    # -- weights ----------------------------------------------------------------
    try:
        reader = CheckpointReader(res.folder)
    except SpecfmtError as e:
        rep.add("weights", FAIL, e.one_line())
        return skip_rest("tensors", "weights unreadable")
    with reader:
        infos = reader.infos
        if reader.format != "safetensors":
            rep.add("weights", FAIL, f"weights are {reader.format} files {reader.files}; the format stores safetensors")
        else:
            total = sum(i.nbytes for i in infos.values())
            rep.add("weights", PASS, f"{len(infos)} tensors, {total / 2**20:.1f} MiB in {', '.join(reader.files)}", [f"{k} ignored: {v}" for k, v in reader.ignored.items()])
        shapes = {n: (i.shape, i.dtype) for n, i in infos.items()}
        if violations:
            skip_rest("tensors", "the config is not schema-valid, so the expected tensors are unknown")
            _finite(rep, reader, infos)
            return rep
        problems = inventory_problems(cfg, shapes)
        inv = [f"missing: {m}" for m in problems["missing"]] + [f"unexpected: {u}" for u in problems["unexpected"]] + [f"shape: {s}" for s in problems["shape"]]
        if inv:
            rep.add("tensors", FAIL, f"{len(problems['missing'])} missing, {len(problems['unexpected'])} unexpected, {len(problems['shape'])} mis-shaped", inv)
        else:
            rep.add("tensors", PASS, f"all {len(infos)} tensors present with the shapes the config implies")
        dt = problems["dtype"] + float_dtype_problems(cfg, infos)
        floats = sorted({i.dtype for i in infos.values() if kind_of(i.dtype) == "float"})
        rep.add("dtypes", FAIL if dt else PASS, "; ".join(dt) if dt else f"floating tensors {'/'.join(floats)}; index tensors as expected", dt)
        _finite(rep, reader, infos)
        tlc = cfg["transformer_layer_config"]
        if cfg["speculators_model_type"] != "eagle3":
            rep.add("vocab_map", PASS, f"no draft vocabulary: {cfg['speculators_model_type']} proposes over the verifier's {tlc['vocab_size']} ids")
        elif "d2t" in infos and "t2d" in infos:
            vp = vocab_map_problems(reader.array("d2t"), reader.array("t2d"), tlc["vocab_size"], cfg["draft_vocab_size"])
            rep.add("vocab_map", FAIL if vp else PASS, "; ".join(vp) if vp else f"d2t/t2d consistent: {cfg['draft_vocab_size']} of {tlc['vocab_size']} ids", vp)
        elif cfg["draft_vocab_size"] == tlc["vocab_size"]:
            rep.add("vocab_map", PASS, "full vocabulary (Vd = V); no map needed")
        else:
            rep.add("vocab_map", SKIP, "d2t/t2d absent (reported under tensors)")
    _verifier_check(rep, cfg, verifier)
    return rep


def _finite(rep: Report, reader, infos) -> None:
    from .checkpoint import kind_of
    from .checks import nonfinite_in

    bad = []
    for name, info in sorted(infos.items()):
        if kind_of(info.dtype) != "float":
            continue
        n = nonfinite_in(reader, name)
        if n:
            bad.append(f"{name}: {n} NaN/Inf")
    rep.add("finite", FAIL if bad else PASS, f"{len(bad)} tensor(s) with NaN/Inf" if bad else "no NaN/Inf", bad)


def _verifier_check(rep: Report, cfg: dict, verifier: str | None) -> None:
    from .convert import load_verifier

    ref = verifier or cfg["speculators_config"]["verifier"]["name_or_path"]
    try:
        v = load_verifier(ref)
    except SpecfmtError as e:
        rep.add("verifier", FAIL if verifier else SKIP, f"verifier config not reachable: {e.one_line()}")
        return
    tlc = cfg["transformer_layer_config"]
    found = []
    ht = cfg.get("target_hidden_size") or tlc["hidden_size"]
    if ht != v.hidden_size:
        found.append(f"the draft takes verifier states of width {ht}, the verifier's hidden_size is {v.hidden_size}")
    if tlc["vocab_size"] != v.vocab_size:
        found.append(f"transformer_layer_config.vocab_size {tlc['vocab_size']} != verifier vocab_size {v.vocab_size}")
    taps = cfg.get("eagle_aux_hidden_state_layer_ids") or []
    out_of_range = [t for t in taps if t >= v.num_hidden_layers]
    if out_of_range:
        found.append(f"tap layers {out_of_range} are not below the verifier's {v.num_hidden_layers} layers")
    archs = cfg["speculators_config"]["verifier"]["architectures"]
    if list(archs) != list(v.architectures):
        found.append(f"verifier.architectures {archs} != the verifier's {list(v.architectures)}")
    where = f"{ref} ({v.num_hidden_layers} layers, H={v.hidden_size}, V={v.vocab_size})"
    rep.add("verifier", FAIL if found else PASS, "; ".join(found) if found else f"matches {where}", found)
