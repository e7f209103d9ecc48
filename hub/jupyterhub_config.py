"""JupyterHub for the course, on one machine: `make hub` (or `python -m hub serve`) starts it.

Read by `jupyterhub -f hub/jupyterhub_config.py`, which `python -m hub serve` runs with the
COURSE_HUB_* variables below set; every path and port comes from them, so nothing here names a
machine. What it sets up (the README's instructor section says how to deploy it on a server):

- the hub and its proxy (configurable-http-proxy, pinned in hub/package-lock.json) listen on
  127.0.0.1 only; put a TLS-terminating web server in front of it on a real server;
- login with the machine's Unix passwords (PAM), for the course's users only (state/users.json);
- each user's JupyterLab is started as that Unix user (LocalProcessSpawner), from the course's
  shared environment (COURSE_HUB_ENV: world-readable, built from requirements.txt by
  `python -m hub env`), in their home folder, with nbgrader's Assignment List and Validate;
- the instructor's server alone gets the formgrader and Create Assignment (its
  JUPYTER_CONFIG_PATH starts with the instance's instructor/ folder) and the course folder
  ~/one-rank (CourseDirectory.root);
- nbgrader's exchange is the instance's exchange/ folder (set for every server in the
  instance's everyone/nbgrader_config.py);
- a service token (COURSE_HUB_SERVICE_TOKEN) may list users and stop servers: `python -m hub
  stop` and the end-to-end test use it; the hub stops every server when it stops.
"""

import json
import os
from pathlib import Path

c = get_config()  # noqa: F821 - provided by JupyterHub

HERE = Path(__file__).resolve().parent
ROOT = Path(os.environ["COURSE_HUB_ROOT"])  # this instance: state/, exchange/, instructor/
ENV = Path(os.environ["COURSE_HUB_ENV"])    # the course's environment every server runs in
STATE = ROOT / "state"
USERS = json.loads((STATE / "users.json").read_text())
INSTRUCTOR, LEARNERS = USERS["instructor"], USERS["learners"]

c.JupyterHub.bind_url = f"http://127.0.0.1:{os.environ['COURSE_HUB_PORT']}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(os.environ["COURSE_HUB_API_PORT"])
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ['COURSE_HUB_PROXY_API_PORT']}"
c.ConfigurableHTTPProxy.command = [str(HERE / "node_modules" / ".bin" / "configurable-http-proxy")]
# CONFIGPROXY_AUTH_TOKEN is set by `python -m hub serve` (the hub and the proxy share it)
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every user's server
c.JupyterHub.cleanup_proxy = True

c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.service = "login"
c.PAMAuthenticator.open_sessions = False
c.Authenticator.allowed_users = set(LEARNERS) | {INSTRUCTOR}
c.Authenticator.admin_users = set()  # nobody may open another user's server

c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [str(ENV / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180
# Only what a server needs from the hub's environment; PATH is the course's environment first.
c.Spawner.env_keep = ["LANG", "LC_ALL", "TZ", "COURSE_QUICK"]
c.Spawner.environment = {
    "PATH": f"{ENV / 'bin'}:/usr/local/bin:/usr/bin:/bin",
    # every process of a user's server (kernels, ranks) carries the instance's id: `hub stop`
    # and the test find anything left behind by it
    "COURSE_HUB_ID": os.environ["COURSE_HUB_ID"],
    "JUPYTER_CONFIG_PATH": str(ROOT / "everyone"),
}
# the end-to-end test reads Lab's models in the page (window.jupyterapp)
if os.environ.get("COURSE_HUB_EXPOSE_APP") == "1":
    c.Spawner.args = ["--LabApp.expose_app_in_browser=True"]


def instructor_only(spawner):
    """The formgrader and the course folder for the instructor; nothing more for learners."""
    if spawner.user.name == INSTRUCTOR:
        spawner.environment["JUPYTER_CONFIG_PATH"] = f"{ROOT / 'instructor'}:{ROOT / 'everyone'}"
    else:
        spawner.environment["JUPYTER_CONFIG_PATH"] = str(ROOT / "everyone")


c.Spawner.pre_spawn_hook = instructor_only


def end_what_is_left(spawner):
    """When a server stops, every process it started stops too: a kernel the server could not
    shut down in time (a busy one, a Validate kernel stuck on a hanging answer) and its ranks are
    killed by pid (the processes of this user that carry this hub's COURSE_HUB_ID)."""
    import pwd

    import psutil

    try:
        uid = pwd.getpwnam(spawner.user.name).pw_uid
    except KeyError:
        return
    left = []
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"].real == uid and p.environ().get("COURSE_HUB_ID") == os.environ["COURSE_HUB_ID"]:
                left.append(p)
        except psutil.Error:
            pass
    for p in left:
        try:
            spawner.log.warning("%s's server stopped; killing its leftover process %s: %s",
                                spawner.user.name, p.pid, " ".join(p.cmdline())[:160])
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=10)


c.Spawner.post_stop_hook = end_what_is_left

c.JupyterHub.services = [{"name": "course-admin", "api_token": os.environ["COURSE_HUB_SERVICE_TOKEN"]}]
c.JupyterHub.load_roles = [{
    "name": "course-admin",
    "description": "list the class and stop servers (python -m hub stop, tests/test_hub.py)",
    "scopes": ["list:users", "read:users", "read:servers", "admin:servers"],
    "services": ["course-admin"],
}]
