"""What scripts/common.sh asks of a Python interpreter, run by that interpreter (standard library
only: it runs before anything is installed; Python >= 3.10).

    python pyenv.py pick ROOT NAME MODULE   # the environment to use: four lines, VENV, PY,
                                            # BASE_PY (what ROOT/.venv is created from, else
                                            # empty) and why (NAME: what the user calls this
                                            # interpreter; MODULE: torch, or a test's stand-in)
    python pyenv.py unmet REQUIREMENT...    # the requirements pip has to install, one a line
"""

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys


def importable_version(module):
    """The module's version where it imports (any import error counts as not importable), else
    None. Whatever the import prints goes to stderr: stdout is read by the shell."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            mod = importlib.import_module(module)
    except Exception:
        return None
    version = getattr(mod, "__version__", None)
    if not isinstance(version, str):
        try:
            version = importlib.metadata.version(module)
        except importlib.metadata.PackageNotFoundError:
            version = "(version unknown)"
    return version


def pick(root, name, module, environ=os.environ):
    """(VENV, PY, BASE_PY, why). An activated virtual environment is used as it is. Otherwise
    this interpreter's own environment where it is a virtual or conda environment that imports
    the module: a venv layered on it would see its base interpreter's packages, not its own. A
    plain (system) interpreter often refuses packages (PEP 668), but a .venv with its
    site-packages visible sees them: ROOT/.venv on it. The same where the module is not
    importable, for test.sh to install it there."""
    version = importable_version(module)
    found = f"{module} {version} importable" if version else f"{module} not importable"
    if environ.get("VIRTUAL_ENV"):
        return environ["VIRTUAL_ENV"], sys.executable, "", \
            f"the activated virtual environment, used as it is; {found}"
    conda = os.path.isdir(os.path.join(sys.prefix, "conda-meta"))
    if version and conda:
        state = "activated" if environ.get("CONDA_PREFIX") == sys.prefix else "not activated"
        return sys.prefix, sys.executable, "", f"the conda environment of {name}, {state}; {found}"
    if version and sys.prefix != sys.base_prefix:
        return sys.prefix, sys.executable, "", \
            f"the virtual environment of {name}, not activated; {found}"
    venv = os.path.join(root, ".venv")
    base = f"{name} = {sys.executable}"
    if version:
        why = f"the repository's .venv, on {base}, whose packages it sees: {found}"
    else:
        why = f"the repository's .venv, from {base}, which cannot import {module}"
    return venv, os.path.join(venv, "bin", "python"), sys.executable, why


_PRE = re.compile(r"[-_.]?(a|b|c|rc|alpha|beta|pre|preview|dev)\d*", re.I)


def version_key(version):
    """A sort key close to PEP 440's: the release numbers (trailing zeros dropped), a pre-release
    or dev release before its release; a local part (+cu130) ignored."""
    m = re.match(r"v?(\d+(?:\.\d+)*)(.*)", version.split("+")[0].strip().lower())
    if not m:
        raise ValueError(f"not a version: {version!r}")
    release = [int(x) for x in m.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    return tuple(release), 0 if _PRE.match(m.group(2)) else 1


def satisfies(version, specifier):
    """Whether the version meets a comma-separated specifier (">=0.10,<1.2"; the operators >=,
    <=, >, <, ==, !=, ~=; no wildcards)."""
    have = version_key(version)
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        m = re.fullmatch(r"(~=|==|!=|>=|<=|>|<)\s*(\S+)", clause)
        if not m:
            raise ValueError(f"unsupported version specifier: {clause!r}")
        op, want = m.groups()
        key = version_key(want)
        if op == "~=":  # ~=1.4.2: >= 1.4.2 and 1.4.*
            n = len(re.match(r"\d+(?:\.\d+)*", want).group().split(".")) - 1
            release = have[0] + (0,) * n
            ok = have >= key and release[:n] == (key[0] + (0,) * n)[:n]
        else:
            ok = {"==": have == key, "!=": have != key, ">=": have >= key, "<=": have <= key,
                  ">": have > key, "<": have < key}[op]
        if not ok:
            return False
    return True


def unmet(requirements, warn=sys.stderr):
    """The requirements that are not installed. One installed at a version outside its pin
    counts as met where its module imports (a warning says so): an offline machine keeps what it
    has rather than fail on a download. The module is the distribution's name with "_" for "-"
    (so for every requirement pyproject.toml lists)."""
    out = []
    for req in requirements:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)", req)
        name, spec = m.group(1), m.group(2).strip()
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out.append(req)
            continue
        if satisfies(version, spec):
            continue
        if importlib.util.find_spec(re.sub(r"[-.]+", "_", name).lower()) is None:
            out.append(req)
            continue
        print(f"== using installed {name} {version} (pyproject.toml pins {spec})", file=warn)
    return out


def main(argv):
    if argv[:1] == ["pick"] and len(argv) == 4:
        print("\n".join(pick(*argv[1:])))
    elif argv[:1] == ["unmet"]:
        for req in unmet(argv[1:]):
            print(req)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
