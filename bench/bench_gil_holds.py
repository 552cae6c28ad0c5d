"""How long reading a large stored document back and inserting it hold the GIL, in one process.

A ticker thread sleeps 1 ms at a time beside the work; its longest gap is how long the work kept it (and an event
loop in that process) from running. 120 MiB of ASCII JSON-like text: about what a 63 MiB upload's canonical text is.
Why it matters: issue 33, /healthz during large uploads (bench/RESULTS.md, "Service limits: large bodies").
Command: ``python bench/bench_gil_holds.py``.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import time


def _ticker(stop: threading.Event, out: list[float]) -> None:
    last, worst = time.perf_counter(), 0.0
    while not stop.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    out.append(worst)


def measure(name: str, fn):
    """Run ``fn()`` beside the ticker; print its time and the ticker's longest gap."""
    stop, out = threading.Event(), []
    ticker = threading.Thread(target=_ticker, args=(stop, out))
    ticker.start()
    t0 = time.perf_counter()
    result = fn()
    spent = time.perf_counter() - t0
    stop.set()
    ticker.join()
    print(f"{name}: {spent * 1000:.0f} ms, longest ticker gap {out[0] * 1000:.0f} ms")
    return result


def main() -> None:
    text = ('{"a":[1,2,3],"name":"layers.%d"},' * 4_000_000)[: 120 * 2**20]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "doc.json")
        with open(path, "w") as out:
            out.write(text)
        measure("read the text back, decoded", lambda: open(path, encoding="utf-8").read())
        data = measure("read the bytes", lambda: open(path, "rb").read())
        measure("decode them", lambda: data.decode("utf-8"))
        db = sqlite3.connect(os.path.join(tmp, "t.db"))
        db.execute("create table t (x text)")

        def insert(value) -> None:
            db.execute("insert into t values (?)", (value,))
            db.commit()

        measure("SQLite insert of the text", lambda: insert(text))
        db.close()


if __name__ == "__main__":
    main()
