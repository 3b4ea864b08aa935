"""Regenerate the protobuf / gRPC Python code from protos/dpfed/v1/*.proto.

Usage: python protos/generate.py [--out DIR]   (default: the repository root, which puts the
modules in dpfed/v1/). The generated files are never edited by hand; tests/test_wire_generated.py
fails when they are stale. grpcio-tools is pinned in pyproject.toml so output is reproducible.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"


def generate(out: Path) -> list[Path]:
    from grpc_tools import protoc
    import grpc_tools

    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in (PROTO_DIR / "dpfed").rglob("*.proto"))
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out}",
            f"--pyi_out={out}", f"--grpc_python_out={out}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out / "dpfed").rglob("*_pb2*.py*"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT)
    for path in generate(parser.parse_args().out):
        print(path)
    sys.exit(0)
