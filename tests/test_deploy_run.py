"""Deploys run as rendered (issue 16, item 9): the Kubernetes manifest against the API's own schema, its
ConfigMap and its containers' scripts run for real, the Containerfile, and the crontab line under
Debian's real ``cron`` daemon firing into the ledger.

The cron test starts ``cron -f`` in a private mount namespace (``unshare -m``) where the test's own
directories are bind-mounted over ``/etc/cron.d``, ``/etc/crontab``, the user crontab spool and
``/run`` (the pid file): the daemon is the real one, but it sees only the rendered file and leaves
the host's cron setup alone. That needs root (cron runs ``/etc/cron.d`` jobs as their user field,
and a mount namespace needs CAP_SYS_ADMIN): .ci/run runs as root and installs ``cron``.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from support import Env, entry, git, improved_step, jsonl, results
from test_install import operator_toolchain, probe_gate, probed

from evolve import deploy
from evolve.metrics import textfile_name
from evolve.paths import Paths

ROOT = Path(__file__).parents[1]
EVOLVE = str(Path(sys.executable).parent / "evolve")
K8S_VERSION = "1.30"  # CronJob.spec.timeZone is GA since 1.27; the oldest release line still supported


def docs_of(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(text: str) -> dict[str, dict]:
    return {d["kind"]: d for d in docs_of(text)}


def pod_of(text: str) -> dict:
    return by_kind(text)["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def rendered(env: Env, cli, *extra: str) -> str:
    r = cli("install", "kubernetes", "--print", "--image", "registry.example.com/evolve:0.1.0", *extra)
    assert r.code == 0, r.stderr
    text = r.stdout
    assert text.startswith("# evolve-repo.yaml\n")
    return text.split("\n", 1)[1]


# -- the Kubernetes API schema -------------------------------------------------------------------------


def test_manifests_validate_against_the_kubernetes_api_schema(env: Env, cli) -> None:
    """Strict: an unknown field (a typo the API server would silently drop) fails as much as a wrong type."""
    import kubernetes_validate

    generic = (ROOT / "deploy" / "kubernetes" / "cronjob.yaml").read_text()
    for text in (generic, rendered(env, cli, "--schedule", "15 3 * * 1-5")):
        kinds = []
        for doc in docs_of(text):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            kinds.append(doc["kind"])
        assert kinds == ["ConfigMap", "PersistentVolumeClaim", "CronJob"]

    # The validator is not vacuous: the mistakes it must catch, each on a copy of the real CronJob.
    cron = by_kind(generic)["CronJob"]

    def pod(d: dict) -> dict:
        return d["spec"]["jobTemplate"]["spec"]["template"]["spec"]

    mistakes = [
        lambda d: d["spec"].update(startingDeadlineSeconds="30"),  # a string for an integer
        lambda d: d["spec"]["jobTemplate"]["spec"].update(backoffLimits=0),  # an unknown field (a typo)
        lambda d: pod(d)["containers"][0].pop("name"),  # a required field missing
        lambda d: pod(d)["volumes"][1]["configMap"].update(name=7),
    ]
    for mistake in mistakes:
        broken = copy.deepcopy(cron)
        mistake(broken)
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_cronjob_names_a_real_image_or_refuses(env: Env, cli) -> None:
    r = cli("install", "kubernetes", "--print")
    assert r.code == 2
    assert "kubernetes needs --image" in r.stderr and "Containerfile" in r.stderr
    assert r.stdout == ""
    pod = pod_of(rendered(env, cli))
    images = {c["image"] for c in pod["initContainers"] + pod["containers"]}
    assert images == {"registry.example.com/evolve:0.1.0"}
    # The pod runs as the Containerfile's user, and the claim is writable by it.
    sc = pod["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == sc["fsGroup"] == containerfile_uid()


# -- the ConfigMap -----------------------------------------------------------------------------------


def test_configmap_carries_the_repositorys_config(env: Env, cli) -> None:
    env.write_config(fire={"max_cycles": 2, "max_minutes": 30})
    text = rendered(env, cli)
    cm = by_kind(text)["ConfigMap"]
    assert cm["data"]["config.toml"] == env.paths.config.read_text()
    pod = pod_of(text)
    (config_volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert config_volume["configMap"]["name"] == cm["metadata"]["name"]
    init_mounts = {m["name"]: m for m in pod["initContainers"][0]["volumeMounts"]}
    assert init_mounts[config_volume["name"]]["mountPath"] == "/etc/evolve"
    assert init_mounts[config_volume["name"]]["readOnly"] is True

    # No config file: the ConfigMap says evolve's defaults apply (the Job still has a file to copy).
    env.paths.config.unlink()
    assert "defaults apply" in by_kind(rendered(env, cli))["ConfigMap"]["data"]["config.toml"]


def test_configmap_never_carries_a_secret(env: Env, cli) -> None:
    token = "sk-ant-api03-" + "Q" * 40
    env.write_config(agent={"runner": "command", "argv": ["agent", "--token", token]})
    r = cli("install", "kubernetes", "--print", "--image", "r/evolve:1")
    assert r.code == 0, r.stderr
    assert token not in r.stdout and token not in r.stderr
    assert "put it in the Secret evolve-agent" in r.stderr
    assert '"--token"' in by_kind(r.stdout.split("\n", 1)[1])["ConfigMap"]["data"]["config.toml"]


@pytest.mark.parametrize(("value", "block"), [
    ('[agent]\nrunner = "command"\n', True),  # one final newline: `|`
    ("[fire]\nmax_cycles = 2", True),  # none: `|-`
    ("[fire]\n\nmax_cycles = 2\n\n\n", True),  # blank lines inside and after: `|+`
    ("  indented first line\n", False),  # a block would misread the indentation
    ("a\n   \nb\n", False),  # a line of spaces only: a block drops them
    ("tab\there\n", False),  # not printable ASCII
    ("caf\u00e9 = 1\n", False),
    ("", False),
])
def test_yaml_block_or_quoted(value: str, block: bool) -> None:
    out = deploy.yaml_block(value, indent=4)
    assert out.startswith("|") == block
    assert yaml.safe_load("config.toml: " + out + "\n")["config.toml"] == value


@given(st.text(max_size=200))
def test_yaml_block_reads_back_exactly(value: str) -> None:
    doc = "data:\n  config.toml: " + deploy.yaml_block(value, indent=4) + "\nnext: 1\n"
    assert yaml.safe_load(doc) == {"data": {"config.toml": value}, "next": 1}


# -- the Job's two scripts, run as a pod would run them --------------------------------------------


def container_script(container: dict) -> str:
    assert container["command"] == ["sh", "-c"]
    (script,) = container["args"]
    return script


def test_kubernetes_job_scripts_clone_install_the_config_and_fire(env: Env, cli, tmp_path: Path) -> None:
    """The init container's clone has no `.agents/` (git-ignored): the config arrives from the ConfigMap,
    and the main container's fire then runs the configured agent, not the defaults (claude, not installed).
    The gate runs on the PATH the manifest gives the container (here a toolchain's, by --path), not on
    evolve's own virtualenv: it imports what only that toolchain has."""
    env.write_config(fire={"max_cycles": 1})
    record = tmp_path / "gate-probe.json"
    probe_gate(env, record)
    venv = operator_toolchain(tmp_path)
    pod_path = f"{venv}/bin:/usr/bin:/bin"
    text = rendered(env, cli, "--path", pod_path)
    configmap = by_kind(text)["ConfigMap"]["data"]
    pod = pod_of(text)

    work, etc = tmp_path / "work", tmp_path / "etc-evolve"
    work.mkdir()
    etc.mkdir()
    for key, value in configmap.items():  # what the kubelet does with a ConfigMap volume
        (etc / key).write_text(value)

    def run(script: str, container: dict) -> subprocess.CompletedProcess[bytes]:
        script = script.replace("/work", str(work)).replace("/etc/evolve", str(etc))
        script = script.replace(deploy.IMAGE_EVOLVE, EVOLVE)  # the image's evolve, by its absolute path
        values = {e["name"]: e["value"].replace("/work", str(work)) for e in container["env"]}
        values["EVOLVE_GIT_URL"] = str(env.repo)  # the origin the manifest names, here a local one
        run_env = env.env(**{"PATH": "/usr/bin:/bin", **values})  # the manifest's PATH, where it sets one
        return subprocess.run(["sh", "-c", script], env=run_env, capture_output=True, timeout=120)

    init = pod["initContainers"][0]
    for _ in range(2):  # every Job runs it: the second run keeps the clone and refreshes the config
        done = run(container_script(init), init)
        assert done.returncode == 0, done.stderr
    clone = work / "repo"
    assert (clone / ".agents" / "evolve" / "config.toml").read_text() == env.paths.config.read_text()
    assert (work / "home").is_dir()
    assert git(clone, "status", "--porcelain").strip() == ""  # .agents/ ignored, as `evolve init` leaves it

    queue = clone / ".agents" / "rpi" / "next-work.jsonl"
    queue.parent.mkdir(parents=True)
    queue.write_bytes(orjson.dumps(entry("from the pod")) + b"\n")
    main = pod["containers"][0]
    done = run(container_script(main), main)
    assert done.returncode == 0, done.stderr
    assert b"fire.end" in done.stdout + done.stderr, done.stdout + done.stderr
    ledger = jsonl(Paths.for_repo(clone, env=env.env()).ledger)
    assert results(ledger) == ["improved"]
    assert env.calls(), "the scripted agent from the ConfigMap's config never ran"
    sha = ledger[0].get("sha")
    assert sha and git(clone, "cat-file", "-t", sha).strip() == "commit"
    assert not (clone / ".git" / "index.lock").exists()
    assert git(clone, "status", "--porcelain").strip() == ""
    assert {"name": "PATH", "value": pod_path} in main["env"]
    gate = probed(record)
    assert gate["prefix"] == str(venv) and gate["env"]["PATH"] == pod_path


def test_the_pod_runs_evolve_by_its_path_and_fires_on_the_images_toolchain(env: Env, cli) -> None:
    """By default the pod's PATH is the image's less evolve's virtualenv, said in the manifest; evolve is
    started by its absolute path in the image, which the Containerfile puts there (and not on PATH)."""
    for text in (rendered(env, cli), (ROOT / "deploy" / "kubernetes" / "cronjob.yaml").read_text()):
        main = pod_of(text)["containers"][0]
        assert {"name": "PATH", "value": deploy.IMAGE_PATH} in main["env"]
        assert "/opt/evolve" not in deploy.IMAGE_PATH
        assert f"{deploy.IMAGE_EVOLVE} --repo /work/repo fire" in container_script(main)
        header = "".join(ln for ln in text.splitlines(keepends=True) if ln.startswith("#"))
        assert "The toolchain:" in header and "[workspace] setup" in header and "--path" in header
    r = cli("install", "kubernetes", "--print", "--image", "r/evolve:1")
    assert f"PATH in the pod (their gate and agent): {deploy.IMAGE_PATH}" in r.stderr
    # The image: evolve's venv is where the manifest runs it from, and its bin is not on the image's PATH.
    lines = [ln for _, ls in stages() for ln in ls]
    venv = str(Path(deploy.IMAGE_EVOLVE).parent.parent)
    assert any(ln.startswith("RUN ") and f"-m venv {venv}" in ln for ln in lines)
    assert not [ln for ln in lines if ln.startswith("ENV ") and f"{venv}/bin" in ln]


# -- the Containerfile ---------------------------------------------------------------------------------


def stages() -> list[tuple[str, list[str]]]:
    """``[(stage name, [instruction lines])]`` of the Containerfile, continuation lines joined."""
    text = (ROOT / "Containerfile").read_text()
    text = re.sub(r"\\\n\s*", " ", text)
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if m:
            out.append((m.group(2) or "", [line]))
        elif out:
            out[-1][1].append(line)
    return out


def containerfile_uid() -> int:
    (user,) = {ln.split()[1] for _, lines in stages() for ln in lines if ln.startswith("USER ")}
    return int(user.split(":")[0])


def test_containerfile_is_multi_stage_non_root_and_the_agent_cli_optional() -> None:
    s = stages()
    names = [name for name, _ in s]
    assert names[0] == "build" and names[-1] == "runtime" and "with-claude" in names
    default = dict(s)
    # The default image (the last stage) has no Node and no agent CLI; `--target with-claude` adds them.
    chain, name = [], "runtime"
    while name in default:
        chain.append(name)
        name = default[name][0].split()[1]
    assert chain == ["runtime", "base"]
    assert not any("node" in ln.lower() or "claude" in ln.lower() for n in chain for ln in default[n])
    assert any("claude-code@" in ln for ln in default["claude-cli"])
    # Non-root: every stage that runs evolve ends on the numeric user the CronJob names.
    for n in ("base", "with-claude"):
        users = [ln for ln in default[n] if ln.startswith("USER ")]
        assert users and users[-1] == f"USER {deploy.CONTAINER_UID}:{deploy.CONTAINER_UID}"
    assert containerfile_uid() == deploy.CONTAINER_UID
    # What the image needs at run time, and only build-stage files come from the build context.
    assert any("git" in ln.split() for ln in default["base"] if ln.startswith("RUN "))
    for _, lines in s:
        for ln in lines:
            if ln.startswith("COPY ") and "--from=" not in ln:
                for src in ln.split()[1:-1]:
                    assert (ROOT / src).exists(), src
    # Base images pinned to a release line, never a floating tag.
    for ln in (ln for _, lines in s for ln in lines if ln.startswith("ARG ") and "_IMAGE=" in ln):
        assert not ln.endswith(":latest") and re.search(r":\d", ln), ln


# -- Debian's real cron daemon -------------------------------------------------------------------------


def cron_prerequisites() -> str:
    """The cron binary; skips (locally) or fails (in CI, which runs as root and installs cron) with the reason."""
    def missing(why: str) -> None:
        if os.environ.get("CI"):
            pytest.fail(f"{why} (.ci/run runs as root and installs it)")
        pytest.skip(why)

    binary = shutil.which("cron") or ("/usr/sbin/cron" if os.access("/usr/sbin/cron", os.X_OK) else None)
    if binary is None:
        missing("Debian's cron daemon is not installed: apt-get install cron")
    if os.geteuid() != 0:
        missing("starting cron needs root: it runs /etc/cron.d jobs as their user field, and the test's private "
                "mount namespace (unshare -m) needs CAP_SYS_ADMIN")
    if shutil.which("unshare") is None:
        missing("unshare (util-linux) is not installed")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        missing(f"no private mount namespace here (unshare -m: {probe.stderr.strip()})")
    return str(binary)


# Inside the namespace: the test's directories over cron's, then cron in the foreground as this process.
# The paths come in as arguments ("$1"...), never spliced into the script.
CRON_NS = """set -e
mount --bind "$1" /etc/cron.d
mount --bind "$2" /etc/crontab
if [ -d /var/spool/cron/crontabs ]; then mount --bind "$3" /var/spool/cron/crontabs; fi
mount -t tmpfs tmpfs /run
exec "$4" -f
"""


def wait_for(what: str, check, timeout: float = 300) -> None:
    """A hang guard only: cron fires at the next minute boundary, and the fire takes what it takes."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.5)


def test_cron_daemon_fires_the_rendered_line_into_the_ledger(env: Env, cli, tmp_path: Path) -> None:
    cron = cron_prerequisites()
    env.queue(entry("a", "b"))
    env.write_config(fire={"max_cycles": 1})
    # The gate needs the operator's own python, first on the PATH install ran with (evolve's venv is not).
    record = tmp_path / "gate-probe.json"  # outside the checkout: the sandboxed gate cannot write there
    probe_gate(env, record)
    venv = operator_toolchain(tmp_path)
    shell_path = f"{venv}/bin:/usr/local/bin:/usr/bin:/bin"
    # A name with a dot: Debian's cron skips /etc/cron.d files named so, and the file name must not carry it.
    r = cli("install", "cron", "--print", "--schedule", "* * * * *", "--name", "my.app",
            extra_env={"PATH": shell_path})
    assert r.code == 0, r.stderr
    assert r.stdout.startswith("# evolve-my_app\n")
    rendered_file = r.stdout.split("\n", 1)[1]

    home = tmp_path / "cron-home"
    home.mkdir()
    # cron's job environment is bare; the user's git identity lives in ~/.gitconfig.
    (home / ".gitconfig").write_text("[user]\n\tname = cron\n\temail = cron@localhost\n")
    # Environment lines a crontab may carry, above the rendered file, which is installed unchanged:
    # HOME for the identity above, and (in a development checkout) the tree under test.
    env_lines = [f"HOME={home}"] + ([f"PYTHONPATH={os.environ['PYTHONPATH']}"] if "PYTHONPATH" in os.environ else [])
    crond = tmp_path / "cron.d"
    crond.mkdir(mode=0o755)
    installed = crond / "evolve-my_app"  # the name `install` writes to /etc/cron.d
    installed.write_text("\n".join(env_lines) + "\n" + rendered_file)
    installed.chmod(0o644)  # cron skips a file that is group- or world-writable
    empty_crontab = tmp_path / "crontab"
    empty_crontab.write_text("")
    spool = tmp_path / "spool"
    spool.mkdir()

    log = env.paths.evolve_dir / "cron.log"
    daemon = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", CRON_NS, "sh",
         str(crond), str(empty_crontab), str(spool), cron],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def fired() -> bool:
            assert daemon.poll() is None, daemon.stdout.read().decode(errors="replace") if daemon.stdout else ""
            return log.exists() and b'"fire.end"' in log.read_bytes()

        wait_for("cron to run the rendered line and the fire to end", fired)
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=60)
    # A tick that started before cron stopped finishes on its own: wait for the line's own lock to be free.
    cron_lock = str(env.paths.evolve_dir / "cron.lock")
    wait_for("the last cron tick to finish",
             lambda: subprocess.run(["flock", "-n", cron_lock, "true"]).returncode == 0)

    ledger = env.ledger()
    assert ledger and set(results(ledger)) == {"improved"}, ledger
    for e in ledger:
        sha = e.get("sha")
        assert sha and git(env.repo, "cat-file", "-t", sha).strip() == "commit"
    gate = probed(record)
    assert gate["prefix"] == str(venv), gate["executable"]  # the operator's python, not evolve's
    assert gate["env"]["PATH"] == shell_path
    events = [orjson.loads(ln)["event"] for ln in log.read_bytes().splitlines() if ln.startswith(b"{")]
    assert "fire.start" in events and "fire.end" in events
    assert not (env.repo / ".git" / "index.lock").exists()
    # The host's cron setup was never touched.
    assert not Path("/etc/cron.d/evolve-my_app").exists()
    assert "# evolve:my.app" in rendered_file  # the tag the user crontab's enable hint matches on keeps the name


@pytest.mark.parametrize(("name", "file"), [
    ("repo", "evolve-repo"), ("my.app", "evolve-my_app"), ("team:api-2", "evolve-team_api-2"), ("a_b", "evolve-a_b"),
])
def test_cron_d_file_names_are_ones_debian_cron_reads(name: str, file: str) -> None:
    assert deploy.cron_d_name(name) == file
    assert re.fullmatch(r"[A-Za-z0-9_-]+", file)  # run-parts' naming, which Debian's cron applies to cron.d


# -- a real systemd: a user manager in a private mount and PID namespace -------------------------------

# Inside the namespace: a tmpfs /run with /run/systemd/system (what sd_booted() checks: a user manager
# refuses to start on a system that was not booted with systemd, and this container's PID 1 is not
# systemd), then `systemd --user` (its unit directory under the test's XDG_CONFIG_HOME, never the real
# ~/.config), then exactly the command `evolve install systemd --user --dest` prints. The service's state
# is written to a file every half second for the test to read.
SYSTEMD_NS = """set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/system /run/user/0
chmod 700 /run/user/0
export XDG_RUNTIME_DIR=/run/user/0
state="$1"; enable="$2"; unit="$3"; shift 3
"$SYSTEMD" --user > "$state.manager.log" 2>&1 &
manager=$!
i=0
until [ -S /run/user/0/systemd/private ]; do
  i=$((i + 1)); [ $i -lt 600 ] || { echo "no user manager socket" >&2; exit 1; }
  kill -0 $manager; sleep 0.1
done
systemctl --user set-environment "$@"
sh -c "$enable"
while kill -0 $manager; do
  systemctl --user show "$unit" -p ActiveState -p Result -p ExecMainStatus -p NRestarts \\
    -p ExecMainStartTimestampMonotonic > "$state.tmp" && mv "$state.tmp" "$state"
  sleep 0.5
done
"""


OUTSIDE: list[Path] = []


def outside_tmp_dir() -> Path:
    """A fresh directory outside /tmp and /var/tmp (which the units leave writable when PrivateTmp is off):
    only ReadWritePaths= can make it writable to the sandboxed fire. Removed after the test."""
    import tempfile

    base = Path("/var/lib/evolve-tests")
    base.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="metrics-", dir=base))
    OUTSIDE.append(d)
    return d


@pytest.fixture(autouse=True)
def _remove_outside_dirs() -> Iterator[None]:
    yield
    while OUTSIDE:
        shutil.rmtree(OUTSIDE.pop(), ignore_errors=True)


def systemd_prerequisites() -> str:
    def missing(why: str) -> None:
        if os.environ.get("CI"):
            pytest.fail(f"{why} (.ci/run runs as root and installs systemd)")
        pytest.skip(why)

    manager = next((p for p in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd") if os.access(p, os.X_OK)), None)
    if manager is None or shutil.which("systemctl") is None:
        missing("systemd is not installed: apt-get install systemd")
    if os.geteuid() != 0:
        missing("the test's private mount and PID namespaces (unshare -m -p) need root")
    probe = subprocess.run(["unshare", "-m", "-p", "-f", "--mount-proc", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        missing(f"no private mount and PID namespace here (unshare: {probe.stderr.strip()})")
    return str(manager)


def unit_state(path: Path) -> dict[str, str]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln)


def test_systemd_user_timer_fires_the_rendered_units_into_the_ledger(env: Env, cli, tmp_path: Path) -> None:
    """The rendered user units, sandbox and all, under a real `systemd --user`, enabled as `evolve install`
    says, until the timer's fire lands in the ledger. The repository is under /tmp, as an operator's may be:
    the units leave PrivateTmp off for it (a private /tmp would hide it: 226/NAMESPACE).

    The gate needs the operator's own python (first on the PATH install ran with, evolve's venv not on it),
    and [metrics] textfile_dir is outside the repository: the timer's fire is green and writes the file."""
    manager = systemd_prerequisites()
    # ProtectSystem=strict leaves only the repository writable: the scripted agent keeps its script there, and
    # the gate its record, in a directory the sandbox (read-only checkout) is told the children may write.
    harness = env.repo / ".agents" / "harness"
    harness.mkdir(parents=True)
    env.script = harness / "agent.json"
    env.steps([improved_step()])
    metrics_dir = outside_tmp_dir()
    env.write_config(agent={"argv": [sys.executable, "-m", "evolve.agent.scripted", "--script", str(env.script)]},
                     fire={"max_cycles": 1}, metrics={"textfile_dir": str(metrics_dir)},
                     sandbox={"writable": [str(harness)]})
    record = harness / "gate-probe.json"
    probe_gate(env, record)
    venv = operator_toolchain(tmp_path)
    env.queue(entry("a", "b"))
    units = tmp_path / "units"
    r = cli("install", "systemd", "--user", "--schedule", "* * * * *", "--dest", str(units),
            extra_env={"PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin"})
    assert r.code == 0, r.stderr
    assert f"-{metrics_dir} " in (units / "evolve@repo.service").read_text()
    (enable,) = [ln.removeprefix("enable: ") for ln in r.stdout.splitlines() if ln.startswith("enable: ")]
    assert "systemctl --user link " in enable and "enable --now evolve@repo.timer" in enable
    assert "PrivateTmp=no" in (units / "evolve@repo.service").read_text()
    # What an operator's manager environment would carry: the git identity (and the tree under test).
    manager_env = [f"{k}={v}" for k, v in env.env().items() if k.startswith("GIT_") or k == "PYTHONPATH"]
    state = tmp_path / "unit-state"
    ns = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "-p", "-f", "--mount-proc", "sh", "-c", SYSTEMD_NS, "sh",
         str(state), enable, "evolve@repo.service", *manager_env],
        # The manager's own config and data (units, Persistent= stamps) stay in the test's directories.
        env={**os.environ, "SYSTEMD": manager, "XDG_CONFIG_HOME": str(env.xdg),
             "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_STATE_HOME": str(tmp_path / "state"),
             "XDG_CACHE_HOME": str(tmp_path / "cache")},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def ran() -> bool:
            assert ns.poll() is None, ns.stdout.read().decode(errors="replace") if ns.stdout else ""
            s = unit_state(state)
            assert s.get("Result", "success") == "success", s  # e.g. exit-code with 226/NAMESPACE
            return s.get("ExecMainStartTimestampMonotonic", "0") != "0" and s.get("ActiveState") == "inactive"

        wait_for("the timer to start evolve@repo.service and its fire to end", ran)
    finally:
        os.killpg(ns.pid, signal.SIGKILL)  # PID 1 of the namespace goes: the kernel ends everything in it
        ns.wait(timeout=60)
    assert unit_state(state)["ExecMainStatus"] == "0"
    ledger = env.ledger()
    assert ledger and set(results(ledger)) == {"improved"}, ledger
    for e in ledger:
        assert git(env.repo, "cat-file", "-t", e["sha"]).strip() == "commit"
    assert not (env.repo / ".git" / "index.lock").exists()
    gate = probed(record)
    assert gate["prefix"] == str(venv), gate["executable"]  # the operator's python, not evolve's
    assert gate["env"]["PATH"] == f"{venv}/bin:/usr/local/bin:/usr/bin:/bin"
    assert (metrics_dir / textfile_name(env.repo)).is_file()  # ReadWritePaths= let the fire write it
    # With PrivateTmp off the real /tmp stays writable: else Python's tempfile falls back to the current
    # directory, and the gate's (and evolve's own) temporary files land in the worktree and the checkout.
    assert gate["tmp"] == "/tmp"
    assert (env.xdg / "systemd" / "user" / "timers.target.wants" / "evolve@repo.timer").is_symlink()
    assert (tmp_path / "data" / "systemd" / "timers" / "stamp-evolve@repo.timer").exists()  # Persistent=true


@pytest.mark.parametrize(("repo", "state", "private"), [
    ("/srv/repo", "/srv/repo/.agents/evolve", True),
    ("/tmp/repo", "/tmp/repo/.agents/evolve", False),
    ("/var/tmp/x", "/var/tmp/x/.agents/evolve", False),
    ("/srv/repo", "/tmp/evolve-state", False),  # EVOLVE_DIR under /tmp
    ("/tmpfiles/repo", "/tmpfiles/repo/.agents/evolve", True),  # only the directory itself, not a prefix
])
def test_private_tmp_only_where_it_hides_nothing(repo: str, state: str, private: bool) -> None:
    t = deploy.Target(name="r", repo=repo, state_dir=state, evolve=("/usr/bin/evolve",), path="/usr/bin",
                      home="/home/u", cron="*/30 * * * *")
    assert (deploy.private_tmp(t) == "PrivateTmp=yes") is private
