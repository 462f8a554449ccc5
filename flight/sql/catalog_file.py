"""A catalog from a TOML file: named Parquet tables, Delta tables, and the tables of Iceberg catalogs.

``flight-coordinator --catalog FILE`` serves one; ``load_catalog_file(path)`` makes the same
``flight.Catalog`` in Python. The file (read with the standard library's ``tomllib``)::

    [tables]
    lineitem = "/data/tpch/lineitem"                 # Parquet: a file, a directory, a glob, an s3:// prefix
    orders = { parquet = "s3://bucket/orders/" }
    events = { delta = "/data/delta/events" }        # the latest version, or version = N

    [iceberg.lake]                                   # an Iceberg catalog: pyiceberg's load_catalog properties
    type = "sql"
    uri = "sqlite:////data/iceberg/catalog.db"
    warehouse = "file:///data/iceberg/warehouse"
    tables = { trips = "nyc.trips" }                 # SQL name -> the catalog's identifier

An error names the file, the table and the key that is wrong, never a value: an Iceberg catalog's
properties may hold credentials.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from flight.errors import PlanError
from flight.sql.catalog import Catalog

__all__ = ["load_catalog_file", "local_paths"]


def load_catalog_file(path: str | Path) -> Catalog:
    """The catalog ``path`` describes; ``PlanError`` naming what is wrong and where."""
    where = str(path)
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise PlanError(f"catalog {where}: cannot be read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"catalog {where}: not TOML: {exc}") from None
    unknown = sorted(set(data) - {"tables", "iceberg"})
    if unknown:
        raise PlanError(f"catalog {where}: unknown sections {unknown}; it has [tables] and [iceberg.NAME]")
    catalog = Catalog()
    for name, spec in _table(data, "tables", where).items():
        catalog.register(name, _source(name, spec, where))
    for catalog_name, props in _table(data, "iceberg", where).items():
        if not isinstance(props, dict):
            raise PlanError(f"catalog {where}: [iceberg.{catalog_name}] must be a table of properties")
        _iceberg(catalog, catalog_name, dict(props), where)
    return catalog


def local_paths(path: str | Path) -> list[str]:
    """The local files and directories a catalog file names (its tables' paths, its Iceberg warehouses): what workers
    started beside it must be allowed to read (``--data-root``). Object-store URIs are left out; a bad file names none."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return []
    named: list[str] = []
    for spec in (data.get("tables") or {}).values():
        named += [spec] if isinstance(spec, str) else [v for k, v in spec.items() if k in ("parquet", "delta")] if isinstance(spec, dict) else []
    for props in (data.get("iceberg") or {}).values():
        if isinstance(props, dict) and isinstance(props.get("warehouse"), str):
            named.append(props["warehouse"])
    out = []
    for uri in (u for u in named if isinstance(u, str)):
        if uri.startswith("file://"):
            uri = uri[len("file://"):]
        if "://" not in uri:
            out.append(uri)
    return out


def _table(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise PlanError(f"catalog {where}: [{key}] must be a table")
    return value


def _source(name: str, spec: Any, where: str) -> Any:
    if isinstance(spec, str):
        return spec
    if not isinstance(spec, dict) or len({"parquet", "delta"} & set(spec)) != 1:
        raise PlanError(f"catalog {where}: table {name!r} must be a path, or a table with one of 'parquet' or 'delta'")
    extra = sorted(set(spec) - {"parquet", "delta", "version"})
    if extra or ("version" in spec and "delta" not in spec):
        raise PlanError(f"catalog {where}: table {name!r} has keys {extra or ['version']} it does not take")
    if "parquet" in spec:
        return str(spec["parquet"])
    from flight.tables.delta import read_delta

    version = spec.get("version")
    if version is not None and (not isinstance(version, int) or version < 0):
        raise PlanError(f"catalog {where}: table {name!r}: version must be a whole number, 0 or more")
    return read_delta(str(spec["delta"]), version=version)


def _iceberg(catalog: Catalog, catalog_name: str, props: dict[str, Any], where: str) -> None:
    tables = props.pop("tables", None)
    if not isinstance(tables, dict) or not tables:
        raise PlanError(f"catalog {where}: [iceberg.{catalog_name}] needs tables = {{ sql_name = \"namespace.table\", ... }}")
    try:
        from pyiceberg.catalog import load_catalog
    except ImportError:
        raise PlanError(f"catalog {where}: [iceberg.{catalog_name}] needs pyiceberg: pip install 'flight-exec[iceberg]'") from None
    from flight.tables.iceberg import read_iceberg

    try:
        iceberg = load_catalog(catalog_name, **{k: str(v) for k, v in props.items()})
    except Exception as exc:  # noqa: BLE001 - pyiceberg raises many kinds; its text may quote properties
        raise PlanError(f"catalog {where}: [iceberg.{catalog_name}] cannot be opened ({type(exc).__name__})") from None
    for name, identifier in tables.items():
        if not isinstance(identifier, str):
            raise PlanError(f"catalog {where}: [iceberg.{catalog_name}] table {name!r} must name an identifier")
        catalog.register(name, read_iceberg(iceberg, identifier))
