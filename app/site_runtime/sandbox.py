"""The warm worker's sandbox: bubblewrap, an unprivileged uid and resource limits.

An approved app bundle is code the researcher wrote; approval says "this code may train
on our data", not "this code may read other datasets, talk to the internet, or rewrite
the ledger and the audit log". So the site runner starts every worker
(:mod:`app.site_runtime.site_worker`) inside a sandbox built with Debian's
``bubblewrap`` (``bwrap``; no hand-written namespace code), :func:`sandboxed_command`:

* new network, PID, IPC, UTS and cgroup namespaces (``--unshare-*``): no network at
  all, the worker's only channel is the socket pair it inherits from the runner;
* a new root holding only what the worker needs, read-only: the system's ``/usr``, the
  Python installation and the virtual environment's libraries (the product's own
  packages, the hospital's copy of the runtime, hidden: :func:`_product_packages`), the
  one installed app bundle, the site's data folder, the worker's copy of the data
  rules; read-write only the worker's own state folder
  (:mod:`app.site_runtime.worker_view`) and a fresh ``/tmp``. The policy file, the
  ledgers, the audit log, the console's token, the runtime's code, other datasets and
  the runner's environment are not there;
* a scrubbed environment (:data:`PASSED_ENV` only);
* an unprivileged uid: a runner started as root hands the worker to ``setpriv`` with
  ``worker_uid`` (default 65534) and no capabilities, inside the namespaces bubblewrap
  set up; a runner that is not root runs it as itself in a user namespace;
* limits (``prlimit``): processes (``RLIMIT_NPROC``, which Linux does not apply to
  uid 0, hence the uid), address space (``RLIMIT_AS``; not on a host with NVIDIA
  devices, whose driver maps device memory into the address space) and, in the
  worker pool, the wall-clock time of one message;
* the NVIDIA device nodes, when present (``--dev-bind``).

Without ``bwrap`` the runner refuses to start a worker (:class:`SandboxUnavailable`,
fail closed) unless the policy says ``sandbox = "off"``.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from app.tooling.errors import FlowerProcessError

__all__ = ["DEFAULT_WORKER_UID", "PASSED_ENV", "SANDBOX_SCRIPT", "SandboxLimits", "SandboxUnavailable",
           "WorkerMounts", "bubblewrap", "sandboxed_command", "worker_owner"]

#: Where the worker script appears inside the sandbox (the runtime's folder does not).
SANDBOX_SCRIPT = "/fedmed/site_worker.py"
#: Environment variables the worker gets from the runner (thread counts, device choice);
#: everything else is scrubbed.
PASSED_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
              "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "FEDMED_LOADER_WORKERS",
              "FEDMED_TORCH_THREADS",
              "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "LANG", "TZ")
#: The product's own packages (a checkout's four, an installed wheel's namespace): the
#: hospital's copy, never shown to the worker.
_PRODUCT_PACKAGES = ("app", "clients", "strategies", "models", "fedmed")
#: System files a Python process reads (libraries' cache, users, time zone, alternatives).
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
        "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")
#: What the worker may read of /sys: the CPU topology (thread counts).
_SYS = ("/sys/devices/system/cpu", "/sys/devices/system/node")
#: The default worker uid of a runner started as root (``nobody``; a hospital should
#: give a dedicated one with ``site_node --worker-uid``).
DEFAULT_WORKER_UID = 65534


class SandboxUnavailable(FlowerProcessError):
    """The sandbox cannot be built here (no bubblewrap): no worker starts."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one worker may use."""

    #: Processes and threads of the worker uid (``RLIMIT_NPROC``).
    max_processes: int = 512
    #: Address space in bytes (``RLIMIT_AS``; 0: none); not applied with NVIDIA devices.
    max_memory: int = 0
    #: The uid (and gid) a root runner starts the worker as.
    worker_uid: int = DEFAULT_WORKER_UID

    def __post_init__(self) -> None:
        if self.max_processes < 8:
            raise FlowerProcessError(f"worker process limit must be >= 8, got "
                                     f"{self.max_processes}")
        if self.max_memory < 0:
            raise FlowerProcessError(f"worker memory limit must be >= 0, got {self.max_memory}")
        if self.worker_uid <= 0:
            raise FlowerProcessError(f"--worker-uid must be a non-root uid, got "
                                     f"{self.worker_uid}")


@dataclass(frozen=True)
class WorkerMounts:
    """What one worker's sandbox shows of the host."""

    #: The site's data folder (read-only).
    data_path: Path
    #: The site's state dir: hidden when it lies inside the data folder.
    state_dir: Path
    #: The worker's own state folder (read-write).
    worker_state: Path
    #: The installed app bundle (read-only) and ``FLWR_HOME`` above it.
    app_dir: Path
    flwr_home: Path
    #: The worker's copy of the data rules (read-only).
    policy_copy: Path
    #: The worker script on the host.
    script: Path


def bubblewrap() -> str:
    """The ``bwrap`` executable.

    Raises
    ------
    SandboxUnavailable
        When bubblewrap is not installed (``apt-get install bubblewrap``).
    """
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailable(
            "the site runner starts the app only in its sandbox and bubblewrap (bwrap) is "
            "not installed: `apt-get install bubblewrap`, or set sandbox = \"off\" in the "
            "site policy (the console then shows the site unsandboxed)")
    return found


def worker_owner(limits: SandboxLimits) -> tuple[int, int] | None:
    """``(uid, gid)`` that must own the worker's state folder (None: the runner's own)."""
    return (limits.worker_uid, limits.worker_uid) if os.geteuid() == 0 else None


def _product_packages() -> list[Path]:
    """Folders of the product's own packages as this (the runtime's) process imports them."""
    found = []
    for name in _PRODUCT_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            found.extend(Path(location) for location in spec.submodule_search_locations)
    return found


def _python_roots() -> list[Path]:
    """The Python installation and the virtual environment (read-only in the sandbox)."""
    roots = {Path(sys.base_prefix).resolve(), Path(sys.prefix)}
    return sorted(roots)


def _dependency_folders() -> list[Path]:
    """The folders ``PYTHONPATH`` and the path lines of the Python roots' ``.pth`` files add
    (dependencies installed outside the venv), and the real folders their symlinked entries
    point into; never one holding the product's own packages (the worker runs the approved
    bundle's), never the process's working folder."""
    roots, listed = _python_roots(), os.environ.get("PYTHONPATH", "").split(os.pathsep)
    for site_dir in {*site.getsitepackages(), sysconfig.get_paths()["purelib"]}:
        for pth in sorted(Path(site_dir).glob("*.pth")):
            lines = pth.read_text(encoding="utf-8", errors="replace").splitlines()
            listed += [str(Path(site_dir) / line.strip()) for line in lines
                       if line.strip() and not line.startswith(("#", "import ", "import\t"))]
    found: set[Path] = set()
    for entry in filter(None, listed):
        folder = Path(entry).resolve()
        if (folder.is_dir() and folder != Path.cwd().resolve()
                and not any(r == folder or r in folder.parents for r in roots)):
            found.add(folder)
            found.update(c.resolve().parent for c in folder.iterdir() if c.is_symlink())
    return sorted(f for f in found if not any((f / n).is_dir() for n in _PRODUCT_PACKAGES))


class _Args:
    """bubblewrap arguments, with every mount point's parents made traversable."""

    def __init__(self) -> None:
        self.argv: list[str] = []
        self._dirs: set[str] = {"/"}

    def parents(self, path: Path) -> None:
        for parent in reversed(path.parents):
            text = str(parent)
            if text not in self._dirs:
                self._dirs.add(text)
                self.argv += ["--perms", "0755", "--dir", text]

    def tmpfs(self, target: str, perms: str = "0755") -> None:
        self._dirs.add(target)
        self.argv += ["--perms", perms, "--tmpfs", target]

    def bind(self, option: str, source: Path, target: Path | None = None) -> None:
        target = Path(target or source)
        self.parents(target)
        self._dirs.add(str(target))
        self.argv += [option, str(source), str(target)]


def _system(args: _Args) -> None:
    for name in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args.argv += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args.bind("--ro-bind", path)
    for name in (*_ETC, *_SYS):
        if Path(name).exists():
            args.bind("--ro-bind", Path(name))


def _python(args: _Args) -> None:
    for root in (*_python_roots(), *_dependency_folders()):
        args.bind("--ro-bind", root)
    hidden = [Path(p) for p in glob.glob(os.path.join(sys.prefix, "lib", "python*",
                                                      "site-packages", "__editable__*"))]
    for path in hidden:  # an editable install's finder would point at the runtime's code
        args.argv += ["--ro-bind", "/dev/null", str(path)]
    for package in _product_packages():
        if any(root in package.parents for root in _python_roots()):
            args.argv += ["--tmpfs", str(package)]


def _devices(args: _Args) -> bool:
    nodes = sorted(glob.glob("/dev/nvidia*"))
    for node in nodes:
        args.argv += ["--dev-bind", node, node]
    return bool(nodes)


def sandboxed_command(python_argv: list[str], mounts: WorkerMounts, limits: SandboxLimits,
                      env: dict[str, str]) -> list[str]:
    """The command that runs ``python_argv`` (the worker script at :data:`SANDBOX_SCRIPT`)
    in the sandbox.

    Raises
    ------
    SandboxUnavailable
        Without bubblewrap.
    """
    bwrap = bubblewrap()
    args = _Args()
    args.argv += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                  "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    root = os.geteuid() == 0
    if not root:
        args.argv.append("--unshare-user")
    _system(args)
    args.argv += ["--dev", "/dev", "--proc", "/proc"]
    args.tmpfs("/dev/shm", "1777")
    args.tmpfs("/tmp", "1777")  # before every bind: a venv or data folder under /tmp stays
    _python(args)
    gpu = _devices(args)
    args.bind("--ro-bind", mounts.data_path)
    state = mounts.state_dir
    if mounts.data_path in state.parents:  # the default state dir lies in the data folder
        args.tmpfs(str(state))
    args.bind("--bind", mounts.worker_state)
    args.bind("--ro-bind", mounts.policy_copy)
    args.bind("--ro-bind", mounts.app_dir)
    args.bind("--ro-bind", mounts.script, Path(SANDBOX_SCRIPT))
    args.argv += ["--chdir", "/tmp", "--clearenv"]
    scrubbed = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp",
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
                "FLWR_HOME": str(mounts.flwr_home), "MPLCONFIGDIR": "/tmp",
                "XDG_CACHE_HOME": "/tmp/cache",
                **{key: env[key] for key in PASSED_ENV if key in env}}
    for key, value in sorted(scrubbed.items()):
        args.argv += ["--setenv", key, value]
    drop = ([shutil.which("setpriv") or "/usr/bin/setpriv", "--reuid", str(limits.worker_uid),
             "--regid", str(limits.worker_uid), "--clear-groups", "--inh-caps=-all",
             "--bounding-set=-all", "--no-new-privs"] if root else [])
    rlimits = [f"--nproc={limits.max_processes}"]
    if limits.max_memory and not gpu:
        rlimits.append(f"--as={limits.max_memory}")
    prlimit = shutil.which("prlimit") or "/usr/bin/prlimit"
    return [prlimit, *rlimits, "--", bwrap, *args.argv, "--", *drop, *python_argv]
