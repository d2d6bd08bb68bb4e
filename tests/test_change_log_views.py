"""`ls` and `docs` keep views derived from the change log (SPEC.md §16): a run reads again only the streams
the log names since its last run, those whose table moved (the heads say so) and those that failed; a
view that is missing or damaged means reading every stream. Landing through the real target, the
`singerlake` command in-process (its lake's storage calls counted); on S3, every request counted at the
HTTP level."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import singerlake.lake
from singerlake.changes import log_prefix
from singerlake.changes.view import local_views, view_key
from singerlake.cli.main import main
from singerlake.format.layout import StreamPaths
from singerlake.lake import Lake
from singerlake.site.pages import page_name
from singerlake.spark.session import OnDemand
from singerlake.storage import LocalStorage, S3Storage
from singerlake.tables.project import project
from support.lakes import TAP, land, local_lake_at, notes_landing, s3_lake_at
from support.s3_counter import counted_root
from support.storage import Counting

SPARK = OnDemand(lambda: pytest.fail("one-task runs of a local master start no Spark"), "local[2]")


class Cli:
    """``singerlake`` in-process on one lake, the lake's storage calls of its last command counted."""

    def __init__(self, root: str, monkeypatch, capsys, args: tuple[str, ...] = ()):
        self.root, self.capsys, self.args, self.counting = root, capsys, args, None
        opened = singerlake.lake.open_storage

        def counted(*a, **k):
            self.counting = Counting(opened(*a, **k))
            return self.counting

        monkeypatch.setattr(singerlake.lake, "open_storage", counted)

    def run(self, command: str, *args: str) -> str:
        self.capsys.readouterr()
        try:
            code = main([command, self.root, *self.args, *args])
        except SystemExit as exit:
            code = exit.code
        out, err = self.capsys.readouterr()
        assert code == 0, err
        return out

    def ls(self) -> dict:
        return json.loads(self.run("ls", "--json"))["taps"][TAP]

    def stream_reads(self) -> set[str]:
        """The streams any of whose objects (raw, published) the command read or listed."""
        return {key.split("/")[2] for _, key in self.counting.requests if key.split("/")[0] in ("raw", "published") and key.count("/") >= 3}

    def manifests_read(self) -> list[str]:
        return sorted(key.split("/")[-2] for method, key in self.counting.requests if method == "read" and key.endswith("/manifest.json"))

    def stream_dirs_listed(self) -> bool:
        return ("list_dirs", f"raw/{TAP}/") in self.counting.requests


@pytest.fixture
def landed(tmp_path, monkeypatch, capsys):
    """Twelve streams landed and projected; the command's views in this test's cache folder."""
    monkeypatch.setenv("SINGERLAKE_CACHE_DIR", str(tmp_path / "cache"))
    lake = local_lake_at(tmp_path)
    land(lake.config, notes_landing([f"s{n:02d}" for n in range(12)]))
    project(Lake(LocalStorage(lake.config["lake_root"])), SPARK)
    return lake, Cli(lake.config["lake_root"], monkeypatch, capsys)


def site_pages(site: Path) -> dict[str, bytes]:
    return {path.relative_to(site).as_posix(): path.read_bytes() for path in site.rglob("*.html")}


def test_a_no_op_ls_and_docs_read_no_stream_and_after_two_streams_changed_only_those(landed, tmp_path):
    lake, cli = landed
    site = tmp_path / "site"
    assert len(cli.ls()) == 12 and cli.manifests_read() == [f"s{n:02d}" for n in range(12)], "no view yet: every stream"
    assert "13 pages (12 streams)" in cli.run("docs", "--out", str(site))
    before = site_pages(site)

    listed = cli.ls()
    assert cli.stream_reads() == set() and not cli.stream_dirs_listed(), cli.counting.requests
    assert {name: (info["records"], info["table"]["rows"]) for name, info in listed.items()} == {f"s{n:02d}": (5, 5) for n in range(12)}
    text = cli.run("ls")
    assert text.count("`singerlake locks` lists every lock") == 1 and "locks shown of the 0 streams read this run" in text
    assert "1 page (12 streams)" in cli.run("docs", "--out", str(site)), "the index alone"
    assert cli.stream_reads() == set() and not cli.stream_dirs_listed(), cli.counting.requests
    assert site_pages(site) | {"index.html": b""} == before | {"index.html": b""}

    land(lake.config, notes_landing(["s03", "s07"], first_id=5))
    text = cli.run("ls")
    assert cli.manifests_read() == ["s03", "s07"] and cli.stream_reads() == {"s03", "s07"}
    assert "locks shown of the 2 streams read this run" in text and "s03: 10 records" in text
    listed = cli.ls()
    assert cli.stream_reads() == set() and {name for name, info in listed.items() if info["records"] == 10} == {"s03", "s07"}

    out = cli.run("docs", "--out", str(site))
    assert "3 pages (12 streams) written" in out and "2 streams read" in out
    assert cli.manifests_read() == ["s03", "s07"] and cli.stream_reads() == {"s03", "s07"}
    after = site_pages(site)
    changed = {page_name(TAP, "s03"), page_name(TAP, "s07"), "index.html"}
    assert {name for name in after if after[name] != before[name]} == changed, "unchanged pages are left byte for byte"
    assert "<dt>Records</dt><dd>10</dd>" in after[page_name(TAP, "s03")].decode()


def test_a_projected_stream_has_its_table_read_again_without_a_marker(landed, tmp_path):
    lake, cli = landed
    site = tmp_path / "site"
    cli.ls()
    cli.run("docs", "--publish")
    land(lake.config, notes_landing(["s05"], first_id=5))
    cli.ls()
    cli.run("docs", "--publish")
    assert cli.stream_reads() == {"s05"}

    assert [r["stream"] for r in project(Lake(LocalStorage(lake.config["lake_root"])), SPARK)] == ["s05"]  # no marker: the heads move
    listed = cli.ls()
    assert cli.stream_reads() == {"s05"} and (listed["s05"]["table"]["version"], listed["s05"]["table"]["rows"]) == (1, 10)
    cli.run("docs", "--publish", "--out", str(site))  # a new --out: every stream is read for it
    assert len(cli.manifests_read()) == 12
    cli.run("docs", "--publish", "--out", str(site))
    assert cli.stream_reads() == set()
    page = (site / page_name(TAP, "s05")).read_text()
    assert "version 1, 10 current rows" in page and page == lake.read(f"docs/{page_name(TAP, 's05')}").decode()


def test_a_missing_or_damaged_view_means_every_stream_is_read(landed, tmp_path, capsys):
    lake, cli = landed
    site = tmp_path / "site"
    expected = cli.ls()
    cli.run("docs", "--out", str(site))
    views = local_views(LocalStorage(lake.config["lake_root"]))
    for damage in (b"{not json", b'{"format": "singerlake-view", "version": 999}'):
        views.write(view_key("", TAP), damage)
        again = cli.ls()
        assert len(cli.manifests_read()) == 12 and {n: i["records"] for n, i in again.items()} == {
            n: i["records"] for n, i in expected.items()
        }
    views.delete(view_key("", TAP))
    again = cli.ls()
    assert len(cli.manifests_read()) == 12 and again.keys() == expected.keys()
    assert cli.ls() and cli.stream_reads() == set(), "and the view is kept again"

    (site / "_singerlake" / f"view-{TAP}.json").write_bytes(b"[]")
    assert "13 pages (12 streams)" in cli.run("docs", "--out", str(site))
    shutil.rmtree(site)  # the site gone, its view with it
    assert "13 pages (12 streams)" in cli.run("docs", "--out", str(site)) and len(site_pages(site)) == 13


def test_a_commit_no_marker_names_is_shown_once_the_view_is_a_day_old(landed, tmp_path):
    lake, cli = landed
    site = tmp_path / "site"
    cli.ls()
    cli.run("docs", "--out", str(site))
    land(lake.config, notes_landing(["s01"], first_id=5))
    shutil.rmtree(Path(lake.config["lake_root"]) / log_prefix(TAP))  # as if its writer died before its marker
    assert cli.ls()["s01"]["records"] == 5, "not named: not read"

    views = local_views(LocalStorage(lake.config["lake_root"]))
    doc = json.loads(views.read(view_key("", TAP)).data)
    doc["place"]["walked"] -= 24 * 3600 * 1000 + 1  # the last visit of every stream is a day old
    views.write(view_key("", TAP), json.dumps(doc).encode())
    assert cli.ls()["s01"]["records"] == 10 and len(cli.manifests_read()) == 12

    verified = cli.run("docs", "--out", str(site), "--verify", "--no-hashes")  # --verify reads every stream
    assert "13 pages (12 streams)" in verified and "Verify" in (site / page_name(TAP, "s01")).read_text()
    assert "13 pages (12 streams)" in cli.run("docs", "--out", str(site)), "then every stream again, to drop the findings"
    assert "Verify" not in (site / page_name(TAP, "s01")).read_text() and "<dd>10</dd>" in (site / page_name(TAP, "s01")).read_text()
    assert "1 page (12 streams)" in cli.run("docs", "--out", str(site))


def test_ls_lists_the_locks_of_the_streams_it_reads_and_keeps_when_it_listed_the_others(landed):
    lake, cli = landed
    schema = cli.ls()["s02"]["versions"][0]["schema_hash"]
    land(lake.config, notes_landing(["s02"], first_id=5))
    held = {"writer-id": "w-1", "acquired": "1970-01-01T00:00:00Z", "refreshed": "1970-01-01T00:00:00Z", "lease_seconds": 60}
    locks = {stream: StreamPaths(TAP, stream).lock(schema) for stream in ("s02", "s03")}
    for lock in locks.values():
        lake.storage.write(lock, json.dumps(held).encode())
    report = json.loads(cli.run("ls", "--json"))
    s02, s03 = report["taps"][TAP]["s02"], report["taps"][TAP]["s03"]
    assert [entry["path"] for entry in s02["locks"]] == [locks["s02"]] and s02["locks_read"] == report["read"]
    assert s03["locks"] == [] and s03["locks_read"] < report["read"], "not read this run: its locks as listed before"
    text = cli.run("ls")
    assert "locks shown of the 0 streams read this run; `singerlake locks` lists every lock" in text and "lock raw/" not in text
    assert [entry["path"] for entry in cli.ls()["s02"]["locks"]] == [locks["s02"]], "kept, as of locks_read"
    listed = json.loads(cli.run("locks", "--json"))
    assert sorted(entry["path"] for entry in listed) == sorted(locks.values()), "`singerlake locks` walks every stream"


STREAMS_ON_S3 = 1_000  # no-op costs are constants: the same here as at 2,000 (which took this test 4 minutes)


@pytest.mark.heavy
def test_on_s3_a_no_op_ls_docs_and_project_of_1000_streams_make_a_constant_number_of_requests(
    request, seaweedfs_server, spark, tmp_path, monkeypatch, capsys
):
    """Built on a local lake (landed and projected once, on Spark), copied to the bucket uncounted, then each command counted.
    On SeaweedFS: moto lists a bucket by walking every key in it, which a full `ls` of 1,000 streams pays per stream."""
    monkeypatch.setenv("SINGERLAKE_CACHE_DIR", str(tmp_path / "cache"))
    streams = [f"t{n:04d}" for n in range(STREAMS_ON_S3)]
    local = local_lake_at(tmp_path)
    land(local.config, notes_landing(streams, records=2))
    assert len(project(Lake(LocalStorage(local.config["lake_root"])), spark)) == STREAMS_ON_S3
    root = counted_root(request, seaweedfs_server)
    url, options = root
    upload = S3Storage(url, **{**options, "endpoint_url": seaweedfs_server.endpoint})  # not through the proxy: not counted
    base = Path(local.config["lake_root"])
    files = sorted(p for p in base.rglob("*") if p.is_file() and not p.name.startswith("."))
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda path: upload.write(path.relative_to(base).as_posix(), path.read_bytes(), durable=False), files))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options["secret_access_key"])
    site = str(tmp_path / "site")  # the lake's reads are counted; the pages go to a local folder
    cli = Cli(url, monkeypatch, capsys, ("--s3-endpoint-url", options["endpoint_url"], "--s3-region", options["region"]))
    assert len(cli.ls()) == STREAMS_ON_S3  # the views' first build, not counted (the site's, not through the proxy either)
    cli.run("docs", "--out", site, "--s3-endpoint-url", seaweedfs_server.endpoint)

    with root.counter.counting() as ls_tally:
        cli.ls()
    with root.counter.counting() as docs_tally:
        assert f"1 page ({STREAMS_ON_S3:,} streams)" in cli.run("docs", "--out", site)
    with capsys.disabled():  # the commands' output is captured, not this
        print(f"no-op ls of {STREAMS_ON_S3:,} streams:", dict(ls_tally.kinds), "no-op docs:", dict(docs_tally.kinds))
    for tally in (ls_tally, docs_tally):
        assert not [r.key for r in tally.requests if any(part in streams for part in r.key.split("/"))], "no object of any stream"
    assert sum(ls_tally.kinds.values()) <= 7, ls_tally.requests
    assert sum(docs_tally.kinds.values()) <= 7, docs_tally.requests  # the pages go to a local folder: the lake is only read
    reader = Lake(S3Storage(url, **options))
    with root.counter.counting() as project_tally:
        assert project(reader, SPARK) == []
    with capsys.disabled():
        print(f"no-op project of {STREAMS_ON_S3:,} streams:", dict(project_tally.kinds))
    assert not [r.key for r in project_tally.requests if any(part in streams for part in r.key.split("/"))], "no object of any stream"
    assert sum(project_tally.kinds.values()) <= 6, project_tally.requests  # the bucket, singerlake.json, the heads, the log

    changed = streams[:: STREAMS_ON_S3 // 10]
    land(s3_lake_at(root).config, notes_landing(changed, first_id=2, records=2))
    with root.counter.counting() as ls_tally:
        listed = cli.ls()
    with root.counter.counting() as docs_tally:
        cli.run("docs", "--out", site)
    with root.counter.counting() as project_tally:
        results = project(reader, SPARK)
    with capsys.disabled():
        print("after 10 streams changed, ls:", dict(ls_tally.kinds), "docs:", dict(docs_tally.kinds), "project:", dict(project_tally.kinds))
    assert [name for name, info in listed.items() if info["records"] == 4] == changed
    for tally in (ls_tally, docs_tally):
        assert len([r for r in tally.of("GET") if r.key.endswith("/manifest.json")]) == 10 and sum(tally.kinds.values()) <= 10 * 8 + 12
    assert sorted(r["stream"] for r in results) == changed and all(r["rows"] == 4 for r in results)
    manifest_gets = [r for r in project_tally.of("GET") if r.key.endswith("/manifest.json")]
    assert len(manifest_gets) == 10 and sum(project_tally.kinds.values()) <= 10 * 12 + 8, project_tally.kinds
