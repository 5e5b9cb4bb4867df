"""The generated stubs inside the package must be what proto/gen.sh makes from proto/."""
import pathlib
import tempfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
PKG = REPO / "clients" / "python"
PROTOS = ["kvmesh/v1/types.proto", "kvmesh/v1/errors.proto", "kvmesh/v1/cache.proto", "kvmesh/v1/admin.proto", "kvmesh/v1/prefill.proto",
          "kvmesh/v1/peer.proto", "kvmesh/v1/object.proto"]


def test_stubs_match_proto():
    protoc = pytest.importorskip("grpc_tools.protoc", reason="needs Debian's python3-grpc-tools")
    # Every .proto must be generated: a new file missing from PROTOS is as stale as an old stub.
    assert sorted(str(p.relative_to(REPO / "proto")) for p in (REPO / "proto" / "kvmesh" / "v1").glob("*.proto")) \
        == sorted(PROTOS), "proto/kvmesh/v1 changed: update PROTOS here and in proto/gen.sh"
    with tempfile.TemporaryDirectory() as out:
        rc = protoc.main(["grpc_tools.protoc", "-I", str(REPO / "proto"), f"--python_out={out}",
                          f"--grpc_python_out={out}", *PROTOS])
        assert rc == 0, "grpc_tools.protoc failed"
        gen = sorted(p.relative_to(out) for p in pathlib.Path(out).rglob("*.py"))
        have = sorted(p.relative_to(PKG) for p in (PKG / "kvmesh" / "v1").glob("*_pb2*.py"))
        assert gen == have, "stubs added or removed: run bash proto/gen.sh"
        stale = [str(p) for p in gen if (pathlib.Path(out) / p).read_bytes() != (PKG / p).read_bytes()]
        assert not stale, f"stale stubs {stale}: run bash proto/gen.sh"
