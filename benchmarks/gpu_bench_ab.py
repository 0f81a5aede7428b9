"""`vsup bench` A/B on one GPU: one TP1 instance at 0.90 against two at 0.45 on the same GPU.

    python3 benchmarks/gpu_bench_ab.py --out DIR            # on the GPU node (default workload:
                                                            # 1000 prompts, 512 in / 256 out)
    python3 benchmarks/gpu_bench_ab.py --cpu-smoke --out DIR   # the same steps on CPU vLLM

Steps: write a model directory of Llama-3.1-8B's shape with only config.json and a tokenizer
(served with vLLM's `--load-format dummy`: random weights drawn by vLLM, no 15 GB weights
file to write first), copy the layouts of benchmarks/gpu_bench (h200-1x090.toml,
h200-2x045.toml) into DIR/layouts with that model and `load-format = "dummy"`, run `vsup bench`
on them with a VSUP_HOME of its own (no daemon runs before, so the bench stops its instances
and its daemon at the end), and keep:
  DIR/bench_ab.json, DIR/bench_ab.md    vsup bench's --json and --markdown
  DIR/bench_ab.txt                      its terminal output (the table, the progress lines)
  DIR/bench_progress.jsonl              status JSON's `bench` key, polled each second
  DIR/dashboard-bench.svg               the dashboard during the first measured run
  DIR/clients/                          each vLLM client's log and result file
  DIR/vsup-home.tar.gz                  instance logs, daemon.log, journal
  DIR/environment.json                  versions, nvidia-smi, the exact vsup bench command
vsup runs from this checkout (supervisor/ on PYTHONPATH) with this interpreter; vLLM must be
importable by it (on the lent H200: `source .vllmkit-b/stage.sh`, /work/shared/gpu-vllm).

`--cpu-smoke` checks this script on a machine without a GPU: a tiny model of the same kind
(config + tokenizer, dummy weights), the same two layouts made CPU layouts (the `cpu` profile,
`gpus = []`, one core each), 16 prompts of 32 in / 16 out. Not a GPU result.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The layouts of the H200 run in docs/gpu-runs/2026-12-01-h200-bench (model: /tmp/m8b, with
# weights); here they get this script's model directory and random weights from vLLM itself.
LAYOUTS = [
    REPO / "benchmarks/gpu_bench/h200-1x090.toml",
    REPO / "benchmarks/gpu_bench/h200-2x045.toml",
]

# Llama-3.1-8B's config.json (meta-llama/Llama-3.1-8B), token ids of the tokenizer below.
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
# What the CPU build serves in seconds (head_dim 64: the CPU attention kernel refuses 16).
TINY = {
    **LLAMA_8B,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "rope_scaling": None,
    "torch_dtype": "float32",
    "vocab_size": 512,
}


def write_model_dir(out: Path, config: dict) -> Path:
    """config.json + a word-level tokenizer covering the whole vocabulary (each id decodes to
    one word, so vLLM's random dataset round-trips its prompt lengths). No weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    tmp = Path(tempfile.mkdtemp(prefix=".model-", dir=out.parent))
    vocab = {f"w{i}": i for i in range(3, config["vocab_size"])}
    vocab.update({"<s>": 0, "</s>": 1, "<unk>": 2})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    )
    fast.save_pretrained(str(tmp))
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    if out.exists():
        shutil.rmtree(out)
    os.rename(tmp, out)
    return out


def layout_copies(dest: Path, model: Path, cpu: bool) -> list[Path]:
    """The two layouts with the model's absolute path; with `cpu`, made CPU layouts."""
    import tomli_w

    dest.mkdir(parents=True, exist_ok=True)
    out = []
    ncpu = max(1, os.cpu_count() or 1)
    for src in LAYOUTS:
        doc = tomllib.loads(src.read_text())
        doc["defaults"]["model"] = str(model)
        doc["defaults"].setdefault("args", {})["load-format"] = "dummy"
        if cpu:
            doc["layout"]["profiles"] = ["cpu"]
            doc["defaults"].pop("command", None)  # the cpu profile's `python -m ...`
            doc["defaults"].pop("gpu_memory_utilization", None)
            doc["defaults"]["args"]["max-model-len"] = 512
            # a CPU start takes 30 s on an idle machine, minutes on a shared, loaded one
            doc["defaults"]["start_timeout_s"] = 900
            for i, inst in enumerate(doc["instance"]):
                inst["gpus"] = []
                # one core each: vLLM CPU binds every instance's OpenMP threads to core 0
                inst["env"] = {"VLLM_CPU_OMP_THREADS_BIND": str(i % ncpu)}
        path = dest / src.name
        header = "".join(ln + "\n" for ln in src.read_text().splitlines() if ln.startswith("#"))
        path.write_text(f"# copied from {src.relative_to(REPO)} by gpu_bench_ab.py\n" + header)
        with path.open("ab") as f:
            tomli_w.dump(doc, f)
        out.append(path)
    return out


class ProgressWatch(threading.Thread):
    """Status JSON's `bench` each second into a JSONL file; a dashboard screenshot during the
    first measured run (what an on-call engineer would see)."""

    def __init__(self, home: Path, out: Path, env: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.home, self.out, self.env = home, out, env
        self.stop = threading.Event()
        self.phases: list[tuple[str | None, str]] = []
        self.shot: str | None = None

    def run(self) -> None:
        from vsup.control.client import JsonClient

        client = JsonClient(self.home, timeout=5)
        with (self.out / "bench_progress.jsonl").open("w") as f:
            while not self.stop.wait(1.0):
                try:
                    bench = client.status().get("bench")
                except Exception:
                    continue  # no daemon yet, or it is gone
                f.write(json.dumps({"t": round(time.time(), 1), "bench": bench}) + "\n")
                f.flush()
                if bench and (bench["layout"], bench["phase"]) not in self.phases:
                    self.phases.append((bench["layout"], bench["phase"]))
                if bench and bench["phase"] == "running" and self.shot is None:
                    self.shot = self.screenshot()
        client.close()

    def screenshot(self) -> str:
        svg = self.out / "dashboard-bench.svg"
        cmd = [sys.executable, "-m", "vsup", "tui", "--readonly", "--screenshot", str(svg)]
        try:
            proc = subprocess.run(
                cmd, env=self.env, capture_output=True, text=True, timeout=60, cwd=self.home
            )
        except subprocess.TimeoutExpired:
            return "timed out"
        return "ok" if svg.exists() else f"rc={proc.returncode} {proc.stderr.strip()[-200:]}"


def facts(env: dict[str, str], command: list[str]) -> dict:
    """Versions and the GPU, for the record."""

    def out(cmd: list[str]) -> str | None:
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return p.stdout.strip() if p.returncode == 0 else None

    return {
        "at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": sys.version.split()[0],
        "vllm": out([sys.executable, "-c", "import vllm; print(vllm.__version__)"]),
        "torch": out([sys.executable, "-c", "import torch; print(torch.__version__)"]),
        "nvidia_smi": out(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"]
        ),
        "cpus": os.cpu_count(),
        "command": shlex.join(command),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ".bench/ab"))
    p.add_argument("--cpu-smoke", action="store_true", help="CPU vLLM, a tiny model (no GPU)")
    p.add_argument("--num-prompts", type=int, help="default 1000 (16 with --cpu-smoke)")
    p.add_argument("--input-len", type=int, help="default 512 (32 with --cpu-smoke)")
    p.add_argument("--output-len", type=int, help="default 256 (16 with --cpu-smoke)")
    p.add_argument("--model-dir", type=Path, help="default .bench/models/<shape> here")
    p.add_argument("--timeout", type=float, default=900, help="per layout, until ready (s)")
    p.add_argument("--run-timeout", type=float, default=900, help="per layout's clients (s)")
    args = p.parse_args(argv)
    cpu = args.cpu_smoke
    out: Path = args.out.absolute()
    out.mkdir(parents=True, exist_ok=True)

    shape = "tiny-llama-shape" if cpu else "llama-3.1-8b-shape"
    model_dir = (args.model_dir or REPO / ".bench/models" / shape).absolute()
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    write_model_dir(model_dir, TINY if cpu else LLAMA_8B)
    print(f"model {model_dir} ({time.monotonic() - t0:.1f} s): config + tokenizer", flush=True)
    layouts = layout_copies(out / "layouts", model_dir, cpu)

    home = Path(tempfile.mkdtemp(prefix="vsup-ab-", dir="/tmp"))
    env = dict(os.environ, VSUP_HOME=str(home), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(
        x for x in (str(REPO / "supervisor"), env.get("PYTHONPATH")) if x
    )
    sys.path.insert(0, str(REPO / "supervisor"))
    n, inp, outl = (
        args.num_prompts or (16 if cpu else 1000),
        args.input_len or (32 if cpu else 512),
        args.output_len or (16 if cpu else 256),
    )
    command = [
        sys.executable, "-m", "vsup", "bench", *map(str, layouts),
        "--num-prompts", str(n), "--input-len", str(inp), "--output-len", str(outl),
        "--yes", "--json", str(out / "bench_ab.json"), "--markdown", str(out / "bench_ab.md"),
        "--out-dir", str(out / "clients"),
        "--timeout", str(args.timeout), "--run-timeout", str(args.run_timeout),
    ]  # fmt: skip
    # importing torch and vLLM for their versions takes a while: beside the bench, not before
    record: dict = {}
    about = threading.Thread(target=lambda: record.update(facts(env, command)), daemon=True)
    about.start()
    print("$ " + shlex.join(command[1:]), flush=True)

    watch = ProgressWatch(home, out, env)
    watch.start()
    with (out / "bench_ab.txt").open("w") as log:
        proc = subprocess.Popen(
            command,
            env=env,
            cwd=home,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            log.write(line)
        rc = proc.wait()
    watch.stop.set()
    watch.join(15)
    about.join(120)
    (out / "environment.json").write_text(json.dumps(record, indent=2))

    # the bench stops its daemon at the end; if it was cut short, stop what it left
    from vsup.control.client import Client

    with Client(home) as probe:
        if probe.alive() is not None:
            down = [sys.executable, "-m", "vsup", "down", "--yes"]
            subprocess.run(down, env=env, cwd=home, timeout=600, check=False)
    with tarfile.open(out / "vsup-home.tar.gz", "w:gz") as tar:
        for name in ("logs", "daemon.log", "journal.jsonl"):
            with contextlib.suppress(FileNotFoundError):
                tar.add(home / name, arcname=name)
    shutil.rmtree(home, ignore_errors=True)
    phases = ", ".join(f"{lay or '-'}:{ph}" for lay, ph in watch.phases)
    print(f"dashboard: bench phases seen in status JSON: {phases or 'none'}")
    print(f"dashboard screenshot: {watch.shot or 'not taken (no measured run seen)'}")
    print(f"vsup bench exit status {rc}; results in {out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
