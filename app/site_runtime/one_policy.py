"""One site policy file governs a hospital's apps and its data.

The site runner (:mod:`app.site_runtime.site_runner`) checks every app bundle
against the ``[apps]`` rules of the policy file it was started with
(``site_node --policy``); the ClientApp it runs reads the data rules (tasks,
batch sizes, steps, DP, queries) from the file the SuperNode's node_config
names (``policy-path``, :class:`app.config.site_config.SiteConfig`). Two
sources could disagree, and a start that gave only one of them would enforce
the apps without the data rules, or the reverse. So the runner needs its
policy, and the node config must name the same file: the node refuses to start
otherwise, and the runner refuses every message whose node config names
another file or none (:func:`policy_mismatch`), naming both paths in the
site's log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flwr.common.config import parse_config_args

__all__ = ["NODE_POLICY_KEY", "node_config_of", "policy_mismatch"]

#: The node_config key of the site policy file (read by the ClientApp).
NODE_POLICY_KEY = "policy-path"


def node_config_of(supernode_args: Sequence[str]) -> dict[str, Any]:
    """The ``--node-config`` of ``flower-supernode`` arguments, parsed as Flower parses it."""
    values = [arg.split("=", 1)[1] for arg in supernode_args if arg.startswith("--node-config=")]
    values += [supernode_args[i + 1] for i, arg in enumerate(supernode_args[:-1])
               if arg == "--node-config"]
    return dict(parse_config_args(values)) if values else {}


def policy_mismatch(policy: Path, node_config: Mapping[str, Any]) -> str | None:
    """Why ``node_config`` does not name the runner's ``policy`` file (None: it does).

    Both paths are compared resolved, so two spellings of one file agree. The
    text names both paths: it is for the site's log, never for a reply.
    """
    named = str(node_config.get(NODE_POLICY_KEY, ""))
    if not named:
        return (f"the site runner enforces the policy {policy}, but the node config has no "
                f"{NODE_POLICY_KEY}: its data rules would not apply (give the same file to both)")
    if Path(named).resolve() != Path(policy).resolve():
        return (f"the site runner enforces the policy {policy}, but the node config's "
                f"{NODE_POLICY_KEY} is {named}: one policy file must govern apps and data")
    return None
