"""What the tests of scripts/*.py share: a script loaded as a module, without running its main."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    """scripts/<name>.py as the module `name` (registered in sys.modules: dataclasses look their
    module up by name)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
