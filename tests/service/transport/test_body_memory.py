"""The bodies a service process holds at once are bounded by bytes, not only by count (issue 33: eight 64 MiB
uploads at once were all read in, held and queued): past ``held_bytes`` a request is 503 with Retry-After before
its body is read, and the memory comes back when each answer is sent."""

from __future__ import annotations

import asyncio

import httpx

from service.transport import BodySizeLimit

MIB = 2**20


def _blocking_app():
    """An app that holds each request until ``release`` is set, then answers 200."""
    release = asyncio.Event()

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app, release


def test_bodies_past_the_memory_set_aside_wait_their_turn():
    async def main():
        app, release = _blocking_app()
        limit = BodySizeLimit(app, max_bytes=8 * MIB, held_bytes=5 * MIB, retry_after_s=3)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=limit), base_url="http://t") as c:
            body = b"x" * (2 * MIB)
            first = [asyncio.ensure_future(c.post("/", content=body)) for _ in range(2)]  # 4 MiB held
            await asyncio.sleep(0.2)
            assert limit.held == 4 * MIB
            third = await c.post("/", content=body)  # 6 MiB would pass 5

            async def streamed():  # no Content-Length: counted as it streams in
                for _ in range(4):
                    yield b"x" * (MIB // 2)

            fourth = await c.post("/", content=streamed())
            never = await c.post("/", content=b"x" * (6 * MIB))  # over what is ever held: 413, not a retry
            release.set()
            done = await asyncio.gather(*first)
            assert limit.held == 0
            again = await c.post("/", content=body)
            return third, fourth, never, done, again

    third, fourth, never, done, again = asyncio.run(main())
    assert third.status_code == 503 and third.headers["retry-after"] == "3"
    assert "SACPLAN_BODY_MEMORY_MB" in third.json()["detail"]
    assert fourth.status_code == 503
    assert never.status_code == 413 and "SACPLAN_BODY_MEMORY_MB" in never.json()["detail"]
    assert [r.status_code for r in done] == [200, 200] and again.status_code == 200


async def _until(condition, timeout_s: float = 30.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)


def test_two_large_bodies_stream_in_at_a_time():
    # /healthz waited up to 102 ms while four 63 MiB bodies streamed in at once (each chunk is event-loop work);
    # two at a time: 33-74 ms (bench/RESULTS.md, "Service limits: large bodies")
    async def main():
        app, release = _blocking_app()
        limit = BodySizeLimit(app, max_bytes=8 * MIB, held_bytes=64 * MIB, retry_after_s=3)
        started, gates = [], [asyncio.Event() for _ in range(3)]

        def body(k: int):
            async def chunks():
                started.append(k)
                await gates[k].wait()
                yield b"x" * (2 * MIB)

            return chunks()

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=limit), base_url="http://t") as c:
            posts = []
            for k in range(3):
                posts.append(asyncio.ensure_future(c.post("/", content=body(k),
                                                          headers={"content-length": str(2 * MIB)})))
                await _until(lambda: len(started) == min(k + 1, 2))
            await asyncio.sleep(0.3)
            waiting = sorted(started)  # the third has not begun to send: no slot
            gates[0].set()
            await _until(lambda: len(started) == 3)  # the first body is in: its slot goes to the third
            after_one = sorted(started)
            for gate in gates:
                gate.set()
            release.set()
            done = await asyncio.gather(*posts)
            small = await c.post("/", content=b"x" * MIB)  # a body under the large size never waits for a slot
        return waiting, after_one, done, small

    waiting, after_one, done, small = asyncio.run(main())
    assert waiting == [0, 1] and after_one == [0, 1, 2]
    assert [r.status_code for r in done] == [200, 200, 200] and small.status_code == 200
