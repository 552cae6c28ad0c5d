"""The service's rooms (``service/lazy.py``): each lists its public names in ``__all__``, every one of them is
there, nothing else is, and importing a room loads none of its modules until a name is used."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOMS = ("api", "docs", "views", "solving", "store", "transport")


@pytest.mark.parametrize("room", ROOMS)
def test_every_name_a_room_lists_is_there(room):
    package = importlib.import_module(f"service.{room}")
    assert package.__all__ and len(set(package.__all__)) == len(package.__all__)
    assert [name for name in package.__all__ if not hasattr(package, name)] == []


def test_a_name_a_room_does_not_list_is_no_attribute_of_it():
    import service.store

    assert "stats_row_fields" in service.store.__all__ and "select" not in service.store.__all__
    with pytest.raises(AttributeError, match="has no attribute 'select'"):
        service.store.select  # imported by service.store.plans; listed by no one


def test_a_spawned_process_entry_loads_neither_the_database_nor_the_web_nor_charts():
    # What a solver process and a render process import first (their entry functions' modules).
    code = ("import sys, service.solving.process, service.views.rendering\n"
            "heavy = [m for m in ('sqlalchemy', 'fastapi', 'starlette', 'matplotlib') if m in sys.modules]\n"
            "sys.exit(f'loaded {heavy}' if heavy else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
