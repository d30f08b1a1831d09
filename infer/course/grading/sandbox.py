"""The sandbox a grading kernel runs in, as far as this machine allows.

    python -m infer.course.grading.sandbox PLAN.json -- python -m ipykernel_launcher -f kernel.json

The grader (infer.course.grading.grader) starts every submission's kernel through this launcher, with a
`Plan` written into the submission's own temporary folder. What the kernel gets depends on what
the operating system lets the grader do; `choose_mode()` tries the strongest first, runs a probe
kernel command through it, and the grader prints one line saying which it got:

- "nobody" (the grader runs as root): the kernel gets its own mount, network, PID, IPC and host
  namespaces and runs as the user `nobody`. In its mount namespace the folders named in
  `Plan.hide` (the instructor's home, /home, /root, /tmp, /var/tmp, /dev/shm, the submissions
  folder, the solutions, the repository's history and built sites) are covered by empty tmpfs
  mounts, the interpreter and the course are bound back read-only (`Plan.show`), and only its own
  folder is writable. Its network namespace
  has a loopback of its own and nothing else: lab 07's server and client talk on it, and nothing
  outside can be reached (the grader talks to the kernel over Unix sockets in that folder, which
  need no network). In its PID namespace it sees and can signal only its own processes, and all
  of them end with it. As `nobody` it cannot undo any of this.
- "userns" (not root, but unprivileged user namespaces are on): the same namespaces, inside a
  user namespace of its own; the kernel is root in there (the grader's user outside), so it could
  unmount what hides the files: this hides them from code that simply opens a path, and the
  network is cut all the same.
- "plain" (neither): no namespaces, only the limits and the clean environment below.

In every mode the kernel runs in its own folder (the only one it may write, and its HOME), with
an environment the grader builds from nothing (no instructor variables), and with resource
limits of its own: address space (or data segment size on a GPU machine, where CUDA reserves
address space it never uses), CPU time, file size, no core files. A runaway kernel is stopped by
its own limit and costs its own row.

What it does not cover, in any mode: time on the GPU and its memory (no limit applies to them);
a fork bomb (the number of processes is not limited: without cgroups, a limit on the processes of
`nobody` would be shared by every kernel); disk use in the submission's own folder, beyond the
size of one file; the CPU and memory the kernel's tmpfs mounts take (their size is capped); the
kernel's reading of the course library, the interpreter and anything else outside the hidden
folders (nothing secret lives there: students have the course); side channels (timing, CPU
load). The checks themselves never run in the kernel (checker_side.py says what that boundary
does not cover)."""

import ctypes
import fcntl
import json
import os
import resource
import signal
import site
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

NOBODY_UID, NOBODY_GID = 65534, 65534
EXIT_NOTE = ".sandbox-exit"  # what killed the kernel, when a limit did (read by the grader)
PROBE_TIMEOUT_S = 60
PARENT_POLL_S = 0.2  # how often the launcher looks whether the grader is still there

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
ST_TIME_FLAGS = 1024 | 2048 | 4096  # noatime, nodiratime, relatime: statvfs and mount share these values
TMPFS_SIZE = "size=512m"  # each hiding mount: /tmp inside the sandbox lives here, in memory
SHARED_TEMPORARY = ("/tmp", "/var/tmp", "/dev/shm")  # hidden by an empty tmpfs anyone may write, as usual

LIMIT_SIGNALS = {
    signal.SIGXCPU: "its CPU-time limit",
    signal.SIGXFSZ: "its file-size limit",
    signal.SIGKILL: "SIGKILL (out of memory, or stopped by the grader)",
    signal.SIGSEGV: "a segmentation fault",
}


@dataclass(frozen=True)
class Plan:
    mode: str  # "nobody", "userns" or "plain"
    workdir: str  # the submission's folder: its only writable one, its HOME and cwd
    hide: tuple[str, ...] = ()  # covered by empty tmpfs mounts
    show: tuple[str, ...] = ()  # bound back, read-only, where a hidden folder covers them
    memory_bytes: int | None = None
    memory_limit: str = "address space"  # or "data" (on a GPU machine)
    cpu_seconds: int | None = None
    file_bytes: int | None = None
    chown: tuple[str, ...] = field(default=())  # files the grader wrote that the kernel must read

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def read(cls, path: str) -> "Plan":
        data = json.loads(Path(path).read_text())
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def launcher_command(plan_path: Path) -> list[str]:
    """The prefix that starts a command in the sandbox described by `plan_path`."""
    return [sys.executable, "-m", "infer.course.grading.sandbox", str(plan_path), "--"]


# ---------------------------------------------------------------- which mode works here


def default_hidden(submissions: Path, extra: tuple[Path, ...] = ()) -> tuple[str, ...]:
    """What a kernel must not see: homes, temporary folders, the submissions, and `extra`."""
    from infer.paths import REPO_ROOT

    home = Path(os.environ.get("HOME") or Path.home())
    paths = [home, Path("/root"), Path("/home"), Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")]
    # the solutions, and where they also live: the history and the instructors' built site
    paths += [Path(tempfile.gettempdir()), submissions, REPO_ROOT / "solutions", REPO_ROOT / ".git"]
    paths += [REPO_ROOT / "_build", *extra]
    return tuple(sorted({str(p.resolve()) for p in paths if p.exists()}))


def default_shown() -> tuple[str, ...]:
    """What a kernel needs to run: the interpreter, the venv, the course, the model cache."""
    from infer.paths import REPO_ROOT

    paths = [REPO_ROOT, Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent]
    paths += [Path(p) for p in site.getsitepackages()]  # not the rest of sys.path: it holds the grader's cwd
    hf_home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    paths.append(hf_home)
    resolved = sorted({p.resolve() for p in paths if p.exists()}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in resolved:  # a folder inside one already shown comes with it
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return tuple(str(p) for p in kept)


def choose_mode(hide: tuple[str, ...], show: tuple[str, ...], python_path: str = "") -> tuple[str, str]:
    """(mode, why the stronger ones did not work here): the strongest mode whose probe ran."""
    tried = []
    for mode in ("nobody", "userns") if os.geteuid() == 0 else ("userns",):
        problem = probe(mode, hide, show, python_path)
        if problem is None:
            return mode, "; ".join(tried)
        tried.append(f"{mode}: {problem}")
    return "plain", "; ".join(tried)


def probe(mode: str, hide: tuple[str, ...], show: tuple[str, ...], python_path: str = "") -> str | None:
    """Run a short Python command in the sandbox `mode` (with the kernels' PYTHONPATH); None if it
    worked, else why not."""
    with tempfile.TemporaryDirectory(prefix="infer-sandbox-probe-") as folder:
        workdir = Path(folder)
        if mode == "nobody":
            os.chown(workdir, NOBODY_UID, NOBODY_GID)
        plan = Plan(mode, str(workdir), hide=hide + (str(workdir.parent),), show=show).write(workdir / "plan.json")
        code = (
            "import socket, infer.paths, os; s = socket.socket(); s.bind(('127.0.0.1', 0)); "
            "open(os.path.join(os.getcwd(), 'ok'), 'w').write('ok')"
        )
        try:
            done = subprocess.run(
                [*launcher_command(plan), sys.executable, "-c", code],
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
                env=minimal_env(workdir, {"PYTHONPATH": python_path} if python_path else None),
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"{type(error).__name__}: {error}"
        if done.returncode != 0 or not (workdir / "ok").exists():
            lines = (done.stderr or done.stdout).strip().splitlines() or [f"exit status {done.returncode}"]
            return lines[-1][:200]
    return None


def minimal_env(workdir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """An environment built from nothing: no instructor variables, HOME in the kernel's folder."""
    env = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "MPLCONFIGDIR": str(workdir / ".matplotlib"),
        "HF_HUB_OFFLINE": "1",
    }
    return env | (extra or {})


def describe(mode: str, why_not_stronger: str) -> str:
    """The line the grader prints about its sandbox."""
    if mode == "nobody":
        return (
            "sandbox: each kernel runs as `nobody` in its own mount, network and PID namespaces "
            "(no network but its own loopback; homes, /tmp, the submissions and the solutions hidden), "
            "with memory, CPU-time and file-size limits"
        )
    if mode == "userns":
        return (
            "sandbox: each kernel runs in user, mount, network and PID namespaces of its own (no network "
            "but its own loopback; homes, /tmp, the submissions and the solutions hidden from plain reads, "
            "though a kernel could unmount what hides them), with memory, CPU-time and file-size limits"
            + (f" [not root, so not as `nobody`: {why_not_stronger}]" if why_not_stronger else "")
        )
    return (
        "sandbox: NO namespaces on this machine, so kernels run with the network and can read what this "
        f"user can read; only their own folders, clean environments and resource limits apply ({why_not_stronger})"
    )


# ---------------------------------------------------------------- the launcher


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    encode = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
    _check(libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)), f"mount {target}")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))


def _covered(path: str, hidden: list[str]) -> bool:
    return any(path == h or path.startswith(h.rstrip("/") + "/") for h in hidden)


def _arrange_mounts(libc, plan: Plan) -> None:
    """Hide and show, shallowest first, so that a folder shown inside a hidden one, or hidden
    inside a shown one, ends up as asked; the kernel's own folder is shown writable."""
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    shown = [p for p in plan.show if os.path.exists(p)] + [plan.workdir]
    handles = {path: os.open(path, os.O_PATH) for path in shown}  # reachable after their parents are hidden
    events = [(p, "hide") for p in plan.hide if os.path.isdir(p)] + [(p, "show") for p in shown]
    events.sort(key=lambda event: (event[0].rstrip("/").count("/"), event[1] == "show"))
    hidden: list[str] = []
    for path, action in events:
        if action == "hide":
            if os.path.isdir(path):  # not when a hiding mount above it already took it away
                mode = "1777" if path in SHARED_TEMPORARY else "755"
                _mount(libc, "tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},{TMPFS_SIZE}")
                hidden.append(path)
            continue
        if _covered(path, hidden):
            os.makedirs(path, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{handles[path]}", path, None, MS_BIND | MS_REC)
        if path != plan.workdir:  # read-only, keeping the flags the mount had (a user namespace may not drop them)
            kept = os.statvfs(path).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC | ST_TIME_FLAGS)
            _mount(libc, None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
    for handle in handles.values():
        os.close(handle)
    _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _set_limits(plan: Plan) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if plan.memory_bytes:
        which = resource.RLIMIT_DATA if plan.memory_limit == "data" else resource.RLIMIT_AS
        resource.setrlimit(which, (plan.memory_bytes, plan.memory_bytes))
    if plan.cpu_seconds:
        resource.setrlimit(resource.RLIMIT_CPU, (plan.cpu_seconds, plan.cpu_seconds + 5))
    if plan.file_bytes:
        resource.setrlimit(resource.RLIMIT_FSIZE, (plan.file_bytes, plan.file_bytes))


def _write_id_maps(uid: int, gid: int) -> None:
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
    Path("/proc/self/gid_map").write_text(f"0 {gid} 1")


def _child(libc, plan: Plan, command: list[str]) -> None:
    """PID 1 of the new PID namespace: finish the sandbox, then become the kernel."""
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    _arrange_mounts(libc, plan)
    _loopback_up()
    if plan.mode == "nobody":
        os.setgroups([])
        os.setgid(NOBODY_GID)
        os.setuid(NOBODY_UID)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    _set_limits(plan)
    os.chdir(plan.workdir)
    os.execv(command[0], command)


def _note_exit(plan: Plan, status: int) -> int:
    """The launcher's exit code for the child's wait status; a note on what killed it."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        why = LIMIT_SIGNALS.get(number, signal.Signals(number).name)
        try:
            Path(plan.workdir, EXIT_NOTE).write_text(f"the kernel was killed by {why}")
        except OSError:
            pass
        return 128 + number
    return os.WEXITSTATUS(status)


def launch(plan: Plan, command: list[str]) -> int:
    for path in plan.chown:
        os.chown(path, NOBODY_UID, NOBODY_GID)
    if plan.mode == "plain":
        _set_limits(plan)
        os.chdir(plan.workdir)
        os.execv(command[0], command)
    libc = _libc()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(flags | (CLONE_NEWUSER if plan.mode == "userns" else 0)), "unshare")
    if plan.mode == "userns":
        _write_id_maps(uid, gid)
    child = os.fork()
    if child == 0:
        try:
            _child(libc, plan, command)
        except BaseException as error:  # noqa: BLE001 - the kernel never started: say why, on stderr
            print(f"sandbox: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        os._exit(127)

    def forward(number, frame):
        try:
            os.kill(child, number)
        except ProcessLookupError:
            pass

    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, forward)
    grader = os.getppid()
    while True:  # until the kernel ends; if the grader dies first, the kernel goes with it
        try:
            done, status = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            return 0
        if done:
            return _note_exit(plan, status)
        if os.getppid() != grader:
            forward(signal.SIGKILL, None)
        time.sleep(PARENT_POLL_S)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m infer.course.grading.sandbox PLAN.json -- command ...", file=sys.stderr)
        return 2
    return launch(Plan.read(argv[0]), argv[2:])


if __name__ == "__main__":
    sys.exit(main())
