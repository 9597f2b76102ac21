"""Single roles of the stack playbook, run in check mode against this machine with files of
their own (nothing here changes): the decisions they make from what a node holds."""

import os
import re
import sys
from pathlib import Path

import ansible_runner
import pytest
import yaml

from podsys.services.deployments import PLAYBOOKS_DIR, SERVICE_PATH_VARS

BIN = str(Path(sys.executable).parent)

# What Docker's containerd.io package installs: ~900 bytes, the CRI plugin switched off.
DOCKER_CONTAINERD_CONFIG = """#   Copyright 2018-2022 Docker Inc.

#   Licensed under the Apache License, Version 2.0 (the "License");
#   you may not use this file except in compliance with the License.
#   You may obtain a copy of the License at

#       http://www.apache.org/licenses/LICENSE-2.0

#   Unless required by applicable law or agreed to in writing, software
#   distributed under the License is distributed on an "AS IS" BASIS,
#   WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
#   See the License for the specific language governing permissions and
#   limitations under the License.

disabled_plugins = ["cri"]

#root = "/var/lib/containerd"
#state = "/run/containerd"
#subreaper = true
#oom_score = 0

#[grpc]
#  address = "/run/containerd/containerd.sock"
#  uid = 0
#  gid = 0

#[debug]
#  address = "/run/containerd/debug.sock"
#  uid = 0
#  gid = 0
#  level = "info"
"""

# The shape of `containerd config default` (1.7), shortened.
DEFAULT_CONFIG = """disabled_plugins = []
version = 2

[plugins]

  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.8"

    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = {systemd}
"""


def _tasks(node):
    """Every task in a loaded tasks file or play, blocks opened."""
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        if "name" in node and not ({"hosts", "block"} & set(node)):
            yield node
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue",
                    "always"):
            yield from _tasks(node.get(key))


def test_every_variable_naming_a_file_on_ogais_host_is_one_runs_may_not_set():
    """A copy or template `src:` is read on OGAI's host: a variable there, were a run's extra
    vars to set it, could copy any file OGAI can read onto a node."""
    found = set()
    for path in PLAYBOOKS_DIR.rglob("*.yml"):
        if ".ansible" in path.parts:
            continue
        for task in _tasks(yaml.safe_load(path.read_text())):
            for module in ("ansible.builtin.copy", "ansible.builtin.template"):
                args = task.get(module)
                if isinstance(args, dict) and not args.get("remote_src"):
                    found.update(re.findall(r"{{\s*(\w+)", str(args.get("src", ""))))
    assert found == set(SERVICE_PATH_VARS)


def _run(tmp_path: Path, role: str, tasks_from: str, hosts: dict, **shared) -> dict:
    """Runs `role`'s `tasks_from` in check mode for each host (all this machine, each with its
    own variables); returns {host: {task: (status, changed, result)}}."""
    playbook = tmp_path / "play.yml"
    playbook.write_text(f"""---
- name: One role's tasks
  hosts: all
  gather_facts: false
  tasks:
    - name: The role
      ansible.builtin.include_role:
        name: {role}
        tasks_from: {tasks_from}
""")
    inventory = {"all": {"hosts": {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
               "ansible_become": False, "ansible_remote_tmp": str(tmp_path / "remote"),
               **variables}
        for name, variables in hosts.items()}, "vars": shared}}
    events: list[dict] = []
    (tmp_path / "run").mkdir()
    runner = ansible_runner.run(
        private_data_dir=str(tmp_path / "run"), playbook=str(playbook), inventory=inventory,
        cmdline="--check", quiet=True,
        envvars={"PATH": f"{tmp_path / 'bin'}{os.pathsep}{BIN}{os.pathsep}"
                         f"{os.environ.get('PATH', '')}",
                 "ANSIBLE_ROLES_PATH": str(PLAYBOOKS_DIR / "roles"),
                 "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")},
        event_handler=lambda event: events.append(event) or True)
    failed = [e["event_data"].get("res") for e in events if e["event"] == "runner_on_failed"]
    assert runner.status == "successful", failed
    seen: dict[str, dict] = {name: {} for name in hosts}
    for event in events:
        kind, data = event["event"], event.get("event_data") or {}
        if kind in ("runner_on_ok", "runner_on_skipped") and data.get("host") in seen:
            res = data.get("res") or {}
            seen[data["host"]][data["task"]] = (kind.removeprefix("runner_on_"),
                                               bool(res.get("changed")), res)
    return seen


@pytest.mark.slow
def test_containerd_gets_its_default_configuration_when_cri_is_off_or_missing(tmp_path):
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "containerd"
    fake.write_text("#!/bin/sh\ncat <<'EOF'\n" + DEFAULT_CONFIG.replace("{systemd}", "false")
                    + "EOF\n")
    fake.chmod(0o755)
    configs = {
        "docker": DOCKER_CONTAINERD_CONFIG,
        "tiny": "version = 2\n",
        "no-cri": DEFAULT_CONFIG.replace("io.containerd.grpc.v1.cri", "io.containerd.other"
                                         ).replace("{systemd}", "true"),
        "cri-commented-off": "#disabled_plugins = [\"cri\"]\n" + DEFAULT_CONFIG.replace(
            "{systemd}", "true"),
        "cgroupfs": DEFAULT_CONFIG.replace("{systemd}", "false"),
    }
    hosts = {}
    for name, text in configs.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        hosts[name] = {"container_runtime_containerd_path": str(path)}
    hosts["missing"] = {"container_runtime_containerd_path": str(tmp_path / "none.toml")}
    seen = _run(tmp_path, "container_runtime", "containerd.yml", hosts,
                stack_container_runtime="containerd", stack_orchestrator="kubernetes",
                container_runtime_installed=True)

    write = "Write containerd's default configuration"
    cgroup = "Use the systemd cgroup driver, as the kubelet does"
    for name in ("docker", "tiny", "no-cri", "missing"):
        assert seen[name][write][:2] == ("ok", True), name
        assert "io.containerd.grpc.v1.cri" in seen[name][
            "Read containerd's default configuration"][2]["stdout"]
        # Not written in check mode: the old file says nothing about the cgroup driver.
        assert seen[name][cgroup][0] == "skipped", name
    # CRI on: kept as it is; only the cgroup driver is set (once: a second run changes nothing).
    for name in ("cri-commented-off", "cgroupfs"):
        assert seen[name][write][0] == "skipped", name
    assert seen["cgroupfs"][cgroup][:2] == ("ok", True)
    assert seen["cri-commented-off"][cgroup][:2] == ("ok", False)
    assert (tmp_path / "docker.toml").read_text() == DOCKER_CONTAINERD_CONFIG
    assert not (tmp_path / "none.toml").exists()


@pytest.mark.slow
def test_slurmd_without_a_munge_key_setting_expects_munge_keyed_and_says_so(tmp_path):
    # A node whose munge has no key yet (this machine's may have one: the Slurm tests'
    # packages key it).
    unkeyed = tmp_path / "munge.key"
    seen = _run(tmp_path, "slurm_node", "main.yml",
                {"node": {"stack_munge_key_file": "", "stack_slurm_conf_server": "ctl",
                          "slurm_node_munge_key": str(unkeyed)}},
                stack_package_manager="none", package_source_ready=True,
                stack_orchestrator_version="23.11")["node"]
    assert seen["Install the cluster's munge key"][0] == "skipped"
    assert seen["Look for the node's own munge key"][0] == "ok"
    assert seen["Start munge and slurmd"][0] == "skipped"
    message = seen["Say what slurmd still needs"][2]["msg"]
    assert "OGAI_SLURM_MUNGE_KEY_FILE" in message and str(unkeyed) in message
