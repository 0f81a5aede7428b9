"""The monitor's stall I/O against a real loopback HTTP server shaped like vLLM's API server:
`/load` read with each scrape of an instance started with load tracking (and only then), and the
canary: one `max_tokens = 1` completion to an idle ready instance each `canary_interval_s`,
each data-parallel rank in turn, whose loss makes the instance stalled until one is answered."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from vsup.control.monitor import Monitor, Target
from vsup.telemetry.gpu.base import NoneProbe

from tests.support.clock import FakeClock

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.32-cpu"
IDLE = (FIX / "metrics_idle.txt").read_bytes()


class VllmLike:
    """/metrics (an idle CPU vLLM 0.32 payload), /load, /v1/models, /v1/completions that
    answer, hang (a frozen engine) or refuse, as set; records what it was sent."""

    def __init__(self) -> None:
        self.load = 0
        self.completions = "answer"  # answer | hang | refuse
        self.paths: list[str] = []
        self.posts: list[tuple[dict[str, str], dict]] = []
        self.release = asyncio.Event()

    async def __aenter__(self) -> VllmLike:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        self.server.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                path = head.split(" ", 2)[1]
                headers = {}
                for line in head.split("\r\n")[1:]:
                    k, sep, v = line.partition(":")
                    if sep:
                        headers[k.strip().lower()] = v.strip()
                self.paths.append(path)
                status, body = 200, b""
                if head.startswith("POST "):
                    sent = await reader.readexactly(int(headers["content-length"]))
                    self.posts.append((headers, json.loads(sent)))
                    if self.completions == "hang":
                        await self.release.wait()
                    status = 401 if self.completions == "refuse" else 200
                    body = b'{"choices":[{"text":"x"}]}'
                elif path == "/metrics":
                    body = IDLE
                elif path == "/load":
                    body = json.dumps({"server_load": self.load}).encode()
                elif path == "/v1/models":
                    body = b'{"data":[{"id":"tiny"}]}'
                writer.write(
                    f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def target(url: str, **kw: object) -> Target:
    base = dict(
        name="a",
        base_url=url,
        run=1,
        pid=None,
        pgid=None,
        gpus=(),
        live=True,
        log_path=None,
        ready=True,
        stall_after_s=60.0,
    )
    base.update(kw)
    return Target(**base)  # type: ignore[arg-type]


async def later(mon: Monitor, clock: FakeClock, seconds: float, t: Target) -> None:
    """`seconds` on, then two polls (as the daemon polls each second): the first scrapes
    fresh figures, the second sends a canary if one is owed."""
    clock.advance(seconds)
    for _ in range(2):
        await mon.poll([t])
        await settle(mon)


async def settle(mon: Monitor) -> None:
    """Until no canary is in flight (each is bounded by its deadline)."""
    for _ in range(200):
        if not mon._canaries:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("a canary still in flight")


async def test_load_is_read_only_from_instances_started_with_load_tracking():
    clock = FakeClock()
    async with VllmLike() as srv:
        mon = Monitor(clock, probe=NoneProbe())
        await mon.open()
        srv.load = 4
        await mon.poll([target(srv.url, load_tracking=True)])
        fields = mon.fields("a", live=True)
        assert fields["requests_in_flight"] == 4 and fields["load_tracking"] is True
        # 4 requests that the (idle) engine never shows, for stall_after_s: a frozen engine
        clock.advance(61.0)
        await mon.poll([target(srv.url, load_tracking=True)])
        stall = mon.stall_fields("a", ready=True, stall_after_s=60.0)
        assert stall["stalled"] is True and stall["stall_evidence"] == "server"
        assert stall["stalled_for_s"] == 61.0 and stall["stalled_ranks"] == ()
        assert mon.fields("a", live=False)["requests_in_flight"] is None
        srv.paths.clear()
        await mon.poll([target(srv.url, load_tracking=False, run=2)])
        assert "/load" not in srv.paths  # without the flag vLLM would answer 0 whatever runs
        assert mon.fields("a", live=True)["requests_in_flight"] is None
        await mon.close()


async def test_a_canary_that_gets_no_answer_makes_the_instance_stalled_until_one_does():
    clock = FakeClock()
    async with VllmLike() as srv:
        mon = Monitor(clock, probe=NoneProbe())
        await mon.open()
        t = target(srv.url, canary_interval_s=30.0, stall_after_s=0.3)
        await mon.poll([t])  # the first scrape: figures that show an idle server
        await settle(mon)
        assert srv.posts == []  # no canary before the figures said idle
        await mon.poll([t])
        await settle(mon)
        (headers, body) = srv.posts[0]
        assert body == {"model": "tiny", "prompt": ".", "max_tokens": 1}
        assert "x-data-parallel-rank" not in headers
        assert mon.stall_fields("a", True, 0.3)["stalled"] is False
        await later(mon, clock, 10.0, t)
        assert len(srv.posts) == 1  # one each canary_interval_s
        srv.completions = "hang"
        await later(mon, clock, 25.0, t)  # its deadline (stall_after_s) passes, no answer
        assert len(srv.posts) == 2
        stall = mon.stall_fields("a", True, 0.3)
        assert stall["stalled"] is True and stall["stall_evidence"] == "canary"
        srv.completions = "answer"
        srv.release.set()
        await later(mon, clock, 30.0, t)
        assert len(srv.posts) == 3
        assert mon.stall_fields("a", True, 0.3)["stalled"] is False
        assert [p for p in srv.paths if p == "/v1/models"] == ["/v1/models"]  # once a run
        await mon.close()


async def test_canaries_go_to_each_rank_in_turn_carry_the_key_and_a_refusal_judges_nothing():
    clock = FakeClock()
    async with VllmLike() as srv:
        mon = Monitor(clock, probe=NoneProbe())
        await mon.open()
        t = target(
            srv.url,
            canary_interval_s=5.0,
            stall_after_s=2.0,
            dp_ranks=2,
            canary_headers=(("Authorization", "Bearer k"),),
        )
        await later(mon, clock, 0.0, t)
        await later(mon, clock, 6.0, t)
        ranks = [h["x-data-parallel-rank"] for h, _body in srv.posts]
        assert ranks == ["0", "1"] and all(h["authorization"] == "Bearer k" for h, _ in srv.posts)
        srv.completions = "refuse"
        await later(mon, clock, 6.0, t)
        assert len(srv.posts) == 3
        assert mon.stall_fields("a", True, 2.0)["stalled"] is False
        # not ready (health checks failing) or no canary_interval_s: no canary at all
        sent = len(srv.posts)
        clock.advance(10.0)
        await mon.poll([target(srv.url, canary_interval_s=5.0, ready=False)])
        await mon.poll([target(srv.url)])
        await settle(mon)
        assert len(srv.posts) == sent
        await mon.close()
