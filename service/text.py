"""Text the databases can store: no NUL characters, no lone surrogates.

PostgreSQL refuses both in text columns and parameters (a NUL is a ``DataError``,
a lone surrogate cannot be encoded as UTF-8), where SQLite would take them. So
they are refused at the edge, on every backend alike: 422 naming the field,
the character and where it is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from service.errors import InvalidInput

__all__ = ["check_storable"]

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def check_storable(value: str, loc: Sequence[str]) -> None:
    """Raise InvalidInput (422) when ``value`` holds a character no database here can store; ``loc`` names it."""
    m = _UNSTORABLE.search(value)
    if m is None:
        return
    what = "a NUL character (U+0000)" if m[0] == "\x00" else f"a lone surrogate (U+{ord(m[0]):04X})"
    message = f"{'.'.join(loc)} contains {what} at character {m.start()}, which cannot be stored: remove it"
    raise InvalidInput(message, errors=[{"loc": list(loc), "msg": message, "input": value}])
