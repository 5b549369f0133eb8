"""The release number a user sees agrees everywhere, and files name the code that wrote them.

pyproject's ``version``, ``lit_rag.__version__`` and CHANGELOG.md's newest release section are
one number; build files (pyproject.toml of lit-rag and of every plugin package) use the SPDX
license form setuptools asks for, so an install prints no deprecation warnings.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import lit_rag
from lit_rag import version
from lit_rag.cli.commands import main

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "pyproject.toml", *sorted((ROOT / "plugins").glob("*/pyproject.toml"))]


def test_pyproject_the_package_and_the_changelog_name_one_release():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", changelog, re.M)
    assert project["version"] == lit_rag.__version__ == version.RELEASE
    assert releases and releases[0][0] == version.RELEASE
    # Unreleased comes first, then the releases newest first
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{version.RELEASE}]")
    numbers = [tuple(int(x) for x in number.split(".")) for number, _ in releases]
    assert numbers == sorted(numbers, reverse=True)


def test_breaking_changes_say_what_to_change():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    for line in changelog.splitlines():
        if line.startswith("- **Breaking"):
            assert "What to change:" in line, line


def test_build_files_use_the_spdx_license_form():
    for path in PACKAGES:
        data = tomllib.loads(path.read_text())
        assert data["project"]["license"] == "Apache-2.0", path
        setuptools = [r for r in data["build-system"]["requires"] if r.startswith("setuptools")]
        # the SPDX string form needs setuptools 77 (PEP 639)
        assert setuptools == ["setuptools>=77"], path
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_a_checkout_records_its_commit_beside_the_release():
    version.build_version.cache_clear()
    built = version.build_version()
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    if not head:  # not a git checkout (a source archive): the release alone
        assert built == version.RELEASE
        return
    assert re.fullmatch(rf"{re.escape(version.RELEASE)}\+g{head}(\.dirty)?", built), built


def test_outside_a_checkout_the_release_alone(monkeypatch, tmp_path):
    fake = tmp_path / "lit_rag" / "version.py"
    fake.parent.mkdir()
    monkeypatch.setattr(version, "__file__", str(fake))
    version.build_version.cache_clear()
    try:
        assert version.build_version() == version.RELEASE
    finally:
        version.build_version.cache_clear()


def test_lit_rag_version_prints_the_build(capsys):
    main(["--version"])
    assert capsys.readouterr().out == f"lit-rag {version.build_version()}\n"
