"""Load test of the service: a real ``sacplan serve`` on 127.0.0.1, driven by wrk (or an httpx async client).

The client is ``wrk`` when it is on PATH (``apt-get install wrk``): one C thread
that leaves the cores to the server. Without it, an httpx async client in this
process (which needs about as much CPU per request as the server). The table
says which one ran.

Scenarios, each at 1, 8 and 32 concurrent clients (closed loop, no think time):

* ``plan-cached``: ``POST /v1/plans`` for a plan already solved (cache hit, no solver);
* ``plan-get``: ``GET /v1/plans/{id}``;
* ``stats-upload``: ``POST /v1/stats`` of the two-layer example with a unique tag (a new row each time).

Prints a markdown table; ``--write`` puts it into bench/RESULTS.md under "## Service load".

    python bench/bench_service.py --write --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model  # noqa: E402

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
L4 = REPO / "tests" / "data" / "torch_format_transformer_L4.json"
SECTION = "## Service load"
sys.path.insert(0, str(REPO))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(data_dir: Path, port: int, workers: int, cpus: str | None = None,
                 settings: dict[str, str] | None = None) -> subprocess.Popen:
    exe = shutil.which("sacplan")
    cmd = (["taskset", "-c", cpus] if cpus else []) + ([exe] if exe else [sys.executable, "-m", "planner.cli"]) + [
        "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir),
        "--workers", str(workers), "--no-access-log", "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SACPLAN_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(settings or {})
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit("server exited")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its children (Linux /proc; uvicorn workers are children),
    so server cost is seen apart from machine load."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        children += [int(c) for c in task.read_text().split()]
    return own + sum(cpu_seconds(c) for c in children)


async def run_level(url: str, concurrency: int, total: int, make_request, server_pid: int) -> dict:
    """``concurrency`` clients, each its own keep-alive connection, sharing ``total`` requests."""
    latencies: list[float] = []
    errors = 0
    counter = iter(range(total))

    async def client_loop() -> None:
        nonlocal errors
        # One AsyncClient per simulated client: httpx's shared pool gets slow with many connections.
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await make_request(client, -1)  # connect before timing starts
            await ready.wait()
            for i in counter:
                t0 = time.perf_counter()
                try:
                    r = await make_request(client, i)
                    ok = r.status_code < 400
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - t0)
                errors += not ok

    ready = asyncio.Event()
    tasks = [asyncio.ensure_future(client_loop()) for _ in range(concurrency)]
    await asyncio.sleep(0.5)
    t0 = time.perf_counter()
    cpu0 = cpu_seconds(server_pid)
    ready.set()
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t0
    server_cpu = cpu_seconds(server_pid) - cpu0
    ms = np.array(latencies) * 1000
    return {"clients": concurrency, "requests": len(ms), "errors": errors, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "req_s": len(ms) / elapsed,
            "server_cpu_ms": 1000 * server_cpu / len(ms)}


# --- wrk -----------------------------------------------------------------------------------------

# Each request's body from WRK_BODY; with WRK_UNIQUE the placeholder __UNIQUE__ becomes a fresh token
# (a new stats row each time). With WRK_EXPECT_HIT every response must carry X-Cache: hit.
WRK_LUA = r"""
local body = os.getenv("WRK_BODY")
local unique = os.getenv("WRK_UNIQUE")
local expect_hit = os.getenv("WRK_EXPECT_HIT")
local threads = {}
local n = 0
misses = 0
wrk.headers["Content-Type"] = "application/json"

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function request()
  if not body then return wrk.format("GET") end
  if unique then
    n = n + 1
    return wrk.format("POST", nil, nil, (body:gsub("__UNIQUE__", unique .. "-" .. id .. "-" .. n)))
  end
  return wrk.format("POST", nil, nil, body)
end

if expect_hit then
  function response(status, headers, _)
    if status == 200 and headers["x-cache"] ~= "hit" and headers["X-Cache"] ~= "hit" then misses = misses + 1 end
  end
end

function done()
  local total = 0
  for _, t in ipairs(threads) do total = total + t:get("misses") end
  io.write(string.format("cache misses: %d\n", total))
end
"""

_UNIT_MS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", text).groups()
    return float(value) * _UNIT_MS[unit]


def parse_wrk(out: str) -> dict:
    """Requests, errors (socket errors + non-2xx/3xx), p50/p99 and rate from ``wrk --latency`` output."""
    requests = int(re.search(r"(\d+) requests in", out)[1])
    errors = sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors += int(non2xx[1]) if non2xx else 0
    misses = re.search(r"cache misses: (\d+)", out)
    return {"requests": requests, "errors": errors, "p50_ms": _ms(re.search(r"50%\s+(\S+)", out)[1]),
            "p99_ms": _ms(re.search(r"99%\s+(\S+)", out)[1]),
            "req_s": float(re.search(r"Requests/sec:\s+([0-9.]+)", out)[1]),
            "misses": int(misses[1]) if misses else 0}


def run_wrk(wrk: str, target: str, concurrency: int, seconds: float, server_pid: int, script: Path,
            env: dict[str, str], client_cpus: str | None) -> dict:
    """One wrk run: ``concurrency`` keep-alive connections on one thread for ``seconds``."""
    cmd = [wrk, "-t1", f"-c{concurrency}", f"-d{seconds:g}s", "--latency", "--timeout", "10s", "-s", str(script), target]
    if client_cpus:
        cmd = ["taskset", "-c", client_cpus] + cmd
    cpu0, busy0, client0, t0 = cpu_seconds(server_pid), machine_busy_seconds(), children_cpu_seconds(), time.monotonic()
    out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout
    server_cpu = cpu_seconds(server_pid) - cpu0
    client_cpu = children_cpu_seconds() - client0
    other_cores = (machine_busy_seconds() - busy0 - server_cpu - client_cpu) / (time.monotonic() - t0)
    res = parse_wrk(out)
    if res.pop("misses"):
        raise SystemExit(f"a benchmarked plan request was not a cache hit:\n{out}")
    return {"clients": concurrency, **res, "server_cpu_ms": 1000 * server_cpu / max(res["requests"], 1),
            "other_cores": max(other_cores, 0.0)}


def machine_busy_seconds() -> float:
    """CPU time all cores spent busy so far (Linux /proc/stat: everything but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """CPU time of finished child processes (the wrk runs; the server is still running)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main_wrk(args, wrk: str) -> list[tuple[str, dict]]:
    from service.examples import EXAMPLE_STATS

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    rows: list[tuple[str, dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "bench.lua"
        script.write_text(WRK_LUA)
        proc = start_server(Path(tmp) / "data", port, args.workers, args.server_cpus)
        try:
            with httpx.Client(base_url=url, timeout=120) as c:
                stats_id = c.post("/v1/stats", json=json.loads(L4.read_text())).json()["id"]
                plan_req = {"stats_id": stats_id, "memory_budget_gib": 5.0, "time_limit_s": 60}
                plan = c.post("/v1/plans", json=plan_req).json()
                assert plan["status"] == "optimal", plan
            doc = json.loads(json.dumps(EXAMPLE_STATS))
            doc["metadata"]["tags"] = {"bench": "__UNIQUE__"}
            scenarios = (
                ("plan-cached (POST /v1/plans, hit)", "/v1/plans",
                 {"WRK_BODY": json.dumps(plan_req), "WRK_EXPECT_HIT": "1"}),
                ("plan-get (GET /v1/plans/{id})", f"/v1/plans/{plan['id']}", {"WRK_EXPECT_HIT": "1"}),
                ("stats-upload (POST /v1/stats, new row)", "/v1/stats",
                 {"WRK_BODY": json.dumps(doc), "WRK_UNIQUE": str(time.time_ns())}),
            )
            for name, path, env in scenarios:
                if args.only and not name.startswith(args.only):
                    continue
                for level in args.levels:
                    res = run_wrk(wrk, url + path, level, args.seconds, proc.pid, script, env, args.client_cpus)
                    rows.append((name, res))
                    print(f"{name:42s} {res}", file=sys.stderr)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    return rows


def server_stack() -> str:
    """What serves the requests: uvicorn with the service's h11 protocol, on uvloop when it is installed."""
    import importlib.util

    import uvicorn

    loop = "uvloop" if importlib.util.find_spec("uvloop") else "the asyncio event loop"
    return f"uvicorn {uvicorn.__version__}, the service's h11 protocol (`service/transport/server.py`), {loop}"


def machine() -> str:
    cpu = cpu_model()
    return f"{os.cpu_count()} CPU cores ({cpu}), Linux, Python {platform.python_version()}"


async def main_async(args) -> list[tuple[str, dict]]:
    from service.examples import EXAMPLE_STATS

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    rows: list[tuple[str, dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_server(Path(tmp), port, args.workers)
        try:
            async with httpx.AsyncClient(base_url=url, timeout=120) as c:
                stats_id = (await c.post("/v1/stats", json=json.loads(L4.read_text()))).json()["id"]
                plan_req = {"stats_id": stats_id, "memory_budget_gib": 5.0, "time_limit_s": 60}
                plan = (await c.post("/v1/plans", json=plan_req)).json()
                assert plan["status"] == "optimal", plan
            plan_id = plan["id"]
            body = json.dumps(plan_req).encode()

            async def plan_cached(client, _i):
                r = await client.post("/v1/plans", content=body, headers={"content-type": "application/json"})
                if r.status_code == 200 and r.headers.get("x-cache") != "hit":
                    raise SystemExit("a benchmarked plan request was not a cache hit")
                return r

            async def plan_get(client, _i):
                return await client.get(f"/v1/plans/{plan_id}")

            def upload_body(i: int) -> bytes:
                doc = json.loads(json.dumps(EXAMPLE_STATS))
                doc["metadata"]["tags"] = {"bench": f"{time.time_ns()}-{i}"}
                return json.dumps(doc).encode()

            async def stats_upload(client, i):
                return await client.post("/v1/stats", content=upload_body(i),
                                         headers={"content-type": "application/json"})

            for name, fn, total in (("plan-cached (POST /v1/plans, hit)", plan_cached, args.reads),
                                    ("plan-get (GET /v1/plans/{id})", plan_get, args.reads),
                                    ("stats-upload (POST /v1/stats, new row)", stats_upload, args.writes)):
                for level in (1, 8, 32):
                    res = await run_level(url, level, total, fn, proc.pid)
                    rows.append((name, res))
                    print(f"{name:42s} {res}", file=sys.stderr)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    return rows


def table(rows: list[tuple[str, dict]]) -> str:
    other = any("other_cores" in r for _, r in rows)
    out = ["| scenario | clients | requests | errors | p50 ms | p99 ms | req/s | server CPU ms/req |"
           + (" other work, cores |" if other else ""),
           "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if other else "")]
    for name, r in rows:
        out.append(f"| {name} | {r['clients']} | {r['requests']} | {r['errors']} | {r['p50_ms']:.2f} | "
                   f"{r['p99_ms']:.2f} | {r['req_s']:.0f} | {r['server_cpu_ms']:.2f} |"
                   + (f" {r['other_cores']:.2f} |" if other else ""))
    return "\n".join(out)


def verdict(rows: list[tuple[str, dict]], client: str) -> str:
    """The target, met or not, and why: a closed loop of n clients at p99 <= 20 ms needs about n / 20 ms req/s."""
    at32 = [r for name, r in rows if name.startswith("plan-") and r["clients"] == 32]
    worst = max((r["p99_ms"] for r in at32), default=float("nan"))
    best_rate = min((r["req_s"] for r in at32), default=float("nan"))
    errors = sum(r["errors"] for _, r in rows)
    met = worst <= 20.0 and errors == 0
    uploads = [r for name, r in rows if name.startswith("stats-upload") and r["clients"] == 32]
    upload_line = ""
    if uploads:
        up = uploads[0]
        upload_line = (f"Target (upload p99 <= 200 ms at 32 clients): **{'met' if up['p99_ms'] <= 200 else 'not met'}"
                       f"** (p99 {up['p99_ms']:.0f} ms at {up['req_s']:.0f} req/s, {up['server_cpu_ms']:.2f} ms "
                       f"server CPU per upload). ")
    return (upload_line +
            f"Target (cached plan read p99 <= 20 ms at 32 clients, zero errors): **{'met' if met else 'not met'}** "
            f"(worst p99 at 32 clients {worst:.1f} ms, errors {errors}, client {client}). With 32 clients and no "
            f"think time, mean latency is about 32 / throughput (Little's law): p99 <= 20 ms needs well over "
            f"1600 req/s and no stalls; the slower cached-read scenario reached {best_rate:.0f} req/s. "
            f"'server CPU ms/req' is the server processes' own CPU time per request (all workers), much less "
            f"affected by other load on the machine; 'other work, cores' is the average number of cores busy with "
            f"processes that are neither the server nor the client during the row (other sessions on this "
            f"machine), taken from /proc/stat.")


def write_results(text: str, section: str = SECTION) -> None:
    """Put ``text`` (starting with its ``section`` heading) into bench/RESULTS.md in place of the old one."""
    path = REPO / "bench" / "RESULTS.md"
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    if section in old:
        start = old.index(section)
        nxt = old.find("\n## ", start + len(section))
        old = old[:start].rstrip("\n") + ("\n\n" + old[nxt + 1:] if nxt != -1 else "\n")
    path.write_text(old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=("auto", "wrk", "httpx"), default="auto",
                        help="load generator: wrk when on PATH (auto), else the httpx async client")
    parser.add_argument("--seconds", type=float, default=5.0, help="wrk: seconds per scenario and level")
    parser.add_argument("--reads", type=int, default=3000, help="httpx: requests per read scenario and level")
    parser.add_argument("--writes", type=int, default=600, help="httpx: requests per upload level")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn workers of the server")
    parser.add_argument("--server-cpus", default=None, help="pin the server to these CPUs (taskset list, e.g. 0)")
    parser.add_argument("--client-cpus", default=None, help="wrk: pin the client to these CPUs (e.g. 1)")
    parser.add_argument("--write", action="store_true", help="write the table into bench/RESULTS.md")
    parser.add_argument("--only", default=None, help="wrk: only the scenarios whose name starts so (stats-upload)")
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32],
                        help="wrk: concurrent clients per row, comma-separated (default 1,8,32)")
    args = parser.parse_args()
    wrk = shutil.which("wrk") if args.client != "httpx" else None
    if args.client == "wrk" and wrk is None:
        raise SystemExit("wrk is not on PATH (apt-get install wrk)")
    load_before = os.getloadavg()[0]
    rows = main_wrk(args, wrk) if wrk else asyncio.run(main_async(args))
    load_after = os.getloadavg()[0]
    cmd = "python bench/bench_service.py " + " ".join(sys.argv[1:])
    pinning = (f"server pinned to CPUs {args.server_cpus or 'any'}, client to {args.client_cpus or 'any'}"
               if args.server_cpus or args.client_cpus else "nothing pinned")
    if wrk:
        version = subprocess.run([wrk, "-v"], capture_output=True, text=True).stdout.split("[")[0].strip()
        client = "wrk"
        how = (f"driven by `{version}` (one thread, keep-alive connections, {args.seconds:g} s per row, "
               f"`--latency`; a Lua script sends the POST bodies and checks every plan answer is `X-Cache: hit`)")
    else:
        client = "httpx"
        how = "driven by an httpx async client in the benchmark process (it needs about as much CPU as the server)"
    text = (f"{SECTION}\n\nA real `sacplan serve --workers {args.workers} --no-access-log` ({server_stack()}; SQLite "
            f"in a temp dir) on 127.0.0.1, {how}; closed loop, no think time, {pinning}. "
            f"Machine: {machine()}.\n"
            f"Load average (1 min) {load_before:.1f} before and {load_after:.1f} after the run (the last column says "
            f"how much other work shared the cores).\nCommand: `{cmd.strip()}`. The plan is the L4 transformer at 5 GiB (solved once before "
            f"timing).\n\n" + table(rows) + "\n\n" + verdict(rows, client) + "\n")
    print(text)
    if args.write:
        write_results(text)


if __name__ == "__main__":
    main()
