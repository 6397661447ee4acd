"""``make psi-secret``: the secret file that salts the PSI of a vertical federation.

``python -m app.tooling.psi_secret --out /abs/psi.secret`` writes 32 random bytes, mode
0600, and never overwrites a file that is there (a second run says so and changes
nothing). One hospital of the federation makes it and passes it to the others over
their own channel, never through the coordinator; each names it in its site policy
(``[vertical] psi-secret = "/abs/psi.secret"``). docs/VERTICAL.md, "What the
coordinator can and cannot learn from the PSI"; clients/vertical/psi_secret.py.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from clients.vertical.psi_secret import SECRET_BYTES, create_secret

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Create the secret file ``--out`` (an absolute path); 0 if made or already there."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path,
                        help="absolute path of the secret file to create")
    args = parser.parse_args(argv)
    if not args.out.is_absolute():
        parser.error("--out must be an absolute path (the site policy names it so)")
    if create_secret(args.out):
        print(f"psi-secret: wrote {SECRET_BYTES} random bytes to {args.out} (mode 0600); give "
              f"it to the federation's other sites over your own channel, never the coordinator")
    else:
        print(f"psi-secret: {args.out} exists; left as it is", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
