"""hub/z2jh-values.yaml, loaded as the Zero to JupyterHub chart loads it.

The chart's jupyterhub_config.py (jupyterhub/files/hub/jupyterhub_config.py in
zero-to-jupyterhub-k8s) sets KubeSpawner's passthrough traits from ``singleuser`` (``uid``,
``fsGid``: skipped when null), then loads each ``hub.config`` section with
``c[section].update(cfg)`` (so a YAML list stays a plain list there), then execs every
``hub.extraConfig`` entry in sorted order, with ``get_config`` being z2jh.get_config (a dotted
key into the values). Helm merges the file over the chart's defaults first; a null removes a
default. :func:`chart_config` does the same, and the tests check what matters for the course:
the extra config runs, the class may log in, no uid is shared while the exchange is a shared
volume, the instructor alone gets the formgrader and the gradebook's credentials, the gradebook
is PostgreSQL, and the settings mounted in the pods are those `python -m hub` writes.
"""

from __future__ import annotations

import copy
import json
import os
import types
from pathlib import Path

import pytest
import yaml
from traitlets.config import Config

from hub import course_hub
from tests.browser_support import ROOT

VALUES = ROOT / "hub" / "z2jh-values.yaml"
#: The chart's own defaults that this file overrides (jupyterhub/values.yaml, singleuser).
CHART_DEFAULTS = {"singleuser": {"uid": 1000, "fsGid": 100}}


def helm_merge(defaults: dict, values: dict) -> dict:
    """Helm's merge of a values file over the chart's defaults: maps merge, a null deletes."""
    out = copy.deepcopy(defaults)
    for key, value in values.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = helm_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def z2jh_get_config(values: dict):
    def get_config(key, default=None):
        value = values
        for level in key.split("."):
            if not isinstance(value, dict) or level not in value:
                return default
            value = value[level]
        return value
    return get_config


def chart_config(values: dict) -> Config:
    """The hub's config as the chart builds it from ``values`` (see the module's docstring)."""
    merged = helm_merge(CHART_DEFAULTS, values)
    get_config = z2jh_get_config(merged)
    c = Config()
    for trait, key in (("uid", "uid"), ("fs_gid", "fsGid")):
        value = get_config(f"singleuser.{key}")
        if value is not None:
            setattr(c.KubeSpawner, trait, value)
    for section, cfg in (get_config("hub.config") or {}).items():
        c[section].update(cfg)
    for key, source in sorted((get_config("hub.extraConfig") or {}).items()):
        exec(compile(source, f"hub.extraConfig.{key}", "exec"), {"c": c, "get_config": get_config})
    return c


@pytest.fixture(scope="module")
def values() -> dict:
    return yaml.safe_load(VALUES.read_text())


def spawner(name: str, environment: dict):
    return types.SimpleNamespace(user=types.SimpleNamespace(name=name), environment=environment)


def exec_config(source: str, env: dict | None = None) -> Config:
    c = Config()
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        exec(compile(source, "nbgrader_config.py", "exec"), {"get_config": lambda: c})
    finally:
        os.environ.clear()
        os.environ.update(old)
    return c


# ---------------------------------------------------------------------- the tests


def test_the_harness_loads_hub_config_as_the_chart_does(values):
    """The check can fail: hub.config's allowed_users arrives as a plain list, so the extraConfig
    this file shipped before (``c.Authenticator.allowed_users.add(...)``) crashes here as it
    crashed the hub."""
    broken = copy.deepcopy(values)
    broken["hub"]["config"]["Authenticator"]["allowed_users"] = ["learner1"]
    broken["hub"]["extraConfig"] = {"course": 'c.Authenticator.allowed_users.add("teacher")\n'}
    with pytest.raises(AttributeError, match="'list' object has no attribute 'add'"):
        chart_config(broken)


def test_the_extra_config_runs_and_lets_the_class_log_in(values):
    from jupyterhub.auth import Authenticator

    c = chart_config(values)
    users = values["custom"]["users"]
    auth = Authenticator(config=c)
    assert auth.allowed_users == set(users), auth.allowed_users
    assert values["custom"]["instructor"] in auth.allowed_users
    assert auth.admin_users == set(), "nobody may be an admin (an admin opens others' servers)"
    assert values["hub"]["config"]["JupyterHub"]["authenticator_class"] not in ("dummy", "null")


def test_no_uid_is_shared_while_the_exchange_is_a_shared_volume(values):
    single = values["singleuser"]
    exchange = next(m["mountPath"] for m in single["storage"]["extraVolumeMounts"] if m["name"] == "exchange")
    volume = next(v for v in single["storage"]["extraVolumes"] if v["name"] == "exchange")
    assert "persistentVolumeClaim" in volume, "the exchange is a volume every pod mounts"
    everyone = exec_config(single["extraFiles"]["everyone-nbgrader"]["stringData"])
    assert everyone.Exchange.root == exchange
    # the chart's default uid (1000 for every pod) is removed, and each pod gets its user's own
    assert "uid" in single and single["uid"] is None
    c = chart_config(values)
    uid = c.KubeSpawner.uid
    assert callable(uid), f"every pod runs as one uid, {uid}: each learner could list the inbound"
    users = values["custom"]["users"]
    uids = {name: uid(spawner(name, {})) for name in users}
    assert len(set(uids.values())) == len(uids), uids
    assert min(uids.values()) >= 1000, uids
    with pytest.raises(ValueError, match="no uid"):
        uid(spawner("someone-else", {}))
    # a shared uid, or none for the instructor, stops the hub at start with what is wrong
    for change, why in ((lambda u: u.update({"CHANGE-ME-learner2": u["CHANGE-ME-learner1"]}), "shared"),
                        (lambda u: u.pop(values["custom"]["instructor"]), "instructor"),
                        (lambda u: u.update({"CHANGE-ME-learner1": 0}), "below 1000")):
        bad = copy.deepcopy(values)
        change(bad["custom"]["users"])
        with pytest.raises(ValueError, match=why):
            chart_config(bad)


def test_the_instructor_alone_gets_the_formgrader_and_the_gradebook(values):
    c = chart_config(values)
    hook = c.KubeSpawner.pre_spawn_hook
    shared = {"LANG": "C.UTF-8"}  # one dict, as a config default may be shared by spawners
    teacher = spawner(values["custom"]["instructor"], shared)
    learner = spawner("CHANGE-ME-learner1", shared)
    hook(teacher)
    hook(learner)
    assert teacher.environment["JUPYTER_CONFIG_PATH"].split(":")[0] == "/etc/one-rank/instructor"
    assert teacher.environment["COURSE_GRADEBOOK_URL"] == values["custom"]["gradebook"]["url"]
    assert teacher.environment["PGPASSWORD"] == {
        "valueFrom": {"secretKeyRef": values["custom"]["gradebook"]["passwordSecret"]}}
    assert learner.environment == {"LANG": "C.UTF-8", "JUPYTER_CONFIG_PATH": "/etc/one-rank/everyone"}
    assert shared == {"LANG": "C.UTF-8"}, "the hook changed a dict other spawners may share"


def test_the_gradebook_is_postgresql(values):
    from sqlalchemy.engine import make_url

    gradebook = values["custom"]["gradebook"]
    url = make_url(gradebook["url"])
    assert url.drivername == "postgresql+psycopg" and url.password is None, url
    assert gradebook["passwordSecret"]["name"] and gradebook["passwordSecret"]["key"]
    config = exec_config(values["singleuser"]["extraFiles"]["instructor-nbgrader"]["stringData"],
                         {"COURSE_GRADEBOOK_URL": gradebook["url"]})
    assert config.CourseDirectory.db_url == gradebook["url"]
    egress = values["singleuser"]["networkPolicy"]["egress"]
    assert any(p["port"] == url.port for rule in egress for p in rule["ports"]), egress


def test_the_pods_get_the_settings_python_m_hub_writes(values, tmp_path):
    files = values["singleuser"]["extraFiles"]
    exchange = Path("/srv/nbgrader/exchange")
    course_hub.prepare(tmp_path, "teacher", ["learner1"])
    local = exec_config(course_hub.write_everyone_config(tmp_path, exchange).joinpath("nbgrader_config.py").read_text())
    pods = exec_config(files["everyone-nbgrader"]["stringData"])
    for section, key in (("CourseDirectory", "course_id"), ("Exchange", "root"), ("Execute", "timeout"),
                         ("Execute", "startup_timeout"), ("Execute", "interrupt_on_timeout")):
        assert pods[section][key] == local[section][key], (section, key)
    local_teacher = exec_config((tmp_path / "instructor" / "nbgrader_config.py").read_text())
    pods_teacher = exec_config(files["instructor-nbgrader"]["stringData"], {"COURSE_GRADEBOOK_URL": "x"})
    assert pods_teacher.CourseDirectory.root == local_teacher.CourseDirectory.root
    for key, path in (("instructor-formgrader", "jupyter_server_config.d/course-formgrader.json"),
                      ("instructor-lab", "labconfig/page_config.json")):
        assert files[key]["mountPath"] == f"/etc/one-rank/instructor/{path}"
        assert files[key]["data"] == json.loads((tmp_path / "instructor" / path).read_text()), key
