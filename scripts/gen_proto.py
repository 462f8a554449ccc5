"""Regenerate flight/wire/_proto/*_pb2.py(i) from proto/ — the one way generated code is made.

``FlightSql.proto`` and ``Flight.proto`` are the Arrow format's, vendored unchanged (Apache
License 2.0, their headers kept; from apache/arrow's ``format/``): the coordinator service speaks
Flight SQL with their messages (``CancelFlightInfo``'s request and result are Flight.proto's).

Usage: python scripts/gen_proto.py [--check]

With --check, generate into a temporary directory and exit 1 if the checked-in
files differ (tests/test_proto_fresh.py runs this).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = Path("flight") / "wire" / "_proto"


def generate(out_root: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) on every .proto; return the generated files."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto (FlightSql.proto imports one)
    sources = sorted((PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))
    plugin = Path(sys.executable).parent / "protoc-gen-mypy"
    args = [
        "protoc",
        f"--plugin=protoc-gen-mypy={plugin}",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={well_known}",
        f"--python_out={out_root}",
        f"--mypy_out={out_root}",
        *[str(s.relative_to(PROTO_ROOT)) for s in sources],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out_root / PACKAGE_DIR).glob("*_pb2.py*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if checked-in code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(Path(tmp))
        target = ROOT / PACKAGE_DIR
        stale = []
        for path in generated:
            dest = target / path.name
            if not dest.exists() or not filecmp.cmp(path, dest, shallow=False):
                stale.append(path.name)
                if not args.check:
                    shutil.copyfile(path, dest)
        if args.check and stale:
            print(f"stale generated protobuf code: {', '.join(stale)}; run python scripts/gen_proto.py")
            return 1
    print("generated protobuf code is up to date" if args.check else "regenerated " + ", ".join(p.name for p in generated))
    return 0


if __name__ == "__main__":
    sys.exit(main())
