"""The packaged systemd units start Fleet with flags the CLI accepts, and the
production control-plane role runs with the ProcessControl consent gate on."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import pytest

from fleet.cli.main import app

UNITS = Path(__file__).resolve().parents[3] / "packaging" / "systemd"
SAMPLE_ENV = {"FLEET_SERVER": "https://10.0.0.1:9300", "FLEET_TOKEN": "abcdef.0123456789abcdef",
              "FLEET_CA_CERT_HASH": "sha256:" + "0" * 64}


def _exec_start(unit: str) -> list[str]:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(UNITS / unit)
    words = shlex.split(parser["Service"]["ExecStart"])
    assert words[0] == "/usr/bin/fleet", words
    # systemd expands ${VAR} to one word and drops an empty $VAR.
    out = []
    for w in words[1:]:
        if w.startswith("${") and w.endswith("}"):
            out.append(SAMPLE_ENV[w[2:-1]])
        elif w.startswith("$"):
            continue
        else:
            out.append(w)
    return out


@pytest.mark.parametrize("unit", ["fleet-server.service", "fleet-agent.service"])
def test_unit_flags_parse(unit: str) -> None:
    command, bound, _ = app.parse_args(_exec_start(unit), exit_on_error=False, print_error=False)
    assert command.__name__ == unit.split("-")[1].split(".")[0]
    assert bound.arguments


def test_production_server_role_turns_the_consent_gate_on() -> None:
    _, bound, _ = app.parse_args(_exec_start("fleet-server.service"), exit_on_error=False,
                                 print_error=False)
    assert bound.arguments.get("hardened") is True


def test_units_leave_containers_running_when_stopped() -> None:
    for unit in ("fleet-server.service", "fleet-agent.service"):
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.read(UNITS / unit)
        assert parser["Service"]["KillMode"] == "process", unit
