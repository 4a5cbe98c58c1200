"""The docs site builds with ``mkdocs build --strict`` (a broken link, a missing anchor, a page left
out of the nav or a docstring mkdocstrings cannot render fails it), and what it generates from the
code covers the code: every command and option of the ``specfmt`` app, every converter layout and
named format, every benchmark result. The README stays a front door (at most 300 lines, links
that resolve), and the docs pages the code cites exist, down to the section.

One build serves every test here (module fixture); it needs the ``docs`` extra (``.ci/install``
installs it).
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import REPO

#: the modules of the ``docs`` extra the build needs; ``.ci/install`` installs the extra, so one missing is a broken
#: install, and the tests that build the site fail (never skip) saying so
DOCS_MODULES = ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_gen_files")


def docs_extra_missing() -> list[str]:
    import importlib.util

    missing = []
    for name in DOCS_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a dotted name whose parent is missing
            found = False
        if not found:
            missing.append(name)
    return missing


def require_docs_extra() -> None:
    missing = docs_extra_missing()
    if missing:
        pytest.fail(f"the docs extra is not installed (no {', '.join(missing)}): .ci/install installs it; "
                    "pip install -e '.[docs]'", pytrace=False)

README_MAX_LINES = 300


class _Text(HTMLParser):
    """The text of a page's article, tags dropped, entities resolved."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def plain(markdown: str) -> str:
    """Text as a page shows it: code spans, bold and roles dropped, whitespace normalised."""
    return " ".join(re.sub(r":\w+:|`|\*\*", "", markdown).split())


def page_text(site: Path, page: str) -> str:
    parser = _Text()
    parser.feed((site / page / "index.html").read_text())
    return " ".join("".join(parser.parts).split())


def test_the_docs_extra_is_installed():
    require_docs_extra()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    require_docs_extra()
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"), "-d", str(out)],
                         cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    # never --quiet: it raises the log level above WARNING, and --strict then counts no warnings
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    return out


def test_the_docs_site_builds_strict_with_every_page(site):
    for page in ("commands/convert", "layouts", "serving", "format", "measured", "design/research-formats",
                 "design/speculators-format", "api/conversion"):
        assert (site / page / "index.html").is_file(), page


def _commands() -> dict:
    import typer.main

    from specfmt.cli import app

    out = {}

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, path + [name])
        elif path:
            out[" ".join(path)] = cmd

    walk(typer.main.get_command(app), [])
    return out


def test_every_command_and_every_option_is_in_the_command_reference(site):
    commands = _commands()
    assert {"convert", "upgrade", "validate", "inspect", "serve-command", "push", "train eagle3", "train fill"} <= set(commands)
    for path, cmd in commands.items():
        text = page_text(site, f"commands/{path.split()[0]}")
        assert f"specfmt {path}" in text, path
        for param in cmd.params:
            names = [param.name.upper()] if param.param_type_name == "argument" else [*param.opts, *param.secondary_opts]
            for name in names:
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), f"specfmt {path}: {name} is not on its page"
            if getattr(param, "help", None):
                assert plain(param.help)[:40] in text, f"specfmt {path}: the help of {names[0]} is not on its page"


def test_every_layout_case_and_named_format_is_on_the_layouts_page(site):
    from specfmt.converters import REGISTRY
    from specfmt.detect import FOREIGN, NAMED

    text = page_text(site, "layouts")
    for conv in REGISTRY.values():
        assert f"--from {conv.name}" in text
        for lay in conv.layouts:
            for part in (lay.evidence, lay.details, lay.outcome, *(e.title for e in lay.examples)):
                assert plain(part) in text, f"{conv.name}/{lay.name}: {part[:60]!r}"
        for case in conv.cases:
            assert plain(case.what) in text and plain(case.outcome) in text, f"{conv.name}: {case.what[:60]!r}"
    for foreign in NAMED + FOREIGN:
        assert plain(foreign.evidence) in text, foreign.evidence
    records = sorted((REPO / "tests" / "data" / "real_configs").glob("*.json"))
    assert records and all(p.stem in text for p in records)


def test_the_serving_matrix_is_specfmt_serving_rules(site):
    from specfmt.serving import CHECKED_RELEASES

    text = page_text(site, "serving")
    for release in CHECKED_RELEASES:
        assert f"vLLM {release}" in text
    # what serving.py says of 0.33: a local verifier needs the explicit form, Medusa is not served
    assert "explicit form, method eagle3" in text and "not served" in text


def test_every_benchmark_result_is_rendered_with_its_figures(site):
    text = page_text(site, "measured")
    results = sorted((REPO / "benchmarks").glob("*.results.json"))
    assert results
    for path in results:
        assert f"benchmarks/{path.name}" in text
    scale = json.loads((REPO / "benchmarks" / "scale_bench.results.json").read_text())
    assert scale["meta"]["date"] in text
    for row in scale["results"]:
        assert str(row["validate"]["reference_over_yardstick"]) in text


def test_the_schema_page_renders_the_committed_schema(site):
    schema = json.loads((REPO / "schemas" / "config-v1.schema.json").read_text())
    text = page_text(site, "format")
    assert schema["$id"] in text
    for name in [*schema["properties"], *schema["$defs"]]:
        assert name in text, name


def test_readme_is_a_front_door_whose_links_resolve():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    assert "bash .ci/install && bash examples/quickstart.sh" in readme
    assert "bash .ci/install && python3 -m pytest -q -ra" in readme
    links = re.findall(r"\]\(([^)#]+?)(?:#[^)]*)?\)", readme)
    local = [target for target in links if not re.match(r"[a-z]+://", target)]
    assert local
    for target in local:
        assert (REPO / target).exists(), f"README links to {target}, which does not exist"


#: a docs page cited from code, with an optional section (``docs/design/research-formats.md`` §4.3)
CITE = re.compile(r"(docs/[\w./-]+?\.md)`{0,2}(?: §(\d+(?:\.\d+)?)(?:[-/]§(\d+(?:\.\d+)?))?)?")


def test_the_docs_pages_cited_in_the_code_exist_down_to_the_section():
    cited = 0
    for folder in ("specfmt", "converters", "tests", "examples", "benchmarks"):
        for path in (REPO / folder).rglob("*.py"):
            if path == Path(__file__):
                continue
            source = path.read_text()
            assert "shared/reference" not in source, f"{path.relative_to(REPO)} cites notes outside the repository"
            assert not re.search(r"(?<!design/)(research-formats|speculators-format)\.md", source), \
                f"{path.relative_to(REPO)} cites a design note by a path that is not docs/design/"
            for m in CITE.finditer(source):
                page = REPO / m.group(1)
                assert page.is_file(), f"{path.relative_to(REPO)} cites {m.group(1)}, which does not exist"
                headings = re.findall(r"^#{2,4} (\d+(?:\.\d+)?)\.? ", page.read_text(), re.M)
                for section in filter(None, m.groups()[1:]):
                    assert section in headings, f"{path.relative_to(REPO)} cites {m.group(1)} §{section}, which has no such section"
                cited += 1
    assert cited >= 10


def test_every_page_the_code_and_ci_name_is_a_file_of_the_repository():
    """A ``*.md`` the code or the CI scripts name is in the repository (a path from its root, or a file of that name in
    it): notes kept outside it (``vllm-cpu.md``, once cited by ``.ci/install``) are no source a reader of a clone has."""
    names = {p.name for p in REPO.rglob("*.md") if ".git" not in p.parts}
    files = [p for folder in ("specfmt", "converters", "benchmarks", "examples") for p in (REPO / folder).rglob("*.py")]
    files += [p for p in (REPO / ".ci").iterdir() if p.is_file()]
    named = 0
    for path in files:
        for m in re.finditer(r"[\w./-]*[\w-]\.md\b", path.read_text()):
            named += 1
            assert (REPO / m.group(0)).is_file() or ("/" not in m.group(0) and m.group(0) in names), \
                f"{path.relative_to(REPO)} names {m.group(0)}, which is not a file of the repository"
    assert named >= 10


# --------------------------------------------------------------------------- what the pages name exists (issue 35)

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
SPAN = re.compile(r"`([^`\n]+)`")
#: ``specfmt CMD [SUB]`` in code: the command, and what follows it when it is a word (a subcommand of a group)
COMMAND = re.compile(r"\bspecfmt ([a-z][\w-]*)(?: ([a-z][\w-]*))?")
FROM = re.compile(r"--from[ =]([\w-]+)")
#: ``--from`` values beside the converters': ``auto`` (every command), ``specfmt`` (train's ``--init``)
FROM_EXTRA = {"auto", "specfmt"}
NUMBER = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def _code(markdown: str) -> list[str]:
    """The code a page shows: its fenced blocks and, outside them, its code spans."""
    blocks = FENCE.findall(markdown)
    return blocks + SPAN.findall(FENCE.sub("", markdown))


def _pages() -> dict[str, str]:
    pages = {"README.md": (REPO / "README.md").read_text()}
    pages.update({p.relative_to(REPO).as_posix(): p.read_text() for p in sorted((REPO / "docs").rglob("*.md"))})
    return pages


def test_every_command_and_from_value_the_readme_and_docs_name_exists():
    """Every ``specfmt COMMAND`` (and ``specfmt GROUP SUBCOMMAND``) shown as code in README.md and docs/ is a command of the
    typer app, and every ``--from X`` a converter of the registry (or ``auto``, ``specfmt``): advice that points at a
    command that does not exist (issue 35: ``specfmt train dflash``) cannot be written into the docs."""
    import typer.main

    from specfmt.cli import app
    from specfmt.converters import REGISTRY

    root = typer.main.get_command(app)
    named_commands = named_froms = 0
    for page, text in _pages().items():
        for code in _code(text):
            for m in COMMAND.finditer(code):
                cmd = root.commands.get(m.group(1))
                assert cmd is not None, f"{page}: `specfmt {m.group(1)}` is no command of specfmt ({', '.join(root.commands)})"
                subs = getattr(cmd, "commands", None)
                if subs and m.group(2):
                    assert m.group(2) in subs, f"{page}: `specfmt {m.group(1)} {m.group(2)}` is no command ({', '.join(subs)})"
                named_commands += 1
            for m in FROM.finditer(code):
                value = m.group(1)
                if value.isupper() or value in ("X", "F"):  # a placeholder (FORMAT, X)
                    continue
                assert value in REGISTRY or value in FROM_EXTRA, f"{page}: `--from {value}` is no converter ({', '.join(REGISTRY)})"
                named_froms += 1
    assert named_commands > 50 and named_froms > 10  # the scan reads the pages' code


def test_the_readme_lists_every_converter_and_every_draft_of_the_example_worlds():
    """README.md is written by hand (the docs pages generate theirs): its ``--from`` list is the converter registry's, and
    what it says of each example world names every draft folder there, with their number."""
    from specfmt.converters import REGISTRY

    readme = (REPO / "README.md").read_text()
    listed = re.search(r"Reads a research draft \((.*?)\)\s", readme, re.S)
    assert listed, "README's convert section has no list of --from values"
    assert set(re.findall(r"`(?:--from )?([\w-]+)`", listed.group(1))) == set(REGISTRY) | {"auto"}
    section = readme.split("## The shipped example", 1)[1].split("\n## ", 1)[0]
    chunks = re.split(r"(?=`examples/world[\w-]*/`)", section)
    worlds = sorted(p for p in (REPO / "examples").glob("world*") if (p / "verifier").is_dir())
    assert len(worlds) >= 2
    for world in worlds:
        chunk = next((c for c in chunks if c.startswith(f"`examples/{world.name}/`")), None)
        assert chunk is not None, f"README's shipped example says nothing of examples/{world.name}/"
        drafts = sorted(p.name for p in world.iterdir() if p.is_dir() and p.name != "verifier")
        assert f"{NUMBER[len(drafts)]} draft" in chunk, f"examples/{world.name}/ holds {len(drafts)} drafts: {chunk[:200]!r}"
        for name in drafts:
            assert f"`{name}`" in chunk, f"README does not name examples/{world.name}/{name}"


def test_the_generated_lists_are_the_registries_and_the_world_folders(site):
    """convert's ``--from`` table, upgrade's accepted algorithms and the example worlds' contents are rendered from the
    converter registry and the folders (``docs/gen_docs.py``), not written by hand."""
    from specfmt.converters import REGISTRY

    convert = page_text(site, "commands/convert")
    for conv in REGISTRY.values():
        assert plain(conv.summary) in convert, conv.name
    upgrade = page_text(site, "commands/upgrade")
    upgraded = [c.upgrades for c in REGISTRY.values() if c.upgrades]
    assert {"eagle3", "peagle", "dflash"} <= set(upgraded)
    for algo in upgraded:
        assert f"{algo} " in upgrade and f"--from {next(c.name for c in REGISTRY.values() if c.upgrades == algo)}" in upgrade, algo
    started = page_text(site, "getting-started")
    for world in sorted(p for p in (REPO / "examples").glob("world*") if (p / "verifier").is_dir()):
        for folder in (p for p in world.iterdir() if p.is_dir()):
            assert f"examples/{world.name}/{folder.name}/" in started, folder
