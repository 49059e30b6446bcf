"""Every name of the package's modules in one namespace, as the shipped file holds them.

The unit tests read the package's internals as `demo.NAME`, whichever module defines NAME; a
test that replaces a name (monkeypatch) replaces it in the module that looks it up.
"""

from __future__ import annotations

import importlib
import pkgutil

import rl_batch_demo

MODULES = {
    info.name: importlib.import_module(f"rl_batch_demo.{info.name}")
    for info in pkgutil.iter_modules(rl_batch_demo.__path__)
    if info.name not in ("__main__", "worker")
}
for _module in MODULES.values():
    globals().update(
        {name: value for name, value in vars(_module).items() if not name.startswith("__")}
    )
__version__ = rl_batch_demo.__version__
