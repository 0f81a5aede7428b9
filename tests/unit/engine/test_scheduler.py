import asyncio

import pytest

from vsup.engine.scheduler import DeviceScheduler


def granted(fut):
    return fut.done() and not fut.cancelled()


async def settle():
    for _ in range(3):
        await asyncio.sleep(0)


async def test_co_tenant_starts_are_one_at_a_time_in_request_order():
    s = DeviceScheduler()
    a = s.request("a", ("cpu",), "start")
    b = s.request("b", ("cpu",), "start")
    c = s.request("c", ("cpu",), "start")
    assert granted(a) and not b.done() and not c.done()
    assert s.blockers("c") == [("a", "start"), ("b", "start")]
    s.release("a")
    assert granted(b) and not c.done()
    s.release("b")
    assert granted(c)


async def test_different_devices_do_not_wait():
    s = DeviceScheduler()
    assert granted(s.request("a", ("gpu0",), "start"))
    assert granted(s.request("b", ("gpu1",), "start"))
    assert granted(s.request("c", ("cpu",), "stop"))


async def test_stop_waits_for_a_co_tenant_start_and_stops_overlap():
    s = DeviceScheduler()
    s.request("a", ("gpu0",), "start")
    b = s.request("b", ("gpu0",), "stop")
    c = s.request("c", ("gpu0",), "stop")
    assert not b.done() and not c.done()
    s.release("a")
    assert granted(b) and granted(c)


async def test_start_waits_while_a_co_tenant_frees_memory():
    s = DeviceScheduler()
    s.request("a", ("gpu0",), "stop")
    b = s.request("b", ("gpu0",), "start")
    assert not b.done()
    s.release("a")
    assert granted(b)


async def test_a_stream_of_starts_cannot_starve_a_stop():
    s = DeviceScheduler()
    s.request("a", ("gpu0",), "start")
    stop_b = s.request("b", ("gpu0",), "stop")
    start_c = s.request("c", ("gpu0",), "start")
    s.release("a")
    assert granted(stop_b) and not start_c.done()
    s.release("b")
    assert granted(start_c)


async def test_multi_gpu_instance_holds_all_or_nothing():
    s = DeviceScheduler()
    s.request("g0", ("gpu0",), "start")
    tp = s.request("tp", ("gpu0", "gpu1"), "start")
    g1 = s.request("g1", ("gpu1",), "start")
    # gpu1 is free, but tp came first and needs it: g1 waits behind tp
    assert not tp.done() and not g1.done()
    s.release("g0")
    assert granted(tp) and not g1.done()
    s.release("tp")
    assert granted(g1)


async def test_own_start_turns_into_a_stop_without_waiting():
    s = DeviceScheduler()
    s.request("a", ("gpu0",), "start")
    waiting = s.request("b", ("gpu0",), "start")
    assert s.to_stop("a") and s.mode("a") == "stop"
    assert not waiting.done()
    assert not s.to_stop("b")


async def test_cancelled_wait_leaves_the_queue():
    s = DeviceScheduler()
    s.request("a", ("cpu",), "start")
    task = asyncio.create_task(s.acquire("b", ("cpu",), "start"))
    c = s.request("c", ("cpu",), "start")
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    s.release("a")
    assert granted(c) and s.mode("b") is None


async def test_withdraw_gives_back_a_hold_granted_meanwhile():
    s = DeviceScheduler()
    a = s.request("a", ("cpu",), "start")
    assert granted(a)
    s.withdraw("a")
    assert granted(s.request("b", ("cpu",), "start"))


async def test_on_change_names_who_still_waits():
    seen: list[object] = []
    s = DeviceScheduler(on_change=seen.append)
    s.request("a", ("cpu",), "start")
    s.request("b", ("cpu",), "start")
    s.request("c", ("cpu",), "start")
    s.release("a")
    assert seen[-1] == ["c"]


async def test_requesting_twice_is_a_bug():
    s = DeviceScheduler()
    s.request("a", ("cpu",), "start")
    with pytest.raises(RuntimeError):
        s.request("a", ("cpu",), "stop")


async def test_blocking_tells_a_co_tenant_holding_the_device_from_starts_queued_before():
    sched = DeviceScheduler()
    sched.request("a", ("gpu0",), "start")
    sched.request("b", ("gpu0", "gpu1"), "start")
    sched.request("c", ("gpu1",), "start")
    assert sched.blocking("b") == ([("a", "start")], [])
    # c's device is free of holds: it waits only for b, queued before it
    assert sched.blocking("c") == ([], [("b", "start")])
    assert sched.blocking("a") == ([], [])  # granted: it waits for nothing
