"""`vsup service install` with a space (and a `%`) in VSUP_HOME writes a unit systemd takes
(issue 35 item 18): `WorkingDirectory=` and `EnvironmentFile=` are the rest of the line, not
quoted words (systemd.exec), and `%` starts a specifier wherever specifiers are resolved."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from vsup.cli import main
from vsup.commands.service import parse_unit, unquote_words


@pytest.fixture
def spaced_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "vsup home 50%x"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("VSUP_HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config dir"))
    return home


def test_the_unit_names_a_home_with_a_space_as_systemd_reads_it(spaced_home, capsys, tmp_path):
    assert main(["service", "install", "--print"]) == 0
    text = capsys.readouterr().out
    service = parse_unit(text)["Service"]
    escaped = str(spaced_home).replace("%", "%%")
    assert service["WorkingDirectory"] == [escaped]  # no quotes: they would be part of the path
    config = str(tmp_path / "config dir" / "vsup" / "service.env").replace("%", "%%")
    assert service["EnvironmentFile"] == ["-" + config]
    assert parse_unit(text)["Unit"]["Description"] == [f"vsup daemon for VSUP_HOME={escaped}"]
    env = [w for v in service["Environment"] for w in unquote_words(v)]
    assert f"VSUP_HOME={spaced_home}" in env


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_verifies_the_unit(spaced_home, capsys, tmp_path):
    assert main(["service", "install", "--print"]) == 0
    unit = tmp_path / "vsup.service"
    unit.write_text(capsys.readouterr().out)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert str(unit) not in done.stdout + done.stderr, done.stdout + done.stderr
