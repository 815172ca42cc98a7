"""The committed stubs are exactly what scripts/gen_proto.sh generates from proto/kvpool.proto."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not on PATH")
def test_committed_stubs_match_proto():
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) regenerates the stubs")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gen_proto.sh"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_stubs_import_as_package_modules():
    from kvpool.proto import kvpool_pb2, kvpool_pb2_grpc

    assert kvpool_pb2.DESCRIPTOR.package == "kvpool.v1"
    assert hasattr(kvpool_pb2_grpc, "MasterServiceStub") and hasattr(kvpool_pb2_grpc, "NodeServiceStub")
