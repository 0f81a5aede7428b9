"""Which instances are workers, and the add/remove calls that follow vsup's states."""

from __future__ import annotations

from vsup.router import MembershipChange, RouterMembership

URLS = {"g0": "http://127.0.0.1:8000", "g1": "http://127.0.0.1:8001", "g2": "http://127.0.0.1:8002"}
U0, U1, U2 = URLS.values()


def test_only_ready_instances_are_workers():
    m = RouterMembership(URLS)
    for state in ("starting", "unhealthy", "backoff", "stopping", "stopped", "failed", None):
        states = {"g0": "ready", "g1": state, "g2": "ready"} if state else {"g0": "ready"}
        assert m.desired(states) == ([U0, U2] if state else [U0])


def test_plan_adds_the_newly_ready_and_removes_the_rest():
    m = RouterMembership(URLS)
    change = m.plan({"g0": "ready", "g1": "ready", "g2": "unhealthy"}, [U2, U0])
    assert change == MembershipChange(add=(U1,), remove=(U2,))
    assert not m.plan({"g0": "ready", "g2": "ready"}, [U0, U2])


def test_workers_vsup_did_not_add_are_removed():
    m = RouterMembership(URLS)
    change = m.plan({"g0": "ready"}, [U0, "http://127.0.0.1:9999"])
    assert change == MembershipChange(remove=("http://127.0.0.1:9999",))


def test_a_leaving_instance_stays_out_while_ready_until_it_rejoins():
    m = RouterMembership(URLS)
    states = {"g0": "ready", "g1": "ready"}
    assert m.leave("g1") == U1
    assert m.plan(states, [U0, U1]) == MembershipChange(remove=(U1,))
    # its restart: stopping, starting, ready again - still out until the engine says so
    for state in ("stopping", "starting", "ready"):
        assert m.desired({**states, "g1": state}) == [U0]
    m.rejoin("g1")
    assert m.plan(states, [U0]) == MembershipChange(add=(U1,))
    assert m.leave("not-a-member") is None


def test_an_empty_router_gets_every_ready_worker_after_its_restart():
    m = RouterMembership(URLS)
    states = dict.fromkeys(URLS, "ready")
    assert m.plan(states, []) == MembershipChange(add=(U0, U1, U2))


def test_a_new_layouts_members_keep_who_is_leaving():
    m = RouterMembership({"a": "http://a", "b": "http://b"})
    m.leave("a")
    new = m.with_workers({"a": "http://a", "c": "http://c"})
    assert new.desired({"a": "ready", "c": "ready"}) == ["http://c"]


def test_foreign_urls_are_those_of_no_member_whatever_their_state():
    m = RouterMembership(URLS)
    listed = [U0, "http://127.0.0.1:9999", U1, "http://127.0.0.1:9999", "http://10.1.2.3:80"]
    assert m.foreign(listed) == ("http://127.0.0.1:9999", "http://10.1.2.3:80")
    m.leave("g1")  # a member that is leaving is drift for the reconcile, not foreign
    assert m.foreign([U1]) == ()
