"""An approved app bundle's install folder, checked against the bundle before every message.

Flower installs a bundle (FAB) once, into ``$FLWR_HOME/apps/<publisher>.<name>.
<version>.<hash8>``, and reuses that folder whenever it exists
(``flwr.cli.install.install_from_fab`` with ``skip_prompt``): an install edited
after the check would keep running under the approval of the original bundle.
So before every message the site runner compares the install folder with the
bundle that was just approved (:func:`install_differences`: every file's bytes,
no file missing, no file added) and, on any difference, deletes the folder and
installs it afresh from the bundle (:func:`verified_install`).

The warm workers run with ``PYTHONDONTWRITEBYTECODE=1``
(:data:`WORKER_ENV`), so nothing but the bundle's own files belongs in the
folder: a byte-code file there is a difference like any other.
"""

from __future__ import annotations

import io
import os
import shutil
import zipfile
from pathlib import Path

from flwr.cli.install import install_from_fab

from app.tooling.errors import FlowerProcessError

__all__ = ["WORKER_ENV", "install_differences", "verified_install"]

#: The environment of the warm workers: the runner's, without byte-code files written into
#: the install folder.
WORKER_ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
#: The bundle's own metadata folder, which Flower removes when it installs.
_INFO = ".info/"


def install_differences(install_dir: Path, fab_bytes: bytes) -> list[str]:
    """Paths (relative, sorted) where ``install_dir`` differs from the bundle ``fab_bytes``.

    A file is different when its bytes differ, when the bundle has it and the
    folder does not, or when the folder has it (a link included) and the bundle
    does not.
    """
    with zipfile.ZipFile(io.BytesIO(fab_bytes)) as bundle:
        expected = {info.filename: bundle.read(info) for info in bundle.infolist()
                    if not info.is_dir() and not info.filename.startswith(_INFO)}
    present = {path.relative_to(install_dir).as_posix(): path
               for path in Path(install_dir).rglob("*") if path.is_symlink() or path.is_file()}
    differences = set(expected.keys() ^ present.keys())
    differences.update(name for name in expected.keys() & present.keys()
                       if present[name].is_symlink()
                       or present[name].read_bytes() != expected[name])
    return sorted(differences)


def verified_install(fab_bytes: bytes) -> tuple[Path, list[str]]:
    """The install folder of an approved bundle, equal to the bundle; what was different.

    Installs the bundle when it is not installed yet; when the folder differs
    from the bundle, deletes it and installs it afresh.

    Returns
    -------
    (Path, list of str)
        The install folder and the differences found before re-installing it
        (empty when the folder was as the bundle says).

    Raises
    ------
    FlowerProcessError
        A fresh install still differs from the bundle (nothing of it may run).
    """
    folder = install_from_fab(fab_bytes, skip_prompt=True)
    differences = install_differences(folder, fab_bytes)
    if differences:
        shutil.rmtree(folder)
        folder = install_from_fab(fab_bytes, skip_prompt=True)
        still = install_differences(folder, fab_bytes)
        if still:
            raise FlowerProcessError(f"the fresh install {folder} differs from its bundle: "
                                     f"{', '.join(still[:5])}")
    return folder, differences
