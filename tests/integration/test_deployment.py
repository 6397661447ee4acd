"""A real deployment on 127.0.0.1: TLS SuperLink with SuperNode authentication.

The SuperNodes run as :mod:`app.site_runtime.site_node` (SuperNode + the
hospital's site runner with warm workers); the federating test gives each site
a policy that approves the app bundle (one by its sha256, one by the
coordinator's signature; the first also requires secure aggregation), federates
under SecAgg+ (five train exchanges per round over TLS, each served by the warm
worker; round keys and the survivor set signed with each site's key and checked against
the roster its policy names), and then submits the same app with one byte changed, which both sites
refuse without installing or running any of it.

One ``flower-superlink`` (TLS with a CA made by ``app.tooling.certs``,
``--enable-supernode-auth``, a sqlite ``--database``; the ``deployment`` fixture of
``conftest.py``) is shared by the tests of the session; each test starts its own
``flower-supernode`` processes. Every process is started by ``app.tooling`` in
its own process group and
stopped by PID in ``finally`` blocks; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import ssl
import subprocess
import zipfile
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import mlflow
import pytest
from flwr.supercore.exit import ExitCode
from mlflow.tracking import MlflowClient

from app.site_runtime.app_approval import fab_sha256, keygen, project_fab, sign_app
from app.site_runtime.audit_chain import verify_chain
from app.site_runtime.audit_log import AuditLog
from app.tooling import secagg_keys
from app.tooling.certs import ensure_server_certificate
from app.tooling.environment import free_port
from app.tooling.flwr_cli import list_supernodes, wait_online
from app.tooling.layout import DeployLayout
from app.tooling.registration import register_site
from app.tooling.run_submission import PROJECT_ROOT, submit_run
from app.site_runtime.supernode import SuperNodeProcess
from tests.integration.deployment_helpers import PERMISSIVE_POLICY

pytestmark = pytest.mark.integration

SITES = ("hospital-a", "hospital-b")


def _tail(*daemons) -> str:
    return "\n".join(f"--- {d.name} ---\n{d.log_text()[-3000:]}" for d in daemons)


def _secagg_pki(folder: Path) -> dict[str, str]:
    """Each site's signing key and one roster of them, made as docs/DEPLOYMENT-REFERENCE.md says
    (``make secagg-key``, ``make secagg-roster-add``); site -> its policy lines."""
    roster, lines = folder / "secagg-roster.json", {}
    for site in SITES:
        key = folder / f"{site}.key"
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            assert secagg_keys.main(["keygen", "--site", site, "--out", str(key)]) == 0
        assert secagg_keys.main(["add", "--roster", str(roster), "--site", site,
                                 "--public", printed.getvalue().split()[-1]]) == 0
        lines[site] = f'roster = "{roster}"\nsigning-key = "{key}"\n'
    return lines


def _approved_app_and_policies(tmp_path: Path) -> tuple[Path, Path, str, str, dict]:
    """The app bundle unpacked as it was submitted, a copy with one byte changed, and policies.

    hospital-a approves the bundle's sha256; hospital-b trusts the coordinator's
    key, whose signature the run carries (``app-signature``).
    """
    fab = project_fab(PROJECT_ROOT)
    approved, changed = tmp_path / "app", tmp_path / "app-changed"
    zipfile.ZipFile(io.BytesIO(fab)).extractall(approved)
    shutil.copytree(approved, changed)
    readme = changed / "README.md"
    text = readme.read_bytes()
    readme.write_bytes(b"#" + text[1:] if text[:1] != b"#" else b"%" + text[1:])
    digest = fab_sha256(fab)
    key, public = keygen(tmp_path / "coordinator")
    pki = _secagg_pki(tmp_path / "pki")  # each site's signing key (0600) and the roster
    policies = {"hospital-a": f'[apps]\napproved-sha256 = ["{digest}"]\n'
                              # SecAgg+ required: a plain train round would be refused
                              '[secure-aggregation]\nrequired = true\nmin-participants = 2\n'
                              + pki["hospital-a"],
                "hospital-b": f'[apps]\ntrusted-keys = ["{public}"]\n'
                              '[secure-aggregation]\n' + pki["hospital-b"]}
    paths = {}
    for site, text in policies.items():
        paths[site] = tmp_path / f"{site}-policy.toml"
        paths[site].write_text(text)
    return approved, changed, digest, sign_app(digest, key), paths


def test_two_authenticated_sites_federate_over_tls(deployment, tmp_path, small_hospitals,
                                                   mlflow_store):
    d = deployment
    data = small_hospitals(tmp_path / "data", 3)
    approved, changed, digest, signature, policies = _approved_app_and_policies(tmp_path)
    node_ids = {site: register_site(d.layout, d.flwr_home, site) for site in SITES}
    assert len(set(node_ids.values())) == 2
    # Registering again is a no-op that returns the same node id.
    assert register_site(d.layout, d.flwr_home, "hospital-a") == node_ids["hospital-a"]
    registered = {n["node-id"]: n["status"] for n in list_supernodes(d.flwr_home)}
    assert registered == {str(i): "registered" for i in node_ids.values()}

    tracking = mlflow_store(tmp_path)  # a migrated empty store (tests/conftest.py)
    run_config = (
        # One round: its train and evaluate messages already show one warm worker
        # serving every message (a second round cost CI a minute on 2 loaded cores).
        "num-server-rounds=1 local-steps=2 image-size=32 batch-size=4 min-nodes=2 "
        "final-evaluation=false "  # tested in test_simulation; saves CI minutes
        # SecAgg+ over TLS: five train exchanges per round, the site's state between
        # them in its state dir, every message served by the warm worker
        'strategy.secure-aggregation="secagg+" strategy.defence="none" '
        f'node-wait-timeout=300 round-timeout=1200 data-root="{tmp_path / "data"}" tracking-uri="{tracking}" '
        f'artifact-root="{tmp_path / "art"}" experiment="deploy" app-signature="{signature}"')
    nodes: list[SuperNodeProcess] = []
    output: list[str] = []
    try:
        for site, site_dir in zip(SITES, data):
            nodes.append(SuperNodeProcess.start(
                d.layout, site, d.link.address, site_dir, policy=policies[site],
                state_dir=tmp_path / "state" / site, port=free_port(), torch_threads=1))
        assert len({n.port for n in nodes}) == 2
        wait_online(d.flwr_home, node_ids.values(), timeout=300, watch=nodes)
        outcome = submit_run(d.flwr_home, run_config, timeout=1500, on_line=output.append,
                             project=approved)
        assert outcome.run_id is not None, "".join(output)[-3000:]
        assert outcome.status == "finished:completed", \
            "".join(output)[-3000:] + _tail(d.link, *nodes)
        refused_output: list[str] = []
        refused = submit_run(d.flwr_home, run_config.replace(
            'experiment="deploy"', 'experiment="deploy-changed"'), timeout=900,
            on_line=refused_output.append, project=changed)
        assert refused.run_id is not None, "".join(refused_output)[-3000:]
        # A vertical federation over the same TLS deployment and approved bundle: its
        # train.vertical messages reach the sites' ClientApps, whose policies (no
        # [vertical] section) refuse them before any data is read (docs/VERTICAL.md).
        vertical_output: list[str] = []
        vertical = submit_run(d.flwr_home, run_config.replace(
            'experiment="deploy"', 'experiment="deploy-vertical"')
            + ' federation.kind="vertical" vertical.method="splitnn-u"', timeout=900,
            on_line=vertical_output.append, project=approved)
        assert vertical.run_id is not None, "".join(vertical_output)[-3000:]
        assert vertical.status != "finished:completed", "".join(vertical_output)[-3000:]
        for node in nodes:
            assert node.process.poll() is None, _tail(node)
    finally:
        for node in nodes:
            node.stop()
    assert all(node.process.poll() is not None for node in nodes)
    # Stopped SuperNodes deregister their session: none stays online.
    assert all(n["status"] != "online" for n in list_supernodes(d.flwr_home))
    # The SuperNodes spoke TLS with their own authenticated identities.
    flower_log = d.link.flower_log.read_text()
    for node_id in node_ids.values():
        assert f"Activated node_id={node_id}" in flower_log

    mlflow.set_tracking_uri(tracking)
    client = MlflowClient()
    experiment = client.get_experiment_by_name("deploy")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["flwr.run-id"] == str(outcome.run_id)

    def steps(key: str) -> list[int]:
        return sorted(m.step for m in client.get_metric_history(run.info.run_id, key))

    assert steps("eval/val-dice") == [1]
    assert [m.value for m in client.get_metric_history(run.info.run_id,
                                                      "strategy/secagg-summed")] == [2.0]
    assert not any(k.endswith("/residual-norm") for k in run.data.metrics)
    for site in SITES:  # the site-name from node_config, not the data folder's name
        assert steps(f"site/{site}/val-dice") == [1], site
        assert steps(f"site/{site}/steps") == [1], site
    assert not any(k.startswith("site/hospital-0") for k in run.data.metrics)
    # Per-site state went to the state-dir given in node_config; the secure round's
    # secrets were deleted after its unmask stage.
    for site in SITES:
        assert (tmp_path / "state" / site).is_dir()
        assert not list((tmp_path / "state" / site).rglob("secagg-round.json"))
    # The approved bundle ran in one warm worker per site, for every message, sandboxed.
    for node in nodes:
        assert node.log_text().count("started warm worker") == 1, _tail(node)
        assert "(sandboxed)" in node.log_text(), _tail(node)
        assert f"installed app {digest[:12]}" in node.log_text()

    vertical_run = client.search_runs(
        [client.get_experiment_by_name("deploy-vertical").experiment_id])[0]
    assert vertical_run.info.status == "FAILED"
    assert vertical_run.data.tags["federation.kind"] == "vertical"
    assert "policy rule vertical.allowed (refused)" in ("".join(vertical_output)
                                                        + d.link.flower_log.read_text())
    for node in nodes:
        assert "refused a train.vertical request" in node.log_text(), _tail(node)

    # Each site's runtime audited every message it received, in an unbroken chain.
    for site in SITES:
        state = tmp_path / "state" / site
        assert verify_chain(state).ok, verify_chain(state).message()
        records = list(AuditLog(state).records())
        assert records[0]["kind"] == "node-start"
        messages = [r for r in records if r["kind"] == "message"]
        assert {r["type"] for r in messages if r["decision"] == "answered" and
                r["app"] == digest} == {"train", "evaluate"}
        assert all(r["bytes_sent"] > 0 and r["run"] == outcome.run_id for r in messages
                   if r["decision"] == "answered")
        assert {r["rule"] for r in messages if r["run"] == refused.run_id} == {"apps"}
        assert {r["rule"] for r in messages if r["type"] == "train.vertical"} == {
            "vertical.allowed"}

    # The bundle with one changed byte: refused by both sites, nothing of it installed or run.
    changed_run = client.search_runs(
        [client.get_experiment_by_name("deploy-changed").experiment_id])[0]
    dropped = json.loads(Path(client.download_artifacts(
        changed_run.info.run_id, "rounds/round-001-dropped.json", str(tmp_path))).read_text())
    for site, node in zip(SITES, nodes):
        assert changed_run.data.metrics[f"site/{site}/refused"] == 1.0
        reason = dropped[f"train/{site}"]
        assert "policy rule apps (refused): app " in reason and "/" not in reason.split(":", 1)[1]
        changed_hash = reason.split("app ")[1][:12]
        assert changed_hash != digest[:12]
        assert f"refused app {changed_hash}" in node.log_text()
        assert f"warm worker" not in node.log_text().split(f"refused app {changed_hash}")[1]
        installed = list((d.layout.supernode_dir(site) / "flwr-home" / "apps").iterdir())
        assert [p.name for p in installed] == [f"fedmed.fedmed.0.1.0.{digest[:8]}"]


@contextmanager
def _supernode_until_exit(layout: DeployLayout, site: str, superlink: str, tmp_path: Path,
                          private_key: Path | None = None, timeout: float = 60.0):
    """Start a SuperNode (on an empty site), yield it with its exit status, stop it."""
    site_dir = tmp_path / f"{site}-data"
    site_dir.mkdir()
    (site_dir / "manifest.csv").write_text("study_id,split,image,mask\n")
    node = SuperNodeProcess.start(layout, site, superlink, site_dir, port=free_port(),
                                  private_key=private_key, policy=PERMISSIVE_POLICY)
    try:
        try:
            code = node.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        yield node, code
    finally:
        node.stop()


def test_unregistered_supernode_is_refused(deployment, tmp_path):
    d = deployment
    with _supernode_until_exit(d.layout, "rogue", d.link.address, tmp_path) as (node, code):
        # Flower logs its own exit code (305: connection error) and exits with 1.
        assert code == 1, _tail(node)
        assert f"Exit Code: {int(ExitCode.SUPERNODE_CONNECTION_ERROR)}" in node.log_text()
        assert "Failed to activate SuperNode" in node.log_text()
    assert "No SuperNode found with the given public key" in d.link.flower_log.read_text()
    # Never added, never online: the SuperLink knows only the registered sites.
    registered = json.loads(d.layout.registry.read_text()) \
        if d.layout.registry.exists() else {}
    nodes = list_supernodes(d.flwr_home)
    assert {n["node-id"] for n in nodes} == {e["node-id"] for e in registered.values()}
    assert all(n["status"] != "online" for n in nodes)


def test_supernode_refuses_a_superlink_signed_by_another_ca(deployment, tmp_path):
    d = deployment
    other = DeployLayout(tmp_path / "other")  # its own CA; hospital-a's real key
    ensure_server_certificate(other.certs, "localhost,127.0.0.1")
    with _supernode_until_exit(other, "hospital-a", d.link.address, tmp_path,
                               private_key=d.layout.private_key("hospital-a")) as (node, code):
        assert code == 1, _tail(node)
        assert "CERTIFICATE_VERIFY_FAILED" in node.log_text()
        assert "SuperNode ID:" not in node.log_text()


def test_superlink_serves_tls_only_to_clients_trusting_its_ca(deployment):
    host, port = deployment.link.host, deployment.link.port
    with pytest.raises(OSError):  # plain HTTP is not served
        urllib.request.urlopen(f"http://{host}:{port}/health", timeout=5)
    with pytest.raises(urllib.error.URLError) as excinfo:  # an unknown CA is refused
        urllib.request.urlopen(f"https://{host}:{port}/health", timeout=5,
                               context=ssl.create_default_context())
    assert isinstance(excinfo.value.reason, ssl.SSLCertVerificationError)
    trusted = ssl.create_default_context(cafile=str(deployment.layout.ca_cert))
    for name in ("127.0.0.1", "localhost"):  # both SubjectAltNames verify
        with urllib.request.urlopen(f"https://{name}:{port}/health", timeout=5,
                                    context=trusted) as response:
            assert response.status == 200


def test_certs_cli_is_idempotent_keeps_keys_private_and_refuses_other_hosts(tmp_path, capsys):
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import (
        load_ssh_private_key,
        load_ssh_public_key,
    )

    from app.tooling.certs import main as certs_main

    out = tmp_path / "certs"
    assert certs_main(["--out", str(out), "--hosts", "localhost,127.0.0.1",
                       "--sites", "hospital-a"]) == 0
    files = sorted(p for p in out.rglob("*") if p.is_file())
    before = {p: p.read_bytes() for p in files}
    assert certs_main(["--out", str(out), "--hosts", "localhost,127.0.0.1",
                       "--sites", "hospital-a"]) == 0
    assert {p: p.read_bytes() for p in files} == before  # nothing rewritten
    for key in (out / "ca.key", out / "superlink.key", out / "sites/hospital-a/supernode.key"):
        assert key.stat().st_mode & 0o777 == 0o600, key
    # The formats flwr 1.42 loads: OpenSSH EC private key, OpenSSH public key line.
    private = load_ssh_private_key((out / "sites/hospital-a/supernode.key").read_bytes(), None)
    public_line = (out / "sites/hospital-a/supernode.pub").read_text()
    assert public_line.startswith("ecdsa-sha2-nistp384 ")
    assert load_ssh_public_key(public_line.encode()).public_numbers() == \
        private.public_key().public_numbers()
    cert = x509.load_pem_x509_certificate((out / "superlink.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    # Other host names: refused without --force, replaced with it (the CA stays).
    capsys.readouterr()
    assert certs_main(["--out", str(out), "--hosts", "fl.example.org"]) == 2
    assert "--force" in capsys.readouterr().err
    assert certs_main(["--out", str(out), "--hosts", "fl.example.org", "--force"]) == 0
    assert (out / "superlink.crt").read_bytes() != before[out / "superlink.crt"]
    assert (out / "ca.crt").read_bytes() == before[out / "ca.crt"]
    assert (out / "ca.key").read_bytes() == before[out / "ca.key"]
    assert certs_main(["--out", str(out), "--hosts", "fl.example.org", "--new-ca"]) == 0
    assert (out / "ca.crt").read_bytes() != before[out / "ca.crt"]
    assert certs_main(["--out", str(out), "--sites", "../evil"]) == 2
