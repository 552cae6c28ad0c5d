"""Hard bounds of the service, measured on a real ``sacplan serve``: time limits, the solver memory cap, big reads.

A synthetic transformer of about 20,000 modules (``bench/synthetic.py``: the
L4 sample's middle block repeated) is uploaded once; then, each timed from
sending the request to the whole answer:

* ``POST /v1/plans`` with ``time_limit_s=3`` (done when: answered within 6 s);
* ``POST /v1/sweeps`` of 64 budgets with ``time_limit_s=10`` (done when: within 12 s);
* the largest resident memory of any solver process during both, sampled every
  20 ms, against ``SACPLAN_SOLVER_MEMORY_MB``;
* the upload itself and ``GET /v1/stats/{id}`` of it, each while ``/healthz`` is asked every
  50 ms: the slowest ``/healthz`` answer meanwhile (the event loop never waits
  for the read-back);
* the server processes' own resident memory after all that.

    python bench/bench_limits.py --write
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_service import _free_port, machine, start_server, write_results  # noqa: E402
from synthetic import make_layers  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
L4 = REPO / "tests" / "data" / "torch_format_transformer_L4.json"
SECTION = "## Service limits"
MIB = 2**20


def solver_rss(server: psutil.Process) -> int:
    """The largest RSS of the server's spawned children: during a solve, the solver process (render ones idle)."""
    peak = 0
    for child in server.children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                peak = max(peak, child.memory_info().rss)
        except psutil.Error:
            pass
    return peak


def tree_rss(server: psutil.Process) -> int:
    """The sum of RSS over the server process and all its descendants (solver and render processes)."""
    total = 0
    for p in [server, *server.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class PeakRss:
    """The largest ``sample(server)`` (default: the solver process's RSS) while running, every 20 ms."""

    def __init__(self, server_pid: int, sample=solver_rss):
        self.server = psutil.Process(server_pid)
        self.sample = sample
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, self.sample(self.server))
            time.sleep(0.02)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def timed(c: httpx.Client, method: str, path: str, **kw) -> tuple[float, httpx.Response]:
    t0 = time.perf_counter()
    r = c.request(method, path, **kw)
    return time.perf_counter() - t0, r


def _probe_healthz(url: str, stop, slowest_ms) -> None:
    """In its own process: ask /healthz every 50 ms until ``stop`` is set; the slowest answer into ``slowest_ms``."""
    with httpx.Client(base_url=url, timeout=60) as c:
        while not stop.is_set():
            seconds, r = timed(c, "GET", "/healthz")
            assert r.status_code == 200
            slowest_ms.value = max(slowest_ms.value, seconds * 1000)
            time.sleep(0.05)


def slowest_healthz_during(url: str, work) -> tuple[float, float, object]:
    """Run ``work()`` while asking /healthz every 50 ms: (slowest /healthz s, work's own s, work's result).

    The prober is a process of its own, as a monitor would be: a thread beside ``work``'s clients waited for this
    process's GIL (building eight HTTP clients at once held it for most of a second) and timed that as well."""
    context = multiprocessing.get_context("spawn")
    stop, slowest_ms = context.Event(), context.Value("d", 0.0)
    prober = context.Process(target=_probe_healthz, args=(url, stop, slowest_ms))
    prober.start()
    time.sleep(1.0)  # the prober's interpreter has started and asks already
    t0 = time.perf_counter()
    try:
        result = work()
    finally:
        spent = time.perf_counter() - t0
        stop.set()
        prober.join()
    return slowest_ms.value / 1000, spent, result


def server_rss_mib(pid: int) -> float:
    """RSS of the server process itself (not its solver or render children), MiB."""
    return psutil.Process(pid).memory_info().rss / MIB


def run(args) -> list[str]:
    source = json.loads(L4.read_text())
    doc = make_layers(source, args.layers)
    body = json.dumps(doc).encode()
    modules = len(doc["module_info"]["mod_stats"])
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    lines = []
    settings = {"SACPLAN_SOLVER_MEMORY_MB": str(args.memory_mb)}
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_server(Path(tmp) / "data", port, 1, settings=settings)
        try:
            with httpx.Client(base_url=url, timeout=600) as c:
                slowest, up_s, up = slowest_healthz_during(url, lambda: c.post(
                    "/v1/stats", content=body, headers={"content-type": "application/json"}))
                assert up.status_code == 201, up.text[:500]
                stats_id = up.json()["id"]
                baseline_gib = up.json()["baseline_peak_gib"]
                lines.append(f"| upload ({len(body) / MIB:.0f} MiB, {modules} modules) | - | {up_s:.1f} | "
                             f"{up.status_code} | slowest /healthz meanwhile {slowest * 1000:.0f} ms |")
                if args.upload_only:
                    return lines
                with PeakRss(proc.pid) as rss:
                    budget = round(baseline_gib * 0.6, 3)
                    plan_s, plan = timed(c, "POST", "/v1/plans", json={
                        "stats_id": stats_id, "memory_budget_gib": budget, "time_limit_s": 3})
                    p = plan.json()
                    lines.append(f"| plan, 1 budget ({budget} GiB) | 3 | {plan_s:.2f} | {plan.status_code} | "
                                 f"{p.get('status')} |")
                    budgets = [round(baseline_gib * (0.3 + 0.7 * k / 63), 4) for k in range(64)]
                    sweep_s, sweep = timed(c, "POST", "/v1/sweeps", json={
                        "stats_id": stats_id, "budgets_gib": budgets, "time_limit_s": 10})
                    points = sweep.json().get("points", [])
                    counts: dict[str, int] = {}
                    for pt in points:
                        counts[pt["status"]] = counts.get(pt["status"], 0) + 1
                    said = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
                    lines.append(f"| sweep, 64 budgets | 10 | {sweep_s:.2f} | {sweep.status_code} | {said} |")
                slowest, read_s, read = slowest_healthz_during(url, lambda: c.get(f"/v1/stats/{stats_id}"))
                lines.append(f"| GET /v1/stats/{{id}} ({len(read.content) / MIB:.0f} MiB answer) | - | "
                             f"{read_s:.2f} | {read.status_code} | slowest /healthz meanwhile "
                             f"{slowest * 1000:.0f} ms |")
                after_mib = server_rss_mib(proc.pid)
        finally:
            proc.send_signal(2)
            proc.wait(timeout=60)
    return [f"| request | time_limit_s | answered in s | HTTP | result |", "|---|---:|---:|---:|---|", *lines,
            "", f"Largest solver process RSS during the plan and the sweep: **{rss.peak_bytes / MIB:.0f} MiB** "
                f"(cap SACPLAN_SOLVER_MEMORY_MB={args.memory_mb}). Server process RSS afterwards "
                f"(without its solver and render processes): {after_mib:.0f} MiB."]


LARGE_SECTION = "## Service limits: large bodies"


def _body_of_size(source: dict, mib: float, tag: str) -> bytes:
    """A synthetic PyTorch-format document of about ``mib`` MiB; ``tag`` makes its content (its hash) its own."""
    layers = max(2, int(mib * 1428 / 28))  # 1428 blocks: 28 MiB
    doc = make_layers(source, layers)
    doc["model"] = f"{doc.get('model', 'synthetic')} {tag}"
    return json.dumps(doc).encode()


def run_large_bodies(args) -> list[str]:
    """Peak RSS across the server's processes and the slowest /healthz: one and 8 concurrent 64 MiB uploads, and
    a 29 MB inline plan with time_limit_s=3 (63 MiB: the largest synthetic body under the 64 MiB limit)."""
    source = json.loads(L4.read_text())
    uploads = [_body_of_size(source, 63, f"upload {k}") for k in range(8)]  # under the 64 MiB body limit
    inline = _body_of_size(source, 27.7, "inline")  # ~29 MB
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"PYTHONPATH": args.tree} if args.tree else {}
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_server(Path(tmp) / "data", port, 1, settings=env)
        try:
            def one(c: httpx.Client, body: bytes, path: str = "/v1/stats") -> httpx.Response:
                return c.post(path, content=body, headers={"content-type": "application/json"})

            with httpx.Client(base_url=url, timeout=900) as c:
                base_mib = sum(p.memory_info().rss for p in [psutil.Process(proc.pid),
                                                             *psutil.Process(proc.pid).children(True)]) / MIB
                with PeakRss(proc.pid, tree_rss) as rss:
                    slowest, spent, r = slowest_healthz_during(url, lambda: one(c, uploads[0]))
                lines.append(f"| one upload ({len(uploads[0]) / MIB:.0f} MiB) | {spent:.1f} | {r.status_code} | "
                             f"{rss.peak_bytes / MIB:.0f} | {slowest * 1000:.0f} | {_said(r)} |")

                def concurrent():
                    with ThreadPoolExecutor(8) as pool:
                        return list(pool.map(lambda b: one(httpx.Client(base_url=url, timeout=900), b), uploads))

                with PeakRss(proc.pid, tree_rss) as rss:
                    slowest, spent, answers = slowest_healthz_during(url, concurrent)
                codes = ", ".join(f"{n}x {code}" for code, n in sorted(Counter(a.status_code for a in answers).items()))
                lines.append(f"| 8 concurrent uploads ({len(uploads[0]) / MIB:.0f} MiB each) | {spent:.1f} | {codes} | "
                             f"{rss.peak_bytes / MIB:.0f} | {slowest * 1000:.0f} | "
                             f"{'; '.join(sorted({_said(a) for a in answers}))} |")
                request = b'{"memory_budget_gib": 100, "time_limit_s": 3, "stats": ' + inline + b"}"
                with PeakRss(proc.pid, tree_rss) as rss:
                    slowest, spent, r = slowest_healthz_during(url, lambda: one(c, request, "/v1/plans"))
                lines.append(f"| inline plan ({len(request) / 1e6:.0f} MB), time_limit_s=3 | {spent:.2f} | "
                             f"{r.status_code} | {rss.peak_bytes / MIB:.0f} | {slowest * 1000:.0f} | {_said(r)} |")
        finally:
            proc.send_signal(2)
            proc.wait(timeout=60)
    return ["| request | answered in s | HTTP | peak RSS, all server processes, MiB | slowest /healthz ms | said |",
            "|---|---:|---|---:|---:|---|", *lines, "",
            f"The server's processes held {base_mib:.0f} MiB together when it had started (before the first upload)."]


def _said(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text[:80]
    if "status" in body:
        return f"status {body['status']}"
    return (body.get("detail") or "")[:110].replace("|", "/") if r.status_code >= 400 else "stored"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1428, help="blocks of the synthetic model (1428: ~20,000 modules)")
    parser.add_argument("--memory-mb", type=int, default=2048, help="SACPLAN_SOLVER_MEMORY_MB of the server")
    parser.add_argument("--write", action="store_true", help="write the table into bench/RESULTS.md")
    parser.add_argument("--upload-only", action="store_true", help="only the upload row (not written)")
    parser.add_argument("--large-bodies", action="store_true",
                        help="peak RSS across the server's processes for one and 8 concurrent 64 MiB uploads, and a "
                             "29 MB inline plan (section 'Service limits: large bodies')")
    parser.add_argument("--tree", help="serve from this checkout instead (PYTHONPATH), e.g. the tree before a change")
    args = parser.parse_args()
    if args.large_bodies:
        text = "\n".join([LARGE_SECTION, "", f"A real `sacplan serve` (1 worker, default settings, SQLite in a temp "
                          f"dir) on 127.0.0.1; machine: {machine()}. Command: `python bench/bench_limits.py "
                          f"--large-bodies`. `/healthz` asked every 50 ms throughout; RSS of the server and all its "
                          f"processes summed, sampled every 20 ms.", "", *run_large_bodies(args)])
        print(text)
        if args.write:
            write_results(text, LARGE_SECTION)
        return
    lines = run(args)
    if args.upload_only:
        print("\n".join(lines))
        return
    text = "\n".join([
        SECTION, "",
        f"A real `sacplan serve` (1 worker, SQLite in a temp dir) on 127.0.0.1; machine: {machine()}, shared with "
        f"other sessions. Command: `python bench/bench_limits.py{' --write' if args.write else ''}`. Synthetic "
        f"stats: the L4 sample's middle block repeated {args.layers} times (`bench/synthetic.py`). Each time is "
        f"from sending the request to the end of the answer (wall clock).", "", *lines])
    print(text)
    if args.write:
        write_results(text, SECTION)


if __name__ == "__main__":
    main()
