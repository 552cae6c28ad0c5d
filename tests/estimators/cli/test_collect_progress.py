"""The collect progress display: tqdm bars on a terminal, one plain line per phase elsewhere."""

from __future__ import annotations

import io

from estimators.cli import CollectProgress


def _feed(progress: CollectProgress) -> None:
    for k in range(1, 6):
        progress("building", k, 0)
    for k in range(1, 5):
        progress("forward", k, 5)  # one of the 5 never runs (a container): the phase still ends at 4
    for k in range(1, 4):
        progress("backward", k, 5)
    progress("optimizer", 1, 1)
    progress.close()


def test_log_gets_one_line_per_phase():
    stream = io.StringIO()
    _feed(CollectProgress(stream=stream, terminal=False))
    lines = [line.rsplit(" (", 1)[0] for line in stream.getvalue().splitlines()]
    assert lines == ["  building the model: 5 modules", "  forward: 4 modules",
                     "  backward (1 of the 4 modules has no gradient to compute): 3 modules", "  optimizer step"]
    assert "\r" not in stream.getvalue()


def test_terminal_gets_bars_that_end_complete():
    stream = io.StringIO()
    _feed(CollectProgress(stream=stream, terminal=True))
    text = stream.getvalue()
    assert "\r" in text  # tqdm redraws in place
    finals = [chunk for chunk in text.split("\r") if chunk.strip()]
    assert any("forward" in c and "4/4" in c and "100%" in c for c in finals)
    assert any("optimizer step" in c for c in finals)


def test_quiet_writes_nothing():
    stream = io.StringIO()
    _feed(CollectProgress(stream=stream, quiet=True, terminal=False))
    assert stream.getvalue() == ""
