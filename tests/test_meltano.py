"""Meltano end to end with the real `meltano` CLI, offline, and the Hub definitions in hub/.

The pipelines run in a temporary copy of ./meltano.yml without pip_url (demo/meltano_project.py), so
Meltano runs the plugins installed in .venv and never installs anything or looks at the Hub.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "demo"))
import meltano_project as mp  # noqa: E402

pytestmark = pytest.mark.heavy  # the real meltano CLI in its own venv, end to end

HUB = {
    "tap-singerlake": REPO / "hub/extractors/tap-singerlake/singerlake.yml",
    "target-singerlake": REPO / "hub/loaders/target-singerlake/singerlake.yml",
}
UTILITY = REPO / "hub/utilities/singerlake/singerlake.yml"
DEMO = [sys.executable, str(REPO / "demo" / "meltano_demo.py")]
SAMPLE = mp.read_jsonl(*sorted(mp.SAMPLE.glob("*.jsonl")))
NEW = mp.read_jsonl(mp.MORE / "users-3.jsonl")


# -- end to end ------------------------------------------------------------------------------------
def lake_records(project: Path) -> list[dict]:
    """Everything the lake holds, replayed by tap-singerlake directly (no state, no Meltano)."""
    config = project / "replay-all.json"
    config.write_text(json.dumps({"lake_root": str(project / "singerlake"), "tap_id": "tap-jsonl"}))
    run = subprocess.run([str(mp.BIN / "tap-singerlake"), "--config", str(config)], capture_output=True, text=True, check=True)
    return [message["record"] for message in map(json.loads, run.stdout.splitlines()) if message["type"] == "RECORD"]


def round_result(project: Path) -> dict:
    """What a round left: the lake's records, target-jsonl's output file and Meltano's saved states."""
    states = {
        state_id: json.loads(mp.meltano(project, "state", "get", state_id).stdout)["singer_state"]
        for state_id in mp.meltano(project, "state", "list").stdout.split()
    }
    return {"lake": lake_records(project), "output": mp.read_jsonl(project / "output" / "users.jsonl"), "states": states}


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """Round one is the README's main job, `./dev demo`: both pipelines in a fresh copy of the project."""
    project = tmp_path_factory.mktemp("meltano") / "project"
    run = subprocess.run([*DEMO, str(project)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr[-5000:]
    return {"project": project, "demo": run.stdout, **round_result(project)}


@pytest.fixture(scope="module")
def project(first):
    return first["project"]


@pytest.fixture(scope="module")
def second(project, first):
    """A new input file, both pipelines again, then the replay once more with nothing new in the lake."""
    shutil.copy(mp.MORE / "users-3.jsonl", project / "demo" / "jsonl")
    mp.meltano(project, "run", "tap-jsonl", "target-singerlake")
    mp.meltano(project, "run", "tap-singerlake", "target-jsonl")
    result = round_result(project)
    mp.meltano(project, "run", "tap-singerlake", "target-jsonl")
    result["output_after_idle_replay"] = mp.read_jsonl(project / "output" / "users.jsonl")
    return result


def test_demo_prints_what_it_did(first):
    assert "1. meltano run tap-jsonl target-singerlake singerlake:project: 24 records of 2 files in demo/jsonl" in first["demo"]
    assert "landed as 24 records in" in first["demo"]
    assert "2. meltano run tap-singerlake target-jsonl: 24 records replayed into" in first["demo"]
    assert "equal to the sample, in order (tap-jsonl's _sdc_ columns aside): True" in first["demo"]


def test_demo_deletes_only_a_previous_demo(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    run = subprocess.run([*DEMO, str(tmp_path)], capture_output=True, text=True)
    assert run.returncode != 0 and "is not a previous demo" in run.stderr
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_land_then_replay_gives_back_the_sample(first):
    assert mp.without_sdc(first["lake"]) == SAMPLE  # big ints, unicode, NUL, nulls, nesting: all as in the files
    assert first["output"] == first["lake"]  # target-jsonl wrote exactly what the lake holds, in order
    assert all(set(record) - set(sample) == mp.SDC_COLUMNS for record, sample in zip(first["output"], SAMPLE, strict=True))
    assert {Path(record["_sdc_filename"]).name for record in first["output"]} == {"users-1.jsonl", "users-2.jsonl"}


def test_tap_id_is_the_extractor_name(project, first):
    assert sorted(path.name for path in (project / "singerlake" / "raw").iterdir() if path.is_dir()) == ["tap-jsonl"]
    assert (project / "singerlake" / "raw" / "tap-jsonl" / "users" / "manifest.json").is_file()


def generation(project: Path) -> str:
    return json.loads((project / "singerlake" / "raw" / "tap-jsonl" / "users" / "manifest.json").read_text())["generation"]


def test_meltano_saves_both_states(project, first):
    states = first["states"]
    position = {"commit": 1, "records": 24, "generation": generation(project)}
    assert states["dev:tap-singerlake-to-target-jsonl"] == {"bookmarks": {"users": {"position": position}}}
    # target-singerlake passed tap-jsonl's STATE on once it was committed, and Meltano saved it
    partitions = states["dev:tap-jsonl-to-target-singerlake"]["bookmarks"]["users"]["partitions"]
    assert sorted(Path(p["context"]["_sdc_filename"]).name for p in partitions) == ["users-1.jsonl", "users-2.jsonl"]


def test_second_run_replays_only_what_was_landed_since(project, first, second):
    # tap-jsonl 0.3.1 is not incremental (meltano.yml says why): it sends every file again, and a raw zone keeps
    # what each run sent, so the lake holds the sample, then the sample again with the new file
    assert mp.without_sdc(second["lake"]) == SAMPLE + SAMPLE + NEW
    # tap-singerlake resumed from the bookmark Meltano saved: exactly the records committed since, each once
    assert second["output"][: len(first["output"])] == first["output"]  # target-jsonl appends to users.jsonl
    assert second["output"][len(first["output"]) :] == second["lake"][len(first["lake"]) :]
    assert mp.without_sdc(second["output"]).count(NEW[0]) == 1
    position = {"commit": 2, "records": 30, "generation": generation(project)}
    assert second["states"]["dev:tap-singerlake-to-target-jsonl"] == {"bookmarks": {"users": {"position": position}}}
    assert second["output_after_idle_replay"] == second["output"]  # nothing new landed: nothing replayed


def test_the_utility_projects_the_landed_stream_in_the_same_run(project, first):
    """`singerlake:project` ran as the third block of the demo's first `meltano run`, on the lake root the project
    sets once (SINGERLAKE_LAKE_ROOT) for the loader, the extractor and the utility."""
    from deltalake import DeltaTable

    rows = DeltaTable(str(project / "singerlake" / "published" / "tap-jsonl" / "users")).to_pyarrow_table().to_pylist()
    current = {record["id"]: record for record in SAMPLE}  # the latest record per key, in file order
    assert sorted(row["id"] for row in rows) == sorted(current)
    assert {row["id"]: row["name"] for row in rows} == {key: record["name"] for key, record in current.items()}


def test_the_utilitys_commands_run_under_meltano(project, first):
    listing = mp.meltano(project, "invoke", "singerlake:ls").stdout
    assert "tap tap-jsonl" in listing and "    users: " in listing
    assert "clean" in mp.meltano(project, "invoke", "singerlake:verify").stdout
    mp.meltano(project, "invoke", "singerlake:docs")
    assert (project / "singerlake" / "docs" / "index.html").is_file()
    mp.meltano(project, "invoke", "singerlake", "ls", "singerlake")  # the plain executable, arguments as typed


def test_discover_shows_the_streams(project, second):
    catalog = json.loads(mp.meltano(project, "invoke", "tap-singerlake", "--discover").stdout)
    assert [stream["tap_stream_id"] for stream in catalog["streams"]] == ["users"]
    (users,) = catalog["streams"]
    assert users["key_properties"] == ["id"]
    # every field of both schema versions: `plan` came with the new file
    assert set(users["schema"]["properties"]) == {key for record in SAMPLE + NEW for key in record} | mp.SDC_COLUMNS


# -- definitions -----------------------------------------------------------------------------------
def about(plugin: str) -> dict:
    run = subprocess.run([str(mp.BIN / plugin), "--about", "--format", "json"], capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


def meltano_kind(prop: dict) -> str:
    """The Meltano setting kind of a JSON schema property (secrets are strings marked `sensitive`)."""
    (json_type,) = {prop["type"]} if isinstance(prop["type"], str) else set(prop["type"]) - {"null"}
    if "enum" in prop:
        return "options"
    if prop.get("format") == "date-time":
        return "date_iso8601"
    # number -> integer as the Hub does: Meltano 4.4.1's `decimal` kind fails on any value from an environment variable
    return {"number": "integer"}.get(json_type, json_type)


@pytest.mark.parametrize("plugin", sorted(HUB))
def test_hub_definition_matches_the_installed_plugin(plugin):
    """Every setting --about lists (the SDK's stream map and flattening settings too), nothing else, same kinds."""
    info, hub = about(plugin), yaml.safe_load(HUB[plugin].read_text())
    assert (hub["name"], hub["namespace"], hub["executable"]) == (plugin, plugin.replace("-", "_"), plugin)
    assert hub["description"] == info["description"]
    assert hub["capabilities"] == info["capabilities"]
    properties = info["settings"]["properties"]
    assert [setting["name"] for setting in hub["settings"]] == list(properties)
    for setting in hub["settings"]:
        prop = properties[setting["name"]]
        assert setting["kind"] == meltano_kind(prop), setting["name"]
        assert setting.get("sensitive", False) == prop.get("secret", False), setting["name"]
        assert setting["description"] == prop["description"], setting["name"]
        assert setting["label"] == prop.get("title", setting["label"]), setting["name"]
        assert setting.get("value") == prop.get("default"), setting["name"]
        assert [option["value"] for option in setting.get("options", [])] == prop.get("enum", []), setting["name"]


@pytest.mark.parametrize("plugin", sorted(HUB))
def test_meltano_yml_defines_the_plugin_as_the_hub_does(plugin):
    hub = yaml.safe_load(HUB[plugin].read_text())
    project = yaml.safe_load((REPO / "meltano.yml").read_text())
    (ours,) = [entry for entries in project["plugins"].values() for entry in entries if entry["name"] == plugin]
    assert ours["pip_url"] == f"-e ./shared -e ./{plugin}"  # from this checkout; the Hub's names the published package
    for key in ("namespace", "executable", "capabilities", "settings"):
        assert ours[key] == hub[key], key


def test_hub_utility_matches_the_command_line_and_the_shared_settings():
    """Each command parses as `singerlake` arguments; the settings are the plugins' lake settings; meltano.yml defines
    the utility as the Hub does."""
    from singerlake.cli.main import parser
    from singerlake.settings import LAKE_LOCATION

    hub = yaml.safe_load(UTILITY.read_text())
    assert (hub["name"], hub["namespace"], hub["executable"]) == ("singerlake", "singerlake", "singerlake")
    assert set(hub["commands"]) >= {"project", "verify", "vacuum", "compact", "docs", "files", "push"}
    for name, command in hub["commands"].items():
        args = command["args"].replace("$SINGERLAKE_LAKE_ROOT", "./singerlake").split()
        assert args[0] == name and args[1] == "./singerlake", name
        extra = {"files": ["--what", "x"], "push": ["PATH", "--what", "x", "--where", "y"]}.get(name, [])
        parser().parse_args(args + extra)  # exits (a test error) on arguments the CLI does not take
    plugin = {s["name"]: s for s in yaml.safe_load(HUB["target-singerlake"].read_text())["settings"]}
    assert [s["name"] for s in hub["settings"]] == [s.name for s in LAKE_LOCATION]
    for setting in hub["settings"][1:]:  # as the loader's; lake_root has a value here, for the commands' arguments
        assert setting == plugin[setting["name"]], setting["name"]
    assert hub["settings"][0]["value"] == "./singerlake"
    project = yaml.safe_load((REPO / "meltano.yml").read_text())
    (ours,) = project["plugins"]["utilities"]
    assert ours["pip_url"] == "-e ./shared"
    for key in ("namespace", "executable", "commands", "settings"):
        assert ours[key] == hub[key], key


def test_definitions_follow_meltanos_schema():
    """meltano.yml and the Hub settings against the JSON schema that ships with meltano 4.4.1."""
    (path,) = (mp.BIN / "meltano").resolve().parents[1].glob("lib/python*/site-packages/meltano/schemas/meltano.schema.json")
    schema = json.loads(path.read_text())
    project = yaml.safe_load((REPO / "meltano.yml").read_text())
    for plugin in project["plugins"]["loaders"]:  # the schema predates the SDK's validate-records capability
        plugin["capabilities"] = [c for c in plugin.get("capabilities", []) if c != "validate-records"]
    jsonschema.validate(project, schema)
    setting_schema = {**schema["$defs"]["base_setting"], "$defs": schema["$defs"]}
    for hub_file in [*HUB.values(), UTILITY]:
        for setting in yaml.safe_load(hub_file.read_text())["settings"]:
            jsonschema.validate(setting, setting_schema)
