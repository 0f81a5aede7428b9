"""A fake Hugging Face hub on 127.0.0.1, served by the test, for the real `huggingface_hub`
client (pointed at it with HF_ENDPOINT): what `vsup pull` and vLLM ask of the hub, and the
hub's failures on cue.

Endpoints, with the headers huggingface_hub 0.26-2.x reads (utils/_http.py, file_download.py):
- `GET /api/models/{id}[/revision/{rev}]` (`?blobs=true`): `{"id", "sha", "private", "gated",
  "siblings": [{"rfilename", "size", "blobId", "lfs": {"sha256", "size", "pointerSize"}}]}`;
- `GET /api/models/{id}/tree/{rev}[/{path}]`: the file list (`HfFileSystem.ls`, which vLLM uses);
- `HEAD`/`GET /{id}/resolve/{rev}/{path}`: `ETag` (the git blob id, or for weights - "LFS"
  files - the sha256, also as `X-Linked-Etag`/`X-Linked-Size`), `X-Repo-Commit`,
  `Content-Length`, `Accept-Ranges: bytes`; `Range: bytes=N-` gets 206 with `Content-Range`;
- errors as the hub sends them: `X-Error-Code` `RepoNotFound` / `RevisionNotFound` /
  `EntryNotFound` / `GatedRepo` (401 without a token, 403 with one that was not granted),
  `X-Error-Message: Invalid credentials in Authorization header` for an unknown token.

On cue: `rate_bps` (bytes per second per transfer, for visible progress and interrupts
mid-file), `hold(model, path, after)` (the next GET of that file stops after `after` bytes
until `release()`), `cut(model, path, after)` (the next GET of that file breaks off after `after` bytes:
a network cut mid-file; `then_down=True`: and the hub stays unreachable - every connection is
closed unanswered - until `up()`), `fail_next(status)`. `requests` records every request (method, path,
Range, status, body bytes sent), so a test counts GETs per file.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".model")
CHUNK = 64 * 1024


@dataclass
class FakeRepo:
    """One model repository with one commit (`main` points at it)."""

    model: str
    files: dict[str, bytes]
    gated: bool = False
    private: bool = False
    tokens: tuple[str, ...] = ()  # tokens with access (gated/private)
    denied: tuple[str, ...] = ()  # known tokens without access (a gated licence not accepted)
    branches: tuple[str, ...] = ("main",)
    _digests: dict[tuple[str, int], str] = field(default_factory=dict, repr=False)

    def sha256(self, name: str) -> str:
        data = self.files[name]
        key = (name, id(data))
        if key not in self._digests:
            self._digests[key] = hashlib.sha256(data).hexdigest()
        return self._digests[key]

    @property
    def commit(self) -> str:
        h = hashlib.sha1(self.model.encode())
        for name in sorted(self.files):
            h.update(name.encode() + b"\0" + self.sha256(name).encode())
        return h.hexdigest()

    def is_lfs(self, name: str) -> bool:
        return name.endswith(LFS_SUFFIXES) or len(self.files[name]) > 10 * 1024 * 1024

    def etag(self, name: str) -> str:
        data = self.files[name]
        if self.is_lfs(name):
            return self.sha256(name)
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    def sibling(self, name: str) -> dict[str, Any]:
        data = self.files[name]
        doc: dict[str, Any] = {"rfilename": name, "size": len(data)}
        if self.is_lfs(name):
            doc["blobId"] = hashlib.sha1(name.encode()).hexdigest()  # the pointer file's oid
            doc["lfs"] = {"sha256": self.etag(name), "size": len(data), "pointerSize": 134}
        else:
            doc["blobId"] = self.etag(name)
        return doc

    @classmethod
    def from_dir(cls, model: str, path: Path, **kw: Any) -> FakeRepo:
        files = {
            str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
        }
        return cls(model, files, **kw)


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    status: int
    sent: int = 0  # body bytes written
    token: str | None = None
    agent: str | None = None  # User-Agent: huggingface_hub's, with the library that called it
    at: float = field(default_factory=time.monotonic)
    wall: float = field(default_factory=time.time)


class FakeHub:
    """The server; `with FakeHub(repos) as hub:` serves at `hub.url` until the block ends."""

    def __init__(self, repos: list[FakeRepo], rate_bps: float | None = None) -> None:
        self.repos = {r.model: r for r in repos}
        self.rate_bps = rate_bps
        self.requests: list[Request] = []
        self._cuts: dict[tuple[str, str], int] = {}
        self._fail: list[int] = []
        self._down_after_cut: set[tuple[str, str]] = set()
        self._holds: dict[tuple[str, str], tuple[int, threading.Event]] = {}
        self._held: list[threading.Event] = []
        self.down = False  # every connection closed unanswered (a network that is gone)
        self._lock = threading.Lock()
        self._in_flight = 0  # requests being answered: a cut-off transfer is recorded at its end
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- cues ------------------------------------------------------------------------------

    def cut(self, model: str, path: str, after: int, then_down: bool = False) -> None:
        """Break the next GET of `path` off after `after` bytes of its body (`then_down`: and
        answer nothing more until `up()`)."""
        with self._lock:
            self._cuts[(model, path)] = after
            if then_down:
                self._down_after_cut.add((model, path))

    def hold(self, model: str, path: str, after: int) -> threading.Event:
        """Make the next GET of `path` wait after `after` bytes until the returned event is
        set (`release()` sets every one): a pull held mid-file for as long as a test needs."""
        gate = threading.Event()
        with self._lock:
            self._holds[(model, path)] = (after, gate)
        return gate

    def release(self) -> None:
        with self._lock:
            gates = [g for _, g in self._holds.values()] + self._held
            self._holds.clear()
        for g in gates:
            g.set()

    def up(self) -> None:
        with self._lock:
            self.down = False

    def fail_next(self, status: int, count: int = 1) -> None:
        with self._lock:
            self._fail += [status] * count

    # -- reading ---------------------------------------------------------------------------

    def gets(self, path: str | None = None, model: str | None = None) -> list[Request]:
        """The successful file GETs (of `path`, of `model`)."""
        out = []
        for r in list(self.requests):
            if r.method != "GET" or "/resolve/" not in r.path or r.status >= 400:
                continue
            if model is not None and not r.path.startswith(f"/{model}/resolve/"):
                continue
            if path is not None and not r.path.endswith(f"/{path}"):
                continue
            out.append(r)
        return out

    def bytes_sent(self, model: str | None = None) -> int:
        return sum(
            r.sent for r in list(self.requests) if model is None or r.path.startswith(f"/{model}/")
        )

    def idle(self) -> bool:
        """No request is being answered: every transfer so far, a client's abandoned one too
        (recorded when the hub's next write fails), is in `requests`."""
        with self._lock:
            return self._in_flight == 0

    def wait_for(self, pred: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise TimeoutError("the fake hub did not see what the test waited for")
            time.sleep(0.02)

    # -- life ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = cast(tuple[str, int], self._server.server_address[:2])
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


_API = re.compile(r"^/api/models/(?P<model>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(r"^/api/models/(?P<model>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
_RESOLVE = re.compile(r"^/(?P<model>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeHub

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_HEAD(self) -> None:
        self._counted(head=True)

    def do_GET(self) -> None:
        self._counted(head=False)

    def _counted(self, head: bool) -> None:
        with self.fake._lock:
            self.fake._in_flight += 1
        try:
            self._serve(head)
        finally:
            with self.fake._lock:
                self.fake._in_flight -= 1

    # -- helpers ---------------------------------------------------------------------------

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None

    def _record(self, status: int, sent: int = 0) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.fake._lock:
            self.fake.requests.append(
                Request(
                    self.command,
                    path,
                    self.headers.get("Range"),
                    status,
                    sent,
                    self._token(),
                    self.headers.get("User-Agent"),
                )
            )

    def _error(self, status: int, code: str | None, message: str, head: bool) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Length", str(0 if head else len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)
        self._record(status)

    def _access(self, repo: FakeRepo, head: bool) -> bool:
        """True when the request may see `repo`; else the hub's answer was sent."""
        token = self._token()
        known = set(repo.tokens) | set(repo.denied)
        if token is not None and token not in known:
            self._error(401, None, "Invalid credentials in Authorization header", head)
            return False
        if repo.gated:
            if token is None:
                msg = (
                    f"Access to model {repo.model} is restricted. You must have access to it "
                    "and be authenticated to access it. Please log in."
                )
                self._error(401, "GatedRepo", msg, head)
                return False
            if token in repo.denied:
                msg = (
                    f"Access to model {repo.model} is restricted and you are not in the "
                    "authorized list."
                )
                self._error(403, "GatedRepo", msg, head)
                return False
        if repo.private and token not in repo.tokens:
            self._error(401, "RepoNotFound", "Repository not found", head)
            return False
        return True

    def _serve(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        if self.fake.down:
            self._record(0)
            self.close_connection = True
            self.connection.shutdown(2)
            return
        with self.fake._lock:
            forced = self.fake._fail.pop(0) if self.fake._fail else None
        if forced is not None:
            self._error(forced, None, f"forced {forced}", head)
            return
        for pattern, handler in (
            (_TREE, self._tree),
            (_API, self._info),
            (_RESOLVE, self._file),
        ):
            m = pattern.match(path)
            if m:
                repo = self.fake.repos.get(m.group("model"))
                if repo is None:
                    self._error(404, "RepoNotFound", "Repository not found", head)
                    return
                if not self._access(repo, head):
                    return
                rev = m.group("rev") or "main"
                if rev not in repo.branches and rev != repo.commit:
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
                    return
                handler(repo, m, head)
                return
        self._error(404, None, f"no route {path}", head)

    def _json(self, doc: Any, head: bool) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)
        self._record(200, 0 if head else len(body))

    def _info(self, repo: FakeRepo, m: re.Match[str], head: bool) -> None:
        self._json(
            {
                "_id": hashlib.md5(repo.model.encode()).hexdigest()[:24],
                "id": repo.model,
                "modelId": repo.model,
                "sha": repo.commit,
                "private": repo.private,
                "gated": "manual" if repo.gated else False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "lastModified": "2026-01-01T00:00:00.000Z",
                "siblings": [repo.sibling(n) for n in sorted(repo.files)],
            },
            head,
        )

    def _tree(self, repo: FakeRepo, m: re.Match[str], head: bool) -> None:
        prefix = (m.group("path") or "").strip("/")
        entries, dirs = [], set()
        for name in sorted(repo.files):
            if prefix and not name.startswith(prefix + "/"):
                continue
            rest = name[len(prefix) + 1 :] if prefix else name
            if "/" in rest:
                d = (prefix + "/" if prefix else "") + rest.split("/", 1)[0]
                if d not in dirs:
                    dirs.add(d)
                    entries.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": d})
                continue
            sib = repo.sibling(name)
            entry: dict[str, Any] = {
                "type": "file",
                "oid": sib["blobId"],
                "size": sib["size"],
                "path": name,
            }
            if "lfs" in sib:
                entry["lfs"] = {
                    "oid": sib["lfs"]["sha256"],
                    "size": sib["size"],
                    "pointerSize": 134,
                }
            entries.append(entry)
        self._json(entries, head)

    def _file(self, repo: FakeRepo, m: re.Match[str], head: bool) -> None:
        name = m.group("path")
        if name not in repo.files:
            self._error(404, "EntryNotFound", f"{name} does not exist", head)
            return
        data = repo.files[name]
        size = len(data)
        start = 0
        status = 200
        rng = self.headers.get("Range")
        if rng and not head:
            mr = re.match(r"bytes=(\d+)-(\d*)$", rng.strip())
            if mr:
                start = int(mr.group(1))
                if start >= size:
                    self._error(416, None, "range not satisfiable", head)
                    return
                status = 206
        etag = repo.etag(name)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("Accept-Ranges", "bytes")
        if repo.is_lfs(name):
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(size))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.send_header("Content-Length", str(size - start))
        self.end_headers()
        if head:
            self._record(status)
            return
        with self.fake._lock:
            cut = self.fake._cuts.pop((repo.model, name), None)
            hold = self.fake._holds.pop((repo.model, name), None)
            if hold is not None:
                self.fake._held.append(hold[1])
        sent = 0
        body = memoryview(data)[start:]
        began = time.monotonic()
        try:
            while sent < len(body):
                n = min(CHUNK, len(body) - sent)
                if cut is not None and sent + n > cut:
                    n = max(0, cut - sent)
                if hold is not None and sent + n > hold[0] and not hold[1].is_set():
                    n = max(0, hold[0] - sent)
                    if n == 0:
                        self.wfile.flush()
                        hold[1].wait(300)
                        continue
                if n:
                    self.wfile.write(body[sent : sent + n])
                    sent += n
                if cut is not None and sent >= cut:
                    self.wfile.flush()
                    self._record(status, sent)
                    with self.fake._lock:
                        if (repo.model, name) in self.fake._down_after_cut:
                            self.fake._down_after_cut.discard((repo.model, name))
                            self.fake.down = True
                    self.close_connection = True
                    # a network cut: the connection ends before Content-Length bytes came
                    self.connection.shutdown(2)
                    return
                rate = self.fake.rate_bps
                if rate:
                    ahead = sent / rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)
        except (BrokenPipeError, ConnectionResetError):
            self._record(status, sent)
            self.close_connection = True
            return
        self._record(status, sent)
