"""What each stored number's column can hold, on every database the service runs on.

Each field of a stats document is bounded (a byte count by ``2**62``), but the
figures the service derives and stores from them are sums: the root's
parameters, gradients and optimizer state at ``2**62`` each give a peak of
``1.4e19`` bytes, past the 64-bit integer column it goes to (SQLite's driver
raised ``OverflowError``, PostgreSQL ``bigint out of range``: a 500). Every
derived figure is checked here before a row is made, against the narrower of
the two databases (``Integer`` is 32-bit on PostgreSQL, 64-bit on SQLite), and
refused with a 422 naming the field, the value and the limit.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

from sqlalchemy import BigInteger, Float, Integer

from service.errors import InvalidInput
from service.store.models import Base

__all__ = ["column_bounds", "check_in_range"]

INT32 = (-(2**31), 2**31 - 1)  # PostgreSQL's integer (SQLite's INTEGER is 64-bit: the narrower one counts)
INT64 = (-(2**63), 2**63 - 1)  # bigint; SQLite's INTEGER
FLOAT = (-sys.float_info.max, sys.float_info.max)  # finite only: the JSON answers cannot carry inf


def column_bounds(model: type[Base], name: str) -> tuple[float, float]:
    """The smallest and largest value ``model.name`` holds on every supported database."""
    kind = model.__table__.columns[name].type
    if isinstance(kind, BigInteger):  # a subclass of Integer: first
        return INT64
    if isinstance(kind, Integer):
        return INT32
    if isinstance(kind, Float):
        return FLOAT
    raise TypeError(f"{model.__name__}.{name} is no numeric column")


def check_in_range(model: type[Base], name: str, value: Any, *, what: str, loc: Sequence[Any],
                   given: Any = None) -> None:
    """Refuse (422) ``value`` for column ``model.name`` when that column cannot hold it.

    ``what`` says in the user's words what the figure is and where it comes
    from; ``loc`` names the request field to blame and ``given`` what the
    client sent there (by default the figure itself).
    """
    if value is None:
        return
    low, high = column_bounds(model, name)
    if isinstance(value, float) and not math.isfinite(value) or not low <= value <= high:
        message = (f"{name} {value} ({what}) is out of the range this service stores, "
                   f"{_shown(low)} to {_shown(high)}")
        raise InvalidInput(message, errors=[{"loc": list(loc), "msg": message,
                                             "input": value if given is None else given}])


def _shown(bound: float) -> str:
    if isinstance(bound, int):
        exponent = bound.bit_length() if bound > 0 else (-bound).bit_length() - 1
        return f"{'-' if bound < 0 else ''}2**{exponent}{' - 1' if bound > 0 else ''}"
    return f"{bound:g}"
