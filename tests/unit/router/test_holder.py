"""Wake on request's holder (router/holder.py): its queue's bounds without any I/O, then the
endpoint itself over real sockets against a small HTTP server standing in for vLLM (no vLLM:
tests/integration/test_sleep_vllm.py drives the real one)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from vsup.router import RouterMembership
from vsup.router.holder import Holder, HoldQueue, Refusal


def run(coro):
    return asyncio.run(coro)


# -- the queue ---------------------------------------------------------------------------------


def test_the_queue_admits_up_to_its_capacity_then_refuses_with_a_retry_after():
    q = HoldQueue(hold_s=20, capacity=2)
    q.admit()
    q.admit()
    with pytest.raises(Refusal) as exc:
        q.admit()
    assert exc.value.kind == "full" and exc.value.retry_after_s == 5
    assert "hold_queue = 2" in exc.value.why
    assert (q.counts.held, q.counts.total, q.counts.full) == (2, 2, 1)
    q.leave("forwarded")
    q.admit()  # room again
    assert (q.counts.held, q.counts.forwarded) == (2, 1)


def test_requests_held_together_share_one_wake():
    async def main():
        q = HoldQueue(hold_s=5, capacity=10)
        calls = []
        go = asyncio.Event()

        async def wake():
            calls.append(1)
            await go.wait()
            return "http://127.0.0.1:1"

        waits = [asyncio.ensure_future(q.wait(wake)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert q.waking and q.episode is not None
        go.set()
        return calls, await asyncio.gather(*waits)

    calls, urls = run(main())
    assert calls == [1] and urls == ["http://127.0.0.1:1"] * 3


def test_a_held_request_gives_up_after_hold_s_and_the_wake_goes_on():
    async def main():
        q = HoldQueue(hold_s=0.2, capacity=10)
        done = asyncio.Event()

        async def wake():
            await asyncio.sleep(0.5)
            done.set()
            return "http://127.0.0.1:1"

        with pytest.raises(Refusal) as exc:
            await q.wait(wake)
        await asyncio.wait_for(done.wait(), 5)
        return exc.value

    r = run(main())
    assert r.kind == "timeout" and "hold_s = 0.2 s" in r.why and r.retry_after_s == 1


def test_a_wake_that_fails_ends_every_waiting_request_at_once_with_its_reason():
    async def main():
        # an hour's hold_s: only the failed wake can end the waits within the test's timeout
        q = HoldQueue(hold_s=3600, capacity=10)

        async def wake():
            await asyncio.sleep(0.05)
            raise RuntimeError("b: out of memory")

        return await asyncio.gather(*(q.wait(wake) for _ in range(3)), return_exceptions=True)

    results = run(main())
    assert all(isinstance(r, Refusal) and r.kind == "wake_failed" for r in results)
    assert all("b: out of memory" in r.why for r in results)


# -- the endpoint ------------------------------------------------------------------------------


class FakeVllm:
    """An HTTP server that answers POSTs like vLLM would (streamed when asked)."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def serve(self, reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        body = json.loads(await reader.readexactly(length))
        self.bodies.append(body)
        if body.get("stream"):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
            for i in range(3):
                writer.write(f"data: {i}\n\n".encode())
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"data: [DONE]\n\n")
        else:
            out = json.dumps({"model": body["model"], "echo": body.get("prompt")}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
            writer.write(f"content-length: {len(out)}\r\n\r\n".encode() + out)
        await writer.drain()
        writer.close()


async def holding(wake, hold_s=10.0, capacity=8, ended=None):
    def on_end(counts, error):
        if ended is not None:
            ended.append((counts, error))

    holder = Holder("m1", wake, hold_s, capacity, names=("/models/m1",), on_end=on_end)
    await holder.start()
    return holder


def test_the_holder_answers_the_routers_health_and_model_questions():
    async def main():
        async def wake():
            raise AssertionError("no wake for these")

        h = await holding(wake)
        async with httpx.AsyncClient(base_url=h.url) as c:
            health = await c.get("/health")
            models = (await c.get("/v1/models")).json()
        await h.aclose()
        return health.status_code, models

    status, models = run(main())
    assert status == 200
    assert models == {"object": "list", "data": [{"id": "m1", "object": "model"}]}


def test_a_held_request_is_woken_for_and_forwarded_and_a_stream_streams_through():
    async def main():
        vllm = FakeVllm()
        target = await vllm.start()
        go = asyncio.Event()
        ended: list = []

        async def wake():
            await go.wait()
            return target

        h = await holding(wake, ended=ended)
        async with httpx.AsyncClient(base_url=h.url, timeout=10) as c:
            plain = asyncio.ensure_future(
                c.post("/v1/completions", json={"model": "m1", "prompt": "hi"})
            )
            streamed = asyncio.ensure_future(
                c.post("/v1/completions", json={"model": "/models/m1", "stream": True})
            )
            await asyncio.sleep(0.2)
            held = h.queue.counts.held
            go.set()
            a, b = await plain, await streamed
        await asyncio.sleep(0.05)
        await h.aclose()
        return held, a, b, h.queue.counts, ended

    held, a, b, counts, ended = run(main())
    assert held == 2
    assert a.status_code == 200 and a.json() == {"model": "m1", "echo": "hi"}
    assert b.status_code == 200 and b.text == "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    assert (counts.held, counts.forwarded, counts.total) == (0, 2, 2)
    assert len(ended) == 1 and ended[0][0].forwarded == 2 and ended[0][1] is None


def test_a_request_for_another_model_gets_vllms_404():
    async def main():
        async def wake():
            raise AssertionError("no wake for another model")

        h = await holding(wake)
        async with httpx.AsyncClient(base_url=h.url) as c:
            resp = await c.post("/v1/chat/completions", json={"model": "nope", "messages": []})
        await h.aclose()
        return resp

    resp = run(main())
    assert resp.status_code == 404
    assert resp.json() == {
        "error": {
            "message": "The model `nope` does not exist. Valid aliases: m1.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


def test_past_hold_s_a_held_request_is_refused_with_retry_after_and_why():
    async def main():
        async def wake():
            await asyncio.sleep(30)
            return "http://127.0.0.1:1"

        h = await holding(wake, hold_s=0.3)
        async with httpx.AsyncClient(base_url=h.url, timeout=10) as c:
            resp = await c.post("/v1/completions", json={"model": "m1", "prompt": "x"})
        await h.aclose()
        return resp, h.queue.counts

    resp, counts = run(main())
    assert resp.status_code == 507 and resp.headers["retry-after"] == "1"
    err = resp.json()["error"]
    assert err["vsup"] == "timeout" and "hold_s = 0.3 s" in err["message"], err
    assert (counts.held, counts.timed_out) == (0, 1)


def test_a_full_queue_refuses_at_once_and_a_failed_wake_ends_the_held_with_its_reason():
    async def main():
        go = asyncio.Event()

        async def wake():
            await go.wait()
            raise RuntimeError("b was not running and its start ended failed")

        ended: list = []
        h = await holding(wake, capacity=1, ended=ended)
        async with httpx.AsyncClient(base_url=h.url, timeout=10) as c:
            pending = asyncio.ensure_future(c.post("/v1/completions", json={"model": "m1"}))
            await asyncio.sleep(0.2)
            second = await c.post("/v1/completions", json={"model": "m1"})
            go.set()
            first = await pending
        await asyncio.sleep(0.05)
        await h.aclose()
        return first, second, h.queue.counts, ended

    first, second, counts, ended = run(main())
    assert second.status_code == 507 and second.json()["error"]["vsup"] == "full"
    assert "retry-after" in second.headers
    assert first.status_code == 507 and first.json()["error"]["vsup"] == "wake_failed"
    assert "its start ended failed" in first.json()["error"]["message"]
    assert (counts.failed, counts.full, counts.held) == (1, 1, 0)
    assert ended[0][0].failed == 1 and ended[0][0].full == 1
    assert "its start ended failed" in ended[0][1]


def test_a_client_that_goes_away_while_held_is_dropped_from_the_queue():
    async def main():
        go = asyncio.Event()
        vllm = FakeVllm()
        target = await vllm.start()

        async def wake():
            await go.wait()
            return target

        h = await holding(wake)
        _r, w = await asyncio.open_connection("127.0.0.1", h.port)
        body = b'{"model": "m1"}'
        w.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n")
        w.write(f"content-length: {len(body)}\r\n\r\n".encode() + body)
        await w.drain()
        for _ in range(100):
            if h.queue.counts.held == 1:
                break
            await asyncio.sleep(0.02)
        held = h.queue.counts.held
        w.close()
        for _ in range(100):
            if h.queue.counts.dropped == 1:
                break
            await asyncio.sleep(0.02)
        go.set()
        await asyncio.sleep(0.1)
        await h.aclose()
        return held, h.queue.counts, vllm.bodies

    held, counts, forwarded = run(main())
    assert held == 1 and (counts.held, counts.dropped, counts.forwarded) == (0, 1, 0)
    assert forwarded == []  # nothing sent on for a client that left


# -- the router's membership -------------------------------------------------------------------


def test_a_model_with_no_awake_instance_has_its_holder_in_the_router():
    urls = {
        "a": "http://127.0.0.1:8000",
        "b": "http://127.0.0.1:8001",
        "c": "http://127.0.0.1:8002",
    }
    m = RouterMembership(
        urls, {"a": "ma", "b": "mb", "c": "ma"}, standins={"mb": "http://127.0.0.1:9001"}
    )
    assert m.desired({"a": "ready", "b": "excluded", "c": "ready"}) == [
        urls["a"],
        urls["c"],
        "http://127.0.0.1:9001",
    ]
    assert m.desired({"a": "ready", "b": "ready", "c": "ready"}) == list(urls.values())
    assert m.foreign(["http://127.0.0.1:9001", "http://127.0.0.1:7"]) == ("http://127.0.0.1:7",)
    assert m.name_of("http://127.0.0.1:9001") == "hold:mb"


def test_the_routers_render_and_tokenize_calls_are_answered_at_once_not_held():
    """vllm-router 0.1.17 POSTs /v1/completions/render, then /tokenize, to a worker before the
    request itself: a holder must not hold them (each would wait hold_s first)."""

    async def main():
        async def wake():
            raise AssertionError("no wake for these")

        h = await holding(wake)
        async with httpx.AsyncClient(base_url=h.url) as c:
            out = [
                (await c.post(path, json={"model": "m1"})).status_code
                for path in ("/v1/completions/render", "/v1/chat/completions/render", "/tokenize")
            ]
        await h.aclose()
        return out, h.queue.counts.total

    statuses, held = run(main())
    assert statuses == [404, 404, 404] and held == 0
