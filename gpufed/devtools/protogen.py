"""`python -m gpufed.devtools.protogen`: regenerate estimator_pb2.py and estimator_pb2.pyi.

Owns: running grpcio-tools' protoc on estimator.proto (`--python_out` and `--pyi_out` only: there is
no `_pb2_grpc` module; the server registers its handlers and the client builds its stubs with the
typed generic APIs of grpc), plus one header in the stub (`PYI_HEADER`). The proto is compiled under
its repository path (`gpupool/estimator/estimator.proto`), which names it in protobuf's global
descriptor pool, so it cannot collide with another `estimator.proto`. A unit test regenerates into a
temporary directory and fails when the committed files differ.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from gpufed.errors import GpufedError

#: The directory the proto path is relative to (the repository root).
ROOT = Path(__file__).resolve().parent.parent.parent
PROTO = "gpupool/estimator/estimator.proto"
#: Where the proto and its generated modules live.
PACKAGE_DIR = ROOT / Path(PROTO).parent
GENERATED = ("estimator_pb2.py", "estimator_pb2.pyi")
#: Prepended to the stub: protoc writes bare `Mapping` (no type arguments) into the constructors'
#: signatures, which strict mypy refuses; this scopes the exemption to that one generated file.
PYI_HEADER = (
    b"# Added by gpufed.devtools.protogen: protoc's stubs use bare Mapping in constructor signatures.\n"
    b'# mypy: disable-error-code="type-arg"\n'
)


class CodegenError(GpufedError):
    """protoc failed; the message carries its output."""


def generate(out_dir: Path) -> dict[str, bytes]:
    """Compile the proto into `out_dir`; the generated files' contents by name."""
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        str(ROOT / PROTO),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CodegenError(f"protoc failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    where = out_dir / Path(PROTO).parent
    files = {name: (where / name).read_bytes() for name in GENERATED}
    files["estimator_pb2.pyi"] = PYI_HEADER + files["estimator_pb2.pyi"]
    return files


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="gpufed-protoc-") as d:
        try:
            files = generate(Path(d))
        except CodegenError as e:
            print(e, file=sys.stderr)
            return 1
    for name, content in files.items():
        (PACKAGE_DIR / name).write_bytes(content)
        print(f"wrote {PACKAGE_DIR / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
