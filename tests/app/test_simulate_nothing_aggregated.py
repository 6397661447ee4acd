"""Issue 29, found 8: ``make simulate`` exits non-zero when the federation aggregated nothing.

``make simulate ENGINE=local`` (:func:`app.tooling.simulate.main`) over two small synthetic
hospitals whose site policy (``configs/site-policy-evaluate-only.toml``) refuses every
train request: the ServerApp's FederationError ends the command with exit code 1 and
the error names the rule; before the fix it printed ``finished:completed`` and exited 0.
"""

from __future__ import annotations

from app.engine.federation import PROJECT_ROOT
from app.tooling.simulate import main
from tests.integration.conftest import write_small_hospitals

EVALUATE_ONLY = PROJECT_ROOT / "configs" / "site-policy-evaluate-only.toml"


def test_simulate_exits_non_zero_when_every_train_was_refused(tmp_path, mlflow_store, capsys):
    write_small_hospitals(tmp_path / "data", seed=0)
    code = main(["--engine", "local", "--sites", "2", "--data-root", str(tmp_path / "data"),
                 "--tracking-uri", mlflow_store(tmp_path / "store"),
                 "--artifact-root", str(tmp_path / "artifacts"),
                 "-c", "num-server-rounds=1", "-c", "image-size=32", "-c", "local-steps=1",
                 "-c", f'site-policy="{EVALUATE_ONLY}"',
                 "-c", f'checkpoint-dir="{tmp_path / "checkpoints"}"'])
    captured = capsys.readouterr()
    assert code == 1
    assert "no round aggregated any update" in captured.err
    assert "min-local-steps: 2" in captured.err
    assert "finished:completed" not in captured.out
