"""Type information of the installed package: the py.typed marker, the extension's stubs (_C.pyi,
written by nanobind's stubgen when the wheel is built) and the annotated signatures, which mypy
checks where it is installed. No GPU needed."""

import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tessera

PKG = Path(tessera.__file__).resolve().parent


def test_py_typed_marker():
    assert (PKG / "py.typed").is_file()


def test_extension_stubs_declare_the_bindings():
    stub = PKG / "_C.pyi"
    assert stub.is_file(), f"no {stub}: the build did not run nanobind's stubgen"
    text = stub.read_text(encoding="utf-8")
    for name in ("add", "gelu", "gelu_backward", "silu", "dropout", "copy", "softmax",
                 "log_softmax_backward", "layer_norm", "rms_norm_backward", "isin", "device_count",
                 "time_op", "ops"):
        assert f"def {name}(" in text, name
    for name in ("DeviceArray", "OpInfo", "Report"):
        assert f"class {name}" in text, name


# Every line marked `# error` must be reported, and no other. None of them passes a wrong tensor:
# without torch installed, torch.Tensor (in tessera._interop.TensorLike) is Any to mypy.
GOOD = """
    import tessera
    import tessera.bench
    from tessera import DeviceArray

    def pipeline(x: DeviceArray, w: DeviceArray) -> DeviceArray:
        y: DeviceArray = tessera.softmax(x, dim=-1)
        y = tessera.add(y, 1.0, alpha=0.5)
        y = tessera.layer_norm(y, (1024,), w, None, 1e-5)
        y = tessera.rms_norm(y, 1024, w, out=y)
        y = tessera.dropout(y, 0.1, seed=1, offset=0)
        tessera.random.manual_seed(0)
        return tessera.gelu(tessera.isin(y, 3), approximate="tanh")

    stats: dict[str, float] = tessera.bench.do_bench(lambda: None, min_reps=10)
    gpus: int = tessera.device_count()
"""
BAD = """
    import tessera
    from tessera import DeviceArray

    def pipeline(x: DeviceArray) -> None:
        tessera.softmax(x, dim="-1")  # error
        tessera.layer_norm(x, "1024")  # error
        tessera.gelu(x, approximate=True)  # error
        tessera.dropout(x, p="0.1")  # error
        s: str = tessera.gelu(x)  # error
        tessera.random.manual_seed("0")  # error
"""


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (pip install mypy)")
def test_mypy_checks_the_signatures(tmp_path):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(textwrap.dedent(GOOD), encoding="utf-8")
    bad.write_text(textwrap.dedent(BAD), encoding="utf-8")
    # From tmp_path, so that mypy finds the installed tessera, not a source tree in the cwd.
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--no-error-summary",
                        "--cache-dir", str(tmp_path / "cache"), "good.py", "bad.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = re.findall(r"^(good|bad)\.py:(\d+): error:", r.stdout, re.MULTILINE)
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 2: mypy itself failed
    expected = {("bad", str(i)) for i, line in enumerate(bad.read_text().splitlines(), 1)
                if line.endswith("# error")}
    assert set(errors) == expected, r.stdout
