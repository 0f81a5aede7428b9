"""`vsup service install|uninstall|status`: the daemon as a systemd unit, so that it comes back
after a reboot (docs/service.md).

`install` writes a user unit (`~/.config/systemd/user/vsup.service`) that runs this interpreter's
`python -m vsup daemon` for this VSUP_HOME, and prints the steps that enable it, lingering
included (`loginctl enable-linger`: without it a user's units start only once that user logs
in). vsup never runs sudo or systemctl itself. `--system --print` writes a system unit to
stdout instead, for `sudo tee /etc/systemd/system/vsup.service`.

At boot the daemon does what it does after any restart (control/restore.py): the state file
gives the running layout; a recorded process that began before the node booted is neither
adopted nor swept (its pid and group may be someone else's now) and its instance starts fresh;
instances stopped on purpose stay stopped.

The unit's `KillMode=process`: `systemctl stop` signals the daemon only, which leaves the
instances running, as SIGTERM always does (`vsup down` stops them). Their processes stay in the
unit's cgroup, so a stop that did kill the whole cgroup would take every vLLM with it.
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

# The first line of every unit vsup writes: `uninstall` removes only such a file.
MARKER = "# Written by `vsup service install`"
DEFAULT_NAME = "vsup"
ENV_FILE = "service.env"  # beside the unit's config: secrets (api_key_env) go there, 0600
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "service",
        help="run the daemon as a systemd unit: it comes back after a reboot",
        description="Write, remove or inspect the systemd unit that starts the vsup daemon of "
        "this VSUP_HOME at boot (a user unit with lingering, or --system). vsup never runs "
        "sudo or systemctl: it prints the steps.",
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    inst = verbs.add_parser("install", help="write the unit file and print how to enable it")
    inst.add_argument(
        "--name", default=DEFAULT_NAME, help=f"unit name (default {DEFAULT_NAME}.service)"
    )
    inst.add_argument(
        "--system",
        action="store_true",
        help="a system unit (User= this user, WantedBy=multi-user.target); with --print",
    )
    inst.add_argument(
        "--print", action="store_true", help="write the unit to stdout instead of a file"
    )
    inst.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME",
        help="copy this variable from the current environment into the unit (repeatable), "
        "e.g. HF_HOME or LD_LIBRARY_PATH; secrets go in the environment file instead",
    )
    inst.add_argument("--force", action="store_true", help="replace a unit vsup did not write")
    un = verbs.add_parser("uninstall", help="remove the unit file (say how to disable it)")
    un.add_argument("--name", default=DEFAULT_NAME)
    st = verbs.add_parser("status", help="is the unit installed, current, enabled, lingering?")
    st.add_argument("--name", default=DEFAULT_NAME)
    p.set_defaults(func=run, verb=None)


def unit_dir() -> Path:
    """Where systemd looks for this user's units."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "systemd" / "user"


def env_file() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "vsup" / ENV_FILE


def quote(value: str) -> str:
    """A value as systemd reads it in `Environment=` and `ExecStart=`: `%` doubled (it starts
    a specifier), quoted when it holds a space, a quote or a backslash."""
    value = value.replace("%", "%%")
    if re.search(r'[\s"\\\']', value):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


def literal(value: str) -> str:
    """A value systemd takes as the rest of the line, unquoted (`Description=`,
    `WorkingDirectory=`, `EnvironmentFile=`): `%` doubled (a specifier) and nothing else:
    quotes there would be part of the path ("WorkingDirectory= path is not absolute"), and a
    space is just a character of it."""
    return value.replace("%", "%%")


def unit_text(
    home: Path,
    interpreter: str,
    env: dict[str, str],
    system: bool = False,
    user: str | None = None,
) -> str:
    """The unit file: this interpreter's `python -m vsup daemon` for `home`."""
    from vsup import __version__

    environment = {"VSUP_HOME": str(home), **env}
    lines = [
        f"{MARKER} (vsup {__version__}); `vsup service uninstall` removes it.",
        "# The vsup daemon (vLLM node supervisor) of the VSUP_HOME below: started at boot,",
        "# restarted if it dies. At start it takes back the running layout from the state file;",
        "# processes from before a reboot are neither adopted nor swept, and start fresh.",
        "[Unit]",
        f"Description={literal(f'vsup daemon for VSUP_HOME={home}')}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
    ]
    if system and user:
        lines.append(f"User={user}")
    lines += [f"Environment={quote(f'{k}={v}')}" for k, v in environment.items()]
    lines += [
        "# Variables the instances need that must not be written here (the API key that",
        "# api_key_env names, HF_TOKEN): one NAME=value a line in this file, mode 0600.",
        f"EnvironmentFile=-{literal(str(env_file()))}",
        f"WorkingDirectory={literal(str(home))}",
        f"ExecStart={quote(interpreter)} -m vsup daemon",
        "# Only the daemon is signalled: it leaves the instances running (`vsup down` stops",
        "# them), and they live in this unit's cgroup.",
        "KillMode=process",
        "Restart=on-failure",
        "RestartSec=5",
        "TimeoutStopSec=60",
        "",
        "[Install]",
        f"WantedBy={'multi-user.target' if system else 'default.target'}",
        "",
    ]
    return "\n".join(lines)


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values]}} (systemd allows a key more than once)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out.setdefault(section, {})
            continue
        if section is None or "=" not in line:
            raise ValueError(f"not a unit file line: {raw!r}")
        key, _, value = line.partition("=")
        out[section].setdefault(key.strip(), []).append(value.strip())
    return out


def unquote_words(value: str) -> list[str]:
    """`ExecStart=` / `Environment=` words as systemd splits them (quotes, `%%`)."""
    import shlex

    return [w.replace("%%", "%") for w in shlex.split(value)]


def unit_path(name: str) -> Path:
    return unit_dir() / f"{name}.service"


def _check_name(name: str) -> str | None:
    if name.endswith(".service"):
        name = name[: -len(".service")]
    return name if _NAME_RE.match(name) else None


def _env_copies(names: list[str]) -> tuple[dict[str, str], str | None]:
    """The variables `--env` names, from this environment; or what is wrong."""
    from vsup.layout.secrets import SECRET_NAME

    out = {"PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    for name in names:
        if SECRET_NAME.search(name):
            return {}, (
                f"--env {name}: a secret is not written into a unit file (systemd shows units to "
                f"every user); put `{name}=...` in {env_file()} (mode 0600) instead"
            )
        if name not in os.environ:
            return {}, f"--env {name}: it is not set in this environment"
        out[name] = os.environ[name]
    return out, None


def linger_enabled(user: str) -> bool | None:
    """Whether systemd keeps this user's units running without a login (None: unknown)."""
    path = Path("/var/lib/systemd/linger")
    if not path.is_dir():
        return None
    return (path / user).exists()


def run(args: argparse.Namespace) -> int:
    from vsup import paths

    if args.verb is None:
        print("vsup service: say install, uninstall or status", file=sys.stderr)
        return 2
    name = _check_name(args.name)
    if name is None:
        print(
            f"vsup service: --name {args.name!r}: letters, digits, '.', '_', '-' or '@'",
            file=sys.stderr,
        )
        return 2
    user = pwd.getpwuid(os.getuid()).pw_name
    if args.verb == "install":
        return install(args, name, paths.vsup_home(), user)
    if args.verb == "uninstall":
        return uninstall(name, user)
    return status(name, user)


def install(args: argparse.Namespace, name: str, home: Path, user: str) -> int:
    if args.system and not args.print:
        print(
            "vsup service install --system: vsup does not write /etc itself; run `vsup service "
            f"install --system --print | sudo tee /etc/systemd/system/{name}.service`",
            file=sys.stderr,
        )
        return 2
    env, problem = _env_copies(args.env)
    if problem:
        print(f"vsup service: {problem}", file=sys.stderr)
        return 2
    text = unit_text(home, sys.executable, env, system=args.system, user=user)
    if args.print:
        sys.stdout.write(text)
        return 0
    from vsup.fsutil import write_atomic

    path = unit_path(name)
    ours = not path.exists() or path.read_text(errors="replace").startswith(MARKER)
    if not ours and not args.force:
        print(
            f"vsup service: {path} exists and vsup did not write it; --force replaces it",
            file=sys.stderr,
        )
        return 1
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode(), mode=0o644)
    unit = f"{name}.service"
    print(f"wrote {path} (the daemon of VSUP_HOME={home}, run by {sys.executable})")
    print("enable it (vsup runs none of these itself):")
    print("  systemctl --user daemon-reload")
    print(f"  systemctl --user enable --now {unit}")
    if linger_enabled(user) is not True:
        print(f"  sudo loginctl enable-linger {user}   # start it at boot, before any login")
    print(
        f"a daemon already running for this VSUP_HOME keeps serving; the unit's daemon then "
        f"exits at once (one per VSUP_HOME). Secrets the instances need: {env_file()} (0600)."
    )
    return 0


def uninstall(name: str, user: str) -> int:
    path = unit_path(name)
    if not path.exists():
        print(f"vsup service: no unit at {path}; nothing to remove")
        return 0
    if not path.read_text(errors="replace").startswith(MARKER):
        print(f"vsup service: {path} was not written by vsup; remove it yourself", file=sys.stderr)
        return 1
    unit = f"{name}.service"
    path.unlink()
    print(f"removed {path}; the daemon and its instances keep running until stopped")
    print("then (vsup runs none of these itself):")
    print(f"  systemctl --user disable {unit}")
    print("  systemctl --user daemon-reload")
    print(f"  (and `loginctl disable-linger {user}` if nothing else needs lingering)")
    return 0


def status(name: str, user: str) -> int:
    from vsup.control.client import Client

    path = unit_path(name)
    if not path.exists():
        print(f"not installed: no unit at {path} (`vsup service install` writes it)")
        return 1
    try:
        unit = parse_unit(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"{path}: cannot read it ({exc})", file=sys.stderr)
        return 1
    service = unit.get("Service", {})
    env = dict(
        w.split("=", 1)
        for value in service.get("Environment", ())
        for w in unquote_words(value)
        if "=" in w
    )
    exec_start = unquote_words(service.get("ExecStart", [""])[-1])
    print(f"unit: {path}")
    print(f"VSUP_HOME: {env.get('VSUP_HOME', '(not set: the default)')}")
    program = exec_start[0] if exec_start else "(none)"
    ok = bool(exec_start) and os.access(program, os.X_OK)
    print(f"runs: {' '.join(exec_start)}" + ("" if ok else "  <- not an executable any more"))
    linger = linger_enabled(user)
    print(
        "lingering: "
        + {True: "on", False: f"off (`sudo loginctl enable-linger {user}`)", None: "unknown"}[
            linger
        ]
    )
    systemctl = shutil.which("systemctl")
    if systemctl:
        for what in ("is-enabled", "is-active"):
            r = subprocess.run(
                [systemctl, "--user", what, f"{name}.service"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            print(f"{what}: {(r.stdout or r.stderr).strip() or r.returncode}")
    else:
        print("systemctl: not found on this node")
    if env.get("VSUP_HOME"):
        probe = Client(Path(env["VSUP_HOME"]))
        ping = probe.alive()
        probe.close()
        print(f"daemon: pid {ping.pid} answers" if ping else "daemon: none answers")
    return 0 if ok else 1
