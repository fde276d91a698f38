"""The installed package: import, version, device queries, wheel layout and the `tessera` command."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tessera
import tessera._cli

PKG = Path(tessera.__file__).resolve().parent


def test_version_matches_metadata():
    assert tessera.__version__ == "0.1.0"
    assert importlib.metadata.version("tessera") == tessera.__version__


def test_public_api():
    for name in ("add", "gelu", "gelu_backward", "is_available", "device_count", "no_gpu_reason",
                 "DeviceArray"):
        assert callable(getattr(tessera, name)), name
    for name in ("do_bench", "peaks", "summarize", "Report"):
        assert callable(getattr(tessera.bench, name)), name
    assert tessera.add.__doc__ and tessera.gelu.__doc__ and tessera.bench.do_bench.__doc__


def test_is_available_agrees_with_device_count():
    n = tessera.device_count()
    assert isinstance(n, int) and n >= 0
    assert tessera.is_available() is (n > 0)
    assert (tessera.no_gpu_reason() == "") is (n > 0)


def test_no_gpu_when_devices_hidden():
    # The same query with every device hidden: False and a reason, on any machine.
    code = "import tessera; print(tessera.is_available()); print(tessera.no_gpu_reason())"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    available, reason = r.stdout.splitlines()[:2]
    assert available == "False"
    assert reason


def test_dtype_codes_follow_the_library():
    assert list(tessera._C.DTYPES) == ["float32", "float16", "bfloat16", "float64", "int8", "int16",
                                       "int32", "int64", "uint8", "bool", "float8_e4m3fn",
                                       "float8_e5m2"]
    assert sorted(tessera._C.DTYPES.values()) == list(range(12))


def test_wheel_layout():
    ext = list(PKG.glob("_C.*.so"))
    assert len(ext) == 1
    assert (PKG / "libtessera.so").is_file()
    assert (PKG / "libtessera_harness.so").is_file()  # the bench engine the extension uses
    assert tessera._cli.executable() == PKG / "bin" / "tessera"
    assert os.access(PKG / "bin" / "tessera", os.X_OK)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tessera", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_help_lists_verbs():
    r = run_cli("--help")
    assert r.returncode == 0, r.stderr
    for verb in ("info", "verify", "bench", "profile"):
        assert verb in r.stdout


def test_console_script_runs_the_binary():
    script = Path(sys.executable).parent / "tessera"
    if not script.exists():
        pytest.skip(f"no console script next to {sys.executable} (package installed elsewhere)")
    r = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "bench" in r.stdout


def test_cli_verify_list_names_the_cases_without_a_gpu():
    r = run_cli("verify", "--list", "rms_norm", "add_rms_norm_backward")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    names = {line.split()[0] for line in lines[:-1]}
    assert {"rms_norm", "add_rms_norm_backward"} <= names <= {"rms_norm", "rms_norm_backward", "add_rms_norm_backward"}
    assert lines[-1] == f"{len(lines) - 1} case(s)" and len(lines) > 50
    assert "PASS" not in r.stdout and "FAIL" not in r.stdout


def test_cli_bad_sizes_is_a_usage_error():
    r = run_cli("bench", "--sizes", "abc")
    assert r.returncode == 2
    assert "abc" in r.stderr


def test_cli_wrapper_reports_a_missing_binary(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(tessera._cli, "executable", lambda: tmp_path / "bin" / "tessera")
    monkeypatch.setattr(sys, "argv", ["tessera", "--help"])
    with pytest.raises(SystemExit) as e:
        tessera._cli.main()
    assert e.value.code == 1
    assert "missing" in capsys.readouterr().err


def _module_imports(path: Path):
    """(imported tessera module, at module level?) for each `from . import` of a module's source."""
    import ast
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None:
            found += [(a.name, id(node) in top) for a in node.names]
    return found


def test_torch_state_has_no_import_cycle():
    """tessera._torch publishes into tessera._state and never imports tessera._interop, which
    imports tessera._torch only inside init_ops: no module runs while another is half-loaded."""
    assert _module_imports(PKG / "_state.py") == []
    assert all(name != "_interop" for name, _ in _module_imports(PKG / "_torch.py"))
    assert ("_torch", False) in _module_imports(PKG / "_interop.py")
    assert ("_torch", True) not in _module_imports(PKG / "_interop.py")


def test_state_is_published_once_torch_is_seen():
    code = ("import tessera, torch; from tessera import _state; assert _state.Tensor is None; "
            "tessera.gelu(torch.ones(2)); assert _state.Tensor is torch.Tensor; "
            "assert _state.torch_module is torch and torch.float32 in _state.FLOATS; print('ok')")
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
