"""The package's shape, checked: no import cycles, imports only down the declared layers, algorithm
knowledge only in the algorithm modules, and converter plans testable without writing anything.

The import graph is read from the source (every ``import`` statement, function-level ones
included), so a cycle hidden inside a function fails here although Python would tolerate it.
The layers are read from ``specfmt/__init__.py``'s docstring, the one place they are declared,
so the order a reader is told is the order checked.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest

from conftest import REPO, WORLD

#: where each importable package of the distribution lives in the repository (pyproject.toml's package-dir)
PACKAGES = {"specfmt": REPO / "specfmt", "specfmt.converters": REPO / "converters"}


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (``specfmt.algorithms.eagle3``; packages by their ``__init__``)."""
    out = {}
    for root_name, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([root_name, *parts])] = path
    return out


def imports(name: str, path: Path, known: set[str], dangling: set[str] | None = None) -> set[str]:
    """The package modules ``name`` imports anywhere in its body: each target is the module that
    provides the imported name (``from .x import y`` -> ``pkg.x.y`` when that is a module, else ``pkg.x``).
    Targets inside the package that are no module of it (a stale path) are added to ``dangling``."""
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
        if dangling is not None:
            dangling.update(t for t in targets if t not in known and t.split(".")[0] in PACKAGES)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_there_are_no_import_cycles_function_level_imports_included():
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    assert sum(map(len, graph.values())) > 100  # the walk sees the package's imports
    assert graph["specfmt.convert"] >= {"specfmt.converters", "specfmt.sources.verifier"}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# --------------------------------------------------------------------------- layers


def declared_layers(doc: str) -> list[tuple[str, ...]]:
    """The layers a docstring declares, bottom first: the names in double backquotes that open each
    numbered line (``3. ``specfmt.format``: ...`` -> layer 3 is ``("specfmt.format",)``).

    Raises:
        ValueError: the lines are not numbered 0, 1, 2, ... in order, or a name is in two layers.
    """
    found = re.findall(r"^(\d+)\. ((?:``[\w.]+``(?:, )?)+):", doc, re.M)
    if [int(n) for n, _ in found] != list(range(len(found))):
        raise ValueError(f"layers must be numbered 0, 1, 2, ... in order: {[n for n, _ in found]}")
    layers = [tuple(re.findall(r"``([\w.]+)``", names)) for _, names in found]
    names = [n for layer in layers for n in layer]
    if len(names) != len(set(names)):
        raise ValueError(f"a name is in two layers: {sorted(n for n in set(names) if names.count(n) > 1)}")
    return layers


def layer_of(module: str, layers: list[tuple[str, ...]]) -> int | None:
    """The layer of ``module``: that of the longest declared name covering it, a name covering itself
    and, when it is a subpackage (it has a dot), the modules below it; None when no name covers it."""
    best: tuple[int, int] | None = None
    for i, names in enumerate(layers):
        for n in names:
            if (module == n or ("." in n and module.startswith(n + "."))) and (best is None or len(n) > best[1]):
                best = (i, len(n))
    return None if best is None else best[0]


def unassigned(graph: dict[str, set[str]], layers: list[tuple[str, ...]]) -> list[str]:
    """The modules of ``graph`` that no layer covers."""
    return sorted(m for m in graph if layer_of(m, layers) is None)


def upward_imports(graph: dict[str, set[str]], layers: list[tuple[str, ...]]) -> list[tuple[str, str]]:
    """``(importer, imported)`` for every import of a module in a higher layer than the importer's
    (modules in no layer are :func:`unassigned`'s)."""
    out = []
    for m, targets in graph.items():
        here = layer_of(m, layers)
        for t in targets:
            there = layer_of(t, layers)
            if here is not None and there is not None and there > here:
                out.append((m, t))
    return sorted(out)


def package_layers() -> list[tuple[str, ...]]:
    return declared_layers(ast.get_docstring(ast.parse((PACKAGES["specfmt"] / "__init__.py").read_text())) or "")


def test_packages_depend_one_way_in_the_declared_order():
    mods = modules()
    dangling: set[str] = set()
    graph = {name: imports(name, path, set(mods), dangling) for name, path in mods.items()}
    layers = package_layers()
    assert len(layers) == 13 and layers[0] == ("specfmt", "specfmt.errors", "specfmt.interrupt") and layers[-1] == ("specfmt.cli", "specfmt.__main__")
    assert sorted(n for layer in layers for n in layer if n not in mods) == []  # each declared name is a module or package
    assert [layer_of(m, layers) for m in ("specfmt", "specfmt.sources.verifier", "specfmt.algorithms.reference", "specfmt.converters.eagle3", "specfmt.cli.train")] == [0, 2, 4, 5, 12]
    assert dangling == set()  # an import of a module that is not there would hide its edge
    assert graph["specfmt.algorithms.eagle3"] >= {"specfmt.algorithms.reference", "specfmt.format.draft"}  # module-level edges
    assert "specfmt.sources.verifier" in graph["specfmt.algorithms.base"]  # a TYPE_CHECKING import is an edge too
    assert unassigned(graph, layers) == []
    assert upward_imports(graph, layers) == []


def unit_of(module: str, layers: list[tuple[str, ...]]) -> str | None:
    """The declared name (a package or a module of a layer) that covers ``module``: the longest, as :func:`layer_of`."""
    best = None
    for names in layers:
        for n in names:
            if (module == n or ("." in n and module.startswith(n + "."))) and (best is None or len(n) > len(best)):
                best = n
    return best


def unit_graph(graph: dict[str, set[str]], layers: list[tuple[str, ...]]) -> dict[str, set[str]]:
    """The import graph between the declared names (``specfmt.datagen`` -> ``specfmt.algorithms``): an edge where
    any module of one imports any module of the other."""
    units: dict[str, set[str]] = {}
    for m, targets in graph.items():
        u = unit_of(m, layers)
        if u is None:
            continue
        units.setdefault(u, set()).update(v for t in targets if (v := unit_of(t, layers)) not in (None, u))
    return units


def test_no_two_packages_import_each_other_even_within_one_layer():
    """The layers order the packages between layers; within one layer (``specfmt.algorithms`` and ``specfmt.serving``,
    the converters and ``specfmt.convert``) two packages may still not import each other, even through different modules.
    The module-level cycle test misses such a pair: ``datagen.chat`` imported ``training.data`` while ``training.hsdata``
    imported ``datagen.layout`` (issue 35), four modules and no module cycle, when both packages shared layer 7."""
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    layers = package_layers()
    units = unit_graph(graph, layers)
    assert "specfmt.datagen" in units["specfmt.training"]  # training reads datagen's layout: the one direction
    assert cycles(units) == []


def test_the_package_graph_finds_a_cycle_between_modules_of_two_packages():
    layers = [("pkg",), ("pkg.a", "pkg.b")]
    graph = {"pkg": set(), "pkg.a": set(), "pkg.a.x": {"pkg.b.y"}, "pkg.b": set(), "pkg.b.y": set(), "pkg.b.z": {"pkg.a"}}
    assert cycles(graph) == []  # no module cycle
    assert cycles(unit_graph(graph, layers)) == [["pkg.a", "pkg.b"]]


def test_the_layer_finder_finds_upward_imports_and_unassigned_modules():
    layers = [("pkg", "pkg.base"), ("pkg.low",), ("pkg.high", "pkg.low.special")]
    graph = {
        "pkg": set(), "pkg.base": set(), "pkg.low": {"pkg.base"}, "pkg.low.a": {"pkg", "pkg.low"},
        "pkg.low.b": {"pkg.high.x"},  # up: layer 1 -> 2
        "pkg.low.special": {"pkg.low.a"},  # the longer name puts it in layer 2: importing layer 1 is down
        "pkg.low.c": {"pkg.low.special"},  # up, to the longer name's layer
        "pkg.high.x": {"pkg.low.a", "pkg.other"},
        "pkg.other": set(),  # the root package covers only itself
        "pkgextra.z": {"pkg.high.x"},  # a name covers what is below it, not what merely starts with it
    }
    assert upward_imports(graph, layers) == [("pkg.low.b", "pkg.high.x"), ("pkg.low.c", "pkg.low.special")]
    assert unassigned(graph, layers) == ["pkg.other", "pkgextra.z"]


def test_the_layers_are_read_from_numbered_lines():
    doc = "Intro.\n\n0. ``a``, ``a.b``: the base;\n1. ``a.c``: above it:\n   more words ``a.d``.\n\nNot a layer: ``a.e``.\n"
    assert declared_layers(doc) == [("a", "a.b"), ("a.c",)]
    with pytest.raises(ValueError, match="numbered"):
        declared_layers("0. ``a``: x\n2. ``b``: y\n")
    with pytest.raises(ValueError, match="two layers"):
        declared_layers("0. ``a``: x\n1. ``a``: y\n")


def test_every_package_is_in_the_wheel():
    """setuptools puts in the wheel the packages pyproject.toml lists, no others: a package left out
    of the list would be missing once installed (an editable install hides it)."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {name for name, path in modules().items() if path.name == "__init__.py"}
    assert "specfmt.sources" in packages and sorted(packages - listed) == []


ALGORITHM_NAMES = {"eagle3", "eagle", "medusa", "hass"}


def _branches_on_algorithm(tree: ast.AST, known: set[str] = ALGORITHM_NAMES) -> list[int]:
    """Lines that compare something with an algorithm's name (one of ``known``), or key a dict literal by one."""
    lines = []

    def names(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        return set()

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(names(c) & known for c in [node.left, *node.comparators]):
            lines.append(node.lineno)
        if isinstance(node, ast.Dict) and any(k is not None and names(k) & known for k in node.keys):
            lines.append(node.lineno)
        if isinstance(node, ast.Match):
            lines.append(node.lineno)
    return lines


def test_no_module_outside_the_algorithm_modules_branches_on_an_algorithm_name():
    offenders = {}
    for name, path in modules().items():
        if name.startswith("specfmt.algorithms"):
            continue
        found = _branches_on_algorithm(ast.parse(path.read_text()))
        if found:
            offenders[str(path.relative_to(REPO))] = found
    assert offenders == {}


def test_the_branch_finder_finds_branches():
    code = 'if cfg["speculators_model_type"] == "eagle3": pass\nx = {"medusa": 1}\ny = algo in ("eagle", "hass")\nz = name == "other"\n'
    assert _branches_on_algorithm(ast.parse(code)) == [1, 2, 3]


# --------------------------------------------------------------------------- plans without a disk


class FakeReader:
    """A source's weights as headers only: what a converter plans from (no file, no torch)."""

    def __init__(self, shapes: dict[str, tuple[tuple[int, ...], str]], fmt: str = "safetensors"):
        from specfmt.checkpoint.reader import TensorInfo

        self._infos = {n: TensorInfo(n, s, d, "model.safetensors") for n, (s, d) in shapes.items()}
        self.format = fmt
        self.folder = Path("/nonexistent-fake-source")
        self.files, self.ignored = ["model.safetensors"], {}

    @property
    def infos(self):
        return dict(self._infos)

    def raw(self, name):
        return None


def _plan(converter: str, config: dict, shapes: dict, opts=None):
    from specfmt.converters import Options, Source, get
    from specfmt.sources.resolve import Resolved
    from specfmt.sources.verifier import Verifier

    src = Source(Resolved(Path("/nonexistent-fake-source"), "fake/source", None, True), config, FakeReader(shapes), Verifier.load(str(WORLD / "verifier")))
    return get(converter).plan(src, opts or Options())


def _eagle3_shapes(H=128, V=2048, Vd=2048, I=384, nH=4, nKV=2, d=32, qwen3=False, midlayer=True):  # noqa: E741
    p = "midlayer." if midlayer else "layers.0."
    s = {
        f"{p}self_attn.q_proj.weight": ((nH * d, 2 * H), "BF16"), f"{p}self_attn.k_proj.weight": ((nKV * d, 2 * H), "BF16"),
        f"{p}self_attn.v_proj.weight": ((nKV * d, 2 * H), "BF16"), f"{p}self_attn.o_proj.weight": ((H, nH * d), "BF16"),
        f"{p}mlp.gate_proj.weight": ((I, H), "BF16"), f"{p}mlp.up_proj.weight": ((I, H), "BF16"), f"{p}mlp.down_proj.weight": ((H, I), "BF16"),
        f"{p}input_layernorm.weight": ((H,), "BF16"), f"{p}hidden_norm.weight": ((H,), "BF16"),
        f"{p}post_attention_layernorm.weight": ((H,), "BF16"),
        "fc.weight": ((H, 3 * H), "BF16"), "norm.weight": ((H,), "BF16"), "lm_head.weight": ((Vd, H), "BF16"),
    }
    if qwen3:
        s[f"{p}self_attn.q_norm.weight"] = ((d,), "BF16")
        s[f"{p}self_attn.k_norm.weight"] = ((d,), "BF16")
    return s


def _eagle3_config(**kw):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 384,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 2048, "rms_norm_eps": 1e-5}
    return {**cfg, **kw}


def test_an_eagle3_plan_is_made_from_headers_alone():
    from specfmt.algorithms.inventory import inventory_problems

    plan = _plan("eagle3", _eagle3_config(), _eagle3_shapes())
    assert plan.layout == "safeailab" and plan.unknown == [] and not plan.derived
    assert {m.src: m.dst for m in plan.moves}["midlayer.hidden_norm.weight"] == "layers.0.hidden_norm.weight"
    assert plan.config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # the reference default for the 8-layer verifier
    assert plan.config["dtype"] == "bfloat16" and plan.config["draft_vocab_size"] == 2048
    assert all(not v for v in inventory_problems(plan.config, plan.output_shapes()).values())


def test_a_qwen3_layer_eagle3_plan_keeps_its_qk_norms_and_family():
    from specfmt.algorithms.layers import FAMILIES
    from specfmt.algorithms.inventory import inventory_problems

    plan = _plan("eagle3", _eagle3_config(model_type="qwen3", head_dim=32), _eagle3_shapes(qwen3=True, midlayer=False))
    tlc = plan.config["transformer_layer_config"]
    assert tlc["model_type"] == "qwen3" and tlc["architectures"] == list(FAMILIES["qwen3"].architectures)
    assert "layers.0.self_attn.q_norm.weight" in plan.output_shapes()
    assert all(not v for v in inventory_problems(plan.config, plan.output_shapes()).values())
    # without the norms the inventory names them
    bare = _plan("eagle3", _eagle3_config(model_type="qwen3"), _eagle3_shapes(midlayer=False))
    missing = inventory_problems(bare.config, bare.output_shapes())["missing"]
    assert sorted(missing) == ["layers.0.self_attn.k_norm.weight", "layers.0.self_attn.q_norm.weight"]


def test_a_medusa_plan_takes_its_sizes_from_the_tensors():
    shapes = {f"{i}.0.linear.{w}": (((128, 128) if w == "weight" else (128,)), "F16") for i in range(2) for w in ("weight", "bias")}
    shapes.update({f"{i}.1.weight": ((2048, 128), "F16") for i in range(2)})
    plan = _plan("medusa", {"medusa_num_heads": 1, "medusa_num_layers": 1}, shapes)
    assert plan.layout == "legacy-trainer" and plan.config["num_heads"] == 2 and plan.config["medusa_fc_bias"] is True
    assert any("medusa_num_heads=1" in n for n in plan.notes)


def test_plans_and_inspect_name_layouts_the_same_way(tmp_path):
    """``inspect`` and the plan use the converter's own layout predicates: one set of names."""
    from specfmt.convert import convert
    from specfmt.detect import detect

    for name, fmt in (("eagle3-safeailab", "eagle3"), ("eagle-safeailab", "eagle"), ("medusa-legacy", "medusa")):
        res = convert(fmt, str(WORLD / name), None, str(WORLD / "verifier"), dry_run=True)
        d = detect(WORLD / name)
        assert d.layout == res.plan.layout and fmt in d.candidates, (name, d, res.plan.layout)
        assert json.dumps(res.config)  # a whole config was planned


@pytest.mark.parametrize("name", ["eagle3", "eagle", "medusa", "dflash"])
def test_every_algorithm_module_provides_the_contract(name):
    from specfmt.algorithms import get
    from specfmt.algorithms.base import Algorithm

    algo = get(name)
    own = {k for k, v in type(algo).__dict__.items() if callable(v)}
    assert {"expected_tensors", "module", "proposer", "loss", "new_draft"} <= own | set(Algorithm.__dict__) and "expected_tensors" in own
    assert algo.title and algo.vllm_method and algo.train_summary


def test_the_from_lists_in_the_help_come_from_the_registry(monkeypatch):
    """`--from`'s help is the registry, not a list typed by hand: a converter registered later appears in it."""
    from typer.testing import CliRunner

    from specfmt.cli import app
    from specfmt.converters import REGISTRY, from_choices
    from specfmt.converters.base import Converter

    runner = CliRunner()
    shown = " ".join(runner.invoke(app, ["convert", "--help"], env={"COLUMNS": "300"}).output.split())
    assert all(name in shown for name in REGISTRY), shown
    # train offers for --init the formats whose drafts it trains (issue 35): EAGLE-3's, and older speculators checkpoints
    help_text = " ".join(runner.invoke(app, ["train", "eagle3", "--help"], env={"COLUMNS": "300"}).output.split())
    offered = re.search(r"Format of --init \((.*?)\)\. \[default", help_text).group(1)
    assert [n.split(" (")[0] for n in offered.split(", ") if not n.startswith("speculators/")] == ["eagle3", "speculators", "specfmt", "auto"], offered

    class PEagleLike(Converter):
        name, label = "peagle", "P-EAGLE"

    monkeypatch.setitem(REGISTRY, "peagle", PEagleLike())
    assert from_choices("auto").endswith("speculators (older speculators/ModelOpt checkpoints), peagle (P-EAGLE), auto")
    assert "hass," in from_choices()  # a subclass does not inherit its parent's label


def _function_lengths(root: Path):
    """``(lines, "path::Class.function", is_method_of_a_class)`` for every function under ``root``."""
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())

        def walk(node, prefix: str, in_class: bool):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield child.end_lineno - child.lineno + 1, f"{path.relative_to(REPO)}::{prefix}{child.name}", in_class
                    yield from walk(child, f"{prefix}{child.name}.", False)
                elif isinstance(child, ast.ClassDef):
                    yield from walk(child, f"{prefix}{child.name}.", True)

        yield from walk(tree, "", False)


#: issue 24: no function in specfmt/ or converters/ longer than 80 lines, no converter method longer than 40
FUNCTION_LINES, CONVERTER_METHOD_LINES = 80, 40


def test_no_function_is_longer_than_80_lines_and_no_converter_method_than_40():
    long = [f"{name}: {n} lines" for root in ("specfmt", "converters") for n, name, _ in _function_lengths(REPO / root) if n > FUNCTION_LINES]
    long += [f"{name}: {n} lines (a converter method)" for n, name, method in _function_lengths(REPO / "converters")
             if method and CONVERTER_METHOD_LINES < n <= FUNCTION_LINES]
    assert not long, "split these into named steps:\n" + "\n".join(long)


def test_the_length_finder_measures_nested_functions_and_methods(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("def f():\n    def g():\n        pass\n    return g\n\n\nclass C:\n    def m(self):\n        x = 1\n        return x\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    found = sorted(_function_lengths(pkg))
    assert found == [(2, "pkg/m.py::f.g", False), (3, "pkg/m.py::C.m", True), (4, "pkg/m.py::f", False)]
