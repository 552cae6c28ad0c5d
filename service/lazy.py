"""A subpackage's public names, loaded from its modules on first use.

Every subpackage of ``service`` lists in its ``__all__`` the names the other
rooms may import from it, and imports none of its modules itself: a solver or
render process is spawned with one module as its entry point
(``service.solving.process``, ``service.views.rendering``) and loads that
module's package on the way, which must not pull in SQLAlchemy, FastAPI or
matplotlib before the process has set itself up.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["exports"]


def exports(package: str, modules: Sequence[str], names: Sequence[str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each of ``names`` from the first of its ``modules`` listing it.

    ``modules`` are ``package``'s modules, in the order they are searched (and loaded); a name not in
    ``names`` is no attribute of the package, whatever its modules define.
    """
    exported = frozenset(names)

    def load(name: str) -> Any:
        if name not in exported:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        for module_name in modules:
            module = importlib.import_module(f"{package}.{module_name}")
            if name in module.__all__:
                value = getattr(module, name)
                setattr(sys.modules[package], name, value)  # looked up once
                return value
        raise AttributeError(f"{package}.__all__ lists {name!r}, which none of {', '.join(modules)} exports")

    return load
