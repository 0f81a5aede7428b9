"""The daemon through its control API: requests, adoption, the state file, the journal."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat

import httpx
import psutil
import pytest

from vsup import paths
from vsup.control.errors import ControlError
from vsup.control.state import StateFile
from vsup.journalevents import ActionEvent, EventPage, SpawnEvent

from tests.unit.control.helpers import emulator_layout, free_port

pytestmark = pytest.mark.timeout(60)


async def raw(home, method: str, path: str, **kw) -> httpx.Response:
    transport = httpx.AsyncHTTPTransport(uds=str(paths.socket_path(home)))
    async with httpx.AsyncClient(transport=transport, base_url="http://vsup") as http:
        return await http.request(method, path, **kw)


async def test_running_daemon_socket_is_private(daemons, vsup_home):
    await daemons.start()
    mode = os.stat(paths.socket_path(vsup_home)).st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert stat.S_IMODE(os.stat(vsup_home).st_mode) == 0o700


async def test_status_of_an_empty_daemon_is_schema_1(daemons):
    daemon, client = await daemons.start()
    doc = await client.status()
    assert doc["schema"] == 1 and doc["instances"] == [] and doc["supervisor"]["pid"] == os.getpid()
    assert doc["node"]["gpu_vendor"] == "none"


@pytest.mark.parametrize(
    "method,path,body,fragment",
    [
        ("POST", "/v1/actions", b"{not json", "not JSON"),
        ("POST", "/v1/actions", b"[1]", "JSON object"),
        ("POST", "/v1/actions", {"action": "explode", "names": ["a"]}, "unknown action 'explode'"),
        ("POST", "/v1/actions", {"action": "stop"}, "give 'names' or set 'all'"),
        ("POST", "/v1/actions", {"action": "stop", "names": "a"}, "'names' must be a list"),
        ("POST", "/v1/actions", {"action": "stop", "names": [1]}, "list of instance names"),
        ("POST", "/v1/actions", {"action": "stop", "all": "yes"}, "'all' must be true or false"),
        ("POST", "/v1/actions", {"action": "stop", "nmes": ["a"]}, "unknown key 'nmes'"),
        ("POST", "/v1/actions", {"action": "drain", "all": True}, "drain takes instance names"),
        ("POST", "/v1/apply", {"path": "/x.toml"}, "missing 'toml'"),
        ("POST", "/v1/apply", {"toml": "", "path": "rel.toml"}, "must be absolute"),
        ("POST", "/v1/save", {"path": "rel.toml"}, "must be absolute"),
        ("GET", "/v1/events?since=-3", None, "'since' must not be negative"),
        ("GET", "/v1/events?since=abc", None, "'since' must be a whole number"),
        ("GET", "/v1/events?sinse=3", None, "unknown query 'sinse'"),
    ],
)
async def test_bad_requests_get_400_saying_what_to_send(
    daemons, vsup_home, method, path, body, fragment
):
    await daemons.start()
    kw = {"content": body} if isinstance(body, bytes) else {"json": body} if body else {}
    resp = await raw(vsup_home, method, path, **kw)
    assert resp.status_code == 400, resp.text
    assert fragment in resp.json()["error"]


async def test_unknown_routes_and_methods_answer_json(daemons, vsup_home):
    await daemons.start()
    resp = await raw(vsup_home, "GET", "/v1/nothing")
    assert resp.status_code == 404 and "no route GET /v1/nothing" in resp.json()["error"]
    resp = await raw(vsup_home, "DELETE", "/v1/status")
    assert resp.status_code == 405 and "DELETE" in resp.json()["error"]


async def test_invalid_layout_is_refused_with_every_error_and_nothing_changes(daemons, port):
    daemon, client = await daemons.start()
    text = emulator_layout({"a": port, "b": port})  # a port clash
    answer = await client.apply(text.replace('model = "test/fake"', ""), "/tmp/x.toml")
    assert answer["applied"] is False and answer["plan"] is None
    texts = " ".join(e["text"] for e in answer["errors"])
    assert "port" in texts and "model" in texts
    assert (await client.status())["instances"] == []
    assert (await client.layout())["toml"] is None


async def test_apply_starts_instances_and_unknown_names_get_404(daemons, vsup_home):
    daemon, client = await daemons.start()
    text = emulator_layout({"a": free_port(), "b": free_port()})
    dry = await client.apply(text, "/tmp/fakes.toml", dry_run=True)
    assert dry["plan"]["start"] == ["a", "b"] and dry["applied"] is False
    assert (await client.status())["instances"] == []
    answer = await client.apply(text, "/tmp/fakes.toml")
    assert answer["applied"] and answer["plan"]["start"] == ["a", "b"]
    for name in ("a", "b"):
        assert await daemon.engine.wait(name, ("ready",), timeout=20) == "ready"
    doc = await client.status()
    assert [(i["name"], i["state"]) for i in doc["instances"]] == [("a", "ready"), ("b", "ready")]
    assert (await client.layout())["name"] == "fakes"
    again = await client.apply(text, "/tmp/fakes.toml", dry_run=True)
    assert again["plan"]["unchanged"] == ["a", "b"]

    for call in (
        client.action("stop", ["a", "ghost", "nobody"]),
        client.logs("ghost"),
        client.config("ghost"),
        client.history("ghost"),
    ):
        with pytest.raises(ControlError) as err:
            await call
        assert err.value.status == 404 and "ghost" in err.value.message
        assert "instances: a, b" in err.value.message
    # A 404 on one name stopped nothing.
    assert {i["state"] for i in (await client.status())["instances"]} == {"ready"}


async def test_actions_logs_config_and_events(daemons, monkeypatch):
    monkeypatch.setenv("FAKE_KEY_VAR", "s3cret")
    daemon, client = await daemons.start()
    text = emulator_layout(
        {"a": free_port()},
        args='api_key_env = "FAKE_KEY_VAR"\nenv = { VLLM_CPU_KVCACHE_SPACE = "1" }',
    )
    assert (await client.apply(text, "/tmp/fakes.toml"))["applied"]
    await daemon.engine.wait("a", ("ready",), timeout=20)
    first_pid = (await client.status())["instances"][0]["pid"]

    cfg = await client.config("a")
    port = str(daemon.engine.instances["a"].spec.port)
    # the emulator runs on vsup's own Python, whose vLLM (0.32) has load tracking: vsup adds it
    assert cfg["argv"][-3:] == ["--port", port, "--enable-server-load-tracking"]
    assert cfg["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "s3cret" not in json.dumps(cfg) and "FAKE_KEY_VAR" in cfg["env"]["VLLM_API_KEY"]

    log = await client.logs("a")
    assert log["run"] == 1 and "emulator server" in log["text"]
    with pytest.raises(ControlError, match="no a previous run|has no a previous run|previous"):
        await client.logs("a", previous=True)

    answer = await client.action("restart", ["a"])
    assert answer == {"done": ["a"], "errors": []}
    await daemon.engine.wait("a", ("ready",), timeout=20)
    doc = await client.status()
    inst = doc["instances"][0]
    assert inst["pid"] != first_pid and inst["run"] == 2 and inst["restarts"] == 0
    prev = await client.logs("a", previous=True)
    assert prev["run"] == 1 and "emulator server" in prev["text"]

    answer = await client.action("stop", all=True)
    assert answer["done"] == ["a"]
    assert (await client.status())["instances"][0]["state"] == "stopped"
    assert (
        not psutil.pid_exists(inst["pid"])
        or psutil.Process(inst["pid"]).status() == psutil.STATUS_ZOMBIE
    )

    # the wire client's page, read as the typed client reads it
    page = EventPage.from_json(await client.events(since=0))
    kinds = [e.kind for e in page.events]
    assert "spawn" in kinds and "ready" in kinds and "action" in kinds
    seqs = [e.seq for e in page.events if e.seq is not None]
    assert len(seqs) == len(page.events)  # the journal stamps every event
    assert seqs == sorted(seqs) and page.next == seqs[-1] + 1
    assert (await client.events(since=page.next))["events"] == []
    # typed: each event is its kind's type, read by attribute, and says itself
    operator = [e for e in page.events if isinstance(e, ActionEvent) and e.by == "operator"]
    assert [e.action for e in operator] == ["restart", "stop"]
    assert operator[0].describe() == "operator: restart a"
    (spawn, *_) = [e for e in page.events if isinstance(e, SpawnEvent)]
    assert spawn.instance == "a" and spawn.port == int(port) and spawn.run == 1
    assert spawn.describe() == f"started run 1 (pid {first_pid})"


async def test_sigterm_like_stop_leaves_instances_and_next_daemon_readopts(daemons, vsup_home):
    daemon, client = await daemons.start()
    await client.apply(emulator_layout({"a": free_port()}), "/tmp/fakes.toml")
    await daemon.engine.wait("a", ("ready",), timeout=20)
    before = (await client.status())["instances"][0]
    await daemons.stop(daemon)  # what SIGTERM does: the API goes, the instance stays
    assert psutil.Process(before["pid"]).status() != psutil.STATUS_ZOMBIE

    daemon2, client2 = await daemons.start()
    inst = daemon2.engine.instances["a"]
    assert inst.pid == before["pid"] and inst.adopted
    assert await daemon2.engine.wait("a", ("ready",), timeout=10) == "ready"
    after = (await client2.status())["instances"][0]
    assert (after["pid"], after["restarts"], after["run"]) == (before["pid"], 0, 1)
    assert (await client2.layout())["name"] == "fakes"
    adopt = [e for e in (await client2.events())["events"] if e["kind"] == "adopt"]
    assert adopt[-1]["instance"] == "a" and adopt[-1]["adopted"] is True

    # The adopted process is not the new daemon's child; its death is still seen.
    os.kill(before["pid"], signal.SIGKILL)
    await daemon2.engine.wait("a", ("backoff", "starting"), timeout=10)
    await daemon2.engine.wait("a", ("ready",), timeout=20)
    last = (await client2.status())["instances"][0]
    assert last["pid"] != before["pid"] and last["restarts"] == 1
    # A non-child's exit status is not ours to read: the reason comes from its log.
    assert last["last_exit"] is not None and last["last_exit"]["reason"]


async def test_instance_that_died_while_no_daemon_ran_is_restarted(daemons, vsup_home):
    daemon, client = await daemons.start()
    await client.apply(emulator_layout({"a": free_port()}), "/tmp/fakes.toml")
    await daemon.engine.wait("a", ("ready",), timeout=20)
    pid = daemon.engine.instances["a"].pid
    pgid = os.getpgid(pid)
    await daemons.stop(daemon)
    os.killpg(pgid, signal.SIGKILL)

    daemon2, client2 = await daemons.start()
    await daemon2.engine.wait("a", ("ready",), timeout=20)
    inst = daemon2.engine.instances["a"]
    assert inst.pid != pid
    events = (await client2.events())["events"]
    adopt = [e for e in events if e["kind"] == "adopt" and e["instance"] == "a"]
    assert adopt[-1]["adopted"] is False


async def test_stopped_instance_stays_stopped_across_a_daemon_restart(daemons):
    daemon, client = await daemons.start()
    await client.apply(emulator_layout({"a": free_port(), "b": free_port()}), "/tmp/fakes.toml")
    await daemon.engine.wait("a", ("ready",), timeout=20)
    await daemon.engine.wait("b", ("ready",), timeout=20)
    await client.action("stop", ["b"])
    await daemons.stop(daemon)

    daemon2, client2 = await daemons.start()
    states = {i["name"]: i["state"] for i in (await client2.status())["instances"]}
    assert states == {"a": "ready", "b": "stopped"} or states["b"] == "stopped"
    await client2.action("start", ["b"])
    assert await daemon2.engine.wait("b", ("ready",), timeout=20) == "ready"


async def test_corrupt_state_file_is_reported_and_survived(daemons, vsup_home):
    daemon, client = await daemons.start()
    await client.apply(emulator_layout({"a": free_port()}), "/tmp/fakes.toml")
    await daemon.engine.wait("a", ("ready",), timeout=20)
    pid = daemon.engine.instances["a"].pid
    await daemons.stop(daemon)
    state = paths.state_path(vsup_home)
    state.write_bytes(state.read_bytes()[:40])  # torn

    daemon2, client2 = await daemons.start()
    doc = await client2.status()
    problems = [a for a in doc["advice"] if a["kind"] == "state_file"]
    assert problems and "unreadable" in problems[0]["message"]
    # The backup plus the journal still find the running instance: adopted, not duplicated.
    assert daemon2.engine.instances["a"].pid == pid
    events = [json.loads(x) for x in paths.journal_path(vsup_home).read_text().splitlines()]
    assert any(e["kind"] == "problem" and e["problem"] == "state_file" for e in events)
    assert list(vsup_home.glob("state.json.corrupt-*"))
    # The daemon writes a good state file again.
    await daemon2.flush_state()
    assert StateFile(state).load().problem is None


async def test_lost_state_file_is_rebuilt_from_the_journal(daemons, vsup_home):
    daemon, client = await daemons.start()
    await client.apply(emulator_layout({"a": free_port()}), "/tmp/fakes.toml")
    await daemon.engine.wait("a", ("ready",), timeout=20)
    pid = daemon.engine.instances["a"].pid
    await daemons.stop(daemon)
    paths.state_path(vsup_home).unlink()
    StateFile(paths.state_path(vsup_home)).backup.unlink()

    daemon2, client2 = await daemons.start()
    inst = daemon2.engine.instances["a"]
    assert inst.pid == pid and inst.adopted


async def test_prometheus_listener_follows_the_layout(daemons):
    daemon, client = await daemons.start()
    mport = free_port()
    text = emulator_layout({"a": free_port()}, extra_header=f'metrics_listen = "127.0.0.1:{mport}"')
    await client.apply(text, "/tmp/fakes.toml")
    await daemon.engine.wait("a", ("ready",), timeout=20)
    await daemon.poll_once()
    async with httpx.AsyncClient() as http:
        body = (await http.get(f"http://127.0.0.1:{mport}/metrics")).text
    assert 'vsup_instance_up{name="a"} 1.0' in body
    assert 'vsup_instance_state{name="a",state="ready"} 1.0' in body
    # A layout without it closes the listener.
    await client.apply(
        emulator_layout({"a": daemon.engine.instances["a"].spec.port}), "/tmp/f.toml"
    )
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as http:
            await http.get(f"http://127.0.0.1:{mport}/metrics")


async def test_save_writes_the_running_layout_and_refuses_when_none(daemons, tmp_path):
    daemon, client = await daemons.start()
    with pytest.raises(ControlError, match="no layout is running"):
        await client.save(tmp_path / "out.toml")
    text = emulator_layout({"a": free_port()})
    await client.apply(text, str(tmp_path / "in.toml"))
    answer = await client.save(tmp_path / "out.toml")
    assert answer["path"] == str(tmp_path / "out.toml")
    import tomllib

    assert tomllib.loads((tmp_path / "out.toml").read_text()) == tomllib.loads(text)


async def test_history_has_one_point_per_poll(daemons):
    """...while someone reads the figures (a dashboard's status requests: control/monitor.py,
    "Nobody watching")."""
    daemon, client = await daemons.start()
    await client.apply(emulator_layout({"a": free_port()}), "/tmp/fakes.toml")
    await daemon.engine.wait("a", ("ready",), timeout=20)
    await client.status()
    for _ in range(3):
        await daemon.poll_once()
    hist = await client.history("a")
    assert set(hist) == {"t", "kv_cache_usage", "generation_tokens_per_s", "preemptions_per_min"}
    assert len(hist["t"]) >= 3 and hist["t"] == sorted(hist["t"])


async def test_reused_pid_is_not_adopted_nor_signalled(daemons, vsup_home):
    """The state file names a pid that now belongs to an unrelated process (same number,
    other start time): the daemon treats the instance as exited and leaves that process be."""
    import subprocess
    import sys

    from vsup.control.state import DaemonState, InstanceRecord, spec_to_dict
    from vsup.layout.compiled import compile_layout

    text = emulator_layout({"a": free_port()})
    compiled, _diags = compile_layout(text, "/tmp/fakes.toml")
    specs = compiled.specs
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        created = psutil.Process(stranger.pid).create_time()
        StateFile(paths.state_path(vsup_home)).save(
            DaemonState(
                layout_path="/tmp/fakes.toml",
                layout_toml=text,
                layout_name="fakes",
                instances={
                    "a": InstanceRecord(
                        name="a",
                        spec=spec_to_dict(specs[0]),
                        state="ready",
                        pid=stranger.pid,
                        create_time=created - 30,  # the same boot: a reused pid
                        pgid=stranger.pid,
                        port=specs[0].port,
                        run=4,
                        restarts=1,
                    )
                },
            )
        )
        daemon, client = await daemons.start()
        assert await daemon.engine.wait("a", ("ready",), timeout=20) == "ready"
        inst = daemon.engine.instances["a"]
        assert inst.pid != stranger.pid and inst.run == 5
        assert inst.restarts == 2, "restarting an instance that died unwatched is a restart"
        adopt = [e for e in (await client.events())["events"] if e["kind"] == "adopt"]
        assert adopt[-1]["adopted"] is False and "another process" in adopt[-1]["why"]
        assert stranger.poll() is None, "an unrelated process was signalled"
    finally:
        stranger.kill()
        stranger.wait()


async def test_a_refused_state_write_is_an_alert_retried_until_it_works(
    daemons, vsup_home, monkeypatch
):
    import errno

    daemon, client = await daemons.start()
    real_save = daemon.state_file.save

    def full(state):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(daemon.state_file, "save", full)
    await client.apply(emulator_layout({"a": free_port()}), "/tmp/fakes.toml")
    await daemon.engine.wait("a", ("ready",), timeout=20)
    for _ in range(50):
        alerts = [a for a in (await client.status())["advice"] if a["kind"] == "state_write"]
        if alerts:
            break
        await asyncio.sleep(0.1)
    assert alerts and "No space left" in alerts[0]["message"] and alerts[0]["severity"] == "error"

    monkeypatch.setattr(daemon.state_file, "save", real_save)
    for _ in range(50):
        if not [a for a in (await client.status())["advice"] if a["kind"] == "state_write"]:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the state_write alert did not clear once writes worked")
    doc = json.loads(paths.state_path(vsup_home).read_text())
    assert doc["instances"]["a"]["pid"] == daemon.engine.instances["a"].pid


async def test_a_poll_reuses_an_instance_target_until_something_it_holds_changes(daemons):
    """Each poll's targets: the last poll's Target object while nothing it is made of moved
    (built once, not once a poll), and a new one from the first poll after a change."""
    daemon, client = await daemons.start()
    await client.apply(emulator_layout({"a": free_port()}), "/tmp/fakes.toml")
    assert await daemon.engine.wait("a", ("ready",), timeout=20) == "ready"
    (first,) = daemon._targets()
    (again,) = daemon._targets()
    assert again is first and first.live and first.ready and first.pid is not None
    await client.action("stop", ["a"])
    assert await daemon.engine.wait("a", ("stopped",), timeout=20) == "stopped"
    (after,) = daemon._targets()
    assert after is not first and not after.live and not after.ready and after.pid is None
