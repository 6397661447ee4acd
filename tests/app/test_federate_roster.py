"""``make federate`` (a deployment) needs the coordinator's roster unless told otherwise (#29).

Without a roster a registered site's first ``num-examples`` sets its weight (only
capped relative to the others), so the deployment's federate command refuses to
submit without run config ``federation.roster`` (``ROSTER=``), naming the flag that
runs without one anyway (``ALLOW_NO_ROSTER=1``, ``--allow-no-roster``). ``make
simulate`` needs none.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.tooling import deployment
from app.tooling.run_submission import RunOutcome
from tests.make_dry_run import make_n

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def submitted(monkeypatch) -> list[str]:
    """The run-config strings the federate command submits (nothing is started)."""
    sent: list[str] = []
    monkeypatch.setattr(deployment, "_connected_layout", lambda args: None)
    monkeypatch.setattr(deployment, "submit_run",
                        lambda home, run_config, *a, **k: sent.append(run_config)
                        or RunOutcome(None, "not-started"))
    return sent


def _federate(tmp_path: Path, *extra: str) -> int:
    return deployment.main(["federate", "--deploy-dir", str(tmp_path / "deploy"),
                            "--flwr-home", str(tmp_path / "flwr-home"),
                            "--tracking-uri", "sqlite:///x.db", "--artifact-root",
                            str(tmp_path), *extra])


def test_federate_without_a_roster_is_refused_naming_the_flag(tmp_path, submitted, capsys):
    assert _federate(tmp_path) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert "ROSTER=/abs/roster.toml" in err and "'federation.roster'" in err
    assert "ALLOW_NO_ROSTER=1" in err and "--allow-no-roster" in err
    assert submitted == []


def test_federate_runs_with_a_roster_or_when_allowed_without(tmp_path, submitted):
    roster = tmp_path / "roster.toml"
    shutil.copy(ROOT / "configs" / "roster.example.toml", roster)
    assert _federate(tmp_path, "-c", f"federation.roster={roster}") == 1  # submitted
    assert _federate(tmp_path, "--allow-no-roster") == 1
    assert len(submitted) == 2 and f"federation.roster=\"{roster}\"" in submitted[0]


def test_make_passes_the_flag_only_when_asked():
    assert "--allow-no-roster" not in make_n("federate")
    assert "--allow-no-roster" in make_n("federate", "ALLOW_NO_ROSTER=1")
    assert "--allow-no-roster" not in make_n("federate", "ALLOW_NO_ROSTER=0")
    assert "federation.roster" not in make_n("simulate")


def test_federate_checkpoints_in_the_deployment_unless_told_and_resume_is_a_flag(
        tmp_path, submitted):
    """Found in review: the checkpoint folder and ``--resume`` were added twice (the
    ``fedmed`` command and the Makefile), and the command's ``-c checkpoint-dir`` overrode
    a preset's."""
    assert _federate(tmp_path, "--allow-no-roster") == 1
    assert f'checkpoint-dir="{(tmp_path / "deploy" / "checkpoints").resolve()}"' in submitted[0]
    assert "resume" not in submitted[0]
    preset = tmp_path / "preset.toml"
    preset.write_text(f'checkpoint-dir = "{tmp_path / "mine"}"\n')
    assert _federate(tmp_path, "--allow-no-roster", "--preset", str(preset), "--resume") == 1
    assert f'checkpoint-dir="{tmp_path / "mine"}"' in submitted[1]
    assert "resume=true" in submitted[1] and str(tmp_path / "deploy") not in submitted[1]
    assert "--resume" in make_n("federate", "RESUME=1")
    assert "checkpoint-dir" not in make_n("federate")
