"""The `tessera` console script: runs the command-line tool bundled in the wheel (tessera/bin)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def executable() -> Path:
    """Path of the bundled `tessera` binary."""
    return Path(__file__).resolve().parent / "bin" / "tessera"


def main() -> None:
    exe = executable()
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        sys.stderr.write(
            f"tessera: the command-line tool is missing from the package (expected {exe}); "
            "reinstall tessera built with TESSERA_BUILD_CLI=ON (the default of `pip install .`)\n")
        sys.exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, ["tessera", *sys.argv[1:]])


if __name__ == "__main__":
    main()
