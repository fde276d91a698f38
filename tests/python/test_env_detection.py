"""How scripts/test.sh and scripts/main.sh choose their Python environment (pick_env in
scripts/common.sh, the rule in scripts/pyenv.py), against throwaway environments: a marker module
(TESSERA_ENV_PROBE) stands in for torch. Also the pinned requirements' check, which must ask pip
for nothing already installed. CPU only; needs bash."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import script_module

ROOT = Path(__file__).resolve().parents[2]
COMMON = ROOT / "scripts" / "common.sh"
MARKER = "tessera_env_marker"  # the stand-in for torch
ABSENT = "tessera_env_absent"  # a module no environment has

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


pyenv = script_module.load("pyenv")


def make_env(path, marker=True, conda=False):
    """A virtual environment without pip (fast, and pip fails in it as it does offline), with
    the marker module in its site-packages; conda: a conda-meta folder, as conda's prefixes have."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   timeout=120)
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(subprocess.run([str(path / "bin" / "python"), "-c", code], check=True,
                               capture_output=True, text=True, timeout=60).stdout.strip())
    if marker:
        (site / f"{MARKER}.py").write_text('__version__ = "9.9"\n')
    if conda:
        (path / "conda-meta").mkdir()
    return path, site


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return make_env(tmp_path_factory.mktemp("env") / "venv")[0]


def bash(script, root, path_first=None, **extra):
    """Runs the script after sourcing common.sh, in root (the repository root to the script),
    with no environment activated: VIRTUAL_ENV, CONDA_PREFIX, PYTHON and PYTHONPATH unset unless
    given."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHON", "PYTHONPATH", "PYTHONHOME")}
    if path_first:
        environ["PATH"] = f"{path_first}{os.pathsep}{environ['PATH']}"
    environ.update(extra)
    return subprocess.run(["bash", "-c", f'set -euo pipefail; source "$1"; {script}', "bash",
                           str(COMMON)], cwd=root, env=environ, capture_output=True, text=True,
                          timeout=120)


def pick(root, probe=MARKER, **kwargs):
    """pick_env's line and the VENV, PY and BASE_PY it set."""
    r = bash('pick_env; printf "%s\\n" "$VENV" "$PY" "$BASE_PY"', root,
             TESSERA_ENV_PROBE=probe, **kwargs)
    assert r.returncode == 0, r.stderr
    line, venv, py, base = r.stdout.splitlines()
    assert line.startswith(f"== Python: {py} ("), line
    return line, venv, py, base


def same(a, b):
    return Path(a).resolve() == Path(b).resolve()


def test_unactivated_venv_that_imports_the_module_is_used(env, tmp_path):
    # python3 on PATH is the venv's; nothing activated: the venv itself, not a .venv made from it.
    line, venv, py, base = pick(tmp_path, path_first=env / "bin")
    assert same(venv, env)
    assert same(Path(py).parent, env / "bin")
    assert base == ""
    assert f"(the virtual environment of python3, not activated; {MARKER} 9.9 importable)" in line
    assert not (tmp_path / ".venv").exists()


def test_venv_without_the_module_falls_back_to_dot_venv(env, tmp_path):
    line, venv, py, base = pick(tmp_path, probe=ABSENT, path_first=env / "bin")
    assert venv == str(tmp_path / ".venv")
    assert py == str(tmp_path / ".venv" / "bin" / "python")
    assert same(Path(base).parent, env / "bin")  # .venv is made from the python3 found
    assert f"which cannot import {ABSENT})" in line
    assert not (tmp_path / ".venv").exists()  # make_venv creates it, not pick_env


def test_activated_venv_is_used_as_it_is(env, tmp_path):
    line, venv, py, base = pick(tmp_path, probe=ABSENT, VIRTUAL_ENV=str(env))
    assert venv == str(env)
    assert py == str(env / "bin" / "python")
    assert "the activated virtual environment, used as it is" in line


def test_conda_environment_that_imports_the_module_is_used(tmp_path):
    conda, _ = make_env(tmp_path / "conda", conda=True)
    prefix = subprocess.run([str(conda / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
                            check=True, capture_output=True, text=True).stdout.strip()
    root = tmp_path / "repo"
    root.mkdir()
    line, venv, _, base = pick(root, PYTHON=str(conda / "bin" / "python"))
    assert same(venv, conda) and base == ""
    assert "the conda environment of $PYTHON, not activated" in line
    line, venv, _, _ = pick(root, path_first=conda / "bin", CONDA_PREFIX=prefix)
    assert same(venv, conda)
    assert "the conda environment of python3, activated" in line


def test_system_python_that_imports_the_module_gets_dot_venv_on_it(tmp_path):
    # A Python that is no virtual environment: .venv, made from it, sees its packages.
    base_python = os.path.join(sys.base_prefix, "bin", "python%d.%d" % sys.version_info[:2])
    if not os.path.exists(base_python):
        base_python = getattr(sys, "_base_executable", sys.executable)
    probe = subprocess.run(
        [base_python, "-c", "import os, sys; print(sys.prefix == sys.base_prefix and not "
         "os.path.isdir(os.path.join(sys.prefix, 'conda-meta')))"],
        capture_output=True, text=True, timeout=60)
    if probe.stdout.strip() != "True":
        pytest.skip(f"{base_python} is not a plain (system) Python")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / f"{MARKER}.py").write_text('__version__ = "9.9"\n')
    line, venv, py, base = pick(tmp_path, PYTHON=base_python, PYTHONPATH=str(tmp_path / "lib"))
    assert venv == str(tmp_path / ".venv")
    assert same(base, base_python)
    assert f"on $PYTHON = {base}, whose packages it sees: {MARKER} 9.9 importable)" in line


def test_a_venv_made_from_a_venv_does_not_see_its_packages(env, tmp_path):
    # Why an unactivated venv is used directly: --system-site-packages reaches the base
    # interpreter's site-packages, not the venv's, where torch is.
    layered = tmp_path / "layered"
    subprocess.run([str(env / "bin" / "python"), "-m", "venv", "--without-pip",
                    "--system-site-packages", str(layered)], check=True, timeout=120)
    r = subprocess.run([str(layered / "bin" / "python"), "-c", f"import {MARKER}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0


def fake_dist(site, name, version, module=True):
    """An installed distribution's metadata and, with module, its module."""
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if module:
        (site / f"{name.replace('-', '_')}.py").write_text("")


@pytest.fixture
def installed(tmp_path):
    """An environment without pip (so any pip call fails, as offline) holding tessera-fake-in
    1.5, tessera-fake-old 1.0 and tessera-fake-ghost 1.0 (metadata, no module); a root whose
    pyproject.toml pins them and tessera-fake-absent."""
    path, site = make_env(tmp_path / "venv", marker=False)
    fake_dist(site, "tessera-fake-in", "1.5")
    fake_dist(site, "tessera-fake-old", "1.0")
    fake_dist(site, "tessera-fake-ghost", "1.0", module=False)
    root = tmp_path / "repo"
    root.mkdir()
    (root / "pyproject.toml").write_text(
        'requires = ["tessera-fake-in>=1,<2", "tessera-fake-old>=2,<3"]\n'
        'test = ["tessera-fake-ghost>=2", "tessera-fake-absent>=1,<2", "tessera-fake-in"]\n')
    return path, root


def test_installed_requirements_need_no_pip(installed):
    # Met, or installed at another version and importable (kept, with a warning): pip, which
    # this environment lacks, is not called.
    path, root = installed
    r = bash("install_pins build", root, VENV=str(path), PY=str(path / "bin" / "python"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "== using installed tessera-fake-old 1.0 (pyproject.toml pins >=2,<3)" in r.stderr
    assert "pip install" not in r.stdout + r.stderr


def test_missing_requirements_name_the_command_that_installs_them(installed):
    path, root = installed
    py = path / "bin" / "python"
    r = bash("install_pins build test", root, VENV=str(path), PY=str(py))
    assert r.returncode != 0
    # Only the missing ones: not installed, or at another version without a module.
    assert f"{py} -m pip install 'tessera-fake-ghost>=2' 'tessera-fake-absent>=1,<2'\n" in r.stderr
    assert "tessera-fake-in" not in r.stdout + r.stderr


@pytest.mark.parametrize("version, spec, ok", [
    ("2.11.0+cu130", ">=2.5,<2.12", True),
    ("2.12.0", ">=2.5,<2.12", False),
    ("2.4.1", ">=2.5,<2.12", False),
    ("2.6.0a0+gitabc123", ">=2.5,<2.12", True),
    ("2.5.0rc1", ">=2.5", False),
    ("0.10", ">=0.10,<1.2", True),
    ("0.9.10", ">=0.10,<1.2", False),
    ("1.2.0", ">=0.10,<1.2", False),
    ("9.2.99", ">=8,<9.3", True),
    ("9.3.0", ">=8,<9.3", False),
    ("1.26.4", ">=1.24,<2.6", True),
    ("3.0", "==3", True),
    ("3.0.1", "!=3.0.1", False),
    ("1.4.7", "~=1.4.2", True),
    ("1.5.0", "~=1.4.2", False),
    ("2.9", "~=2.2", True),
    ("3.0", "~=2.2", False),
    ("5.0", "", True),
])
def test_version_comparison(version, spec, ok):
    assert pyenv.satisfies(version, spec) is ok


def test_pyproject_pins_are_understood():
    # Every requirement pyproject.toml lists is one the check can compare.
    r = subprocess.run(["bash", "-c", f'source "{COMMON}"; for l in build test torch; do '
                        f'pins "$l" "{sys.executable}"; done'], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    reqs = r.stdout.split()
    assert len(reqs) >= 6
    for req in reqs:
        spec = re.fullmatch(r"[A-Za-z0-9._-]+(.*)", req).group(1)
        pyenv.satisfies("1.0", spec)  # raises on what it cannot read


def test_main_builds_for_the_gpu_it_finds(tmp_path):
    # gpu_archs: TESSERA_CUDA_ARCHITECTURES where set; else the build directory's; else the GPU's own
    # (nvidia-smi's compute capability); else the default of both.
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"

    def archs(cap, **extra):
        smi.write_text(f"#!/bin/sh\necho {cap}\n" if cap else "#!/bin/sh\nexit 9\n")
        smi.chmod(0o755)
        r = bash("gpu_archs", tmp_path, path_first=fake, **extra)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert archs("9.0") == "90a"
    assert archs("8.6") == "80"
    assert archs("") == "80;90a"  # no GPU answered: the default
    assert archs("9.0", TESSERA_CUDA_ARCHITECTURES="80") == "80"
    build = tmp_path / "build"
    build.mkdir()
    (build / "CMakeCache.txt").write_text("CMAKE_CUDA_ARCHITECTURES:STRING=80;90a\n")
    assert archs("9.0") == "80;90a"  # what test.sh configured: nothing compiled twice
