"""DESIGN's size caps on the sources: every CUDA kernel (a __global__ function, from its template
line to its closing brace) is at most 80 lines, so that it reads in one sitting. Runs on the
repository's sources; skipped where they are not next to the tests (an installed wheel)."""

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
KERNEL_LINES = 80


def kernels(path: Path):
    """(name, first line, lines) of each __global__ function defined in path."""
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        if "__global__" not in lines[i] or lines[i].lstrip().startswith("//"):
            i += 1
            continue
        start = i - 1 if i > 0 and lines[i - 1].lstrip().startswith("template") else i
        j = i
        while j < len(lines) and "{" not in lines[j] and not lines[j].rstrip().endswith(";"):
            j += 1
        if j == len(lines) or "{" not in lines[j]:  # a declaration
            i = j + 1
            continue
        depth, k = 0, j
        while k < len(lines):
            depth += lines[k].count("{") - lines[k].count("}")
            if depth <= 0:
                break
            k += 1
        head = " ".join(lines[i:j + 1]).split("__global__", 1)[1]
        names = [n for n in re.findall(r"(\w+)\s*\(", head) if n != "__launch_bounds__"]
        yield (names[0] if names else "?"), start + 1, k - start + 1
        i = k + 1


@pytest.mark.skipif(not SRC.is_dir(), reason="the repository's sources are not next to the tests")
def test_every_kernel_fits_the_cap():
    found, over = 0, []
    for path in sorted(SRC.rglob("*.cu*")):
        for name, line, n in kernels(path):
            found += 1
            if n > KERNEL_LINES:
                over.append(f"{path.relative_to(SRC.parent)}:{line} {name}: {n} lines")
    assert found > 40, f"the scan found {found} kernels: it no longer reads the sources"
    assert not over, f"kernels over {KERNEL_LINES} lines: " + "; ".join(over)
