"""Where a site's data and state live, from the SuperNode's node_config.

A hospital's SuperNode is started with ``--node-config`` giving
``data-path`` (its site folder, with ``manifest.csv``), ``state-dir`` (where
site state persists across restarts), ``site-name`` and optionally
``cache-decoded`` (``false``: no decoded copy of the data in ``state-dir``),
``state-retention-days`` (days a federation's state folder is kept after its
last change, default 30, 0 = keep: :mod:`clients.site.state_retention`),
``cohort`` (the absolute path of a PACS cohort file, :mod:`clients.pacs.cohort`; the
site runtime syncs it into ``data-path`` = ``<state-dir>/pacs/<name>`` before the app
sees the data, :mod:`app.site_runtime.pacs_sync`), ``local-steps-cap`` (the most local steps this site trains a round, whatever tau the
server asks: a compute budget, trained to the cap and reported as the steps done; 0 =
none; not a privacy rule: the policy's ``max-local-steps`` refuses instead) and
``policy-path`` (the absolute path of the hospital's site policy TOML,
:mod:`clients.site.policy`; ``make supernode`` passes ``configs/site-policy.toml``
unless ``POLICY=`` names another; the hospital's site runner refuses to start or
answer unless it names the runner's own ``--policy``,
:mod:`app.site_runtime.one_policy`; only Flower's own executor, kept for a
benchmark, runs a site without it, under the permissive policy).
In simulation Flower gives only ``partition-id``; it is mapped to the synthetic
hospital ``<data-root>/hospital-<id>`` of the run config, and the policy is the
run config's ``site-policy`` (``make simulate POLICY=...``; permissive when
empty): a file for every virtual site, or a folder of ``<site-name>.toml`` files
(one policy per hospital; a site without its file runs the permissive policy).
That run-config key is honoured only in simulation: a deployed site's policy
comes from its own node_config, never from the researcher's run config.

``privacy-ledger = "site-runtime"`` is set only by the hospital's site runtime in the
node config it hands its sandboxed worker (:mod:`app.site_runtime.worker_view`): the
runtime has charged the privacy ledger before the app saw the message, and the app's
round charges nothing (:attr:`clients.site.site.Site.runtime_ledger`).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clients.site.policy import SitePolicy, load_policy
from clients.site.site import Site
from clients.site.state_retention import DEFAULT_RETENTION_DAYS
from strategies.rounds.site_book import site_name_problem
from strategies.wire.errors import ConfigError
from clients.datagen.federation import hospital_name

__all__ = ["COHORT", "POLICY_FILES", "RUNTIME_LEDGER", "SiteConfig", "SiteConfigError", "encode_policy_files"]

#: node_config ``privacy-ledger``: the value the site runtime sets for its worker.
RUNTIME_LEDGER = ("privacy-ledger", "site-runtime")
#: node_config key of the files the policy names, as the site runtime read them for its
#: sandboxed worker (JSON: path -> base64 of the bytes; :func:`encode_policy_files`).
POLICY_FILES = "policy-files"
#: node_config key of the site's PACS cohort file (absolute; ``data-path`` is then the folder
#: the site runtime syncs it into, :mod:`app.site_runtime.pacs_sync`).
COHORT = "cohort"


class SiteConfigError(ConfigError):
    """The node_config does not say where the site's data is."""


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise SiteConfigError(f"node_config cache-decoded must be true or false, got {value!r}")


def _days(value: Any) -> float:
    try:
        days = float(value)
    except (TypeError, ValueError):
        days = -1.0
    if not days >= 0:
        raise SiteConfigError(f"node_config state-retention-days must be a number of days >= 0 "
                              f"(0 keeps all), got {value!r}")
    return days


def _steps_cap(node_config: Mapping[str, Any]) -> int:
    """node_config ``local-steps-cap`` (0: none); the old name is refused, naming the new one."""
    if "max-local-steps" in node_config:
        raise SiteConfigError("node_config max-local-steps was renamed local-steps-cap (the "
                              "site's compute budget, trained to the cap); the policy's "
                              "max-local-steps refuses a longer request instead")
    value = node_config.get("local-steps-cap", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SiteConfigError(f"node_config local-steps-cap must be a whole number >= 0 "
                              f"(0: none), got {value!r}")
    return value


def _runtime_ledger(value: Any) -> bool:
    if value not in ("", RUNTIME_LEDGER[1]):
        raise SiteConfigError(f"node_config {RUNTIME_LEDGER[0]} must be {RUNTIME_LEDGER[1]!r} "
                              f"(set by the site runtime) or absent, got {value!r}")
    return value == RUNTIME_LEDGER[1]


def _policy_path(value: Any, source: str) -> Path | None:
    if not str(value):
        return None
    path = Path(str(value))
    if not path.is_absolute():
        raise SiteConfigError(f"{source} must be an absolute path, got {str(path)!r}")
    return path


def encode_policy_files(files: Mapping[str, bytes]) -> str:
    """node_config ``policy-files``' value for ``files`` (path -> bytes)."""
    return json.dumps({path: base64.b64encode(data).decode("ascii")
                       for path, data in sorted(files.items())})


def _policy_files(value: object) -> tuple[tuple[str, bytes], ...]:
    if value in ("", None):
        return ()
    try:
        files = json.loads(str(value))
        return tuple(sorted((str(path), base64.b64decode(text, validate=True))
                            for path, text in files.items()))
    except (ValueError, TypeError, AttributeError, binascii.Error):
        raise SiteConfigError(f"node_config {POLICY_FILES} must be a JSON table of path -> "
                              "base64 (the site runtime writes it)") from None


@dataclass(frozen=True)
class SiteConfig:
    """Site-specific paths, name and the path of the site policy (None: permissive).

    :meth:`site` builds the round's :class:`~clients.site.site.Site` from it.
    """

    name: str
    data_path: Path
    state_dir: Path
    cache_decoded: bool = True
    policy_path: Path | None = None
    state_retention_days: float = DEFAULT_RETENTION_DAYS
    runtime_ledger: bool = False
    local_steps_cap: int = 0
    policy_files: tuple[tuple[str, bytes], ...] = ()
    #: node_config ``dataset-name``: what the hospital calls this data ("": unnamed,
    #: :attr:`dataset_name` is then the data folder's name).
    dataset_label: str = ""

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any], data_root: str,
                         simulation_policy: str = "") -> SiteConfig:
        """Resolve the site from ``node_config`` (deployment) or ``partition-id`` (simulation).

        ``simulation_policy`` (the run config's ``site-policy``) is used only
        in simulation.
        """
        if "data-path" in node_config:
            data_path = Path(str(node_config["data-path"]))
            if not data_path.is_absolute():
                raise SiteConfigError(
                    f"node_config data-path must be absolute, got {str(data_path)!r}")
            name = str(node_config.get("site-name", data_path.name))
            problem = site_name_problem(name)
            if problem is not None:  # the product's one rule (the server applies it too)
                raise SiteConfigError(f"node_config site-name: {problem}")
            state = Path(str(node_config.get("state-dir", data_path / ".fedmed-state")))
            return cls(name=name, data_path=data_path, state_dir=state,
                       cache_decoded=_flag(node_config.get("cache-decoded", True)),
                       policy_path=_policy_path(node_config.get("policy-path", ""),
                                                "node_config policy-path"),
                       state_retention_days=_days(node_config.get("state-retention-days",
                                                                  DEFAULT_RETENTION_DAYS)),
                       runtime_ledger=_runtime_ledger(node_config.get(RUNTIME_LEDGER[0], "")),
                       local_steps_cap=_steps_cap(node_config),
                       policy_files=_policy_files(node_config.get(POLICY_FILES, "")),
                       dataset_label=str(node_config.get("dataset-name", "")))
        if "partition-id" in node_config:
            if not data_root:
                raise SiteConfigError(
                    "simulation needs run-config 'data-root' (absolute path of the "
                    "synthetic hospitals); `make simulate` sets it")
            name = hospital_name(int(node_config['partition-id']))
            data_path = Path(data_root) / name
            policy = _policy_path(simulation_policy, "run-config site-policy")
            if policy is not None and policy.is_dir():
                policy = policy / f"{name}.toml" if (policy / f"{name}.toml").is_file() else None
            return cls(name=name, data_path=data_path, state_dir=data_path / ".fedmed-state",
                       policy_path=policy)
        raise SiteConfigError(
            "node_config has neither 'data-path' (deployment) nor 'partition-id' "
            f"(simulation): {dict(node_config)}")

    @property
    def dataset_name(self) -> str:
        """The name the hospital's console shows beside the dataset's id: node_config
        ``dataset-name``, else the data folder's name."""
        return self.dataset_label or self.data_path.name

    def policy(self) -> SitePolicy:
        """The site policy to enforce: read from ``policy_path``, else the permissive one.

        Raises
        ------
        clients.site.policy.SitePolicyError
            The policy file is unreadable or invalid (the site then answers no request).
        """
        return SitePolicy.permissive() if self.policy_path is None else load_policy(self.policy_path)

    def site(self) -> Site:
        """The :class:`~clients.site.site.Site` a round runs at: these values, the policy read.

        Raises
        ------
        clients.site.policy.SitePolicyError
            The policy file is unreadable or invalid (the site then answers no request).
        """
        return Site(self.name, self.data_path, self.state_dir, self.policy(),
                    self.cache_decoded, self.local_steps_cap, self.runtime_ledger,
                    self.policy_files)
