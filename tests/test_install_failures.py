"""What ``.ci/install`` installs is never a reason to skip: a test that needs the docs extra or vLLM fails, saying
what is missing and how to get it, when that is not installed (a skip would hide a broken install, as a green
CI once hid two install steps). Run here in a child pytest in which those packages cannot be found."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO

#: a pytest plugin for the child run: neither ``importlib.util.find_spec`` nor ``import`` finds vLLM or the docs extra
#: (``import vllm`` raises ModuleNotFoundError, as where it is not installed: ``pytest.importorskip`` would skip)
HIDE = '''
import importlib.util
import sys

HIDDEN = ("vllm", "mkdocs", "material", "mkdocstrings_handlers", "mkdocs_gen_files")
_find = importlib.util.find_spec


def find_spec(name, package=None):
    if name.split(".")[0] in HIDDEN:
        return None
    return _find(name, package)


class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


importlib.util.find_spec = find_spec
sys.meta_path.insert(0, Hide())
'''

#: tests that read vLLM's own code without an engine (marked ``vllm``; issue 35 found two that skipped instead)
VLLM_READERS = ["tests/test_peagle.py::test_vllm_reads_our_peagle_config_as_parallel_eagle3_with_our_mask_token",
                "tests/test_dflash_convert.py::test_vllm_reads_ours_non_causal_and_speculators_causal",
                "tests/test_converter_tables.py::test_a_name_map_reads_names_as_vllms_weights_mapper_does"]


def test_a_missing_docs_extra_or_vllm_fails_the_tests_that_need_it(tmp_path):
    (tmp_path / "hide_installed.py").write_text(HIDE)
    tests = ["tests/test_docs.py::test_the_docs_extra_is_installed", "tests/test_docs.py::test_the_docs_site_builds_strict_with_every_page",
             "tests/test_serving.py::test_the_line_printed_for_the_installed_vllm_starts_its_server", *VLLM_READERS]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "hide_installed", "-q", "-rA", "-p", "no:cacheprovider", *tests],
                       cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "skipped" not in out, out[-3000:]
    assert f"1 failed, {2 + len(VLLM_READERS)} errors" in out, out[-3000:]  # failed in setup (the site fixture, the vllm marker): errors
    assert "the docs extra is not installed (no mkdocs, material, mkdocstrings_handlers.python, mkdocs_gen_files): .ci/install installs it" in out
    assert "vLLM is not installed, and this test needs it: .ci/install installs it" in out and "-m 'not vllm'" in out


#: every skip the test suite may take, and why it is legitimate: none is for a package .ci/install installs
ALLOWED_SKIPS = {
    ("test_architecture.py", 'pytest.importorskip("tomllib")'):
        "tomllib is in the standard library from Python 3.11; the check reads pyproject.toml, the same on every Python, "
        "and CI's Python has it",
    ("test_scale.py", "pytest.mark.skipif(torch.cuda.is_available()"):
        "checks the error given where CUDA is absent: on a machine with CUDA there is no such error to check",
}
SKIP = re.compile(r"pytest\.(importorskip\([^)]*\)|skip\(|mark\.skip\b|mark\.skipif\([^,]*)|\bskipif\(")


def test_every_skip_in_the_tests_is_one_allowed_with_its_reason():
    """A test never skips for what .ci/install installs (vLLM, the docs extra, speculators' and the other peers' test
    environments, which the tests build): each ``importorskip``, ``pytest.skip`` or ``skipif`` in ``tests/`` is one of
    :data:`ALLOWED_SKIPS`, where its reason is stated. A new ``pytest.importorskip("vllm")`` fails here; mark the
    test ``vllm`` instead."""
    found = set()
    for path in sorted((REPO / "tests").glob("*.py")):
        if path.name == Path(__file__).name:
            continue
        text = path.read_text()
        for m in SKIP.finditer(text):
            key = next((k for k in ALLOWED_SKIPS if k[0] == path.name and text.startswith(k[1], m.start())), None)
            assert key is not None, f"{path.name}: {m.group(0)!r} is a skip not in ALLOWED_SKIPS (mark a test that needs vLLM `vllm`)"
            found.add(key)
    assert found == set(ALLOWED_SKIPS), f"allowed but no longer in the tests: {set(ALLOWED_SKIPS) - found}"
