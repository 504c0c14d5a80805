"""Generate the Python code for protos/tandem/v1/*.proto, or check that it is up to date.

    python -m protos.generate           # (re)write *_pb2.py, *_pb2.pyi, *_pb2_grpc.py
    python -m protos.generate --check   # exit 1 if the committed code differs from a fresh run

The protos are compiled from the repository root (``-I .``), so generated modules import
each other as ``protos.tandem.v1.*`` without any editing. Needs grpcio-tools (dev extra).
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = Path("protos/tandem/v1")
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out: Path) -> list[Path]:
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(ROOT)) for p in (ROOT / PROTO_DIR).glob("*.proto"))
    args = ["grpc_tools.protoc", "-I", str(ROOT), f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted(p.relative_to(out) for p in (out / PROTO_DIR).iterdir() if p.name.endswith(SUFFIXES))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed code instead of writing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        committed = sorted(p.relative_to(ROOT) for p in (ROOT / PROTO_DIR).iterdir() if p.name.endswith(SUFFIXES))
        if args.check:
            stale = [str(p) for p in fresh if not (ROOT / p).exists() or not filecmp.cmp(Path(tmp) / p, ROOT / p, shallow=False)]
            stale += [f"{p} (no longer generated)" for p in committed if p not in fresh]
            if stale:
                print("generated protobuf code is out of date; run `python -m protos.generate`:\n  "
                      + "\n  ".join(stale), file=sys.stderr)
                return 1
            print(f"protos: {len(fresh)} generated files up to date")
            return 0
        for p in committed:
            if p not in fresh:
                (ROOT / p).unlink()
        for p in fresh:
            (ROOT / p).write_bytes((Path(tmp) / p).read_bytes())
        print(f"protos: wrote {len(fresh)} files under {PROTO_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
