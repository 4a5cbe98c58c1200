"""The wheel ships the schemas and maps converters/ to specfmt.converters."""

import subprocess
import sys
import zipfile

import pytest

from conftest import REPO


def test_wheel_layout(tmp_path):
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    try:
        found = version("setuptools")
    except PackageNotFoundError:
        found = None
    if found is None or Version(found) < Version("70.1"):  # never a skip: a missing build tool is a broken install
        pytest.fail(f"setuptools>=70.1 is needed to build the wheel without build isolation (the tests use no network), found "
                    f"{found or 'none'}: the test extra installs it (.ci/install); pip install 'setuptools>=70.1'", pytrace=False)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("specfmt-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "specfmt/schemas/config-v1.schema.json" in names
    assert "specfmt/converters/eagle3.py" in names and "specfmt/converters/base.py" in names
    assert not [n for n in names if n.startswith(("converters/", "schemas/", "tests/"))]
    assert any(n.endswith("entry_points.txt") for n in names)


def test_schema_is_draft_2020_12_with_versioned_id():
    import json

    from jsonschema import Draft202012Validator

    schema = json.loads((REPO / "schemas" / "config-v1.schema.json").read_text())
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith(":v1")
