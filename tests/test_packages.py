"""The three packages as a user installs them: wheels and sdists built from this checkout, checked as PyPI
would, installed into a clean venv from the built files alone, one version everywhere."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"shared": "singerlake", "tap-singerlake": "tap-singerlake", "target-singerlake": "target-singerlake"}
VERSION = (REPO / "VERSION").read_text().strip()

pytestmark = pytest.mark.heavy  # three builds and a venv


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """Each package built as a user's `python -m build` does: the sdist, then the wheel from it."""
    out = tmp_path_factory.mktemp("dist")
    for folder in PACKAGES:
        build = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO / folder)]
        done = subprocess.run(build, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_every_package_builds_a_wheel_and_an_sdist_that_pass_twine(dist):
    names = sorted(path.name for path in dist.iterdir())
    for name in PACKAGES.values():
        stem = name.replace("-", "_")
        assert f"{stem}-{VERSION}-py3-none-any.whl" in names and f"{stem}-{VERSION}.tar.gz" in names, names
    twine = [sys.executable, "-m", "twine", "check", "--strict", *map(str, sorted(dist.iterdir()))]
    checked = subprocess.run(twine, capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_built_files_alone_install_and_run(dist, tmp_path):
    """No checkout on the path: the venv gets our three wheels (nothing else from here); their dependencies are
    borrowed read-only from this interpreter's site-packages (a plain path entry: its .pth files, which point
    at the checkout, are not read)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    wheels = sorted(str(path) for path in dist.glob("*.whl"))
    pip = [str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", *wheels]
    installed = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True)
    (Path(site.stdout.strip()) / "zz-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def run(*args: str) -> str:
        done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    assert run("singerlake", "--version").strip() == f"singerlake {VERSION}"
    for plugin in ("target-singerlake", "tap-singerlake"):
        about = json.loads(run(plugin, "--about", "--format", "json"))
        assert about["name"] == plugin and about["version"] == VERSION
    where = run(str(python), "-c", "import singerlake, tap_singerlake, target_singerlake as t; print(singerlake.__file__, t.__file__)")
    assert str(REPO) not in where and all(path.startswith(str(venv)) for path in where.split()), where


def test_one_version_everywhere():
    """VERSION is the one source: each package reads it (a link), pins its siblings to it, and the changelog names it."""
    for folder in PACKAGES:
        assert (REPO / folder / "VERSION").resolve() == (REPO / "VERSION").resolve(), folder
        pins = re.findall(r'"singerlake(?:\[\w+\])?==([^"]+)"', (REPO / folder / "pyproject.toml").read_text())
        assert all(pin == VERSION for pin in pins), (folder, pins)
    assert re.search(rf"^## {re.escape(VERSION)}\b", (REPO / "CHANGELOG.md").read_text(), re.M)


def test_hub_definitions_install_the_published_packages():
    for kind, name in (("extractors", "tap-singerlake"), ("loaders", "target-singerlake"), ("utilities", "singerlake")):
        hub = yaml.safe_load((REPO / "hub" / kind / name / "singerlake.yml").read_text())
        assert hub["pip_url"].split("[")[0] == name, kind
