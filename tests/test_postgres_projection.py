"""A real PostgreSQL table through MeltanoLabs tap-postgres, target-singerlake and `singerlake project`:
the published Delta table equals the source table, column by column (numeric(38,18), jsonb strings
and objects, arrays, timestamptz, unicode, dotted and spaced names)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from deltalake import DeltaTable
from singerlake.format.exact import decode, json_text, parse_timestamp
from singerlake.storage import LocalStorage
from singerlake.tables.delta import table_key, table_uri
from support.projections import back_to_json, same

BIN = Path(sys.executable).parent
ROWS = 3000
TABLE = """
CREATE TABLE public.things (
    id integer PRIMARY KEY,
    amount numeric(38,18),
    "qty.count" integer,
    "with space €" text,
    doc jsonb,
    tags text[],
    happened timestamptz,
    big bigint
);
INSERT INTO public.things
SELECT g,
       ((CASE WHEN g % 2 = 0 THEN '-' ELSE '' END) || '12345678901234567' || lpad((g % 1000)::text, 3, '0') || '.'
        || lpad(g::text, 18, '0'))::numeric(38,18),
       g % 7,
       'ü€ ' || g,
       CASE g % 4 WHEN 0 THEN to_jsonb('just a string'::text)
                  WHEN 1 THEN jsonb_build_object('a', g, 'nested', jsonb_build_array(1.50, 'x', null))
                  WHEN 2 THEN to_jsonb('{"a": 1}'::text)
                  ELSE NULL END,
       ARRAY['a€', g::text],
       timestamptz '2024-01-01 00:00:00+00' + g * interval '1.123456 second',
       g::bigint * 3000000000000000
FROM generate_series(1, {ROWS}) AS g;
""".replace("{ROWS}", str(ROWS))


@pytest.mark.heavy
def test_a_postgres_table_comes_back_exact_in_the_published_delta_table(postgres, tmp_path):
    tap = BIN / "tap-postgres"
    if not tap.exists():
        pytest.skip("tap-postgres is not installed: ./dev tools installs meltanolabs-tap-postgres into its own venv")
    postgres.psql(TABLE)
    tap_config, target_config, lake = tmp_path / "tap.json", tmp_path / "target.json", tmp_path / "lake"
    source = {"host": "127.0.0.1", "port": postgres.port, "user": "postgres", "password": "-", "database": "postgres"}
    tap_config.write_text(json.dumps(source))
    target_config.write_text(json.dumps({"lake_root": str(lake), "tap_id": "tap-postgres"}))
    env = {k: v for k, v in os.environ.items() if k != "MELTANO_EXTRACTOR_NAME"}
    discovered = subprocess.run([str(tap), "--config", str(tap_config), "--discover"], capture_output=True, text=True, timeout=300, env=env)
    assert discovered.returncode == 0, discovered.stderr[-2000:]
    catalog = json.loads(discovered.stdout)
    catalog["streams"] = [entry for entry in catalog["streams"] if entry["tap_stream_id"] == "public-things"]
    for entry in catalog["streams"][0]["metadata"]:
        if entry["breadcrumb"] == []:
            entry["metadata"]["selected"] = True  # tap-postgres selects nothing by default
    (tmp_path / "catalog.json").write_text(json.dumps(catalog))
    extract_command = [str(tap), "--config", str(tap_config), "--catalog", str(tmp_path / "catalog.json")]
    with subprocess.Popen(extract_command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as extract:
        target = [str(BIN / "target-singerlake"), "--config", str(target_config)]
        landed = subprocess.run(target, stdin=extract.stdout, capture_output=True, timeout=600, env=env)
        extract.stdout.close()
        tap_errors = extract.stderr.read().decode()[-2000:]
    assert extract.returncode == 0, tap_errors
    assert landed.returncode == 0, landed.stderr.decode()[-3000:]
    projected = subprocess.run(
        [str(BIN / "singerlake"), "project", str(lake), "--spark-master", "local[2]", "--json"], capture_output=True, text=True, timeout=600
    )
    assert projected.returncode == 0, projected.stderr[-3000:]
    streams = {s["stream"]: s for s in json.loads(projected.stdout)["streams"] if s["stream"].endswith("things")}
    assert len(streams) == 1, projected.stdout  # tap-postgres names it public-things
    ((stream, summary),) = streams.items()
    assert summary["rows"] == ROWS, summary

    table = DeltaTable(table_uri(LocalStorage(lake), table_key("tap-postgres", stream))).to_pyarrow_table()
    source = [decode(line) for line in postgres.psql("SELECT row_to_json(t) FROM public.things t ORDER BY id").splitlines()]
    assert len(source) == ROWS and set(table.column_names) == set(source[0])
    published = {row["id"]: row for row in table.to_pylist()}
    fields = {field.name: field for field in table.schema}
    assert str(fields["amount"].type) == "decimal128(38, 18)" and str(fields["big"].type) == "int64"
    assert fields["doc"].metadata[b"singerlake.json"] == b"true"
    for expected in source:
        row = published[expected["id"]]
        for name, value in expected.items():
            got = back_to_json(row[name], fields[name])
            if isinstance(got, datetime):
                assert got == parse_timestamp(value), (name, got, value)
            else:
                assert same(got, value), (expected["id"], name, got, value)
    docs = {json_text(decode(row["doc"]))[:1] for row in published.values() if row["doc"] is not None}
    assert docs == {'"', "{"}  # jsonb strings and objects stay distinguishable
