"""`python -m vsup.pull.worker`: one pull, as the daemon runs it (in a child process).

The job comes as one JSON object on stdin: `{"model", "revision", "cache_dir", "load_format",
"token_env"}`; the token itself is in this process's environment under `token_env` (the
daemon's own variable), never in the job. Reports go to stdout, one JSON object a line:
`{"event": "plan", ...}` once the files are chosen, `{"event": "progress", ...}` about every
second, then `{"event": "done", ...}` (exit 0) or `{"event": "failed", "reason", "message"}`
(exit 1). SIGTERM (and SIGINT) cancel: the download in flight stops at its next chunk and
removes its temporary file; what was complete stays in the cache.

Why a process and not a thread of the daemon: a 100 GB download is hours of work that must not
share the daemon's interpreter (its 1 Hz polls), a hung connection must be killable, and the
token should be in no process but the one that sends it.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from vsup.pull.errors import PullError


def _emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    from vsup.pull.run import PullRequest, pull_model
    from vsup.pull.targets import PullTarget, token_for

    cancel = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        cancel.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        job = json.loads(sys.stdin.readline() or "{}")
        req = PullRequest(
            model=str(job["model"]),
            revision=job.get("revision"),
            cache_dir=Path(job["cache_dir"]),
            load_format=job.get("load_format"),
            token_env=job.get("token_env"),
        )
    except (ValueError, KeyError, TypeError) as exc:
        _emit({"event": "failed", "reason": "error", "message": f"bad job: {exc}"})
        return 2
    try:
        target = PullTarget(req.model, req.revision, req.cache_dir, None, req.token_env, ())
        token = token_for(target)
        result = pull_model(
            req,
            token,
            on_plan=lambda plan: _emit({"event": "plan", **plan.to_json()}),
            on_progress=lambda rep: _emit({"event": "progress", **rep.to_json()}),
            cancel=cancel,
            report_every_s=1.0,
        )
    except PullError as exc:
        _emit({"event": "failed", "reason": exc.reason, "message": exc.message})
        return 1
    except Exception as exc:  # a bug, or an error huggingface_hub did not classify
        _emit({"event": "failed", "reason": "error", "message": f"{type(exc).__name__}: {exc}"})
        return 1
    _emit({"event": "done", **result.to_json()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
