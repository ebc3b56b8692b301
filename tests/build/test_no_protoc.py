"""The gRPC code is generated without a system protoc (issue 19: a build that needs nothing but
cargo). The crate that holds the generated code is checked in a scratch target directory, so
that its build script really runs, with `protoc` absent from PATH and PROTOC pointing at a file
that does not exist: any code path that still shells out to protoc fails here."""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def path_without_protoc() -> str:
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(d for d in dirs if d and not (Path(d) / "protoc").exists())


def test_generated_grpc_code_builds_without_protoc(tmp_path):
    env = dict(os.environ)
    env["PATH"] = path_without_protoc()
    env["PROTOC"] = str(tmp_path / "no-protoc-here")
    env["CARGO_TARGET_DIR"] = str(tmp_path / "target")
    assert shutil.which("protoc", path=env["PATH"]) is None
    result = subprocess.run(
        ["cargo", "check", "--offline", "-p", "mergestream-proto", "--message-format", "short"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    generated = list((tmp_path / "target").glob("debug/build/mergestream-proto-*/out/mergestream.ingest.v1.rs"))
    assert generated, "the build script did not generate the ingest service"
    assert "pub mod ingest_client" in generated[0].read_text()
