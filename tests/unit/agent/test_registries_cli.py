"""`fleet agent --registries` and `fleet server --registries`: the file reaches the agent's
config (explicit path, or the data-dir default), and a bad file stops the command with
the field named.  Nothing is started: the run entry points are replaced by recorders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fleet.cli.main as cli
import fleet.server.run as server_run

GOOD = "mirrors:\n  docker.io:\n    endpoint: ['http://127.0.0.1:5000']\n"


def run_agent(monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    seen: list[Any] = []

    def fake_trio_run(fn: Any, *a: Any) -> None:
        # partial(supervise, "agent", partial(run, cfg), retry_start=False)
        seen.append(fn.args[1].args[0])

    monkeypatch.setattr(cli.trio, "run", fake_trio_run)
    cli.app(["agent", "--server", "https://127.0.0.1:1", *args], result_action="return_value")
    return seen[0]


def test_agent_explicit_and_default_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    data.mkdir()
    cfg = run_agent(monkeypatch, "--data-dir", str(data))
    assert cfg.registries is None
    (data / "registries.yaml").write_text(GOOD)
    cfg = run_agent(monkeypatch, "--data-dir", str(data))
    assert cfg.registries.mirrors["docker.io"].endpoints == ("http://127.0.0.1:5000/v2",)
    assert not cfg.registries.disable_default_endpoint
    other = tmp_path / "other.yaml"
    other.write_text("mirrors:\n  '*':\n    endpoint: ['http://127.0.0.1:6000']\n")
    cfg = run_agent(monkeypatch, "--data-dir", str(data), "--registries", str(other),
                    "--disable-default-registry-endpoint")
    assert list(cfg.registries.mirrors) == ["*"] and cfg.registries.disable_default_endpoint


def test_agent_bad_file_exits_naming_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "r.yaml"
    bad.write_text("mirrors:\n  docker.io:\n    endpoint: ['ftp://x.example']\n")
    with pytest.raises(SystemExit) as info:
        run_agent(monkeypatch, "--data-dir", str(tmp_path), "--registries", str(bad))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"fleet agent: error: --registries: {bad}: mirrors['docker.io'].endpoint[0]" in err
    with pytest.raises(SystemExit):
        run_agent(monkeypatch, "--data-dir", str(tmp_path), "--registries", str(tmp_path / "no"))
    assert "cannot read" in capsys.readouterr().err


def test_server_passes_the_file_to_its_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[Any] = []

    async def fake_run(cfg: Any, **kw: Any) -> None:
        seen.append(cfg)
        raise OSError("recorded, not started")

    monkeypatch.setattr(server_run, "run", fake_run)
    (tmp_path / "registries.yaml").write_text(GOOD)
    with pytest.raises(SystemExit):
        cli.app(["server", "--data-dir", str(tmp_path), "--disable-default-registry-endpoint"])
    assert seen[0].agent_registries.mirrors["docker.io"].endpoints == ("http://127.0.0.1:5000/v2",)
    assert seen[0].agent_registries.disable_default_endpoint
    assert "recorded, not started" in capsys.readouterr().err

    bad = tmp_path / "bad.yaml"
    bad.write_text("configs:\n  x.example:\n    auth: {user: u}\n")
    with pytest.raises(SystemExit) as info:
        cli.app(["server", "--data-dir", str(tmp_path), "--registries", str(bad)])
    assert info.value.code == 2
    assert "configs['x.example'].auth.user: unknown field" in capsys.readouterr().err
    assert len(seen) == 1
