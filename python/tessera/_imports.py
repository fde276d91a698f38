"""Running a function right after another package's module is first imported, without importing it.

tessera registers things with parts of torch that take a second or more to import and that most
programs never load: DTensor's sharding rules (torch.distributed.tensor) and inductor's lowerings
(torch._inductor.lowering). ``after_import(name, fn, *args)`` calls ``fn(*args)`` at once where the module is
already loaded, else from the import that loads it, right after the module's code has run.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys


def after_import(name: str, fn, *args) -> None:
    """Calls ``fn(*args)`` now if module ``name`` is loaded, else once its first import has run it
    (once, however often this is called with the same name, function and arguments)."""
    if name in sys.modules:
        fn(*args)
    elif not any(isinstance(f, _Finder) and f.key == (name, fn, args) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, fn, args))


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the module through the other finders and wraps its loader so that the call runs after it."""

    def __init__(self, name, fn, args):
        self.key = (name, fn, args)

    def find_spec(self, name, path, target=None):
        if name != self.key[0]:
            return None
        sys.meta_path.remove(self)  # the lookup below, and later imports, without this finder
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader, (_, fn, args) = spec.loader, self.key

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                fn(*args)

            def __getattr__(self, attr):  # get_source, resource readers, ...: the real loader's
                return getattr(loader, attr)

        spec.loader = Loader()
        return spec
