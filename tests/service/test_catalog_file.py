"""A catalog from a TOML file (``flight.sql.catalog_file``): Parquet, Delta and Iceberg tables by name.

Each kind is written by its own library (pyarrow, deltalake, pyiceberg's SQL catalog on SQLite) and
read through SQL with ``run_local``; the answers are compared with what those libraries read. The
service takes the same file (``--catalog``). Errors name the file, the table and the key, never a
value (an Iceberg catalog's properties may hold credentials).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyiceberg.catalog.sql import SqlCatalog

import flight
from flight.sql.catalog_file import load_catalog_file

ROWS = pa.table({"id": pa.array(range(20), pa.int64()), "v": pa.array([i * 3 % 7 for i in range(20)], pa.int64())})


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("catalog-file")
    (root / "events").mkdir()
    pq.write_table(ROWS, root / "events" / "part-0.parquet")
    write_deltalake(str(root / "delta"), ROWS.slice(0, 10))
    write_deltalake(str(root / "delta"), ROWS.slice(10, 10), mode="append")
    iceberg = SqlCatalog("lake", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
    iceberg.create_namespace("nyc")
    iceberg.create_table("nyc.trips", schema=ROWS.schema).append(ROWS)
    (root / "catalog.toml").write_text(f'''
[tables]
events = "{root}/events"
raw = {{ parquet = "{root}/events/part-0.parquet" }}
changes = {{ delta = "{root}/delta" }}
first = {{ delta = "{root}/delta", version = 0 }}

[iceberg.lake]
type = "sql"
uri = "sqlite:///{root}/catalog.db"
warehouse = "file://{root}/warehouse"
tables = {{ trips = "nyc.trips" }}
''')
    return root


def total(catalog: flight.Catalog, table: str) -> list[object]:
    return flight.run_local(flight.sql(f"select count(*) as n, sum(v) as s from {table}", catalog)).read_all().to_pylist()


def test_every_kind_of_table_reads_as_its_library_reads_it(lake: Path) -> None:
    catalog = load_catalog_file(lake / "catalog.toml")
    assert sorted(catalog) == ["changes", "events", "first", "raw", "trips"]
    whole = [{"n": 20, "s": sum(ROWS["v"].to_pylist())}]
    for table in ("events", "raw", "trips"):
        assert total(catalog, table) == whole, table
    delta = DeltaTable(str(lake / "delta")).to_pyarrow_table()
    assert total(catalog, "changes") == [{"n": delta.num_rows, "s": sum(delta["v"].to_pylist())}]
    first = DeltaTable(str(lake / "delta"), version=0).to_pyarrow_table()
    assert total(catalog, "first") == [{"n": first.num_rows, "s": sum(first["v"].to_pylist())}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[tabels]\nx = 'y'", r"unknown sections \['tabels'\]"),
        ("[tables]\nx = { csv = '/a' }", r"table 'x' must be a path, or a table with one of 'parquet' or 'delta'"),
        ("[tables]\nx = { parquet = '/a', version = 2 }", r"table 'x' has keys \['version'\] it does not take"),
        ("[iceberg.lake]\ntype = 'sql'\nuri = 'sqlite:///nowhere/s3cret.db'", r"needs tables = "),
        ("[iceberg.lake]\ntype = 'nosuchkind'\npassword = 's3cret'\ntables = { t = 'a.b' }", r"\[iceberg.lake\] cannot be opened"),
        ("tables = [", r"not TOML"),
    ],
    ids=["section", "kind", "extra key", "no tables", "bad catalog", "syntax"],
)
def test_what_is_wrong_is_named_without_values(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    with pytest.raises(flight.PlanError, match=message) as raised:
        load_catalog_file(path)
    assert "s3cret" not in str(raised.value)


def test_the_service_serves_a_catalog_file(lake: Path) -> None:
    import adbc_driver_flightsql.dbapi as dbapi

    proc = subprocess.Popen([sys.executable, "-m", "flight.service", "--port", "0", "--local-workers", "1", "--data-root", str(lake),
                             "--catalog", str(lake / "catalog.toml")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1]
        with dbapi.connect(url, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("select count(*) as n from trips join events on trips.id = events.id")
            assert cur.fetchall() == [(20,)]
            names = {t["table_name"] for c in conn.adbc_get_objects(depth="tables").read_all().to_pylist()
                     for s in c["catalog_db_schemas"] for t in s["db_schema_tables"]}
            assert names == {"changes", "events", "first", "raw", "trips"}
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        if proc.stdout is not None:
            proc.stdout.close()
