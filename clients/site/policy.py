"""The site policy: the rules a hospital sets on what its SuperNode computes and sends.

A hospital writes a TOML file (``configs/site-policy.toml`` is the documented
default) and starts its SuperNode with ``POLICY=/abs/policy.toml``; node_config
carries only that path. The site reads the file before it touches any data
and checks every request against it (:mod:`clients.site.policy_check`); a
request that breaks a rule is refused with :class:`PolicyRefusal`, whose text
names the rule and never a path.

File format (every key optional; a missing key takes the permissive value of
:meth:`SitePolicy.permissive`; ``inf`` is TOML's infinity, "no limit")::

    allowed-tasks = ["cxr-cls", "ct3d-cls", "pe-seg"]   # "*": any task
    allowed-codecs = ["none", "fp16", "topk", "randk", "qsgd", "sign"]  # "*": any
    answer-queries = true        # answer Power-of-Choice loss queries
    max-queries = inf            # loss queries answered per dataset, all federations together
    evaluate-trains = true       # an evaluate message may adapt (train) under the train rules
    share-finetuned-model = true # the cross-site exchange's fine-tune may run and leave
    share-control-variates = true # SCAFFOLD's Delta c_i may leave with the update (twice the bytes)
    share-pruning-gradients = true # PruneFL's per-weight squared gradients may leave (re-pruning)
    min-batch-size = 8
    min-local-steps = 1
    max-local-steps = inf        # a request above it is refused, not clamped
    max-time-budget = inf        # seconds; a request without a budget counts as inf
    min-image-size = 8
    max-image-size = 512
    max-volume-depth = inf       # slices of a 3D volume (ct3d-cls volume-depth)
    max-slab-slices = inf        # slices of a 2.5D slab (pe-seg slab-slices)
    max-study-bytes = inf        # bytes of one decoded float32 study the run's sizes define
    min-val-items = 0            # fewer validation items: only counts leave
    sandbox = "on"               # the site runner runs the app only in its sandbox (bubblewrap);
                                 # "off": a plain process, shown in red on the console

    [dp]
    required = false             # refuse training without DP-SGD
    min-noise-multiplier = 0.0   # sigma of the Gaussian mechanism, at least
    max-grad-norm = inf          # per-example clipping norm C, at most
    delta = 1.0                  # the delta of (epsilon, delta)-DP, at most
    max-epsilon = inf            # the epsilon budget of the site's data, all federations
    accountants = ["*"]          # privacy.accountant a run may use: "rdp", "prv"; "*": any

    [secure-aggregation]         # SecAgg+ (Bell et al. 2020): clients/site/secure_round.py
    required = false             # refuse a train round whose update is not securely aggregated
    min-participants = 2         # refuse a round summing fewer sites' updates (setup and unmask)
    min-threshold = 0.5          # t/(k+1) at least this (t > (k+1)/2 always), in [0.5, 1]
    roster = ""                  # absolute path: the federation's site signing keys (the PKI)
    signing-key = ""             # absolute path: this site's private signing key

    [vertical]                   # vertical federations (pvFed, split learning): docs/VERTICAL.md
    allowed = false              # answer vertical messages (they carry per-patient vectors)
    min-intersection = 20        # the fewest shared patients (PSI) this site works with
    share-labels = false         # vanilla SplitNN: the site's labels go to the coordinator
    psi-secret = ""              # absolute path: the sites' shared PSI salt (never the coordinator's)
    max-request-ratio = 2.0      # a PSI request holds at most this times the site's own ids
    max-psi-requests = 32        # PSI requests served per dataset, all federations together
    label-dp-epsilon = inf       # U-shaped split learning's label DP (finite: required when
                                 # share-labels = false)
    max-evaluations = 64         # split-learning evaluations scored per dataset, all federations

    [audit]                      # the audit log's anchors: app/site_runtime/audit_anchor.py
    anchor = ""                  # "": none; "syslog": journald/syslog; "/abs/path": a file on
                                 # another mount, appended with the log's head
    anchor-every = 100           # records between two anchors (and at every node stop)

    [apps]                       # which app bundles run: clients/site/app_rules.py
    any = true                   # false: only approved-sha256 / approved-file / trusted-keys

    [pacs]                       # the PACS the runtime syncs a cohort from: clients/site/pacs_rules.py
    endpoints = []               # DICOMweb base URLs and DIMSE peers "AET@host:port"; "*": any
                                 # (a file without [pacs]: none)
    max-cohort = inf             # the most studies a synced cohort may hold
    write-back = false           # results may be stored back into the PACS
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from clients.registry import TASKS
from clients.site.app_rules import AppApprovalError, AppRules, parse_app_rules
from clients.site.pacs_rules import PERMISSIVE_PACS, PacsRules, parse_endpoints
from clients.training.dp_accountants import ACCOUNTANTS
from strategies.wire.codecs.registry import CODECS
from strategies.wire.errors import ConfigError, SiteError

__all__ = ["PolicyRefusal", "SitePolicyError", "AppRules", "AuditRules", "DpRules",
           "SecAggRules", "VerticalRules", "PacsRules", "SitePolicy", "load_policy", "ANY", "SANDBOX_MODES",
           "SYSLOG_ANCHOR"]

ANY = "*"
#: ``sandbox``: "on" (the default: the worker runs only inside the sandbox, fail closed) or
#: "off" (a plain process; the console shows it in red).
SANDBOX_MODES = ("on", "off")
#: ``audit.anchor`` naming the system log (journald through syslog) instead of a file.
SYSLOG_ANCHOR = "syslog"


class PolicyRefusal(SiteError):
    """A request breaks a rule of the site policy; the site refuses it.

    Parameters
    ----------
    rule : str
        The rule, as its policy key (``min-batch-size``, ``dp.max-epsilon``).
    detail : str
        What the request asked and what the rule allows; never a path.
    """

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"policy rule {rule}: {detail}")
        self.rule = rule
        self.detail = detail


class SitePolicyError(ConfigError):
    """A site policy file is unreadable, has an unknown key or a bad value."""


@dataclass(frozen=True)
class DpRules:
    """The differential-privacy rules of a site (section ``[dp]``).

    ``max_epsilon`` bounds the epsilon of (epsilon, delta)-DP that every computation on
    the site's data together may spend, whichever federation or message asks (Dwork &
    Roth 2014, Def. 2.4; the one ledger, :mod:`clients.site.privacy_ledger`, plus the
    allowance a hospital admin added with ``make privacy-budget EXTEND=...``);
    ``math.inf`` means no limit. ``accountants`` are the accountants
    (:mod:`clients.training.dp_accountants`) a run may measure that epsilon with; the
    site's ledger counts with the run's, so a site that wants the looser RDP bound to
    govern its budget allows only ``"rdp"``.
    """

    required: bool = False
    min_noise_multiplier: float = 0.0
    max_grad_norm: float = math.inf
    delta: float = 1.0
    max_epsilon: float = math.inf
    accountants: tuple[str, ...] = (ANY,)

    def allows_accountant(self, accountant: str) -> bool:
        """Whether the site lets a run account its epsilon with ``accountant``."""
        return ANY in self.accountants or accountant in self.accountants


@dataclass(frozen=True)
class SecAggRules:
    """The secure-aggregation rules of a site (section ``[secure-aggregation]``).

    Under SecAgg+ (Bell et al., CCS 2020, "Secure Single-Server Aggregation with
    (Poly)Logarithmic Overhead") the coordinator learns only the sum of the updates of
    the sites that finished the round. ``required`` refuses every train round whose
    update would leave in the clear; ``min_participants`` is the fewest sites the
    site's update may be summed with, itself included (a sum of one is the update);
    ``min_threshold`` bounds the Shamir threshold from below: t of the k + 1 shares of
    a secret (one per neighbour, one the site keeps) reconstruct it, so fewer than t
    colluding neighbours (plus the server) learn nothing, and t > (k + 1)/2 always, so
    the server cannot obtain both the self-mask and the pairwise-mask shares of one
    site (Bell et al., Sec. 3).
    """

    required: bool = False
    min_participants: int = 2
    min_threshold: float = 0.5
    #: Absolute path of the roster of the federation's site signing keys ("" = none).
    roster: str = ""
    #: Absolute path of this site's private signing key ("" = none).
    signing_key: str = ""


@dataclass(frozen=True)
class VerticalRules:
    """The vertical-federation rules of a site (section ``[vertical]``, docs/VERTICAL.md).

    A vertical federation (pvFed, split learning) sends per-patient vectors: a local
    encoder of the shared patients, or the cut-layer activations of each batch. A
    policy *file* must say ``allowed = true`` for the site to answer any vertical
    message (a file without the section refuses them); ``min_intersection`` is the
    fewest patients the private set intersection may leave (fewer: refused, and every
    later per-patient message of that federation too); ``share_labels`` lets vanilla
    SplitNN send the site's labels to the coordinator (the U-shaped variant keeps them).
    ``psi_secret`` names the file of the salt the federation's sites share and the
    coordinator never learns; ``max_request_ratio`` caps a PSI request relative to the
    site's own set, ``max_psi_requests`` and ``max_evaluations`` count PSI requests and
    split-learning evaluations per dataset, across federations; ``label_dp_epsilon`` is
    the label-DP parameter of U-shaped split learning (``inf``: no defence).
    """

    allowed: bool = False
    min_intersection: int = 20
    share_labels: bool = False
    psi_secret: str = ""
    max_request_ratio: float = 2.0
    max_psi_requests: float = 32
    label_dp_epsilon: float = math.inf
    max_evaluations: float = 64


@dataclass(frozen=True)
class AuditRules:
    """Where the site's audit log is anchored off the machine (section ``[audit]``).

    A hash chain (:mod:`app.site_runtime.audit_log`) shows an edited or deleted record,
    but not a chain rewritten whole with its head: the head must also be kept where the
    rewriter cannot reach. ``anchor`` names that place: ``""`` (none; ``make
    audit-verify`` then says so), ``"syslog"`` (the system log, journald's syslog socket)
    or an absolute path (a file on another mount, e.g. a write-once share) that every
    anchor appends to; ``anchor_every`` is the number of records between two anchors (one
    is also written at every node stop).
    """

    anchor: str = ""
    anchor_every: int = 100


#: What a site without a policy file answers (simulation): every vertical message.
PERMISSIVE_VERTICAL = VerticalRules(allowed=True, min_intersection=1, share_labels=True,
                                    max_request_ratio=math.inf, max_psi_requests=math.inf,
                                    max_evaluations=math.inf)


@dataclass(frozen=True)
class SitePolicy:
    """The rules a site enforces on every request (see the module docstring)."""

    allowed_tasks: tuple[str, ...] = (ANY,)
    allowed_codecs: tuple[str, ...] = (ANY,)
    answer_queries: bool = True
    max_queries: float = math.inf
    evaluate_trains: bool = True
    share_finetuned_model: bool = True
    share_control_variates: bool = True
    share_pruning_gradients: bool = True
    min_batch_size: int = 1
    min_local_steps: int = 1
    max_local_steps: float = math.inf
    max_time_budget: float = math.inf
    min_image_size: int = 1
    max_image_size: float = math.inf
    max_volume_depth: float = math.inf
    max_slab_slices: float = math.inf
    max_study_bytes: float = math.inf
    min_val_items: int = 0
    sandbox: str = "on"
    dp: DpRules = field(default_factory=DpRules)
    secure_aggregation: SecAggRules = field(default_factory=SecAggRules)
    vertical: VerticalRules = field(default_factory=lambda: PERMISSIVE_VERTICAL)
    audit: AuditRules = field(default_factory=AuditRules)
    pacs: PacsRules = field(default_factory=lambda: PERMISSIVE_PACS)
    apps: AppRules = field(default_factory=AppRules)
    fingerprint: str = ""

    @classmethod
    def permissive(cls) -> SitePolicy:
        """The policy that allows every request (simulation's default)."""
        return _fingerprinted(cls())

    def allows_task(self, task: str) -> bool:
        """Whether the policy lets the site run ``task``."""
        return ANY in self.allowed_tasks or task in self.allowed_tasks

    def allows_codec(self, codec_name: str) -> bool:
        """Whether the policy lets the site send updates packed by ``codec_name``."""
        return ANY in self.allowed_codecs or codec_name in self.allowed_codecs


def _canonical(policy: SitePolicy) -> str:
    values = asdict(policy)
    values.pop("fingerprint")
    return json.dumps(values, sort_keys=True, default=str,
                      allow_nan=True).replace("Infinity", "inf")


def _fingerprinted(policy: SitePolicy) -> SitePolicy:
    digest = hashlib.sha256(_canonical(policy).encode()).hexdigest()[:16]
    return replace(policy, fingerprint=digest)


def _key(name: str) -> str:
    return name.replace("_", "-")


def _number(value: Any, where: str, *, integer: bool, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SitePolicyError(f"{where} must be a number, got {value!r}")
    if math.isnan(value) or value < minimum:
        raise SitePolicyError(f"{where} must be >= {minimum}, got {value!r}")
    if integer and not math.isinf(value) and value != int(value):
        raise SitePolicyError(f"{where} must be a whole number, got {value!r}")
    return int(value) if integer and not math.isinf(value) else float(value)


def _names(value: Any, where: str, known: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SitePolicyError(f"{where} must be a list of names, got {value!r}")
    unknown = sorted(set(value) - set(known) - {ANY})
    if unknown:
        raise SitePolicyError(f"{where} has unknown names {unknown}; known: {list(known)}")
    return tuple(sorted(set(value)))


#: Limits that are whole numbers although their default is ``inf``.
_WHOLE_LIMITS = ("max_local_steps", "max_image_size", "max_queries", "max_volume_depth",
                 "max_slab_slices", "max_study_bytes", "max_psi_requests", "max_evaluations",
                 "max_cohort")
#: Settings that are "" or an absolute path.
_PATHS = ("roster", "signing_key", "psi_secret")
#: Sizes and counts that must be at least 1.
_AT_LEAST_ONE = ("batch_size", "local_steps", "image_size", "volume_depth", "slab_slices",
                 "study_bytes")


def _typed(name: str, value: Any, default: Any, where: str) -> Any:
    if name == "allowed_tasks":
        return _names(value, where, tuple(sorted(TASKS)))
    if name == "allowed_codecs":
        return _names(value, where, tuple(CODECS))
    if name == "accountants":
        return _names(value, where, tuple(ACCOUNTANTS))
    if name == "endpoints":
        try:
            return parse_endpoints(value, where)
        except ValueError as exc:
            raise SitePolicyError(str(exc)) from None
    if name == "sandbox":
        if value not in SANDBOX_MODES:
            raise SitePolicyError(f"{where} must be one of {list(SANDBOX_MODES)}, got {value!r}")
        return value
    if name in _PATHS:
        if not isinstance(value, str) or not (value == "" or Path(value).is_absolute()):
            raise SitePolicyError(f"{where} must be \"\" or an absolute path, got {value!r}")
        return value
    if name == "anchor":
        if not isinstance(value, str) or not (value in ("", SYSLOG_ANCHOR)
                                              or Path(value).is_absolute()):
            raise SitePolicyError(f"{where} must be \"\", \"{SYSLOG_ANCHOR}\" or an absolute "
                                  f"path, got {value!r}")
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise SitePolicyError(f"{where} must be true or false, got {value!r}")
        return value
    integer = isinstance(default, int) or name in _WHOLE_LIMITS
    minimum = 1.0 if name.endswith(_AT_LEAST_ONE) or name == "anchor_every" else 0.0
    number = _number(value, where, integer=integer, minimum=minimum)
    if name == "delta" and not 0.0 < number <= 1.0:
        raise SitePolicyError(f"{where} must be in (0, 1], got {value!r}")
    if name == "min_participants" and number < 2:
        raise SitePolicyError(f"{where} must be >= 2 (a sum of one is the update), got {value!r}")
    if name == "min_intersection" and number < 1:
        raise SitePolicyError(f"{where} must be >= 1, got {value!r}")
    if name in ("max_request_ratio", "label_dp_epsilon") and not number > 0:
        raise SitePolicyError(f"{where} must be > 0, got {value!r}")
    if name == "min_threshold" and not 0.5 <= number <= 1.0:
        raise SitePolicyError(f"{where} must be in [0.5, 1], got {value!r}")
    return number


#: The policy's tables: ``[dp]``, ``[secure-aggregation]``, ``[vertical]``, ``[audit]`` and
#: ``[pacs]`` (``[apps]``: parse_app_rules). A file without ``[vertical]`` refuses vertical
#: federations, one without ``[pacs]`` every PACS endpoint.
_TABLES = {"dp": DpRules, "secure-aggregation": SecAggRules, "vertical": VerticalRules,
           "audit": AuditRules, "pacs": PacsRules}


def _section(cls: type, table: Mapping[str, Any], prefix: str, source: str) -> dict[str, Any]:
    tables = (*_TABLES, "apps") if cls is SitePolicy else ()
    names = {_key(f.name): f for f in fields(cls)
             if _key(f.name) not in tables and f.name != "fingerprint"}
    allowed = set(names) | set(tables)
    for key in table:
        if key not in allowed:
            raise SitePolicyError(f"site policy {source}: unknown key '{prefix}{key}'; "
                                  f"known: {sorted(allowed)}")
    defaults = cls()
    return {f.name: _typed(f.name, table[key], getattr(defaults, f.name),
                           f"site policy {source}: '{prefix}{key}'")
            for key, f in names.items() if key in table}


def load_policy(path: str | Path) -> SitePolicy:
    """Read, check and fingerprint a site policy file.

    Parameters
    ----------
    path : str or Path
        The TOML file the hospital owns.

    Returns
    -------
    SitePolicy
        With ``fingerprint`` = the first 16 hex digits of the SHA-256 of the
        policy's canonical form (every rule, defaults filled in), so two files
        that state the same rules have the same fingerprint.

    Raises
    ------
    SitePolicyError
        The file is unreadable, not TOML, or has an unknown key or a bad
        value; the message names the file and the key.
    """
    source = str(path)
    try:
        table = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SitePolicyError(f"site policy {source}: unreadable ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SitePolicyError(f"site policy {source}: not valid TOML ({exc})") from exc
    for section in (*_TABLES, "apps"):
        if not isinstance(table.get(section, {}), dict):
            raise SitePolicyError(f"site policy {source}: '{section}' must be a table")
    sections = {name.replace("-", "_"): rules(**_section(rules, table.get(name, {}), f"{name}.",
                                                          source))
                for name, rules in _TABLES.items()}
    try:
        apps = parse_app_rules(table.get("apps", {}), source)
    except AppApprovalError as exc:
        raise SitePolicyError(str(exc)) from exc
    policy = SitePolicy(**_section(SitePolicy, table, "", source), **sections, apps=apps)
    if policy.min_local_steps > policy.max_local_steps:
        raise SitePolicyError(f"site policy {source}: 'min-local-steps' exceeds 'max-local-steps'")
    if policy.min_image_size > policy.max_image_size:
        raise SitePolicyError(f"site policy {source}: 'min-image-size' exceeds 'max-image-size'")
    return _fingerprinted(policy)
