"""A fresh venv with the fedmed wheel installed from a local wheelhouse, no checkout on its path.

The wheel is built from this checkout by its own backend (``app/tooling/wheel_build.py``)
into ``<tmp>/wheelhouse`` and installed with ``pip install --no-index --find-links``. The
fresh venv sees the product's dependencies (torch, flwr, MLflow, ...) through one ``.pth``
that points at links to the test venv's installed distributions, so pip resolves them as
installed and nothing is downloaded or copied; their console scripts (``flower-superlink``,
``flwr``, ...) are written as pip writes them. Used by ``test_wheel_install.py`` and
``test_deployment_walkthrough.py`` (one process group: the wheel is built once).
"""

from __future__ import annotations

import configparser
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class WheelVenv:
    """The fresh venv: its folder, python, the environment to run its commands in."""

    tmp: Path
    venv: Path
    wheelhouse: Path
    env: dict[str, str]

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def fedmed(self, *args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
        """``fedmed ARGS`` in ``cwd``, its output captured."""
        return subprocess.run([str(self.venv / "bin" / "fedmed"), *args], cwd=cwd, env=self.env,
                              capture_output=True, text=True, timeout=timeout)


def _excluded(name: str) -> bool:
    """Entries of the test venv the fresh venv must not see: the product, pip, .pth files
    (its setuptools is seen: torch requires one, and the fresh venv's own is removed)."""
    return (name.startswith(("fedmed", "__editable__", "pip"))
            or name.endswith(".pth") or name == "__pycache__")


def _console_scripts(deps: Path, bin_dir: Path) -> None:
    """The linked distributions' commands in the fresh venv, as pip writes them."""
    for entry_points in deps.glob("*.dist-info/entry_points.txt"):
        parser = configparser.ConfigParser(interpolation=None)
        parser.optionxform = str  # command names keep their case
        parser.read(entry_points)
        for name, target in (parser["console_scripts"].items()
                             if parser.has_section("console_scripts") else []):
            module, _, function = target.strip().partition(":")
            script = bin_dir / name
            if not script.exists():
                script.write_text(f"#!{bin_dir / 'python'}\nimport sys\nfrom {module} import "
                                  f"{function.split('.')[0]}\nsys.exit({function}())\n")
                script.chmod(0o755)


def build_wheel_venv(tmp: Path) -> WheelVenv:
    """Build the wheel into ``tmp/wheelhouse``, make ``tmp/venv`` and install it there."""
    wheelhouse = tmp / "wheelhouse"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--disable-pip-version-check", "-w", str(wheelhouse),
                    str(ROOT)], check=True, cwd=tmp, timeout=600)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "uninstall", "--quiet", "-y", "setuptools"],
                   check=False, timeout=600)
    deps = tmp / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not _excluded(entry.name):
            (deps / entry.name).symlink_to(entry)
    site_packages = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    (site_packages / "fedmed-test-deps.pth").write_text(f"{deps}\n")
    _console_scripts(deps, venv / "bin")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp), "LANG": "C.UTF-8",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-index",
                    "--disable-pip-version-check", "--find-links", str(wheelhouse), "fedmed"],
                   check=True, env=env, cwd=tmp, timeout=600)
    return WheelVenv(tmp=tmp, venv=venv, wheelhouse=wheelhouse, env=env)
