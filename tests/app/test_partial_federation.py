"""Issue 47, walkthrough 4: a federation that lost a hospital says so and is not the newest -best.

Through the in-process engine (the real ServerApp, MLflow): two scripted sites; site-b's
policy refuses every train instruction after round 1 (it revoked the app), so site-a
finishes the run alone. The run is *partial*: the ServerApp tags it, logs the metric, keeps
its best model out of ``<experiment>-best`` and the summary says ``partial: 1 of 2``;
``make federate`` exits :data:`~app.tooling.deployment.EXIT_PARTIAL`. The rules themselves
(:mod:`strategies.rounds.site_coverage`) are tested on round reports.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from flwr.app import Context, Error, Message, MessageType
from mlflow.tracking import MlflowClient

from app.engine import VirtualSite, run_federation
from app.tooling import deployment
from strategies.rounds.round_report import RoundReport
from strategies.rounds.site_coverage import check_setting, required_sites, site_coverage
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError
from tests.fixtures.scripted_site import ScriptedSite

ROUNDS = 3


def _revoking_after_round_1(site: ScriptedSite):
    """``site``, refusing every train instruction after its first under policy rule apps."""
    trained: list[int] = []

    def answer(message: Message, context: Context) -> Message:
        if message.metadata.message_type == MessageType.TRAIN:
            trained.append(1)
            if len(trained) > 1:
                return Message(Error(code=keys.POLICY_REFUSAL_CODE, reason=(
                    f"site {site.name}: {keys.POLICY_RULE_PREFIX}apps (refused)")),
                    reply_to=message)
        return site(message, context)

    return answer


def _improving(name: str) -> ScriptedSite:
    """A site whose val-dice rises with every evaluation: the last round is the best."""
    calls: list[int] = []

    def evaluate(weights) -> dict[str, float]:
        calls.append(1)
        return {"val-dice": 0.1 * len(calls), "test-dice": 0.5}

    return ScriptedSite(name, evaluate=evaluate)


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory, mlflow_store):
    tmp = tmp_path_factory.mktemp("partial")
    store = mlflow_store(tmp / "store")
    sites = [VirtualSite({}, _improving("site-a")),
             VirtualSite({}, _revoking_after_round_1(_improving("site-b")))]
    outcome = run_federation({
        "num-server-rounds": ROUNDS, "image-size": 16, "node-wait-timeout": 5,
        "experiment": "partial", "tracking-uri": store, "final-evaluation": False,
        "artifact-root": str(tmp / "artifacts"), "checkpoint-dir": str(tmp / "checkpoints")},
        sites, run_id=4701)
    return store, outcome


def test_a_run_finished_by_one_of_two_sites_is_partial_and_not_the_best(partial_run, capsys):
    store, outcome = partial_run
    assert sorted(outcome.reports[1].train) == ["site-a", "site-b"]
    assert sorted(outcome.reports[ROUNDS].train) == ["site-a"]
    assert outcome.coverage.partial and not outcome.coverage.register_best
    client = MlflowClient(store)
    run = client.get_run(outcome.mlflow_run_id)
    assert run.info.status == "FINISHED"
    tags, metrics = run.data.tags, run.data.metrics
    assert tags["federation.partial"] == "true"
    assert tags["federation.missing-sites"] == "site-b"
    assert tags["federation.contributing-sites"] == "site-a"
    assert tags["federation.best-not-registered"].startswith(f"round {ROUNDS}: 1 of 2 sites")
    assert metrics["federation/contributing-sites"] == 1.0
    assert metrics["federation/sites"] == 2.0
    assert client.search_model_versions("name='partial-best'") == []
    assert len(client.search_model_versions("name='partial-final'")) == 1
    assert outcome.models.best_uri and not outcome.models.best_version
    from app.tooling.federation_summary import print_summary  # noqa: PLC0415

    assert print_summary(store, 4701, 1.0, "/tmp/artifacts") is True
    printed = capsys.readouterr().out
    assert ("sites: partial: 1 of 2 sites contributed to the final model (missing: site-b; "
            "federation.min-contributing-sites needs 2)") in printed
    assert f"best model not registered: round {ROUNDS}: 1 of 2 sites" in printed


def test_make_federate_exits_3_on_a_partial_run(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(deployment, "checked_run_config", lambda config: {})
    monkeypatch.setattr(deployment, "_connected_layout",
                        lambda args: SimpleNamespace(superlink_dir=tmp_path))
    monkeypatch.setattr(deployment, "submit_run", lambda *a, **k: SimpleNamespace(
        run_id=7, status="finished:completed"))
    from app.tooling import federation_summary  # noqa: PLC0415

    for partial, status in ((True, deployment.EXIT_PARTIAL), (False, 0), (None, 0)):
        monkeypatch.setattr(federation_summary, "print_summary", lambda *a, p=partial: p)
        assert deployment.main(["federate", "--allow-no-roster", "--allow-same-name",
                                "--deploy-dir", str(tmp_path), "--flwr-home", str(tmp_path),
                                "--tracking-uri", "sqlite:///x.db",
                                "--artifact-root", str(tmp_path)]) == status
    assert "a partial federation" in capsys.readouterr().err


def _reports(*rounds: tuple[str, ...], failed: int = 0) -> dict[int, RoundReport]:
    return {r: RoundReport(r, train={s: {"num-examples": 5.0} for s in sites},
                           aggregation_failed="not finite" if r == failed else "")
            for r, sites in enumerate(rounds, start=1)}


def test_the_roster_sets_the_sites_and_the_fraction_how_many_a_round_needs():
    reports = _reports(("a", "b", "c"), ("a", "b"))
    full = site_coverage(reports, {"a", "b", "c", "d"}, 0, 1.0, best_round=1)
    assert full.partial and full.required == 4 and full.missing() == ("c", "d")
    assert not full.register_best  # round 1: 3 of the roster's 4
    half = site_coverage(reports, {"a", "b", "c", "d"}, 0, 0.5, best_round=1)
    assert not half.partial and half.register_best and half.text().startswith("complete: 2 of 4")
    lowered = site_coverage(reports, None, 2, 1.0, best_round=2)
    assert lowered.sites == ("a", "b", "c") and not lowered.partial and lowered.register_best
    assert required_sites(0, 3, 0.34) == 2 and required_sites(0, 3, 1 / 3) == 1


def test_a_failed_aggregation_keeps_the_model_of_the_round_before():
    reports = _reports(("a", "b"), ("a",), failed=2)
    coverage = site_coverage(reports, None, 0, 1.0, best_round=2)
    assert coverage.final_round == 1 and not coverage.partial and coverage.register_best
    resumed = site_coverage({3: RoundReport(3, train={"a": {}})}, {"a", "b"}, 0, 1.0,
                            best_round=2)  # the best round ran before the resume: not judged
    assert resumed.best is None and resumed.register_best and resumed.partial


def test_a_setting_above_the_roster_is_refused():
    check_setting(2, {"a", "b"})
    check_setting(5, None)
    with pytest.raises(ConfigError, match="'federation.min-contributing-sites' must be at most "
                                          "the roster's 2 sites, got 3"):
        check_setting(3, {"a", "b"})
