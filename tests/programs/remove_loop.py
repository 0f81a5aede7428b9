"""Another user's remove_worker loop against a router (the audit's, issue 35): read the worker
list, remove every worker on it, again, as fast as one connection allows, for SECONDS.

    python3 - BASE_URL SECONDS < remove_loop.py

Standard library only: it runs as a second local user with the system's Python (tests/programs/
second_user.py), reading this text on stdin. Prints one JSON line: how many removals it sent,
and for each worker it saw again after removing it, how long that took (the time vsup left it
out, plus at most one round of this loop).
"""

import http.client
import json
import sys
import time
import urllib.parse


def main() -> None:
    base, seconds = sys.argv[1], float(sys.argv[2])
    url = urllib.parse.urlsplit(base)
    assert url.hostname is not None
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    removed_at: dict[str, float] = {}  # worker URL -> when this loop last removed it
    back_after = []  # seconds from a removal to the worker listed again
    slow = []  # (worker, removed at, listed again at) for the slowest, on CLOCK_MONOTONIC
    removals = errors = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            conn.request("GET", "/list_workers")
            urls = json.loads(conn.getresponse().read()).get("urls", [])
            now = time.monotonic()
            for worker in urls:
                if worker in removed_at:
                    took = now - removed_at.pop(worker)
                    back_after.append(took)
                    slow.append((took, worker, now - took, now))
                query = urllib.parse.urlencode({"url": worker})
                conn.request("POST", "/remove_worker?" + query)
                conn.getresponse().read()
                removed_at[worker] = time.monotonic()
                removals += 1
        except (OSError, http.client.HTTPException, ValueError):
            errors += 1
            conn.close()
            time.sleep(0.01)
    back_after.sort()
    print(
        json.dumps(
            {
                "removals": removals,
                "errors": errors,
                "seen_back": len(back_after),
                "back_p50_s": back_after[len(back_after) // 2] if back_after else None,
                "back_max_s": back_after[-1] if back_after else None,
                "slowest": [s[1:] for s in sorted(slow, reverse=True)[:5]],
            }
        )
    )


if __name__ == "__main__":
    main()
