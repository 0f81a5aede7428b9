"""vsup against real vLLM on a real NVIDIA GPU: every check of the GPU issue, one run.

    python3 benchmarks/gpu_real.py --model DIR --out DIR [--vllm-cmd "vllm serve"] [--gpu 0]

Needs vLLM (any release that logs `GPU KV cache size`), torch with CUDA, nvidia-smi, and vsup
importable by the same interpreter (the daemon is started with it). The model is a local
directory (e.g. a random-weight Llama of a real shape, with its tokenizer); the run uses about
0.9 of one GPU. Phases, each printed as PASS/FAIL lines with figures (exit 1 if any fails):

 pair     two co-tenants at gpu_memory_utilization 0.45 on one GPU, no block override, started
          by vsup (one after the other): KV capacity each got (vsup status vs the log's
          `GPU KV cache size`), attention backend from the log (FLASH_ATTN, FA version),
          HBM per instance vs nvidia-smi per pid, time to all-ready vs one start, the dashboard;
          daemon CPU while both serve vLLM's own bench client.
 kills    SIGKILL of one API server (its EngineCore outlives it holding HBM: swept, released,
          restarted) and SIGKILL of the other's EngineCore (engine_dead, restarted); the time
          from the kill to ready again split into vsup's part and vLLM's start (journal).
 down     `vsup down`: no process left, the GPU back to its memory before the run.
 control  the same two started at the same moment as plain processes, without vsup: the KV
          capacity each got, or which failed (the measured reason for the serialized start).
 kvload   one instance with a small KV (num-gpu-blocks-override) under load: KV use,
          preemptions and the advice as vsup shows them vs vLLM's /metrics read directly.
 alltp1   (2+ GPUs) one TP1 instance per GPU started at once: all-ready vs one start, pinning.
 tp2      (2+ GPUs) one TP2 instance on GPUs 0, 1 (NCCL): HBM summed and per GPU vs nvidia-smi.
 foreign  a foreign torch process holds most of the GPU while an instance at 0.90 starts:
          what vsup does (spawns and vLLM refuses: the exit classification and the
          EngineCore's ValueError line; or, with the memory wait, waits and names the holder),
          and that the instance comes up once the holder exits.

Everything (vLLM logs with their raw bytes, journal, status snapshots, /metrics payloads) is
packed into --out/logs.tar.gz; the record is --out/gpu_real.txt.
`--cpu` runs the same phases against the CPU build of vLLM (gpus = [], GPU checks skipped):
a check of this script's own logic on a machine without a GPU, not a GPU result.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpulib import (
    MiB,
    alive,
    check,
    journal,
    results,
    screenshot,
    smi_apps,
    smi_gpus,
    tree_pids,
    ts,
    vsup,
    wait_for,
)

PHASES = ("pair", "kills", "down", "control", "kvload", "alltp1", "tp2", "foreign")
# What each phase needs at least, in seconds, to be worth starting before the deadline.
PHASE_MIN_S = {
    "pair": 120,
    "kills": 90,
    "down": 15,
    "control": 80,
    "kvload": 70,
    "foreign": 60,
    "alltp1": 150,
    "tp2": 150,
}
SERVED = "m"

KV_TOKENS = re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens")
KV_GIB = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
BACKEND = re.compile(r"Using (\w+) attention backend")
FA_VERSION = re.compile(r"Using FlashAttention version (\d+)")
MEMORY_PLAN = re.compile(r"[^\n]*Free memory on device[^\n]*")
VALUE_ERROR = re.compile(r"[^\n\r]*ValueError: [^\n\r]*")

figures: dict = {}
notes: list[str] = []


def note(text: str) -> None:
    notes.append(text)
    print(f"NOTE {text}", flush=True)


class Ctx:
    """What every phase shares: the arguments, vsup's home, the work folder, the deadline."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cpu: bool = args.cpu
        self.gpu: int = args.gpu
        self.model = str(Path(args.model).resolve())
        self.cmd = (
            shlex.split(args.vllm_cmd)
            if args.vllm_cmd
            else [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
            ]
        )
        self.out: Path = args.out
        # Kept outside --out: the GPU machine returns only a few files from there.
        self.work = Path(tempfile.mkdtemp(prefix="gpu-real-work-"))
        self.home = Path(tempfile.mkdtemp(prefix="vsup-real-", dir="/tmp"))
        os.environ["VSUP_HOME"] = str(self.home)
        self.deadline = time.monotonic() + args.deadline_s
        self.before = {} if self.cpu else smi_gpus()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def gpus(self) -> list[int]:
        return [] if self.cpu else [self.gpu]

    def base_args(self) -> dict:
        args: dict[str, object] = {"served-model-name": SERVED}
        if self.cpu:
            args.update({"dtype": "float32", "max-model-len": 512, "enforce-eager": True})
        return args

    def base_env(self) -> dict:
        env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        if self.cpu:
            env["VLLM_CPU_KVCACHE_SPACE"] = "1"
        return env


# ----------------------------------------------------------------------------- helpers


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f'"{k}" = {toml_value(x)}' for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def write_layout(ctx: Ctx, name: str, instances: list[dict], restart: dict | None = None) -> Path:
    """A layout TOML with the run's defaults and these instances (keys as in docs/layout.md)."""
    restart = restart or {"policy": "on-failure", "backoff_s": 1, "max_failures": 4}
    lines = [
        "[layout]",
        f'name = "{name}"',
        "",
        "[defaults]",
        f"model = {toml_value(ctx.model)}",
        f"command = {toml_value(ctx.cmd)}",
        'host = "127.0.0.1"',
        "start_timeout_s = 400",
        "stop_grace_s = 20",
        f"env = {toml_value(ctx.base_env())}",
        f"restart = {toml_value(restart)}",
        "",
    ]
    for inst in instances:
        lines.append("[[instance]]")
        for k, v in inst.items():
            if k == "args":
                v = {**ctx.base_args(), **v}
            lines.append(f"{k} = {toml_value(v)}")
        if "args" not in inst:
            lines.append(f"args = {toml_value(ctx.base_args())}")
        lines.append("")
    path = ctx.home / f"{name}.toml"
    path.write_text("\n".join(lines))
    (ctx.work / path.name).write_text(path.read_text())
    return path


def st(ctx: Ctx) -> dict:
    proc = vsup("status", "--json", check_rc=False, quiet=True)
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {"instances": [], "gpus": [], "advice": []}


def inst_of(doc: dict, name: str) -> dict:
    return next(i for i in doc["instances"] if i["name"] == name)


def save_json(ctx: Ctx, name: str, doc) -> None:
    (ctx.work / name).write_text(json.dumps(doc, indent=1))


def events(ctx: Ctx, name: str | None = None, after: int = 0, kind: str | None = None) -> list:
    return [
        e
        for e in journal(ctx.home)
        if e.get("seq", 0) > after
        and (name is None or e.get("instance") == name)
        and (kind is None or e["kind"] == kind)
    ]


def last_seq(ctx: Ctx) -> int:
    return max((e.get("seq", 0) for e in journal(ctx.home)), default=0)


def run_log(ctx: Ctx, name: str, run: int) -> Path | None:
    for e in events(ctx, name, kind="spawn"):
        if e.get("run") == run and e.get("log"):
            return Path(e["log"])
    return None


def read_text(path: Path | None) -> str:
    if path is None or not path.exists():
        return ""
    return path.read_bytes().decode("utf-8", errors="replace")


def log_facts(text: str) -> dict:
    """What vLLM's own start-up log says about KV, backend and memory."""
    kv = [int(m.replace(",", "")) for m in KV_TOKENS.findall(text)]
    return {
        "kv_tokens_log": kv[-1] if kv else None,
        "kv_gib_log": float(KV_GIB.findall(text)[-1]) if KV_GIB.findall(text) else None,
        "backend_log": (BACKEND.findall(text) or [None])[-1],
        "fa_version_log": (FA_VERSION.findall(text) or [None])[-1],
        "memory_line": (MEMORY_PLAN.findall(text) or [None])[-1],
        "value_error": (VALUE_ERROR.findall(text) or [None])[0],
    }


def engine_core(pid: int) -> int | None:
    """The EngineCore child of an API server (its title is VLLM::EngineCore)."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        for c in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if "EngineCore" in c.name() or "EngineCore" in " ".join(c.cmdline()):
                    return c.pid
    return None


def get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def cache_labels(text: str) -> dict:
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            return dict(re.findall(r'(\w+)="([^"]*)"', line))
    return {}


def bench_cmd(ctx: Ctx, port: int, prompts: int, inp: int, out: int, conc: int) -> list[str]:
    """vLLM's own benchmark client against one instance."""
    flags = [
        "--backend",
        "vllm",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--model",
        SERVED,
        "--tokenizer",
        ctx.model,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(inp),
        "--random-output-len",
        str(out),
        "--num-prompts",
        str(prompts),
        "--max-concurrency",
        str(conc),
        "--ignore-eos",
    ]
    if ctx.cpu:
        # vllm-cpu's CLI cannot find its own version (the dist is named vllm-cpu): call the
        # client directly.
        code = (
            "import sys; from vllm.benchmarks import serve; "
            "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
            "p = P(); serve.add_cli_args(p); serve.main(p.parse_args(sys.argv[1:]))"
        )
        return [sys.executable, "-c", code, *flags]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", *flags]


def start_bench(ctx: Ctx, tag: str, port: int, **kw) -> tuple[subprocess.Popen, Path]:
    log = ctx.work / f"bench_{tag}.log"
    proc = subprocess.Popen(
        bench_cmd(ctx, port, **kw),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=tempfile.gettempdir(),
        start_new_session=True,
    )
    return proc, log


def bench_summary(log: Path) -> str:
    keep = ("Successful requests", "Output token throughput", "Benchmark duration")
    lines = [ln.strip() for ln in read_text(log).splitlines() if ln.strip().startswith(keep)]
    return "; ".join(" ".join(ln.split()) for ln in lines) or read_text(log)[-300:]


def stop_group(proc: subprocess.Popen, grace: float = 20) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    # The group may outlive its leader (an orphaned EngineCore): end what is left of it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def gpu_used_mib(ctx: Ctx) -> int | None:
    if ctx.cpu:
        return None
    return next(g["used_mib"] for g in smi_gpus().values() if g["index"] == ctx.gpu)


def smi_by_pids(pids: set[int]) -> tuple[int, list[dict]]:
    mine = [a for a in smi_apps() if a["pid"] in pids]
    return sum(a["used_mib"] for a in mine), mine


def wait_gpu_free(ctx: Ctx, pids: set[int], timeout: float = 60) -> float:
    """Seconds until no pid of `pids` holds memory on any GPU (NaN on CPU)."""
    if ctx.cpu:
        return float("nan")
    t0 = time.monotonic()
    wait_for(lambda: not smi_by_pids(pids)[1], timeout, "the GPU memory to be released")
    return time.monotonic() - t0


# ----------------------------------------------------------------------------- phases

PAIR = ("t0a", "t0b")
PAIR_PORTS = {"t0a": 8400, "t0b": 8401}


def phase_pair(ctx: Ctx) -> None:
    """Two co-tenants at 0.45 started by vsup, then vLLM's bench client on both."""
    layout = write_layout(
        ctx,
        "real-pair",
        [
            {"name": n, "gpus": ctx.gpus(), "port": PAIR_PORTS[n], "gpu_memory_utilization": 0.45}
            for n in PAIR
        ],
    )
    vsup("validate", str(layout))
    t0 = time.time()
    vsup("up", str(layout), "--detach", "--wait", "--timeout", "500", timeout=560)
    all_ready = time.time() - t0
    spawn = {e["instance"]: ts(e) for e in events(ctx, kind="spawn")}
    ready = {e["instance"]: e for e in events(ctx, kind="ready")}
    one = ready["t0a"]["startup_s"]
    figures["pair_all_ready_s"] = round(all_ready, 1)
    figures["pair_startup_s"] = {n: ready[n]["startup_s"] for n in PAIR}
    figures["one_start_s"] = one
    check(
        "co-tenants start one after the other",
        spawn["t0b"] >= ts(ready["t0a"]),
        f"t0a ready after {one:.1f}s; t0b spawned {spawn['t0b'] - ts(ready['t0a']):.3f}s after "
        f"that, ready after {ready['t0b']['startup_s']:.1f}s; all ready {all_ready:.1f}s from "
        f"`vsup up` = {all_ready / one:.2f}x one start",
    )

    def telemetry_in():
        d = st(ctx)
        return d if all(i["kv_capacity_tokens"] and i["backend"] for i in d["instances"]) else None

    doc = wait_for(telemetry_in, 60, "KV capacity and backend of both instances")
    save_json(ctx, "status_pair_ready.json", doc)
    apps = [] if ctx.cpu else smi_apps()
    figures["pair"] = {}
    for n in PAIR:
        i = inst_of(doc, n)
        facts = log_facts(read_text(run_log(ctx, n, 1)))
        row = {
            "kv_tokens_vsup": i["kv_capacity_tokens"],
            **facts,
            "backend_vsup": i["backend"],
            "backend_source": i["backend_source"],
            "hbm_mib_vsup": round(i["hbm_bytes"] / MiB) if i["hbm_bytes"] else None,
            "planned_hbm_mib": round(i["planned_hbm_bytes"] / MiB)
            if i.get("planned_hbm_bytes")
            else None,
        }
        figures["pair"][n] = row
        check(
            f"{n} KV capacity in vsup == vLLM's `GPU KV cache size` line",
            row["kv_tokens_vsup"] is not None and row["kv_tokens_vsup"] == row["kv_tokens_log"],
            f"vsup {row['kv_tokens_vsup']} tokens, log {row['kv_tokens_log']} tokens "
            f"({row['kv_gib_log']} GiB of KV)",
        )
        want = "CPU_ATTN" if ctx.cpu else "FLASH_ATTN"
        check(
            f"{n} attention backend from the real log",
            i["backend"] == want
            and (ctx.cpu or (i["backend_source"] == "log" and facts["fa_version_log"] == "3")),
            f"vsup shows {i['backend']} (source {i['backend_source']}); log: "
            f"{facts['backend_log']}, FlashAttention version {facts['fa_version_log']}",
        )
        if not ctx.cpu:
            pids = tree_pids(i["pid"])
            smi_sum = sum(a["used_mib"] for a in apps if a["pid"] in pids)
            on_other = [a for a in apps if a["pid"] in pids and a["gpu"] != ctx.gpu]
            row["hbm_mib_smi"] = smi_sum
            check(
                f"{n} HBM == nvidia-smi sum over its pids",
                row["hbm_mib_vsup"] is not None
                and abs(row["hbm_mib_vsup"] - smi_sum) <= len(pids)
                and not on_other,
                f"vsup {row['hbm_mib_vsup']} MiB ({i['hbm_source']}), nvidia-smi {smi_sum} MiB "
                f"over pids {sorted(pids)}; planned {row['planned_hbm_mib']} MiB; "
                f"{facts['memory_line'] and facts['memory_line'].split('] ')[-1]}",
            )
    a, b = (figures["pair"][n]["kv_tokens_vsup"] or 0 for n in PAIR)
    check(
        "both co-tenants got the KV capacity of their share (within 3% of each other)",
        a > 0 and b > 0 and abs(a - b) <= 0.03 * max(a, b),
        f"t0a {a} tokens, t0b {b} tokens (ratio {b / a if a else float('nan'):.3f})",
    )
    if not ctx.cpu:
        by = {g["index"]: g for g in smi_gpus().values()}[ctx.gpu]
        g = next(x for x in doc["gpus"] if x["index"] == ctx.gpu)
        check(
            f"GPU {ctx.gpu} used/total matches nvidia-smi",
            abs(g["hbm_used_bytes"] / MiB - by["used_mib"]) <= max(0.01 * by["used_mib"], 2),
            f"vsup {g['hbm_used_bytes'] / MiB:.0f}/{g['hbm_total_bytes'] / MiB:.0f} MiB, "
            f"nvidia-smi {by['used_mib']}/{by['total_mib']} MiB",
        )

    # Daemon CPU while both real instances serve vLLM's own bench client.
    import psutil

    daemon = psutil.Process(doc["supervisor"]["pid"])
    c0, w0 = sum(daemon.cpu_times()[:2]), time.monotonic()
    n_prompts = 24 if ctx.cpu else 400
    inp, outl = (64, 32) if ctx.cpu else (512, 256)
    benches = [
        start_bench(ctx, n, PAIR_PORTS[n], prompts=n_prompts, inp=inp, out=outl, conc=64)
        for n in PAIR
    ]
    peak = {n: 0.0 for n in PAIR}
    shot_taken = False
    while any(p.poll() is None for p, _ in benches) and time.monotonic() - w0 < 150:
        time.sleep(1.0)
        d = st(ctx)
        for n in PAIR:
            with contextlib.suppress(StopIteration):
                peak[n] = max(peak[n], inst_of(d, n)["kv_cache_usage"] or 0)
        if not shot_taken and time.monotonic() - w0 > 4:
            screenshot(ctx.out / "dash-pair.svg", (160, 45), select="t0a")
            shot_taken = True
    for p, _ in benches:
        if p.poll() is None:
            stop_group(p)
    c1, w1 = sum(daemon.cpu_times()[:2]), time.monotonic()
    pct = 100 * (c1 - c0) / (w1 - w0)
    figures["daemon_cpu_pct_under_load"] = round(pct, 2)
    figures["pair_load"] = {
        n: bench_summary(log) for (_, log), n in zip(benches, PAIR, strict=True)
    }
    check(
        "daemon CPU while two real instances serve load",
        pct < 25,
        f"{pct:.2f}% of one core over {w1 - w0:.1f}s; peak KV use seen by vsup "
        f"{ {n: round(v, 3) for n, v in peak.items()} }; bench: {figures['pair_load']}",
    )
    if not shot_taken:
        screenshot(ctx.out / "dash-pair.svg", (160, 45), select="t0a")


def kill_and_back(ctx: Ctx, name: str, target: str) -> None:
    """SIGKILL the API server (`target` "api") or its EngineCore ("core"); wait for ready."""
    doc = st(ctx)
    i = inst_of(doc, name)
    api = i["pid"]
    core = engine_core(api)
    pids = tree_pids(api)
    seq0 = last_seq(ctx)
    held_mib = None
    if target == "api":
        # The daemon is paused around the kill so the orphaned EngineCore can be seen holding
        # its memory; running, vsup sweeps it within milliseconds.
        dpid = doc["supervisor"]["pid"]
        os.kill(dpid, signal.SIGSTOP)
        try:
            t_kill = time.time()
            os.kill(api, signal.SIGKILL)
            wait_for(lambda: not alive(api), 10, "the API server to die")
            if ctx.cpu:
                held_mib = -1 if core and alive(core) else None
            else:
                held_mib = wait_for(
                    lambda: smi_by_pids({core})[0] if core else None, 10, "the orphan in smi"
                )
            paused = time.time() - t_kill
        finally:
            os.kill(dpid, signal.SIGCONT)
        check(
            f"{name}: after SIGKILL of the API server its EngineCore still holds HBM",
            bool(held_mib) and core is not None and alive(core),
            f"API server {api} gone; EngineCore {core} alive, holding {held_mib} MiB "
            f"(daemon paused {paused:.2f}s to see it)",
        )
    else:
        t_kill = time.time()
        assert core is not None
        os.kill(core, signal.SIGKILL)

    def back():
        d = st(ctx)
        x = inst_of(d, name)
        return d if x["state"] == "ready" and x["pid"] != api else None

    d2 = wait_for(back, 300, f"{name} ready again")
    ev = events(ctx, name, after=seq0)
    save_json(ctx, f"journal_kill_{name}.json", ev)
    ex = next((e for e in ev if e["kind"] == "exit"), None)
    rel = next((e for e in ev if e["kind"] == "gpu_release"), None)
    sp = next((e for e in ev if e["kind"] == "spawn"), None)
    rd = next((e for e in ev if e["kind"] == "ready"), None)
    sw = next((e for e in ev if e["kind"] == "sweep"), None)
    want = "killed" if target == "api" else "engine_dead"
    check(
        f"{name}: exit classified {want}",
        ex is not None and ex["reason"] == want,
        f"reason {ex and ex['reason']}, signal {ex and ex['signal']}, code {ex and ex['code']}, "
        f"excerpt {(ex and ex['log_excerpt'] or '')[:200]!r}",
    )
    left = [p for p in pids if alive(p)]
    check(
        f"{name}: old process tree gone, memory released before the new spawn",
        not left
        and sp is not None
        and (ctx.cpu or (rel is not None and rel["released"] is True and ts(sp) >= ts(rel))),
        f"left {left}; gpu_release {rel and {k: rel[k] for k in ('released', 'waited_s')}}",
    )
    x = inst_of(d2, name)
    split = {
        "kill_to_exit_seen_s": round(ts(ex) - t_kill, 3) if ex else None,
        "sweep": sw and {k: sw.get(k) for k in ("pids", "kill", "waited_s")},
        "exit_seen_to_released_s": round(ts(rel) - ts(ex), 3) if rel and ex else None,
        "vsup_exit_seen_to_spawn_s": round(ts(sp) - ts(ex), 3) if sp and ex else None,
        "vllm_start_s": rd["startup_s"] if rd else None,
        "kill_to_ready_s": round(ts(rd) - t_kill, 1) if rd else None,
    }
    figures[f"kill_{target}"] = split
    check(
        f"{name}: restarted on the same GPU",
        x["gpus"] == ([] if ctx.cpu else [ctx.gpu]) and x["restarts"] >= 1,
        f"pid {api} -> {x['pid']}, restarts {x['restarts']}; {split}",
    )
    if target == "core":
        assert ex is not None
        (ctx.work / "engine_dead.log").write_bytes(
            (run_log(ctx, name, ex["run"]) or Path("/dev/null")).read_bytes()
        )


def phase_kills(ctx: Ctx) -> None:
    kill_and_back(ctx, "t0a", "api")
    kill_and_back(ctx, "t0b", "core")


def phase_down(ctx: Ctx, tag: str = "down") -> None:
    doc = st(ctx)
    pids: set[int] = set()
    for i in doc["instances"]:
        if i["pid"]:
            pids |= tree_pids(i["pid"])
    daemon = doc.get("supervisor", {}).get("pid")
    vsup("down", timeout=120)
    time.sleep(1.0)
    left = [p for p in pids | ({daemon} if daemon else set()) if alive(p)]
    on_gpu = [] if ctx.cpu else smi_by_pids(pids)[1]
    check(f"{tag}: vsup down leaves no process", not left and not on_gpu, f"left {left} {on_gpu}")
    if not ctx.cpu:
        for uuid, g in smi_gpus().items():
            b = ctx.before[uuid]["used_mib"]
            check(
                f"{tag}: GPU {g['index']} memory back to its level before the run",
                g["used_mib"] <= b,
                f"before {b} MiB, after {g['used_mib']} MiB",
            )


def phase_control(ctx: Ctx) -> None:
    """The same two, started at the same moment as plain processes, without vsup."""
    procs = {}
    env = {**os.environ, **ctx.base_env(), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env["CUDA_VISIBLE_DEVICES"] = "" if ctx.cpu else str(ctx.gpu)
    from vsup.layout.flags import args_to_flags

    for n, port in zip(("c0a", "c0b"), (8410, 8411), strict=True):
        argv = [*ctx.cmd, "--model", ctx.model, "--host", "127.0.0.1", "--port", str(port)]
        if not ctx.cpu:
            argv += ["--gpu-memory-utilization", "0.45"]
        argv += args_to_flags(ctx.base_args())
        log = ctx.work / f"control_{n}.log"
        procs[n] = (argv, port, log)
    (ctx.work / "control_argv.json").write_text(json.dumps({n: p[0] for n, p in procs.items()}))
    t0 = time.monotonic()
    running = {
        n: subprocess.Popen(
            argv,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tempfile.gettempdir(),
            start_new_session=True,
        )
        for n, (argv, port, log) in procs.items()
    }
    outcome: dict[str, dict] = {}
    try:
        while len(outcome) < 2 and time.monotonic() - t0 < min(300, ctx.left() - 30):
            for n, p in running.items():
                if n in outcome:
                    continue
                if p.poll() is not None:
                    outcome[n] = {"ready": False, "exit_code": p.returncode}
                elif get(f"http://127.0.0.1:{procs[n][1]}/health", 2)[0] == 200:
                    outcome[n] = {"ready": True, "ready_s": round(time.monotonic() - t0, 1)}
            time.sleep(0.5)
        hbm = {}
        if not ctx.cpu:
            for n, p in running.items():
                hbm[n] = smi_by_pids(tree_pids(p.pid))[0] if p.poll() is None else 0
    finally:
        pids = set()
        for p in running.values():
            pids |= tree_pids(p.pid)
        for p in running.values():
            stop_group(p)
    rows = {}
    for n, (_, _, log) in procs.items():
        text = read_text(log)
        facts = log_facts(text)
        row = outcome.get(n, {"ready": False, "timeout": True})
        # Only a failed start has an error to show; every start warns about ulimit's OSError.
        err = None
        if not row.get("ready"):
            err = facts["value_error"] or next(
                (ln for ln in reversed(text.splitlines()) if "Error" in ln), None
            )
        rows[n] = {**row, **facts, "error": err}
        rows[n]["hbm_mib_smi"] = hbm.get(n)
    figures["control"] = rows
    save_json(ctx, "control.json", rows)
    released = wait_gpu_free(ctx, pids, 90)
    vsup_kv = {n: figures.get("pair", {}).get(n, {}).get("kv_tokens_vsup") for n in PAIR}
    desc = "; ".join(
        f"{n}: "
        + (
            f"ready after {r['ready_s']}s, KV {r['kv_tokens_log']} tokens ({r['kv_gib_log']} GiB)"
            if r.get("ready")
            else f"FAILED (exit {r.get('exit_code')}): {(r['error'] or '')[-220:]}"
        )
        for n, r in rows.items()
    )
    check(
        "control: two plain vLLM started together on one GPU (recorded beside vsup's pair)",
        True,
        f"{desc}; vsup's one-after-the-other start gave {vsup_kv}; memory released "
        f"{released:.1f}s after the stop",
    )


def phase_kvload(ctx: Ctx) -> None:
    """A small KV (num-gpu-blocks-override) under load: preemptions, advice, /metrics."""
    # vLLM refuses to start when the override cannot hold one max-model-len request.
    blocks = 6 if ctx.cpu else 128
    mml = 512 if ctx.cpu else 1024
    port = 8420
    layout = write_layout(
        ctx,
        "real-kvload",
        [
            {
                "name": "kv0",
                "gpus": ctx.gpus(),
                "port": port,
                "gpu_memory_utilization": 0.3,
                "args": {
                    "num-gpu-blocks-override": blocks,
                    "max-model-len": mml,
                    "enforce-eager": True,
                },
            }
        ],
    )
    vsup("up", str(layout), "--detach", "--wait", "--timeout", "300", timeout=330)
    # Each request needs (inp + out) / block_size blocks: a few fit at once, the rest preempt.
    inp, outl, n, conc = (200, 250, 12, 12) if ctx.cpu else (256, 256, 24, 24)
    bench, blog = start_bench(ctx, "kvload", port, prompts=n, inp=inp, out=outl, conc=conc)
    samples = []
    advice_seen: dict[str, str] = {}
    t0 = time.monotonic()
    shot = False
    while bench.poll() is None and time.monotonic() - t0 < 150:
        d = st(ctx)
        code, text = get(f"http://127.0.0.1:{port}/metrics")
        i = inst_of(d, "kv0")
        samples.append(
            {
                "t": round(time.monotonic() - t0, 2),
                "vsup_kv": i["kv_cache_usage"],
                "vsup_preempt": i["preemptions_total"],
                "vsup_preempt_per_min": i["preemptions_per_min"],
                "vsup_running": i["requests_running"],
                "vsup_waiting": i["requests_waiting"],
                "metrics_kv": metric(text, "vllm:kv_cache_usage_perc"),
                "metrics_preempt": metric(text, "vllm:num_preemptions_total"),
                "metrics_running": metric(text, "vllm:num_requests_running"),
                "metrics_waiting": metric(text, "vllm:num_requests_waiting"),
            }
        )
        for a in d.get("advice", []):
            advice_seen.setdefault(a["kind"], a["message"])
        if "kv_exhausted" in advice_seen and not shot:
            screenshot(ctx.out / "dash-kvload.svg", (160, 45), select="kv0")
            (ctx.work / "metrics_kvload.txt").write_text(text)
            shot = True
        time.sleep(0.7)
    if bench.poll() is None:
        stop_group(bench)
    time.sleep(2.5)  # one more scrape by the daemon after the load
    d = st(ctx)
    i = inst_of(d, "kv0")
    _, text = get(f"http://127.0.0.1:{port}/metrics")
    (ctx.work / "metrics_after_kvload.txt").write_text(text)
    save_json(ctx, "kvload_samples.json", samples)
    labels = cache_labels(text)
    cap = int(labels.get("num_gpu_blocks", 0)) * int(labels.get("block_size", 0))
    m_pre = metric(text, "vllm:num_preemptions_total")
    peak_kv = max((s["vsup_kv"] or 0 for s in samples), default=0)
    peak_m = max((s["metrics_kv"] or 0 for s in samples), default=0)
    figures["kvload"] = {
        "blocks": blocks,
        "kv_tokens_vsup": i["kv_capacity_tokens"],
        "kv_tokens_metrics": cap,
        "preemptions_vsup": i["preemptions_total"],
        "preemptions_metrics": m_pre,
        "peak_kv_vsup": peak_kv,
        "peak_kv_metrics": peak_m,
        "advice": advice_seen,
        "bench": bench_summary(blog),
    }
    check(
        "kvload: KV capacity in vsup == num_gpu_blocks x block_size in /metrics",
        i["kv_capacity_tokens"] == cap and cap > 0,
        f"vsup {i['kv_capacity_tokens']}, /metrics {labels.get('num_gpu_blocks')} x "
        f"{labels.get('block_size')} = {cap}",
    )
    check(
        "kvload: preemptions in vsup == vllm:num_preemptions_total",
        bool(m_pre) and i["preemptions_total"] == m_pre,
        f"vsup {i['preemptions_total']}, /metrics {m_pre}; peak KV use vsup {peak_kv:.3f}, "
        f"/metrics {peak_m:.3f}; {len(samples)} samples",
    )
    check(
        "kvload: the KV-exhausted advice fired",
        "kv_exhausted" in advice_seen,
        f"advice seen: {advice_seen}",
    )
    if not shot:
        screenshot(ctx.out / "dash-kvload.svg", (160, 45), select="kv0")
    phase_down(ctx, "kvload down")


FOREIGN = """
import sys, time, torch
free, total = torch.cuda.mem_get_info()
x = torch.empty(int(float(sys.argv[1]) * total), dtype=torch.uint8, device="cuda")
print("holding", x.numel() >> 20, "MiB of", total >> 20, flush=True)
time.sleep(float(sys.argv[2]))
"""


def phase_foreign(ctx: Ctx) -> None:
    """A foreign process holds most of the GPU while an instance at 0.90 starts."""
    if ctx.cpu:
        note("foreign: needs a GPU (skipped on --cpu)")
        return
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(ctx.gpu), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    flog = ctx.work / "foreign.log"
    holder = subprocess.Popen(
        [sys.executable, "-c", FOREIGN, "0.6", "400"],
        stdout=flog.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        _foreign_run(ctx, holder, flog)
    finally:
        stop_group(holder, 5)  # never leave the holder on the GPU
    phase_down(ctx, "foreign down")


def _foreign_run(ctx: Ctx, holder: subprocess.Popen, flog: Path) -> None:
    wait_for(lambda: "holding" in read_text(flog), 60, "the foreign process's allocation")
    held = smi_by_pids({holder.pid})[0]
    layout = write_layout(
        ctx,
        "real-foreign",
        [
            {
                "name": "big0",
                "gpus": ctx.gpus(),
                "port": 8430,
                "gpu_memory_utilization": 0.9,
                "args": {"enforce-eager": True},
            }
        ],
        restart={"policy": "on-failure", "backoff_s": 5, "backoff_max_s": 10, "max_failures": 6},
    )
    seq0 = last_seq(ctx)
    vsup("up", str(layout), "--detach", check_rc=False, timeout=120)
    # vsup either spawns and vLLM refuses (an `exit`), or - with the memory wait of the engine
    # work - spawns nothing and says who holds the memory (a `memory_wait` event).
    first = wait_for(
        lambda: next(
            (e for e in events(ctx, "big0", after=seq0) if e["kind"] in ("exit", "memory_wait")),
            None,
        ),
        150,
        "big0's first exit or memory wait",
    )
    time.sleep(1.5)  # the next status carries the advice and the wait
    d = st(ctx)
    i = inst_of(d, "big0")
    advice = [a["kind"] for a in d.get("advice", [])]
    figures["foreign"] = {"held_mib": held, "first": first, "state_after": i["state"]}
    figures["foreign"]["advice"] = advice
    if first["kind"] == "exit":
        text = read_text(run_log(ctx, "big0", first["run"]))
        (ctx.work / "memory_refusal.log").write_text(text)
        facts = log_facts(text)
        figures["foreign"]["value_error"] = facts["value_error"]
        what = (
            f"spawned; exit reason {first['reason']} (code {first['code']}); EngineCore: "
            f"{(facts['value_error'] or '').split('] ')[-1][:300]}"
        )
    else:
        figures["foreign"]["waiting_for"] = i.get("waiting_for")
        what = f"waits without spawning: {first.get('message')}; waiting_for {i.get('waiting_for')}"
    check(
        "foreign: what vsup does when the GPU is held (recorded)",
        True,
        f"holder pid {holder.pid} holds {held} MiB; big0 {what}; state now {i['state']}; "
        f"advice {advice}",
    )
    t_free = time.time()
    stop_group(holder, 5)
    try:
        d2 = wait_for(
            lambda: (x := st(ctx)) and inst_of(x, "big0")["state"] in ("ready", "failed") and x,
            min(200, ctx.left() - 25),
            "big0 ready or failed after the holder left",
        )
        i2 = inst_of(d2, "big0")
        figures["foreign"]["after_release"] = {
            "state": i2["state"],
            "restarts": i2["restarts"],
            "s_after_release": round(time.time() - t_free, 1),
        }
        check(
            "foreign: big0 comes up once the holder has gone",
            i2["state"] == "ready",
            f"state {i2['state']} {time.time() - t_free:.1f}s after the holder exited, "
            f"restarts {i2['restarts']}, KV {i2['kv_capacity_tokens']} tokens",
        )
    except SystemExit as exc:
        check("foreign: big0 comes up once the holder has gone", False, str(exc))


def gpu_indices(ctx: Ctx) -> list[int]:
    return sorted(g["index"] for g in ctx.before.values())


def phase_alltp1(ctx: Ctx) -> None:
    """One TP1 instance per GPU, all started at once: all-ready vs one start, pinning."""
    gpus = gpu_indices(ctx)
    if len(gpus) < 2:
        note(f"alltp1: not run, needs 2 or more GPUs ({len(gpus)} here)")
        return
    insts = [
        {"name": f"g{g}", "gpus": [g], "port": 8440 + g, "gpu_memory_utilization": 0.9}
        for g in gpus
    ]
    layout = write_layout(ctx, "real-alltp1", insts)
    seq0 = last_seq(ctx)
    t0 = time.time()
    vsup("up", str(layout), "--detach", "--wait", "--timeout", "500", timeout=560)
    all_ready = time.time() - t0
    spawn = [ts(e) for e in events(ctx, after=seq0, kind="spawn")]
    starts = sorted(e["startup_s"] for e in events(ctx, after=seq0, kind="ready"))
    median = starts[len(starts) // 2]
    figures["alltp1"] = {"gpus": len(gpus), "all_ready_s": round(all_ready, 1)}
    figures["alltp1"]["startup_s"] = starts
    check(
        f"alltp1: {len(gpus)} TP1 instances start in parallel",
        max(spawn) - min(spawn) < 2.0,
        f"spawns within {max(spawn) - min(spawn):.3f}s; all ready {all_ready:.1f}s vs the median "
        f"start {median:.1f}s (x{all_ready / median:.2f}); one start in the pair phase: "
        f"{figures.get('one_start_s')}",
    )
    apps = smi_apps()
    for i in st(ctx)["instances"]:
        pids = tree_pids(i["pid"])
        on = sorted({a["gpu"] for a in apps if a["pid"] in pids})
        check(f"alltp1: {i['name']} only on GPU {i['gpus']}", on == i["gpus"], f"on GPUs {on}")
    phase_down(ctx, "alltp1 down")


def phase_tp2(ctx: Ctx) -> None:
    """One TP2 instance on GPUs 0 and 1 (NCCL): HBM summed over both and per GPU."""
    gpus = gpu_indices(ctx)
    if len(gpus) < 2:
        note(f"tp2: not run, needs 2 GPUs ({len(gpus)} here)")
        return
    pair = gpus[:2]
    layout = write_layout(
        ctx,
        "real-tp2",
        [{"name": "tp2", "gpus": pair, "port": 8450, "gpu_memory_utilization": 0.45}],
    )
    seq0 = last_seq(ctx)
    vsup("up", str(layout), "--detach", "--wait", "--timeout", "500", timeout=560)
    time.sleep(3)
    doc = st(ctx)
    i = inst_of(doc, "tp2")
    (ctx.work / "tp2_startup.log").write_bytes(read_text(run_log(ctx, "tp2", 1)).encode())
    pids = tree_pids(i["pid"])
    apps = [a for a in smi_apps() if a["pid"] in pids]
    per_gpu_smi = {g: sum(a["used_mib"] for a in apps if a["gpu"] == g) for g in pair}
    per_gpu_vsup = {
        g["index"]: round(
            sum(p["hbm_bytes"] or 0 for p in g.get("processes", []) if p["instance"] == "tp2") / MiB
        )
        for g in doc["gpus"]
        if g["index"] in pair
    }
    total = round((i["hbm_bytes"] or 0) / MiB)
    figures["tp2"] = {"hbm_mib_vsup": total, "per_gpu_vsup": per_gpu_vsup}
    figures["tp2"]["per_gpu_smi"] = per_gpu_smi
    figures["tp2"]["startup_s"] = next(
        (e["startup_s"] for e in events(ctx, "tp2", after=seq0, kind="ready")), None
    )
    check(
        "tp2: HBM summed over both GPUs == nvidia-smi over its pids",
        abs(total - sum(per_gpu_smi.values())) <= len(pids) and all(per_gpu_smi.values()),
        f"vsup {total} MiB; nvidia-smi per GPU {per_gpu_smi}; vsup per GPU {per_gpu_vsup}; "
        f"workers {[a['pid'] for a in apps]}",
    )
    check(
        "tp2: per-GPU figures (the bars) == nvidia-smi per GPU",
        all(abs(per_gpu_vsup.get(g, 0) - per_gpu_smi[g]) <= len(pids) for g in pair),
        f"vsup {per_gpu_vsup}, nvidia-smi {per_gpu_smi}",
    )
    phase_down(ctx, "tp2 down")


# ----------------------------------------------------------------------------- main


def machine() -> str:
    parts = [platform.node() or "?", platform.machine()]
    with contextlib.suppress(Exception):
        parts.append(
            subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,driver_version,memory.total",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .replace("\n", " | ")
        )
    with contextlib.suppress(Exception):
        import torch

        parts.append(f"torch {torch.__version__}")
    with contextlib.suppress(Exception):
        import vllm

        parts.append(f"vllm {vllm.__version__}")
    return "; ".join(parts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="local model directory")
    p.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="gpu-real-")))
    p.add_argument(
        "--vllm-cmd",
        default="",
        help="how vLLM runs here (default: this python -m vllm.entrypoints.openai.api_server)",
    )
    p.add_argument("--gpu", type=int, default=0, help="the GPU to use (default 0)")
    p.add_argument("--phases", default=",".join(PHASES), help=f"subset of {','.join(PHASES)}")
    p.add_argument("--deadline-s", type=float, default=3000, help="skip phases after this")
    p.add_argument("--cpu", action="store_true", help="logic check with the CPU build of vLLM")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(args)
    used_before = {g["index"]: g["used_mib"] for g in ctx.before.values()}
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        f"# gpu_real.py, {started}",
        f"command: {' '.join(shlex.quote(a) for a in sys.argv)}",
        f"machine: {machine()}",
        f"model: {ctx.model}",
        f"GPU memory used before (MiB): {used_before}",
    ]
    print("\n".join(head), flush=True)
    want = [x for x in args.phases.split(",") if x]
    fns = {
        "pair": phase_pair,
        "kills": phase_kills,
        "down": phase_down,
        "control": phase_control,
        "kvload": phase_kvload,
        "foreign": phase_foreign,
        "alltp1": phase_alltp1,
        "tp2": phase_tp2,
    }
    timing = {}
    broken: set[str] = set()
    try:
        for name in PHASES:
            if name not in want:
                continue
            if name == "kills" and "pair" in broken:
                note("kills: not run, the pair did not come up")
                continue
            if ctx.left() < PHASE_MIN_S[name]:
                note(f"{name}: not run, {ctx.left():.0f}s left before the deadline")
                continue
            print(f"\n=== {name} ({ctx.left():.0f}s left)", flush=True)
            t0 = time.monotonic()
            try:
                fns[name](ctx)
            except (Exception, SystemExit) as exc:  # one broken phase must not lose the rest
                check(f"{name}: phase ran to its end", False, f"{type(exc).__name__}: {exc}")
                broken.add(name)
                with contextlib.suppress(Exception, SystemExit):
                    vsup("down", check_rc=False, timeout=120)
            timing[name] = round(time.monotonic() - t0, 1)
    finally:
        # Unconditionally: any status call starts a daemon, and `down` also ends an idle one.
        with contextlib.suppress(Exception, SystemExit):
            vsup("down", check_rc=False, timeout=120)
        figures["phase_s"] = timing
        failed = [r for r in results if not r[1]]
        body = [f"{'PASS' if ok else 'FAIL'} {n}: {d}" for n, ok, d in results]
        body += [f"NOTE {n}" for n in notes]
        summary = f"checks={len(results)} failed={len(failed)}"
        text = "\n".join([*head, "", *body, "", "figures: " + json.dumps(figures), summary])
        (args.out / "gpu_real.txt").write_text(text + "\n")
        (args.out / "results.json").write_text(
            json.dumps({"head": head, "results": results, "figures": figures, "notes": notes})
        )
        with contextlib.suppress(Exception):
            for f in ctx.home.rglob("*"):
                if f.is_file() and not f.is_socket():
                    dest = ctx.work / "vsup_home" / f.relative_to(ctx.home)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(f.read_bytes())
            with tarfile.open(args.out / "logs.tar.gz", "w:gz") as tar:
                tar.add(ctx.work, arcname="work")
        print(summary, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
