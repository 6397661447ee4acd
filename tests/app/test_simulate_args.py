"""The launcher's run-config string: absolute paths, preset file, then overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.tooling.run_config_string import build_run_config


def _parse(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(" "))


def test_paths_are_absolute_and_quoted(tmp_path: Path):
    config = _parse(build_run_config([], Path("rel/data"), "sqlite:///x.db", tmp_path))
    assert config["data-root"] == f'"{(Path.cwd() / "rel/data").resolve()}"'
    assert config["tracking-uri"] == '"sqlite:///x.db"'


def test_overrides_win_over_the_preset(tmp_path: Path):
    preset = tmp_path / "p.toml"
    preset.write_text('num-server-rounds = 2\noptimizer = "sgd"\nlr = 0.5\n')
    config = _parse(build_run_config(["lr=0.1", "optimizer=adam"], tmp_path, "", tmp_path,
                                     preset))
    assert config["num-server-rounds"] == "2"
    assert config["lr"] == "0.1"
    assert config["optimizer"] == '"adam"'


def test_override_needs_key_and_value(tmp_path: Path):
    with pytest.raises(SystemExit, match="key=value"):
        build_run_config(["lr"], tmp_path, "", tmp_path)


@pytest.fixture()
def nothing_starts(monkeypatch):
    """Fail the test if `make simulate` starts Ray, a SuperLink or a run."""
    import app.tooling.simulate as simulate  # noqa: PLC0415

    def started(*_args, **_kwargs):
        raise AssertionError("a Flower or Ray process was started")

    monkeypatch.setattr(simulate, "local_ray", started)
    monkeypatch.setattr(simulate.SuperLinkProcess, "start_simulation", started)
    monkeypatch.setattr(simulate, "submit_run", started)


def _simulate(tmp_path: Path, *overrides: str, engine: str = "ray") -> int:
    from app.tooling.simulate import main  # noqa: PLC0415

    argv = ["--data-root", str(tmp_path), "--sites", "1", "--tracking-uri", "sqlite:///x.db",
            "--artifact-root", str(tmp_path), "--engine", engine]
    for item in overrides:
        argv += ["-c", item]
    return main(argv)


@pytest.mark.usefixtures("nothing_starts")
@pytest.mark.parametrize("override, named", [
    ("strategy.aggregator=fedavgg", "'strategy.aggregator'"),
    ("strategy.aggregatr=fedavg", "'strategy.aggregatr'"),
    ("local-steps=0", "'local-steps'"),
    ("task=no-such-task", "'task'"),
])
def test_a_bad_run_config_fails_in_one_line_before_anything_starts(tmp_path, capsys,
                                                                   override, named):
    assert _simulate(tmp_path, override) == 2  # no hospital folders either: config first
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("error: ") and named in err and "Traceback" not in err


@pytest.mark.usefixtures("nothing_starts")
def test_the_local_engine_checks_the_same_way(tmp_path, capsys):
    assert _simulate(tmp_path, "round.quorum=-1", engine="local") == 2
    assert "'round.quorum'" in capsys.readouterr().err


def test_federate_checks_the_run_config_before_connecting(tmp_path, capsys):
    from app.tooling.deployment import main  # noqa: PLC0415

    home = tmp_path / "flwr-home"
    code = main(["federate", "--deploy-dir", str(tmp_path / "deploy"), "--flwr-home", str(home),
                 "--tracking-uri", "sqlite:///x.db", "--artifact-root", str(tmp_path),
                 "-c", "strategy.defence=krum"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "'strategy.defence'" in err
    assert not home.exists()  # the CLI's connection was never written
