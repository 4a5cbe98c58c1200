"""Parts of the docs generated from the code and the data at build time (mkdocs-gen-files runs
this script before the pages are read, ``mkdocs.yml``).

A page asks for a generated part with a marker on a line of its own::

    <!-- gen:options convert -->

and the marker is replaced by what :data:`RENDERERS` makes of it. The kinds:

* ``commands``: every command of the ``specfmt`` app, with the page that documents it;
* ``options CMD...``: the usage and every option of one command, read from the typer app through
  click (``typer.main.get_command``), so the reference cannot drift from ``--help``;
* ``layouts NAME``: a converter's accepted layouts and the variations it converts or refuses, from
  its :class:`~specfmt.converters.base.Layout` and :class:`~specfmt.converters.base.Case` declarations;
* ``named``: the formats no converter reads, from :data:`specfmt.detect.NAMED` and ``FOREIGN``;
* ``from``: every ``--from`` value of ``convert``, from the converter registry, each linked to its layouts;
* ``upgrades``: what ``specfmt upgrade`` accepts: every ``speculators_model_type`` a converter upgrades, and the
  variations the speculators converter declares;
* ``worlds``: the example worlds (``examples/world*/``): each folder's verifier and drafts as ``inspect`` names them;
* ``corpus``: the real-config corpus of ``tests/data/real_configs``;
* ``serving-matrix`` / ``serving-lines`` / ``recognised``: which checked vLLM release serves what,
  from :mod:`specfmt.serving` and each algorithm's ``vllm_releases``;
* ``schema``: ``schemas/config-v1.schema.json`` as tables;
* ``bench NAME``: ``benchmarks/NAME.results.json`` as tables, with the machine and the date;
* ``file PATH``: a file of the repository as it is (e.g. ``examples/train.sh``).

The build fails (and so does ``mkdocs build --strict`` in CI) when a marker is unknown, or when a
command, a converter or a benchmark result has no page that renders it.
"""

from __future__ import annotations

import json
import posixpath
import re
import subprocess
from pathlib import Path
from typing import Any, Callable

import mkdocs_gen_files

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- gen:([\w-]+)((?: [^ >]+)*) -->$", re.M)
#: Sphinx roles in docstrings and declarations (``:func:`x```), shown as code
ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


class DocsError(RuntimeError):
    """A page asks for what does not exist, or something the code declares has no page."""


def cell(text: Any) -> str:
    """A Markdown table cell: roles as code, newlines joined, pipes escaped outside code spans
    (a pipe inside backticks is not a column separator, and an escape there would show)."""
    parts = re.split(r"(`[^`]*`)", " ".join(ROLE.sub(r"`\1`", str(text)).split()))
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


def table(head: list[str], rows: list[list[Any]], align: str = "") -> str:
    """A Markdown table; ``align`` is one letter per column (``l``/``r``), default left."""
    marks = ["---:" if (align[i:i + 1] == "r") else "---" for i in range(len(head))]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(marks) + " |"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def link(page: str, target: str) -> str:
    """A relative link from ``page`` to ``target`` (both paths under docs/)."""
    return posixpath.relpath(target, posixpath.dirname(page) or ".")


# --------------------------------------------------------------------------- commands


def _app():
    import typer.main

    from specfmt.cli import app

    return typer.main.get_command(app)


def command_paths() -> dict[str, Any]:
    """Every leaf command of the app by its path (``convert``, ``train eagle3``), in the app's order."""
    out: dict[str, Any] = {}

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, path + (name,))
        elif path:
            out[" ".join(path)] = cmd

    walk(_app(), ())
    return out


def _context(path: str):
    """A click context for the command at ``path`` (for its help records)."""
    root = _app()
    ctx = root.make_context("specfmt", ["--help"], resilient_parsing=True)
    cmd = root
    for name in path.split():
        cmd = cmd.commands[name]
        ctx = type(ctx)(cmd, info_name=name, parent=ctx)
    return cmd, ctx


def render_options(page: str, args: list[str], state: dict) -> str:
    path = " ".join(args)
    commands = command_paths()
    if path not in commands:
        raise DocsError(f"{page}: <!-- gen:options {path} --> names no command of the specfmt app (known: {', '.join(commands)})")
    state["documented"][path] = page
    cmd, ctx = _context(path)
    usage = " ".join(["specfmt", path, *cmd.collect_usage_pieces(ctx)])
    usage = re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), usage)
    rows = []
    for param in cmd.params:
        if getattr(param, "hidden", False):
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, help_text = record
        if param.param_type_name == "argument":
            names = param.name.upper()
        rows.append([f"`{names}`", help_text])
    rows.append(["`--help`", "Show the help and exit."])
    help_text = ROLE.sub(r"`\1`", cmd.help or "").replace("\b", "").strip()
    return "\n\n".join([f"```text\n{usage}\n```", help_text, table(["option", "meaning"], rows)])


def render_commands(page: str, args: list[str], state: dict) -> str:
    rows = []
    for path, cmd in command_paths().items():
        where = state["documented"].get(path)
        if where is None:
            raise DocsError(f"command `specfmt {path}` has no page: add <!-- gen:options {path} --> to one")
        first = ROLE.sub(r"`\1`", (cmd.help or "").strip().split("\n\n")[0])
        rows.append([f"[`specfmt {path}`]({link(page, where)})", first])
    return table(["command", "what it does"], rows)


# --------------------------------------------------------------------------- layouts


def _examples(examples: tuple) -> str:
    parts = []
    for ex in examples:
        title = f"[{ex.title}]({ex.url})" if ex.url else ex.title
        parts.append(title + (f" ({ex.note})" if ex.note else ""))
    return "; ".join(parts) if parts else "—"


def render_layouts(page: str, args: list[str], state: dict) -> str:
    from specfmt.converters import REGISTRY

    if len(args) != 1 or args[0] not in REGISTRY:
        raise DocsError(f"{page}: <!-- gen:layouts {' '.join(args)} --> must name one converter ({', '.join(REGISTRY)})")
    conv = REGISTRY[args[0]]
    state["layouts"].add(conv.name)
    rows = [[f"`{lay.name}`", lay.evidence + (f"<br>{lay.details}" if lay.details else ""), _examples(lay.examples), lay.outcome]
            for lay in conv.layouts]
    out = [f"`--from {conv.name}`: {cell(conv.summary)}.", table(["layout", "what identifies it; what it holds", "real example", "what happens"], rows)]
    if "cases" in vars(type(conv)) and conv.cases:  # inherited cases are rendered with the class that declares them
        out.append(table(["variation", "real example", "what happens"], [[c.what, _examples(c.examples), c.outcome] for c in conv.cases]))
    return "\n\n".join(out)


def render_named(page: str, args: list[str], state: dict) -> str:
    from specfmt.converters.base import Seen
    from specfmt.detect import FOREIGN, NAMED

    state["named"] = True
    empty = Seen({}, {}, "safetensors", frozenset())
    rows = []
    for foreign in NAMED + FOREIGN:
        layout = f" / `{foreign.layout}`" if foreign.layout else ""
        rows.append([f"`{foreign.format}`{layout}", foreign.evidence, _examples(foreign.examples), foreign.serving(empty)])
    return table(["format / layout", "what identifies it", "real example", "what specfmt says"], rows)


def _layouts_link(page: str, name: str, state: dict) -> str:
    """A link from ``page`` to the section that renders converter ``name``'s layouts (``<!-- gen:layouts NAME -->``)."""
    where = state["layout_sections"].get(name)
    if where is None:
        raise DocsError(f"{page}: converter {name} has no <!-- gen:layouts {name} --> under a heading")
    return f"{link(page, where[0])}#{where[1]}"


def render_from(page: str, args: list[str], state: dict) -> str:
    from specfmt.converters import REGISTRY

    rows = [[f"[`{conv.name}`]({_layouts_link(page, conv.name, state)})", conv.summary] for conv in REGISTRY.values()]
    rows.append(["`auto`", "detects the format from tensor names and config fields (as `specfmt inspect`); where the files fit two, "
                           "it stops and lists the `--from` values that pick one"])
    return table(["`--from`", "what it reads"], rows)


def render_upgrades(page: str, args: list[str], state: dict) -> str:
    from specfmt.algorithms import REGISTRY as ALGORITHMS
    from specfmt.converters import REGISTRY

    rows = []
    for conv in REGISTRY.values():
        if conv.upgrades is not None:
            algo = ALGORITHMS.get(conv.upgrades)
            title = f"{algo.title} " if algo is not None else ""
            rows.append([f"`{conv.upgrades}`", f"{title}(`--from {conv.name}`: [layouts]({_layouts_link(page, conv.name, state)}))",
                         conv.summary])
    speculators = REGISTRY["speculators"]
    cases = table(["variation", "what happens"], [[c.what, c.outcome] for c in speculators.cases])
    return (table(["`speculators_model_type`", "handed to", "what that converter reads"], rows)
            + "\n\nWithin them, the older dialects and what becomes of each:\n\n" + cases)


def _world_rows(world: Path) -> list[list[Any]]:
    from specfmt.detect import detect

    rows = []
    for folder in sorted((p for p in world.iterdir() if p.is_dir()), key=lambda p: (p.name != "verifier", p.name)):
        d = detect(str(folder))
        s = d.summary
        if d.format == "causal-lm":
            cfg = json.loads((folder / "config.json").read_text())
            what = (f"the verifier: `{(cfg.get('architectures') or ['?'])[0]}`, {cfg.get('num_hidden_layers')} layers, "
                    f"H {cfg.get('hidden_size')}, V {cfg.get('vocab_size')}")
        else:
            what = f"a draft: `{d.format}` / `{d.layout}`" + (f" (`{s['algorithm']}`)" if s.get("algorithm") not in (None, d.layout) else "")
            what += f"; read with `{d.convert_hint}`" if d.convert_hint else ""
        rows.append([f"`{folder.relative_to(REPO).as_posix()}/`", what, s.get("tensors", ""), f"{s.get('size_mib', 0):.2f}"])
    prompts = world / "prompts.jsonl"
    if prompts.is_file():
        n = sum(1 for line in prompts.read_text().splitlines() if line.strip())
        rows.append([f"`{prompts.relative_to(REPO).as_posix()}`", f"{n} held-out prompts", "", ""])
    return rows


def worlds() -> list[Path]:
    """The example worlds: ``examples/world*/`` folders holding a verifier."""
    return sorted(p for p in (REPO / "examples").glob("world*") if (p / "verifier").is_dir())


def render_worlds(page: str, args: list[str], state: dict) -> str:
    out = []
    for world in worlds():
        out.append(f"**`{world.relative_to(REPO).as_posix()}/`**\n\n"
                   + table(["path", "what `specfmt inspect` finds", "tensors", "MiB"], _world_rows(world), "llrr"))
    return "\n\n".join(out)


def render_corpus(page: str, args: list[str], state: dict) -> str:
    from collections import Counter

    records = sorted((REPO / "tests" / "data" / "real_configs").glob("*.json"))
    rows, converted, refused = [], Counter(), Counter()
    for path in records:
        rec = json.loads(path.read_text())
        exp = rec["expect"]
        source = f"[source]({rec['source_url']})" if rec["source_url"].startswith("http") else rec["source_url"]
        outcome = exp["outcome"]
        if outcome == "converted":
            converted[exp.get("algorithm", "?")] += 1
            what = (f"converted to `{exp.get('algorithm')}`" + (f", `--tap-ids {exp['tap_ids']}`" if exp.get("tap_ids") else "")
                    + (f", `--mask-token-id {exp['mask_token_flag']}`" if exp.get("mask_token_flag") is not None else ""))
        else:
            refused[exp["inspect"].split("/")[0]] += 1
            what = "refused, named"
        rows.append([f"`{path.stem}`", rec["repo"], source, f"`{exp['inspect']}`", f"`--from {exp['from']}`", what])
    total_c, total_r = sum(converted.values()), sum(refused.values())
    summary = (f"{len(records)} records: {total_c} converted ({', '.join(f'{k} {v}' for k, v in sorted(converted.items()))}) and "
               f"{total_r} refused with their names ({', '.join(f'{k} {v}' for k, v in sorted(refused.items()))}).")
    return summary + "\n\n" + table(["record", "what it is", "published text", "`inspect`", "read with", "outcome"], rows)


# --------------------------------------------------------------------------- serving


def _configs() -> list[tuple[str, str, dict]]:
    """A config per algorithm and verifier reference, as :mod:`specfmt.serving` reads it."""
    from specfmt.algorithms import REGISTRY

    out = []
    for name in REGISTRY:
        for kind, ref in (("local path", "/models/verifier"), ("Hub id", "OWNER/VERIFIER")):
            cfg = {"speculators_model_type": name,
                   "speculators_config": {"proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                          "verifier": {"name_or_path": ref}}}
            out.append((name, kind, cfg))
    return out


def render_serving_matrix(page: str, args: list[str], state: dict) -> str:
    from specfmt.algorithms import get
    from specfmt.serving import CHECKED_RELEASES, serve_command

    rows = []
    for name, kind, cfg in _configs():
        row = [f"{get(name).title} (`{name}`), verifier named by a {kind}"]
        for release in CHECKED_RELEASES:
            c = serve_command(cfg, "OUT", release)
            if c is None:
                row.append("not served")
            elif c.form == "auto":
                row.append("`vllm serve OUT`")
            else:
                row.append(f"explicit form, method `{c.speculative_config['method']}`")
        rows.append(row)
    return table(["output", *[f"vLLM {r}" for r in CHECKED_RELEASES]], rows)


def render_serving_lines(page: str, args: list[str], state: dict) -> str:
    from specfmt.algorithms import get
    from specfmt.serving import serve_commands

    out = []
    for name, kind, cfg in _configs():
        algo = get(name)
        commands, _ = serve_commands(cfg, "OUT", "0.0")
        lines = [f"# vLLM {c.releases}\n{c.line}" for c in commands]
        note = algo.serving_note()
        block = f"**{algo.title}, verifier named by a {kind}**\n\n```bash\n" + "\n".join(lines) + "\n```"
        out.append(block + (f"\n\n{cell(note)}" if note else ""))
    return "\n\n".join(out)


def render_sglang(page: str, args: list[str], state: dict) -> str:
    """Per algorithm: the SGLang draft class and ``--speculative-algorithm`` the export writes for, or why it does not."""
    from specfmt.algorithms import REGISTRY

    rows = []
    for name, algo in REGISTRY.items():
        part = algo.sglang
        if part is not None:
            flags = " ".join(["--speculative-algorithm", part.sglang_algorithm, *part.sglang_flags({}, 3)])
            rows.append([f"{algo.title} (`{name}`)", f"`{part.sglang_architecture}` (`{part.sglang_source}`)", f"`{flags}`",
                         "written by `specfmt export --to sglang`"])
        else:
            rows.append([f"{algo.title} (`{name}`)", cell(algo.sglang_unserved), "", "refused (`unserved`)"])
    return table(["algorithm", "SGLang 0.5.23 draft class", "speculative flags (k = 3)", "export"], rows)


def render_recognised(page: str, args: list[str], state: dict) -> str:
    from specfmt.algorithms import REGISTRY
    from specfmt.algorithms.recognised import RECOGNISED

    interop = table(["algorithm", "speculators 0.9"], [[f"{a.title} (`{n}`)", a.interop_note or "—"] for n, a in REGISTRY.items()])
    rec = table(["`speculators_model_type`", "what it is", "how vLLM serves it", "defined in"],
                [[f"`{r.name}`", r.title, r.served, r.source] for r in RECOGNISED.values()])
    return interop + "\n\nAlgorithms speculators writes that this specfmt recognises without validating them:\n\n" + rec


# --------------------------------------------------------------------------- schema


def _type_of(node: dict) -> str:
    if "$ref" in node:
        name = node["$ref"].split("/")[-1]
        return f"[{name}](#{name})"
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " | ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    for key in ("oneOf", "anyOf"):
        if key in node:
            return " or ".join(_type_of(n) for n in node[key])
    t = node.get("type", "")
    t = " or ".join(t) if isinstance(t, list) else t
    if t == "array" and isinstance(node.get("items"), dict):
        t = f"array of {_type_of(node['items'])}"
    bounds = [f"≥ {node['minimum']}" if "minimum" in node else "", f"≤ {node['maximum']}" if "maximum" in node else "",
              f"≥ {node['minItems']} items" if "minItems" in node else "", f"pattern `{node['pattern']}`" if "pattern" in node else ""]
    return " ".join([t or "any", *[b for b in bounds if b]])


def _properties(node: dict) -> str:
    required = set(node.get("required", []))
    rows = [[f"`{k}`", _type_of(v), "yes" if k in required else "", v.get("description", "")] for k, v in node.get("properties", {}).items()]
    out = table(["field", "type", "required", "meaning"], rows) if rows else ""
    extra = [f"required: {', '.join(f'`{r}`' for r in sorted(required - set(node.get('properties', {}))))}" if required - set(node.get("properties", {})) else ""]
    if "not" in node:
        extra.append(f"must not match: `{json.dumps(node['not'].get('required', node['not']))}`" + (f" ({node['not']['description']})" if node["not"].get("description") else ""))
    if node.get("additionalProperties") is False:
        extra.append("no other fields")
    return "\n\n".join([out, *[e for e in extra if e]])


def render_schema(page: str, args: list[str], state: dict) -> str:
    path = REPO / "schemas" / "config-v1.schema.json"
    schema = json.loads(path.read_text())
    out = [f"`$id`: `{schema.get('$id')}` (JSON Schema `{schema.get('$schema')}`). {cell(schema.get('description', ''))}",
           "### The top level", _properties(schema)]
    for rule in schema.get("allOf", []):
        cond = rule.get("if", {}).get("properties", {})
        then = rule.get("then", {})
        if cond and "$ref" in then:
            (key, val), = cond.items()
            target = then["$ref"].split("/")[-1]
            out.append(f"- `{key}` = `{json.dumps(val.get('const'))}`: the [{target}](#{target}) branch applies too.")
    for name, node in schema.get("$defs", {}).items():
        body = _properties(node) if "properties" in node or "required" in node else f"{_type_of(node)}"
        out += [f"### {name}", cell(node.get("description", "")), body]
    out.append(f"### The file\n\n```json\n{json.dumps(schema, indent=2)}\n```")
    return "\n\n".join(o for o in out if o)


# --------------------------------------------------------------------------- benchmarks

CONVERT_CASES = {"eagle3-8b-bin": "8B EAGLE-3, `.bin`", "eagle3-8b-st": "8B EAGLE-3, safetensors", "eagle3-8b-sharded": "8B EAGLE-3, 2 shards",
                 "eagle3-70b": "70B EAGLE-3, own embedding, `.bin`", "medusa-7b": "Medusa, 5 heads for 7B, `.pt`"}
TRAIN_CASES = {"eagle3": "EAGLE-3, new draft, TTT 3 steps", "eagle": "EAGLE-1, new draft", "medusa": "Medusa, 3 new heads",
               "eagle3-cache-build": "EAGLE-3 with `--cache`, first run (fills the cache)", "eagle3-cache-read": "EAGLE-3 with `--cache`, second run (reads it)"}
MiB, GiB = 2 ** 20, 2 ** 30


def _when(name: str, data: dict) -> str:
    """The machine and the date of a result file: the JSON's own, else the date the file was committed."""
    machine_field = data.get("machine", {})  # an object of fields, or one line (fuzz_bench)
    meta = {**(machine_field if isinstance(machine_field, dict) else {"machine": machine_field}), **data.get("meta", {})}
    meta.setdefault("date", data.get("date"))
    machine = ", ".join(f"{k} {meta[k]}" for k in ("machine", "platform", "cpus", "threads", "python", "torch", "vllm", "device") if meta.get(k) is not None)
    if meta.get("loadavg"):
        machine += ", load average " + " / ".join(f"{x:.1f}" for x in meta["loadavg"])
    date = meta.get("date")
    if not date:
        try:
            date = subprocess.run(["git", "log", "-1", "--format=%cs", "--", f"benchmarks/{name}.results.json"], cwd=REPO,
                                  capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            date = ""
        date = f"results committed {date}" if date else "date not recorded"
    return f"`benchmarks/{name}.results.json`: {machine or 'machine not recorded'}; {date}."


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def bench_convert(data: dict) -> str:
    rows = []
    for key, c in data["cases"].items():
        s, sp = c["specfmt"], c.get("speculators")
        start = data.get("start_s", {}).get(key)
        net = s["wall_s"] - start if start is not None else None
        limit = (c["largest_tensor_bytes"] + 400e6) / MiB
        theirs = "not run" if sp is None else (f"{sp['wall_s']:.2f} s" if sp["ok"] else f"fails: \"{sp['error']}\"")
        rows.append([CONVERT_CASES.get(key, key), _size(c["input_bytes"]), f"{c['copy_s']:.2f} s", f"{s['wall_s']:.2f} s" if s["ok"] else f"fails: {s['error']}",
                     f"{net:.2f} s" if net is not None else "", f"{net / c['copy_s']:.2f}" if net is not None else "",
                     f"{s['rss_mib']:,.0f} MiB", f"{limit:,.0f} MiB", theirs, f"{sp['rss_mib']:,.0f} MiB" if sp and sp["ok"] else ""])
    out = [table(["input", "size", "copy (floor)", "specfmt", "specfmt − start-up", "× copy", "specfmt peak RSS", "RSS limit (largest tensor + 400 MB)",
                  data.get("speculators", "speculators"), "its peak RSS"], rows, "lrrrrrrrrr")]
    ref = data["cases"].get("eagle3-8b-bin")
    if ref and ref.get("speculators", {}).get("ok"):
        out.append(f"On the 8B `.bin`, specfmt is {ref['speculators']['wall_s'] / ref['specfmt']['wall_s']:.1f}× faster than "
                   f"{data.get('speculators', 'speculators')} and uses {ref['speculators']['rss_mib'] / ref['specfmt']['rss_mib']:.1f}× less memory. "
                   f"Runs per tool: {data.get('runs', '?')} (medians).")
    starts = {k: v for k, v in data.get("start_s", {}).items() if k in ("help", "inspect")}
    if starts:
        out.append("Start-up: " + ", ".join(f"`specfmt {'--help' if k == 'help' else k}` {v:.2f} s" for k, v in starts.items()) + ".")
    return "\n\n".join(out)


def bench_real_configs(data: dict) -> str:
    t = data["total"]
    head = (f"{t['records']} records, {t['source_gb']} GB of published-shape sources: `convert` {t['convert_s']} s and `validate` "
            f"{t['validate_s']} s in all, {t['failures']} failures, peak RSS {t['max_convert_rss_mib']} MiB for any one conversion.")
    rows = [[f"`{r['record']}`", _size(r["source_bytes"]), f"{r['convert_s']:.1f}", f"{r['convert_rss_mib']}", f"{r['validate_s']:.1f}",
             "ok" if r["convert_rc"] == 0 and r["validate_rc"] == 0 else f"failed: {r.get('error', '')}"] for r in data["rows"]]
    return head + "\n\n" + table(["record", "source", "convert (s)", "convert peak RSS (MiB)", "validate (s)", "result"], rows, "lrrrrl")


def bench_scale(data: dict) -> str:
    rows = []
    for r in data["results"]:
        v, t = r.get("validate") or {}, r.get("train") or {}
        ref, yard = v.get("reference_seconds", {}), v.get("yardstick", {})
        rows.append([r["size"], f"{r['params'] / 1e6:,.1f} M", f"{r['verifier_bytes'] / GiB:.2f} GiB",
                     v.get("device", ""), v.get("dtype", ""), v.get("wall_seconds", ""),
                     f"{ref.get('verifier', '')} + {ref.get('drafts', '')}" if ref else "",
                     f"{yard.get('generate_seconds', '')} + {yard.get('forward_seconds', '')}" if yard else "",
                     v.get("reference_over_yardstick", ""),
                     f"{v['peak_rss'] / GiB:.2f} / {v['bound'] / GiB:.2f}" if "peak_rss" in v else "",
                     f"{t['tokens_per_second']:,}" if "tokens_per_second" in t else "", t.get("wall_seconds", ""),
                     f"{t['peak_rss'] / GiB:.2f} / {t['bound'] / GiB:.2f}" if "peak_rss" in t else ""])
    opts = data.get("meta", {}).get("options", {})
    head = ("Options: " + ", ".join(f"{k} {v}" for k, v in opts.items() if v is not None) + ".") if opts else ""
    return "\n\n".join(x for x in [head, table(
        ["verifier", "params", "verifier bytes", "device", "dtype", "`validate --run --no-vllm` wall (s)", "reference: verifier passes + drafts (s)",
         "yardstick: one generation + one forward (s)", "reference / yardstick", "validate peak RSS / bound (GiB)", "`train` tokens/s", "`train` wall (s)",
         "train peak RSS / bound (GiB)"], rows, "lrrllrrrrrrrr")] if x)


def bench_train(data: dict) -> str:
    rows = [[TRAIN_CASES.get(r["case"], r["case"]), r.get("device", ""), f"{r['tokens_per_second']:,.0f}", f"{r['seconds_per_step']:.3f}",
             f"{r['peak_rss_mib']:,.0f}", f"{r['cuda_peak_mib']:,.0f}" if r.get("cuda_peak_mib") else "", f"{r['wall_seconds']:.0f}"]
            for r in data["results"]]
    first = data["results"][0] if data["results"] else {}
    head = f"{first.get('steps', '?')} steps of {first.get('batch', '?')} × {first.get('seq_len', '?')} tokens, each case in its own process."
    return head + "\n\n" + table(["case", "device", "tokens/s", "s/step", "peak RSS (MiB)", "peak GPU memory (MiB)", "wall (s)"], rows, "llrrrrr")


def bench_generic(data: Any) -> str:
    """Any other result file: its scalar values, flattened."""
    rows: list[list[Any]] = []

    def walk(x: Any, key: str) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{key}.{k}" if key else k)
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, f"{key}[{i}]")
        else:
            rows.append([f"`{key}`", x])

    walk(data, "")
    return table(["key", "value"], rows)


def bench_fuzz(data: dict) -> str:
    def opt(r: dict, key: str) -> Any:  # rows of runs that did not count it (before issue 35): a dash
        return f"{r[key]:,}" if key in r else "—"

    rows = [[f"`{name}`", f"{r['examples']:,}", f"{r['ok']:,}", f"{r['refused']:,}", opt(r, "reached"), r["uncaught"], opt(r, "wrong"),
             r["left_behind"], r["inputs_modified"], f"{r['seconds']:,.0f}", r.get("commit", "")] for name, r in data["commands"].items()]
    t = data["totals"]
    rows.append(["**all**", f"{t['examples']:,}", f"{t['ok']:,}", f"{t['refused']:,}", f"{t.get('reached', 0):,}", t["uncaught"],
                 f"{t.get('wrong', 0):,}", t["left_behind"], t["inputs_modified"], f"{sum(r['seconds'] for r in data['commands'].values()):,.0f}", ""])
    runs = "; ".join(f"`python benchmarks/fuzz_bench.py {r}`".replace(" `", "`") for r in data.get("runs", [data["command"].removeprefix("python benchmarks/fuzz_bench.py ")]))
    head = (f"{runs}: hypothesis {data['hypothesis']}, seed {data['seed']}, {data['examples_per_command']:,} examples per command, "
            f"each command's row from one run.")
    removed = [f"`{name}` {r['removed_temporary']:,}" for name, r in data["commands"].items() if r.get("removed_temporary")]
    foot = (f"\n\nRefusals that removed a killed run's temporary file (`NAME.PID.tmp`, never data) from the existing output before "
            f"refusing, counted apart from \"left behind\": {', '.join(removed)}.") if removed else ""
    return head + "\n\n" + table(["command", "examples", "exit 0/1", "refused (exit 2, one line)", "reached the verifier's weights",
                                   "uncaught", "wrong result", "left behind", "inputs modified", "seconds", "code"], rows, "lrrrrrrrrrl") + foot


def bench_memory(data: dict) -> str:
    gib = 1 << 30
    rows = [[r["size"], r["stored"], r["code"], f"{r['params'] / 1e9:.2f} B", f"{r['verifier_bytes'] / gib:.2f}", f"{r['peak_rss'] / gib:.2f}",
             f"{r['bound'] / gib:.2f}", "yes" if r["within_bound"] else "**no**", r["measured_by"]] for r in data["results"]]
    phases = [[r["stored"], r["code"], p["phase"], f"{p['rss'] / gib:.2f}", f"{p['anon'] / gib:.2f}", f"{p['file'] / gib:.2f}"]
              for r in data["results"] for p in r.get("phases", [])]
    out = table(["size", "stored as", "code", "parameters", "verifier in float32 (GiB)", "peak RSS (GiB)", "bound (GiB)", "within",
                 "measured by"], rows, "lllrrrrll")
    if phases:
        out += "\n\nLargest resident set per phase (GiB), the same run in process:\n\n" + table(
            ["stored as", "code", "phase", "RSS", "anonymous", "file pages"], phases, "lllrrr")
    return out


def bench_datagen(data: dict) -> str:
    rows = [[r["size"], r["mode"], r["tokens"], f"{r['seconds']:.1f}", f"{r['tokens_per_s']:,.1f}",
             f"{r['bytes_per_token']:,.1f}" if "bytes_per_token" in r else "", f"{r['tensor_bytes_per_token']:,}" if "tensor_bytes_per_token" in r else "",
             " / ".join(f"{x:.1f}" for x in r.get("loadavg", []))] for r in data["results"]]
    out = table(["verifier", "mode", "tokens", "seconds", "tokens/s", "bytes/token on disk", "tensors need", "load average"], rows, "llrrrrrl")
    ratios = [f"{label}: **{data['meta'][k]}**" for k, label in (("extraction_over_prefill", "vLLM extraction / vLLM prefill"),
                                                                  ("vllm_over_transformers", "vLLM extraction / transformers forward"))
              if k in data.get("meta", {})]
    return out + ("\n\n" + "; ".join(ratios) + "." if ratios else "")


def bench_trainer_vs_speculators(data: dict) -> str:
    runs = sorted(data["runs"].values(), key=lambda r: (r["world"], r["steps"], r["trainer"], r["lr"], r.get("seed", 0)))
    seed = data.get("meta", {}).get("seed")
    best = {}
    for r in (r for r in runs if r.get("seed", seed) == seed):  # a seed sweep's runs are not a rate's best
        k = (r["world"], r["steps"], r["trainer"])
        best[k] = max(best.get(k, 0.0), r["reference"]["al"])
    large = "prompts-heldout.jsonl"  # the larger held-out set (issue 38): a run's figures there, when measured
    rows = [[r["world"] + (f" ({r['algorithm']})" if r.get("algorithm") else ""), r["steps"],
             r["trainer"] + (" " + " ".join(r["options"]) if r["options"] else "")
             + (f" {r['optimizer']}" if r.get("optimizer") and not any("optimizer" in o for o in r["options"]) else "")
             + (f" {r['schedule']}" if r.get("schedule") and not any("schedule" in o for o in r["options"]) else "")
             + (f" (specfmt/ tree {r['specfmt_tree']})" if r["trainer"] == "specfmt" and r.get("specfmt_tree") else "")
             + (f", seed {r['seed']}" if r.get("seed", seed) != seed else ""), f"{r['lr']:g}",
             (f"**{r['reference']['al']:.3f}**" if r["reference"]["al"] == best.get((r["world"], r["steps"], r["trainer"]))
              else f"{r['reference']['al']:.3f}"),
             " / ".join(f"{x:.3f}" for x in r["reference"]["per_position"]), f"{r['vllm']['al']:.3f}" if "vllm" in r else "",
             f"{r['evals'][large]['al']:.3f}" if large in r.get("evals", {}) else "",
             f"{r['vllm:' + large]['al']:.3f}" if "vllm:" + large in r else "",
             f"{r['tokens_per_second']:,.0f}", f"{r['train_seconds']:.0f}", " / ".join(f"{x:.1f}" for x in r.get("load_average", []))]
            for r in runs]
    m = data.get("meta", {})
    source = {"verifier": "the verifier's top-1 predictions", "data": "the training tokens"}
    facts = "; ".join(f"{w.split('|')[0]}: {f['samples']:,} samples of {f['seq_len']} tokens, draft vocabulary from the counts of "
                      f"{source.get(f['vocab_from'], f['vocab_from'])} "
                      f"(the top {m.get('draft_vocab', '?')} hold {f['vocab_coverage_of_counts']:.1%} of them)" for w, f in data.get("data", {}).items())
    head = (f"{m.get('batch', '?')} × {m.get('seq_len', '?')} tokens per step, seed {m.get('seed', '?')}; {facts}. "
            "Bold: each trainer's best learning rate per budget.")
    paired = [f"- `{p['a']}` minus `{p['b']}`: {p['difference']:+.3f}, 95 % interval {p['low']:+.3f} to {p['high']:+.3f} "
              f"(paired bootstrap over the {p['prompts']} prompts, {p['resamples']:,} resamplings; `--paired`)" for p in data.get("paired", {}).values()]
    sched = lambda t: f" {t['schedule']} schedule" if t.get("schedule") else ""  # noqa: E731  (results before --schedule: none)
    h2h = [f"- {k if '|' in k else 'world, EAGLE-3, ' + k + ' steps'}: specfmt {v['specfmt']['optimizer']}{sched(v['specfmt'])} lr {v['specfmt']['lr']:g} "
           f"mean **{v['specfmt']['mean']:.3f}** ({' / '.join(f'{x:.3f}' for x in v['specfmt']['seeds'])}), speculators "
           f"{v['speculators']['optimizer']}{sched(v['speculators'])} lr {v['speculators']['lr']:g} mean **{v['speculators']['mean']:.3f}** "
           f"({' / '.join(f'{x:.3f}' for x in v['speculators']['seeds'])}); specfmt minus speculators {v['paired']['difference']:+.3f}, "
           f"95 % interval {v['paired']['low']:+.3f} to {v['paired']['high']:+.3f} (paired bootstrap over the {v['paired']['prompts']} "
           f"prompts of `{large}`, every seed's draft on the same resampled prompts)" + _h2h_vllm(v.get("vllm"))
           for k, v in data.get("head_to_head", {}).items()]
    return (head + "\n\n" + table(["world", "steps", "trainer", "lr", "AL reference", "per position", "AL vLLM", f"AL `{large}`",
                                     f"AL vLLM `{large}`", "tokens/s", "train (s)", "load average before / after"], rows, "lrlrrlrrrrrl")
            + ("\n\n" + "\n".join(paired) if paired else "")
            + ("\n\n**Three seeds at each trainer's best setting** (mean AL on `" + large + "`):\n\n" + "\n".join(h2h) if h2h else ""))


def _h2h_vllm(v: dict | None) -> str:
    """The vLLM half of a head-to-head line (the same drafts measured by vLLM on the same prompts), or nothing."""
    if not v:
        return ""
    seeds = lambda t: " / ".join(f"{x:.3f}" for x in v[t]["seeds"])  # noqa: E731
    p = v["paired"]
    return (f"; by vLLM on the same prompts, specfmt **{v['specfmt']['mean']:.3f}** ({seeds('specfmt')}), speculators "
            f"**{v['speculators']['mean']:.3f}** ({seeds('speculators')}), difference {p['difference']:+.3f}, 95 % interval "
            f"{p['low']:+.3f} to {p['high']:+.3f}")


def bench_vocab_coverage(data: dict) -> str:
    rows = [[r["vocabulary"], f"{r['top1_coverage']:.1%}", f"{r['heldout_al']:.3f}", " / ".join(f"{x:.3f}" for x in r["per_position"])]
            for r in data["rows"]]
    head = (f"{data['training_positions']:,} training positions; measured {data['date']} ({data['machine']}, Python {data['python']}).")
    return head + "\n\n" + table(["draft vocabulary", "verifier top-1 covered (training positions)", "held-out AL", "per position"], rows, "lrrl")


def bench_pairs(data: dict) -> str:
    """``pairs_bench``: each pair in each engine, acceptance per position, and whether the tokens equal the verifier alone."""
    rows = [[r["pair"], r["engine"], r["how"], " / ".join(f"{a:.3f}" for a in r["acceptance_rate_per_position"]), f"{r['mean_acceptance_length']:.3f}",
             r["num_drafts"], {True: "yes", False: "**no**", None: "-"}[r["exact"]]] for r in data["rows"]]
    head = (f"{data['prompts']} prompts x {data['max_tokens']} tokens, k = {data['k']}; transformers {data['transformers']}, vLLM {data['vllm']}; "
            f"the unfixed `draft-lm-padded` in vLLM: {data['padded_in_vllm']}")
    return head + "\n\n" + table(["pair", "engine", "how", "acceptance rate per position", "mean acceptance length", "drafts", "tokens = verifier alone"],
                                 rows, "lllrrrl")


def bench_compare_world(data: dict) -> str:
    """``compare_world``: ``specfmt compare`` on the example world per temperature, and how the ranking by estimated speedup
    changes between them."""
    def f(x: Any, d: int = 3) -> str:
        return "-" if x is None else f"{x:.{d}f}"

    out, ranks = [], {}
    for run in data["runs"]:
        t = run["temperature"]
        rows = []
        for m in run["methods"]:
            if not m["measured"]:
                rows.append([m.get("label", m["method"]), m["k"], f"not measured on this machine: {m['not_measured']}", "", "", "", "", ""])
                continue
            ref, vl = m["reference"] or {}, m["vllm"] or {}
            rates = " / ".join(f"{a:.3f}|{b:.3f}" if vl else f"{a:.3f}|-" for a, b in zip(ref["rate_per_step"], vl.get("rate_per_step") or ref["rate_per_step"]))
            agree = m.get("agreement") or {}
            sp = m["estimated_speedup"]
            rows.append([m.get("label", m["method"]), m["k"], rates.replace("|", " ↔ "), f"{f(ref['tokens_per_step'])} ↔ {f(vl.get('tokens_per_step'))}",
                         f"{ref['drafted_steps']} / {ref['steps']}", f(m["cost"]["per_step"]) if m.get("cost") else "-",
                         f"{f(sp['reference'], 2)} ↔ {f(sp['vllm'], 2)}", "-" if "ok" not in agree else ("yes" if agree["ok"] else "**no**")])
        measured = [m for m in run["methods"] if m["measured"]]
        ranks[t] = [m.get("label", m["method"]) for m in sorted(measured, key=lambda m: -(m["estimated_speedup"]["vllm"] or m["estimated_speedup"]["reference"] or 0))]
        head = (f"**T = {t:g}**" + (f", seeds {run['seeds']} (the reference's figures are expected values)" if t > 0 else ", greedy")
                + f": {run['prompts']['count']} prompts × {run['max_tokens']} tokens, {run['seconds']:.0f} s, load average "
                + " / ".join(f"{x:.1f}" for x in run.get("load_average", [])) + ".")
        out.append(head + "\n\n" + table(["method", "k", "acceptance per position per verifier pass (reference ↔ vLLM)",
                                            "tokens per pass (reference ↔ vLLM)", "drafted steps (reference)", "cost per step",
                                            "estimated speedup (reference ↔ vLLM)", "agree"], rows, "lrlllrll"))
    if len(ranks) > 1:
        lines = [f"- T = {t:g}: " + " > ".join(r) for t, r in ranks.items()]
        out.append("Ranking by vLLM's estimated speedup:\n\n" + "\n".join(lines))
    return "\n\n".join(out)


def bench_quickstart_vllm(data: dict) -> str:
    runs, s = data["runs"], data["summary"]

    def spread(sp: dict, digits: int) -> str:
        if sp["min"] == sp["max"]:
            return f"{sp['min']:,.{digits}f}"
        return " / ".join(f"{sp[k]:,.{digits}f}" for k in ("min", "median", "max"))

    ref, vl = s["reference"], s["vllm"]
    rows = [[f"acceptance rate, position {j + 1}", spread(r, 3), spread(v, 3)]
            for j, (r, v) in enumerate(zip(ref["acceptance_rate_per_position"], vl["acceptance_rate_per_position"]))]
    rows += [["**mean acceptance length**", f"**{spread(ref['mean_acceptance_length'], 3)}**", f"**{spread(vl['mean_acceptance_length'], 3)}**"],
             ["drafts", spread(ref["num_drafts"], 0), spread(vl["num_drafts"], 0)],
             ["accepted tokens", spread(ref["num_accepted_tokens"], 0), spread(vl["num_accepted_tokens"], 0)]]
    gap = max(abs(a - b) for r in runs for a, b in zip(r["vllm"]["acceptance_rate_per_position"], r["reference"]["acceptance_rate_per_position"]))
    passed = sum(bool(r["passed"]) for r in runs)
    head = (f"{len(runs)} runs of the quickstart's `specfmt validate --run` on one converted draft (the 16 held-out prompts × 32 "
            f"tokens, k = 3), each in a child process, at {data.get('commit', '?')}. Where the runs differ: minimum / median / maximum. "
            f"{passed} of {len(runs)} runs passed every check; the largest gap between vLLM's and the reference's acceptance rate at any "
            f"position, over the runs, is {gap:.3f} (tolerance 0.1).")
    per_run = [[i + 1, f"{r['reference']['mean_acceptance_length']:.3f}", f"{r['vllm']['mean_acceptance_length']:.3f}",
                " / ".join(f"{x:.3f}" for x in r["vllm"]["acceptance_rate_per_position"]), r["vllm"]["num_drafts"],
                r["vllm"]["num_accepted_tokens"], "pass" if r["passed"] else f"fail (exit {r['exit']})", f"{r['seconds']:.0f}",
                " / ".join(f"{x:.1f}" for x in r["load_average"])] for i, r in enumerate(runs)]
    return "\n\n".join([head, table(["", "reference (transformers, float32)", "vLLM CPU build (bfloat16)"], rows, "lrr"),
                         table(["run", "reference AL", "vLLM AL", "vLLM per position", "vLLM drafts", "vLLM accepted", "validate",
                                "seconds", "load average"], per_run, "rrrlrrlrl")])


def bench_draft_layers(data: dict) -> str:
    m = data.get("meta", {})
    runs = sorted(data["runs"].values(), key=lambda r: (r["budget"] != "steps", r["layers"]))
    rows = [[r["budget"], r["layers"], r["steps"], f"{r['train_seconds']:.0f}", f"{r['al_heldout']:.3f}",
             f"{r['served']['vllm_al']:.3f}" if r.get("served") and r["served"].get("vllm_al") is not None else "",
             ", ".join(f"{k} {v}" for k, v in r.get("served", {}).get("checks", {}).items()),
             f"{r['cost']['params'] / 1e6:.2f} M", f"{r['cost']['draft_pass_ms']:.1f}", f"{r['cost']['verifier_pass_ms']:.1f}"]
            for r in runs]
    head = (f"`python benchmarks/draft_layers.py --steps {m.get('steps')} --lr {m.get('lr')} --optimizer {m.get('optimizer')}`: "
            "AL on the world's larger held-out set (`prompts-heldout.jsonl`, 719 prompts × 32 tokens, reference); vLLM on the 16 held-out prompts (`validate --run`); the draft pass and "
            "the verifier's forward over a 256-token window, one thread, median of 20.")
    cal = data.get("calibration")
    if cal:
        per = cal["seconds_per_step"]
        top = max(per, key=int)
        head += (f" Seconds per training step, each draft {cal['steps']} steps in turn on one thread, twice, the lower kept "
                 f"({cal['date']}): " + ", ".join(f"{n} layer{'s' if n != '1' else ''} {v:.3f}" for n, v in sorted(per.items()))
                 + f"; the equal wall-clock budget is the {top}-layer draft's {m.get('steps')} steps, "
                 f"{m.get('steps', 0) * per[top]:,.0f} s at that pace.")
    return head + "\n\n" + table(["budget", "layers", "steps", "train (s)", "AL (719 prompts)", "AL vLLM (16)", "vLLM checks",
                                     "draft parameters", "draft pass (ms)", "verifier pass (ms)"], rows, "lrrrrrlrrr")


def bench_muon_cpu(data: dict) -> str:
    """``muon_cpu``: five Newton-Schulz iterations per matrix, torch's bf16 function against specfmt's float32 products."""
    rows = [[f"`{r['matrix']}`", " x ".join(map(str, r["shape"])), f"{r['torch_bf16_s']:.4f}", f"{r['specfmt_s']:.4f}", f"{r['speedup']}x",
             f"{r['torch_bf16_distance_to_polar']} / {r['specfmt_distance_to_polar']}"] for r in data["rows"]]
    step = data["world_eagle3_step"]
    return (table(["matrix", "shape", "torch bf16 (s)", "specfmt (s)", "faster", "distance to UV^T (torch / specfmt)"], rows)
            + f"\n\nThe world EAGLE-3 draft's matrices, one optimizer step: {step['torch_bf16_s']} s with torch's function, "
            f"{step['specfmt_s']} s with specfmt's (best of {data['repeats']})." )


def bench_gpu_train(data: dict) -> str:
    m = data["meta"]
    rows = [[t, f"{r['tokens_per_second']:,.0f}", f"{r.get('peak_gpu_used_mib', 0):,} MiB",
             f"{r['peak_cuda_allocated_bytes'] / 2**30:.2f} GiB" if "peak_cuda_allocated_bytes" in r else ""] for t, r in data["runs"].items()]
    return (f"{m['gpu']}, {m['size']} verifier ({m['shapes']['hidden_size']} wide, {m['shapes']['num_hidden_layers']} layers), {m['dtype']}, "
            f"{m['batch']} x {m['seq_len']} tokens per step, {m['steps']} steps.\n\n"
            + table(["trainer", "tokens/s", "peak GPU memory (nvidia-smi)", "peak allocated (torch)"], rows, "lrrr"))


BENCHES: dict[str, Callable[[dict], str]] = {"draft_layers": bench_draft_layers, "gpu_train_bench": bench_gpu_train, "convert_bench": bench_convert, "real_configs_bench": bench_real_configs,
                                             "scale_bench": bench_scale, "train_bench": bench_train, "fuzz_bench": bench_fuzz,
                                             "memory_bench": bench_memory, "datagen_throughput": bench_datagen,
                                             "trainer_vs_speculators": bench_trainer_vs_speculators, "vocab_coverage": bench_vocab_coverage,
                                             "pairs_bench": bench_pairs, "compare_world": bench_compare_world,
                                             "quickstart_vllm": bench_quickstart_vllm, "muon_cpu": bench_muon_cpu}


def render_bench(page: str, args: list[str], state: dict) -> str:
    if len(args) != 1:
        raise DocsError(f"{page}: <!-- gen:bench NAME --> takes one name")
    name = args[0]
    path = REPO / "benchmarks" / f"{name}.results.json"
    if not path.is_file():
        raise DocsError(f"{page}: benchmarks/{name}.results.json does not exist")
    state["benches"].add(name)
    data = json.loads(path.read_text())
    return _when(name, data) + "\n\n" + BENCHES.get(name, bench_generic)(data)


def render_file(page: str, args: list[str], state: dict) -> str:
    path = REPO / " ".join(args)
    if len(args) != 1 or not path.is_file():
        raise DocsError(f"{page}: <!-- gen:file {' '.join(args)} --> names no file of the repository")
    lang = {".sh": "bash", ".py": "python", ".json": "json", ".toml": "toml"}.get(path.suffix, "text")
    return f"```{lang} title=\"{args[0]}\"\n{path.read_text().rstrip()}\n```"


# --------------------------------------------------------------------------- the pages

RENDERERS: dict[str, Callable[[str, list[str], dict], str]] = {
    "options": render_options, "commands": render_commands, "layouts": render_layouts, "named": render_named, "corpus": render_corpus,
    "serving-matrix": render_serving_matrix, "serving-lines": render_serving_lines, "sglang": render_sglang, "recognised": render_recognised,
    "schema": render_schema, "bench": render_bench, "file": render_file,
}
RENDERERS.update({"from": render_from, "upgrades": render_upgrades, "worlds": render_worlds})  # issue 35: generated, not hand-kept
#: rendered after the others: they list what the others documented
LAST = ("commands",)


def layout_sections(pages: dict[str, str]) -> dict[str, tuple[str, str]]:
    """``{converter: (page, anchor)}``: the heading above each ``<!-- gen:layouts NAME -->`` (the anchor as mkdocs' toc makes it)."""
    from markdown.extensions.toc import slugify

    out = {}
    for page, text in pages.items():
        heading = None
        for line in text.splitlines():
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            m = MARKER.match(line)
            if m and m.group(1) == "layouts" and heading is not None:
                out[m.group(2).strip()] = (page, slugify(heading, "-"))
    return out


def main() -> None:
    docs = Path(mkdocs_gen_files.config["docs_dir"])
    pages = {p.relative_to(docs).as_posix(): p.read_text() for p in sorted(docs.rglob("*.md"))}
    state: dict[str, Any] = {"documented": {}, "layouts": set(), "named": False, "benches": set(), "layout_sections": layout_sections(pages)}
    for kind in [k for k in RENDERERS if k not in LAST] + list(LAST):
        for page, text in pages.items():
            def replace(m: re.Match, page: str = page) -> str:
                return RENDERERS[m.group(1)](page, m.group(2).split(), state)

            for m in MARKER.finditer(text):
                if m.group(1) not in RENDERERS:
                    raise DocsError(f"{page}: unknown marker <!-- gen:{m.group(1)} --> (known: {', '.join(RENDERERS)})")
            pages[page] = MARKER.sub(lambda m: replace(m) if m.group(1) == kind else m.group(0), text)
    for page, text in pages.items():
        if "<!-- gen:" in text:
            raise DocsError(f"{page}: a marker is not on a line of its own: {text[text.index('<!-- gen:'):][:60]!r}")
    from specfmt.converters import REGISTRY

    missing = [f"command `specfmt {c}` (<!-- gen:options {c} -->)" for c in command_paths() if c not in state["documented"]]
    missing += [f"converter `{c}` (<!-- gen:layouts {c} -->)" for c in REGISTRY if c not in state["layouts"]]
    missing += [] if state["named"] else ["the formats no converter reads (<!-- gen:named -->)"]
    missing += [f"benchmarks/{p.name} (<!-- gen:bench {p.name.removesuffix('.results.json')} -->)" for p in sorted((REPO / "benchmarks").glob("*.results.json"))
                if p.name.removesuffix(".results.json") not in state["benches"]]
    if missing:
        raise DocsError("no docs page renders: " + "; ".join(missing))
    for page, text in pages.items():
        if text != (docs / page).read_text():
            with mkdocs_gen_files.open(page, "w") as f:
                f.write(text)


main()
