from vsup.snapshot import (
    GpuProcess,
    GpuStatus,
    LastExit,
    NodeInfo,
    StatusSnapshot,
    SupervisorInfo,
    empty_instance,
)


def test_status_json_round_trips_and_keeps_unknowns_null():
    snap = StatusSnapshot(
        supervisor=SupervisorInfo(pid=1, version="0.1.0", uptime_s=3.0),
        node=NodeInfo(hostname="n", gpu_vendor="none", gpu_count=0),
        gpus=(GpuStatus(0, "H200", 10, 5, None, None, None, (GpuProcess(7, 5, "a"),)),),
        instances=(
            empty_instance(
                "a",
                state="backoff",
                last_exit=LastExit(None, "SIGKILL", "killed", "2026-01-01T00:00:00.000Z", None),
            ),
        ),
    )
    doc = snap.to_json()
    assert list(doc)[0] == "schema" and doc["schema"] == 1
    assert doc["instances"][0]["kv_cache_usage"] is None
    assert doc["instances"][0]["last_exit"]["signal"] == "SIGKILL"
    assert StatusSnapshot.from_json(doc) == snap
