"""A throw-away PostgreSQL server for the tests: ``initdb`` + ``pg_ctl`` in a temporary folder.

It runs as an unprivileged user (``nobody`` when the tests run as root: PostgreSQL refuses root),
listens on a free port of 127.0.0.1 only, with its socket in its own folder, and asks for a
password (scram-sha-256, a random one): a grading sandbox on the same machine reaches
127.0.0.1, and must not be able to write the gradebook. :func:`postgresql` yields the
SQLAlchemy URL of an empty database and stops the server and removes its folder whatever happens.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile

UNPRIVILEGED = 65534


def _tool(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"{name} not found: install Debian's postgresql package "
                           "(make test does when run as root: make db-deps)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def postgresql(database: str = "gradebook"):
    import psycopg

    as_root = os.geteuid() == 0
    user = {"user": UNPRIVILEGED, "group": UNPRIVILEGED} if as_root else {}
    # under /tmp, not the run's private TMPDIR: the server's user must reach its folder
    folder = tempfile.mkdtemp(prefix="course-pg-", dir="/tmp")
    data, sockets = os.path.join(folder, "data"), os.path.join(folder, "run")
    password = secrets.token_hex(16)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": folder, "LC_ALL": "C.UTF-8"}
    started = False
    try:
        os.mkdir(sockets)
        with open(os.path.join(folder, "pw"), "w") as f:
            f.write(password)
        if as_root:
            for path in (folder, sockets, os.path.join(folder, "pw")):
                os.chown(path, UNPRIVILEGED, UNPRIVILEGED)
        subprocess.run([_tool("initdb"), "-D", data, "-U", "grader", "--auth=scram-sha-256",
                        f"--pwfile={folder}/pw", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True, env=env, cwd=folder, **user)
        port = _free_port()
        subprocess.run([_tool("pg_ctl"), "-D", data, "-l", os.path.join(folder, "log"), "-w", "-t", "60",
                        "-o", f"-p {port} -k {sockets} -h 127.0.0.1 -F", "start"],
                       check=True, capture_output=True, env=env, cwd=folder, **user)
        started = True
        with psycopg.connect(host="127.0.0.1", port=port, user="grader", password=password,
                             dbname="postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        yield f"postgresql+psycopg://grader:{password}@127.0.0.1:{port}/{database}"
    finally:
        if started:
            subprocess.run([_tool("pg_ctl"), "-D", data, "-m", "fast", "-w", "-t", "60", "stop"],
                           capture_output=True, env=env, cwd=folder, **user)
        shutil.rmtree(folder, ignore_errors=True)
