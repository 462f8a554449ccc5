"""The Spark Connect client side of the ``sail`` engines, run by the harness as a subprocess of the Sail venv.

Sail 0.7 accepts PySpark Connect clients up to 4.2 and refuses the 4.3 that the
``spark`` extra installs ("unsupported PySpark version: 4.3.0"), so the client
runs in a venv of its own (``pyspark-client``, see ``benchmarks.engines.sail_venv``)
and this script imports nothing but the standard library, PySpark and pyarrow.

Protocol, one JSON object a line on stdin, one answer a line on stdout:

* ``{"remote": "sc://127.0.0.1:PORT", "tables": {name: [parquet paths]}}`` first:
  connect, make one temporary view per table; answers ``{"ok": true, "version": ...}``.
* ``{"sql": TEXT, "out": PATH}``: run ``spark.sql(TEXT).toArrow()`` and write the
  table to PATH as an Arrow IPC file; answers ``{"ok": true, "rows": N}``.
* An error answers ``{"ok": false, "error": "Type: message"}``; end of input stops the session.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _answer(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def main() -> int:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    spark: Any = None
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            if spark is None:
                spark = SparkSession.builder.remote(request["remote"]).getOrCreate()
                for table, paths in request["tables"].items():
                    spark.read.parquet(*paths).createOrReplaceTempView(table)
                _answer({"ok": True, "version": spark.version})
                continue
            result = None  # the text's one query; Q15 makes and drops a view around it (no ';' in TPC-H strings)
            for statement in (x.strip() for x in request["sql"].split(";")):
                if statement:
                    frame = spark.sql(statement)
                    if statement.split(None, 1)[0].lower() in ("select", "with"):
                        result = frame.toArrow()
            if result is None:
                raise ValueError("the text holds no query")
            with pa.OSFile(request["out"], "wb") as sink, pa.ipc.new_file(sink, result.schema) as writer:
                writer.write_table(result)
            _answer({"ok": True, "rows": result.num_rows})
        except Exception as exc:  # noqa: BLE001 - the harness reports it on the query's cell
            message = " ".join(str(exc).split())
            _answer({"ok": False, "error": f"{type(exc).__name__}: {message[:2000]}"})
    if spark is not None:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
