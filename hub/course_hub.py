"""The course on a JupyterHub on this machine: ``python -m hub`` (``make hub``, ``make hub-stop``).

    python -m hub env                  build (or update) the course's shared environment
    python -m hub users [--create]     show, or (as root) create, the course's Unix users
    python -m hub serve [--port N]     start the hub on 127.0.0.1 (Ctrl-C stops it and every server)
    python -m hub stop                 stop a hub started by `serve` (same --root); exits 1 when
                                       there is none, or when the recorded pid is not that hub

An instance lives in one folder (``--root``, default /opt/one-rank-hub, world-traversable):

    venv/          the course's environment (requirements.txt + the course's helpers), built from
                   a Python every user can run (/usr/bin/python3.11); shared by every instance
    state/         the hub's database, cookie secret, pid, log, users.json (root only)
    exchange/      nbgrader's exchange (mode 777; nbgrader makes the course's inbound 733)
    everyone/      Jupyter config every server reads (the exchange, the course id, Validate's limits)
    instructor/    Jupyter config only the instructor's server reads (formgrader, course folder)

The hub must run as root: it checks passwords with PAM and starts each user's server as that user.
It refuses to start while a learner can read the checkout it is started from (``solutions/`` and
``tests/`` hold the answers): ``chmod go-rwx`` the checkout, or clone it where only root can read.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
COURSE = HERE.parent
COURSE_ID = "one-rank"
DEFAULT_ROOT = Path(os.environ.get("COURSE_HUB_ROOT", "/opt/one-rank-hub"))
DEFAULT_ENV = Path(os.environ.get("COURSE_HUB_ENV", DEFAULT_ROOT / "venv"))
BASE_PYTHON = os.environ.get("COURSE_HUB_PYTHON", "/usr/bin/python3.11")
INSTRUCTOR = "or-instructor"
LEARNERS = ["or-learner1", "or-learner2", "or-learner3"]
COURSE_FOLDER = "one-rank"  # in the instructor's home: nbgrader's course root
NOT_ROOT = ("the course's hub must run as root: it checks passwords with PAM and starts each "
            "user's JupyterLab as that Unix user (run `sudo make hub`)")
# Server extensions of the environment: every learner gets these; the formgrader is the instructor's.
LEARNER_EXTENSIONS = ["assignment_list", "course_list", "validate_assignment"]
INSTRUCTOR_LAB_PLUGINS = ["@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment"]
# Lab settings for every user of the hub: no news or update checks (the hub has no internet),
# every cell attached to the page.
LAB_OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {"checkForUpdates": False, "fetchNews": "false"},
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
}


def say(msg: str) -> None:
    print(f"[hub] {msg}", flush=True)


def is_root() -> bool:
    return os.geteuid() == 0


# ============================================================================ the environment


def _env_fingerprint() -> str:
    """What the environment is built from: requirements, the course's package, and the recipe
    (build_env and the extension lists it applies). The rest of this file (the CLI, the instance)
    is not part of it, so a change there does not rebuild an environment every hub shares."""
    h = hashlib.sha256()
    files = [COURSE / "requirements.txt", COURSE / "pyproject.toml"]
    for pkg in ("helpers", "course_tools"):
        files += sorted(p for p in (COURSE / pkg).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts)
    for f in files:
        h.update(str(f.relative_to(COURSE)).encode() + b"\0" + f.read_bytes())
    recipe = [inspect.getsource(build_env), inspect.getsource(_temp_copy_of_package),
              json.dumps([LEARNER_EXTENSIONS, INSTRUCTOR_LAB_PLUGINS, LAB_OVERRIDES], sort_keys=True)]
    h.update("\0".join(recipe).encode())
    return h.hexdigest()


def _runs_for_everyone(py: str) -> str | None:
    """None if an unprivileged user (nobody) can run ``py``; else what went wrong. Every user's
    server runs from a venv of ``py``, so a Python under a private home cannot serve the class."""
    if not is_root():
        return None
    try:
        proc = subprocess.run([py, "-c", "import encodings, ensurepip"], user=65534, group=65534,
                              extra_groups=[], capture_output=True, text=True, cwd="/", timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["failed"])[-1]


def build_env(env: Path = DEFAULT_ENV, quiet: bool = False) -> Path:
    """The course's environment at ``env``, usable by every Unix user (rebuilt when it changed).

    pip installs requirements.txt, then the course's helpers as a regular (non-editable) package,
    so the users' servers never read the course's checkout (which holds solutions/).
    """
    stamp = env / ".course-hub"
    want = _env_fingerprint()
    if stamp.is_file() and stamp.read_text() == want:
        return env
    py = shutil.which(BASE_PYTHON) or BASE_PYTHON
    if not os.access(py, os.X_OK):
        raise SystemExit(f"the hub's environment is built from {BASE_PYTHON}, which is missing: "
                         "install Debian's python3.11 and python3.11-venv, or point COURSE_HUB_PYTHON "
                         "(make hub HUB_PYTHON=...) at a Python 3.11 every user can run")
    why = _runs_for_everyone(py)
    if why:
        raise SystemExit(f"the hub's environment is built from {py}, but an unprivileged user cannot "
                         f"run it ({why}): every learner's server runs from it. Use a Python 3.11 "
                         "outside any private home (Debian's /usr/bin/python3.11, or a toolcache under "
                         "/opt) with COURSE_HUB_PYTHON=/path/to/python3.11 (make hub HUB_PYTHON=...)")
    env.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(env.parent, 0o755)
    if not (env / "bin" / "python").exists():
        say(f"building the course's environment in {env} from {py} (a few minutes)")
        proc = subprocess.run([py, "-m", "venv", str(env)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{py} -m venv failed (Debian: apt-get install python3.11-venv):\n"
                             f"{proc.stdout}{proc.stderr}")
    else:
        say(f"updating the course's environment in {env}")
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    old_umask = os.umask(0o022)  # everything readable by every user
    try:
        subprocess.run(pip + ["-r", str(COURSE / "requirements.txt")], check=True)
        with _temp_copy_of_package() as src:
            subprocess.run(pip + ["--no-deps", "--no-build-isolation", "--force-reinstall", str(src)],
                           check=True)
        jupyter = str(env / "bin" / "jupyter")
        quiet_run = dict(check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for ext in LEARNER_EXTENSIONS:
            subprocess.run([jupyter, "server", "extension", "enable", "--sys-prefix",
                            f"nbgrader.server_extensions.{ext}"], **quiet_run)
        subprocess.run([jupyter, "server", "extension", "disable", "--sys-prefix",
                        "nbgrader.server_extensions.formgrader"], **quiet_run)
        for ext in ("@jupyter/nbgrader", "@jupyter-widgets/jupyterlab-manager"):
            subprocess.run([jupyter, "labextension", "enable", "--level=sys_prefix", ext], **quiet_run)
        for plugin in INSTRUCTOR_LAB_PLUGINS:
            subprocess.run([jupyter, "labextension", "disable", "--level=sys_prefix", plugin], **quiet_run)
        settings = env / "share" / "jupyter" / "lab" / "settings"
        settings.mkdir(parents=True, exist_ok=True)
        (settings / "overrides.json").write_text(json.dumps(LAB_OVERRIDES, indent=1))
        stamp.write_text(want)
    finally:
        os.umask(old_umask)
    if not quiet:
        say(f"the course's environment is ready: {env}")
    return env


class _temp_copy_of_package:
    """The course's package sources (pyproject, helpers, course_tools) in a temporary folder, so a
    non-editable install leaves no build/ or .egg-info in the checkout."""

    def __enter__(self) -> Path:
        import tempfile

        self.tmp = Path(tempfile.mkdtemp(prefix="course-hub-pkg-"))
        ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
        shutil.copy2(COURSE / "pyproject.toml", self.tmp)
        for pkg in ("helpers", "course_tools"):
            shutil.copytree(COURSE / pkg, self.tmp / pkg, ignore=ignore)
        return self.tmp

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def proxy_command() -> Path:
    """configurable-http-proxy from hub/package-lock.json (``npm ci --prefix hub`` if missing)."""
    cmd = HERE / "node_modules" / ".bin" / "configurable-http-proxy"
    stamp = HERE / "node_modules" / ".installed"
    lock = HERE / "package-lock.json"
    if not (cmd.exists() and stamp.exists() and stamp.stat().st_mtime >= lock.stat().st_mtime):
        if shutil.which("npm") is None:
            raise SystemExit("the hub's proxy needs Node.js and npm: apt-get install nodejs npm")
        subprocess.run(["npm", "ci", "--prefix", str(HERE), "--no-audit", "--no-fund",
                        "--loglevel=error"], check=True)
        stamp.touch()
    return cmd


# ============================================================================ users


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def create_user(name: str, password: str) -> None:
    """A Unix user with a home folder only they can read, and ``password`` (as root)."""
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
    subprocess.run(["chpasswd"], input=f"{name}:{password}\n", text=True, check=True)
    os.chmod(pwd.getpwnam(name).pw_dir, 0o700)


def remove_user(name: str) -> None:
    """The user, their home folder and every process still running as them (by pid)."""
    import psutil

    if not user_exists(name):
        return
    uid = pwd.getpwnam(name).pw_uid
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] and p.info["uids"].real == uid:
                p.kill()
        except psutil.Error:
            pass
    subprocess.run(["userdel", "--remove", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def course_folder(instructor: str) -> Path:
    return Path(pwd.getpwnam(instructor).pw_dir) / COURSE_FOLDER


def setup_course_folder(instructor: str, course: Path = COURSE) -> Path:
    """The instructor's nbgrader course root: the nbgrader_config.py and solutions/ (nbgrader's
    source folder) of the checkout ``course``, owned by the instructor, in a home only they can read."""
    dest = course_folder(instructor)
    if dest.exists():
        return dest
    dest.mkdir()
    shutil.copy2(course / "nbgrader_config.py", dest)
    shutil.copytree(course / "solutions", dest / "solutions",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    pw = pwd.getpwnam(instructor)
    for path in [dest, *dest.rglob("*")]:
        os.chown(path, pw.pw_uid, pw.pw_gid)
    return dest


#: What of the course's checkout no learner may read: the solutions and hidden tests, and the
#: test suite (its right answers to every exercise).
PRIVATE_PARTS = ("solutions", "tests")

_READABLE_SH = ('for p do if [ -r "$p" ] && { [ ! -d "$p" ] || [ -x "$p" ]; }; then '
                'printf "%s\\n" "$p"; fi; done')


def readable_by(user: str, paths: list[Path]) -> list[Path]:
    """The ``paths`` Unix user ``user`` can read (a folder: list), tried as that user, so that
    their groups, ACLs and every parent folder's search bit count (as root)."""
    pw = pwd.getpwnam(user)
    proc = subprocess.run(["/bin/sh", "-c", _READABLE_SH, "sh", *map(str, paths)],
                          user=pw.pw_uid, group=pw.pw_gid, extra_groups=os.getgrouplist(user, pw.pw_gid),
                          env={"PATH": "/usr/bin:/bin"}, cwd="/", capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"could not check what {user} can read: {proc.stderr.strip()}")
    return [Path(line) for line in proc.stdout.splitlines() if line]


def exposed_checkout(learners: list[str], course: Path = COURSE) -> dict[str, list[Path]]:
    """Per learner, what of ``course``'s private parts (:data:`PRIVATE_PARTS`: each folder and
    every file in it) they can read; empty when none of them can read any."""
    paths = []
    for part in PRIVATE_PARTS:
        folder = course / part
        if folder.exists():
            paths += [folder, *sorted(f for f in folder.rglob("*") if f.is_file())]
    found = {}
    for user in learners:
        seen = readable_by(user, paths)
        if seen:
            found[user] = seen
    return found


def exposure_message(exposed: dict[str, list[Path]], course: Path = COURSE) -> str:
    users = ", ".join(exposed)
    first = next(iter(exposed.values()))
    more = f" and {len(first) - 1} more" if len(first) > 1 else ""
    return (f"the course's checkout {course} is readable by the class: {users} can read {first[0]}{more} "
            f"({' and '.join(p + '/' for p in PRIVATE_PARTS)} hold the answers and hidden tests). "
            f"Make it private before serving the class: `sudo chmod go-rwx {course}` (no learner's "
            "server uses the checkout: they run from the hub's own environment), or clone the course "
            "where only root can read it (under /root, say); then run `make hub` again.")


# ============================================================================ an instance


def free_port() -> int:
    """A port free on 127.0.0.1 now. Another process may take it before the hub binds it:
    :meth:`Hub.start` then tries again with new ports (:data:`PORT_ATTEMPTS`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: Starts tried when a port chosen by free_port() was taken before the hub or its proxy bound it.
PORT_ATTEMPTS = 5
#: How jupyterhub and configurable-http-proxy report a port already taken.
_BIND_FAILED = ("EADDRINUSE", "Address already in use")


def _port_taken(log: str, ports: dict[str, int]) -> tuple[str, int | None] | None:
    """(role, port) if the log reports one of ``ports`` taken (role "a", port None if it does not
    say which), else None. Only the lines reporting the failure are read: the others name every
    port the hub uses."""
    lines = [line for line in log.splitlines()
             if any(marker in line for marker in (*_BIND_FAILED, "Failed to bind"))]
    if not lines:
        return None
    for role, port in ports.items():
        if any(re.search(rf":{port}(?!\d)", line) for line in lines):
            return role, port
    return "a", None


class PortTaken(RuntimeError):
    def __init__(self, port: int | None, role: str, log: str):
        super().__init__(f"the {role} port {port} was taken before the hub could bind it")
        self.port, self.role, self.log = port, role, log


def prepare(root: Path, instructor: str, learners: list[str]) -> dict:
    """The instance's folders and settings (state/ root-only, exchange/ and instructor/ readable)."""
    state, exchange, conf = root / "state", root / "exchange", root / "instructor"
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    state.mkdir(exist_ok=True)
    os.chmod(state, 0o700)
    # nbgrader's documented exchange: world-writable; nbgrader makes <course>/inbound 733 so no
    # learner can list what others submitted (their submissions' names carry a random part).
    exchange.mkdir(exist_ok=True)
    os.chmod(exchange, 0o777)
    (conf / "jupyter_server_config.d").mkdir(parents=True, exist_ok=True)
    (conf / "labconfig").mkdir(exist_ok=True)
    (conf / "jupyter_server_config.d" / "course-formgrader.json").write_text(json.dumps(
        {"ServerApp": {"jpserver_extensions": {"nbgrader.server_extensions.formgrader": True}}}, indent=1))
    (conf / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {p: False for p in INSTRUCTOR_LAB_PLUGINS}}, indent=1))
    (conf / "nbgrader_config.py").write_text(
        "# The instructor's course folder (python -m hub writes this file).\n"
        "import os\nc = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.root = os.path.expanduser('~/{COURSE_FOLDER}')\n")
    for d in [conf, *conf.rglob("*")]:
        os.chmod(d, 0o755 if d.is_dir() else 0o644)
    (state / "users.json").write_text(json.dumps({"instructor": instructor, "learners": learners}))
    return {"state": state, "exchange": exchange, "instructor": conf}


def write_everyone_config(root: Path, exchange: Path) -> Path:
    """nbgrader's exchange and course, and the course's cell time limits for Validate, for every
    user of this instance (root/everyone, on every server's JUPYTER_CONFIG_PATH)."""
    etc = root / "everyone"
    etc.mkdir(parents=True, exist_ok=True)
    os.chmod(etc, 0o755)
    cfg = etc / "nbgrader_config.py"
    cfg.write_text("# The course's hub (python -m hub writes this file).\nc = get_config()  # noqa: F821\n"
                   f"c.CourseDirectory.course_id = {COURSE_ID!r}\n"
                   f"c.Exchange.root = {str(exchange)!r}\n"
                   "c.Execute.timeout = 30\nc.Execute.startup_timeout = 60\n"
                   "c.Execute.interrupt_on_timeout = True\n")
    os.chmod(cfg, 0o644)
    return etc


class Hub:
    """A running hub: ``jupyterhub`` as a child process, stopped with everything it started.

    ``port``: the public port (None: a free one, and new ones if it is taken before the proxy
    binds it); ``course``: the checkout it serves (the instructor's course folder is made from its
    solutions/), which no learner may read (checked before anything starts). ``python -m hub``
    serves the checkout it runs from."""

    def __init__(self, root: Path = DEFAULT_ROOT, env: Path = DEFAULT_ENV, port: int | None = None,
                 instructor: str = INSTRUCTOR, learners: list[str] = LEARNERS, course: Path = COURSE):
        self.root, self.env, self.course = Path(root), Path(env), Path(course)
        self.instructor, self.learners = instructor, list(learners)
        self.fixed_port = port
        self.port: int | None = port
        self.id = secrets.token_hex(8)
        self.token = secrets.token_hex(32)
        self.proc: subprocess.Popen | None = None
        self.retries: list[str] = []  # why a start was tried again (a port taken meanwhile)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.root / "state" / "jupyterhub.log"

    @property
    def info_path(self) -> Path:
        return self.root / "state" / "instance.json"

    def start(self, timeout: float = 120) -> "Hub":
        if not is_root():
            raise SystemExit(NOT_ROOT)
        missing = [u for u in [self.instructor, *self.learners] if not user_exists(u)]
        if missing:
            raise SystemExit(f"the course's users {missing} do not exist: create them with "
                             "`sudo make hub USERS=1` (or useradd + chpasswd yourself)")
        exposed = exposed_checkout(self.learners, self.course)
        if exposed:
            raise SystemExit(exposure_message(exposed, self.course))
        dirs = prepare(self.root, self.instructor, self.learners)
        build_env(self.env, quiet=True)
        write_everyone_config(self.root, dirs["exchange"])
        setup_course_folder(self.instructor, self.course)
        proxy_command()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return self._start_once(dirs["state"], timeout)
            except PortTaken as e:
                if self.fixed_port is not None and e.port == self.fixed_port:
                    raise SystemExit(f"port {e.port} on 127.0.0.1 is taken by another program: choose "
                                     "another (make hub HUB_PORT=N, python -m hub serve --port N), or "
                                     "leave it out to get a free one") from None
                self.retries.append(str(e))
                if attempt == PORT_ATTEMPTS:
                    raise RuntimeError(f"{e} in each of {PORT_ATTEMPTS} starts:\n{e.log}") from None
                say(f"{e} (another program started at the same time): starting again on other ports")
        raise AssertionError("unreachable")

    def _start_once(self, state: Path, timeout: float) -> "Hub":
        """One start of jupyterhub on ports chosen now; :class:`PortTaken` if one of them was
        taken before it was bound (the hub or the proxy exited saying so)."""
        self.port = self.fixed_port or free_port()
        ports = {"public": self.port, "hub API": free_port(), "proxy API": free_port()}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "VIRTUAL_ENV"))}
        env.update(COURSE_HUB_ROOT=str(self.root), COURSE_HUB_ENV=str(self.env),
                   COURSE_HUB_PORT=str(ports["public"]), COURSE_HUB_API_PORT=str(ports["hub API"]),
                   COURSE_HUB_PROXY_API_PORT=str(ports["proxy API"]), COURSE_HUB_ID=self.id,
                   COURSE_HUB_SERVICE_TOKEN=self.token, CONFIGPROXY_AUTH_TOKEN=secrets.token_hex(32),
                   PATH=f"{self.env / 'bin'}:/usr/local/bin:/usr/bin:/bin")
        log = open(self.log_path, "ab")
        log_start = log.tell()
        self.proc = subprocess.Popen([str(self.env / "bin" / "jupyterhub"), "-f", str(HERE / "jupyterhub_config.py")],
                                     cwd=state, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self._write_info()
        deadline = time.monotonic() + timeout
        while True:
            # configurable-http-proxy logs a port taken and goes on running without it; the hub
            # exits: either way the log says so, and this start is ended
            taken = _port_taken(self._log_since(log_start), ports)
            if taken or self.proc.poll() is not None:
                self.stop()
                if taken:
                    raise PortTaken(taken[1], taken[0], self._log_since(log_start)[-3000:])
                raise RuntimeError(f"jupyterhub exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                # our own hub, not whatever else answers on that port: the service token must work
                self.api("GET", "/hub/api/user", timeout=5)
                return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the hub did not answer in {timeout} s:\n{self.log_tail()}")
            time.sleep(0.25)  # polling the hub's API and its log, not synchronising on time

    def _write_info(self) -> None:
        """state/instance.json: how `python -m hub stop` finds this hub, and checks it is this hub."""
        tmp = self.info_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": self.url, "id": self.id, "token": self.token,
                                   "pid": self.proc.pid if self.proc else None}))
        os.replace(tmp, self.info_path)

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _end_process_group(self) -> None:
        """The proxy the hub started, if the hub exited without stopping it."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def api(self, method: str, path: str, body=None, timeout: float = 30):
        import urllib.request

        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def leftovers(self) -> list:
        """Processes of this instance still running: its servers, kernels and their ranks."""
        return instance_processes(self.id)

    def stop(self) -> list[str]:
        """Stop the hub (it stops the proxy and every user's server), then kill by pid whatever
        of this instance is still running; return what had to be killed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        killed = kill_all(self.leftovers())
        self._end_process_group()
        return killed

    def log_tail(self, n: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def instance_processes(instance_id: str) -> list:
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get("COURSE_HUB_ID") == instance_id \
                    and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            pass
    return found


def kill_all(procs: list) -> list[str]:
    import psutil

    killed = []
    for p in procs:
        try:
            killed.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=30)
    return killed


# ============================================================================ the CLI


def _users_cmd(args) -> int:
    names = [args.instructor, *args.learners]
    if not args.create:
        for n in names:
            say(f"{n}: {'exists' if user_exists(n) else 'missing'}")
        return 0
    if not is_root():
        say(f"cannot create users: {NOT_ROOT}")
        return 1
    for n in names:
        if user_exists(n):
            say(f"{n} exists already: left as it is")
            continue
        password = secrets.token_urlsafe(9)
        create_user(n, password)
        role = "instructor" if n == args.instructor else "learner"
        say(f"created Unix user {n} ({role}), password {password}")
    folder = setup_course_folder(args.instructor)
    say(f"the instructor's course folder: {folder}")
    return 0


def _serve_cmd(args) -> int:
    if not is_root():
        say(NOT_ROOT)
        return 1
    if args.users:
        rc = _users_cmd(argparse.Namespace(create=True, instructor=args.instructor, learners=args.learners))
        if rc:
            return rc
    hub = Hub(args.root, args.env, args.port, args.instructor, args.learners)
    stopping = []

    def on_signal(signum, frame):
        stopping.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        hub.start()
        say(f"the course's hub: {hub.url}  (instructor {args.instructor}, learners "
            f"{', '.join(args.learners)}; log {hub.log_path}). Ctrl-C or `make hub-stop` stops it.")
        while not stopping and hub.proc.poll() is None:
            time.sleep(0.5)  # waiting for Ctrl-C, SIGTERM or `python -m hub stop`
    finally:
        if hub.proc is not None:  # started (a refusal before that started nothing)
            killed = hub.stop()
            left = hub.leftovers()
            say("stopped" + (f"; killed what was left: {killed}" if killed else "; nothing left running"))
            hub.info_path.unlink(missing_ok=True)
    return 1 if left else 0


def hub_process(inst: dict):
    """The process recorded in an instance.json if it is that instance's jupyterhub (its
    COURSE_HUB_ID is the instance's id), else None: the pid may have been reused since."""
    import psutil

    try:
        proc = psutil.Process(int(inst["pid"]))
        if proc.environ().get("COURSE_HUB_ID") == inst["id"] and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except (psutil.Error, KeyError, TypeError, ValueError):
        pass
    return None


def _stop_cmd(args) -> int:
    if not is_root():
        say(f"cannot stop the hub: {NOT_ROOT}")
        return 1
    import psutil

    info = args.root / "state" / "instance.json"
    if not info.exists():
        say(f"nothing to stop: no hub was started from {args.root} ({info} is missing)")
        return 1
    inst = json.loads(info.read_text())
    hub = hub_process(inst)
    pid = inst.get("pid")
    if hub is None:
        try:
            alive = psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, TypeError, ValueError):
            alive = False
        why = (f"process {pid} is not this hub (no COURSE_HUB_ID={inst.get('id')} in its environment): "
               "its pid was reused; it was left alone" if alive else
               f"the hub recorded there (pid {pid}) is not running")
    else:
        hub.send_signal(signal.SIGTERM)
        try:
            hub.wait(timeout=60)
        except psutil.TimeoutExpired:
            os.killpg(hub.pid, signal.SIGKILL)  # its own session (start_new_session): the proxy too
            hub.wait(timeout=30)
    # what the instance left running (servers, kernels, the proxy): found by its id, not by pid
    killed = kill_all(instance_processes(inst["id"])) if inst.get("id") else []
    if hub is None:
        info.unlink(missing_ok=True)
        if killed:
            say(f"{why}; killed what it had left running: {killed}")
            return 0
        say(f"nothing to stop from {args.root}: {why}. Removed the stale {info}.")
        return 1
    say(f"stopped the hub (pid {hub.pid})" + (f"; killed what was left: {killed}" if killed else ""))
    return 0


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give the learners' user names, separated by commas")
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hub", description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the instance's folder")
    ap.add_argument("--env", type=Path, default=DEFAULT_ENV, help="the course's shared environment")
    ap.add_argument("--instructor", default=INSTRUCTOR)
    # one argument, comma-separated: a list of words would swallow the command that follows it
    ap.add_argument("--learners", type=_names, default=LEARNERS, metavar="NAME,NAME,...",
                    help=f"the learners' Unix users (default {','.join(LEARNERS)})")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("env", help="build or update the course's environment")
    u = sub.add_parser("users", help="show, or create (--create, as root), the course's users")
    u.add_argument("--create", action="store_true")
    s = sub.add_parser("serve", help="start the hub on 127.0.0.1")
    s.add_argument("--port", type=int, default=None)
    s.add_argument("--users", action="store_true", help="create the course's users first (root)")
    sub.add_parser("stop", help="stop the hub started from --root")
    args = ap.parse_args(argv)
    if args.cmd == "env":
        build_env(args.env)
        return 0
    return {"users": _users_cmd, "serve": _serve_cmd, "stop": _stop_cmd}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
