"""Every name of the package's modules in one namespace, as the shipped file holds them.

The unit tests read the package's internals as `demo.NAME`, whichever module defines NAME; a
test that replaces a name (monkeypatch) replaces it in the module that looks it up.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import types

import rl_batch_demo

# The package's modules; or, where the generated single file is what imports as rl_batch_demo (the
# benchmarks run it), that file, which holds every name already.
MODULES = (
    {
        info.name: importlib.import_module(f"rl_batch_demo.{info.name}")
        for info in pkgutil.iter_modules(rl_batch_demo.__path__)
        if info.name
        not in (
            "__main__",
            "worker",
            "guardian",
            "sandbox_server",
            "launcher",
        )  # programs shipped as text
    }
    if hasattr(rl_batch_demo, "__path__")
    else {"rl_batch_demo": rl_batch_demo}
)
for _module in MODULES.values():
    globals().update(
        {name: value for name, value in vars(_module).items() if not name.startswith("__")}
    )
__version__ = rl_batch_demo.__version__


class _Copies(types.ModuleType):
    """This namespace holds copies of the modules' names: replacing one here would reach no module
    (a patch that silently tests nothing), so it is refused with where to replace it instead."""

    def __setattr__(self, name: str, value: object) -> None:
        raise _Copies.refusal(name)

    def __delattr__(self, name: str) -> None:
        raise _Copies.refusal(name)

    @staticmethod
    def refusal(name: str) -> AttributeError:
        holders = [key for key, module in MODULES.items() if name in vars(module)]
        return AttributeError(
            f"all_names.{name} is a copy: replace it in each module that looks it up "
            f"(demo.MODULES[...], one of {holders or 'none'})"
        )


sys.modules[__name__].__class__ = _Copies
