"""The deploy templates (systemd, cron, Kubernetes): one text each, so `deploy/` and `evolve install` agree.

``{{name}}`` placeholders are filled by :mod:`evolve.deploy`, each already quoted or escaped for its
place (a comment, a raw value, an ExecStart= word); everything else is literal.
"""

# Above the PATH each rendering sets (docs/DESIGN.md §9, README "Triggers").
PATH_NOTE = """\
# PATH: where the gate and the agent find their programs, as a hand-run fire does: `evolve install` renders
# the PATH of the shell it ran in, less evolve's own virtualenv (evolve runs by its absolute path);
# `evolve install ... --path DIRS` sets another.
"""

FIRE_SERVICE = """\
# evolve: one fire (what `evolve fire` does) against a repository; started by evolve@{{instance}}.timer.
{{rendered_note}}[Unit]
Description=evolve: one fire against {{repo_desc}}
{{network}}
[Service]
Type=oneshot
{{user}}WorkingDirectory={{repo_dir}}
{{path_note}}Environment={{path_env}}
{{extra_env}}ExecStart={{exec_fire}}
# 75: busy, rate-limited, try later; 143: stopped mid-cycle after recording `interrupted`.
SuccessExitStatus=75 143
# Type=oneshot has no start timeout by default: a hung agent must not block every later tick.
TimeoutStartSec={{timeout_start}}
# The agent's whole process tree goes on stop or timeout: no orphaned agent keeps editing the repo.
KillMode=control-group
SyslogIdentifier=evolve
# Sandbox, inherited by the agent: no sudo, a read-only system, writes only to the repository, evolve's
# state and the directories the config names ([metrics] textfile_dir...), and the agent's own config.{{sandbox_note}}
{{sandbox}}"""

# `systemd-analyze security` review (see deploy/README.md): everything an agent loop does not need is
# closed; what it needs stays open and is documented: the network (the model's API), the home
# directory (the CLI writes ~/.claude.json and its session store), JIT memory (Node), namespaces, and
# @mount on top of @system-service: bubblewrap (docs/DESIGN.md §8.6) mounts the agent's and the gate's
# read-only view in a user namespace of its own; without @mount seccomp kills it (SIGSYS) and a fire
# runs them unsandboxed. The empty CapabilityBoundingSet= stays: a new user namespace has its own.
# The sandbox both services share; the user units stop after PrivateTmp (see HARDENING).
SANDBOX = """\
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths={rw_paths}
{private_tmp}
"""

HARDENING = """\
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
LockPersonality=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service @mount
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
CapabilityBoundingSet=
UMask=0027
"""

FIRE_TIMER = """\
# evolve: fire {{repo_text}} on a schedule (schedule.cron {{cron}}).
{{rendered_note}}[Unit]
Description=evolve: fire {{repo_desc}} on a schedule

[Timer]
{{oncalendar}}
# A fire missed while the machine was off runs once at boot.
Persistent=true
# Spreads a fleet's fires; a service still running when the timer elapses is not started again.
RandomizedDelaySec={{delay}}
{{accuracy}}
[Install]
WantedBy=timers.target
"""

DAEMON_SERVICE = """\
# evolve daemon: fires {{repo_text}} on schedule.cron in-process (APScheduler), Type=notify with a watchdog.
{{rendered_note}}[Unit]
Description=evolve daemon: scheduled fires against {{repo_desc}}
{{network}}# A crash loop gives up instead of hammering the agent's API.
StartLimitIntervalSec=600
StartLimitBurst=5

[Service]
Type=notify
NotifyAccess=main
{{user}}WorkingDirectory={{repo_dir}}
{{path_note}}Environment={{path_env}}
{{extra_env}}ExecStart={{exec_daemon}}
# The daemon pings at half this from its scheduler loop; a stuck loop is killed and restarted.
WatchdogSec=60
# Crashes only: 75 (try later) and 78 (bad configuration) would hit the same wall again.
Restart=on-failure
RestartSec=30
RestartPreventExitStatus=75 78
SuccessExitStatus=75 143
TimeoutStartSec=60
# SIGTERM: stop claiming, interrupt the running agent, record `interrupted`, exit 143 within daemon.grace_s.
TimeoutStopSec={{timeout_stop}}
KillMode=control-group
SyslogIdentifier=evolve
# Sandbox, inherited by the agent (see evolve@.service).{{sandbox_note}}
{{sandbox}}
[Install]
WantedBy={{wanted_by}}
"""

CRONTAB = """\
# evolve:{{name}}: one fire of {{repo}} per tick. Cron has a bare environment, so the line sets PATH and
# cd's into the repo; the outer flock (its own file, not evolve's fire.lock) skips a tick while the last
# one runs (exit 75), and evolve's own lock guards against every other trigger anyway. Times are cron's
# local time (schedule.timezone {{timezone}} applies to the daemon and systemd only). Logs: JSON lines.
{{path_note}}{{schedule}} {{cron_user}}{{command}}  # evolve:{{name}}
"""

KUBERNETES = """\
# evolve:{{name}}: one fire per tick as a Kubernetes CronJob. The repository and evolve's state live on
# the PersistentVolumeClaim (ReadWriteOnce: evolve's flock is not reliable on NFS). Cluster-level STOP:
#   kubectl patch cronjob evolve-{{name}} -p '{"spec":{"suspend":true}}'
# The image: build it from the repository's Containerfile and push it (deploy/README.md, "Kubernetes").
# The config: the ConfigMap below is the repository's .agents/evolve/config.toml (git-ignored, so no clone
# has it); every Job copies it into the clone. Change it here and `kubectl apply` again.
# The toolchain: every fire, so the gate and the agent, runs on the PATH given to the evolve container
# below, never on evolve's own virtualenv (evolve runs as {{evolve}}).
# The gate finds the project's tools only if they are there: build the image on your project's own
# toolchain image (Debian-based, Python >= 3.11: podman build --build-arg PYTHON_IMAGE=...;
# deploy/README.md) and put its directories on that PATH (`evolve install kubernetes --path ...`), or
# have [workspace] setup install them into the worktree on the volume (e.g. python3 -m venv .venv, then
# .venv/bin/pip install -e .) with [workspace] path naming the directory (.venv/bin): the fire puts it first.
apiVersion: v1
kind: ConfigMap
metadata:
  name: evolve-{{name}}-config
  labels:
    app.kubernetes.io/name: evolve
    app.kubernetes.io/instance: {{name}}
data:
  config.toml: {{config_toml}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: evolve-{{name}}-work
  labels:
    app.kubernetes.io/name: evolve
    app.kubernetes.io/instance: {{name}}
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 10Gi
---
apiVersion: batch/v1
kind: CronJob
metadata:
  name: evolve-{{name}}
  labels:
    app.kubernetes.io/name: evolve
    app.kubernetes.io/instance: {{name}}
spec:
  schedule: {{schedule}}
  timeZone: {{timezone}}
  # Never two fires at once; Replace would kill the running agent mid-cycle.
  concurrencyPolicy: Forbid
  # A fire that could not start this long after its time is skipped (the controller checks every ~10 s).
  startingDeadlineSeconds: {{starting_deadline}}
  suspend: false
  successfulJobsHistoryLimit: 3
  failedJobsHistoryLimit: 3
  jobTemplate:
    spec:
      # The next tick retries, not the Job controller: a CronJob may start zero or two Jobs per tick,
      # and evolve's lock plus its re-runnable cycle make both harmless.
      backoffLimit: 0
      activeDeadlineSeconds: {{active_deadline}}
      template:
        metadata:
          labels:
            app.kubernetes.io/name: evolve
            app.kubernetes.io/instance: {{name}}
        spec:
          restartPolicy: Never
          # SIGTERM: evolve interrupts the agent, records `interrupted` and exits 143 within this.
          terminationGracePeriodSeconds: {{termination_grace}}
          # The image's user (Containerfile); fsGroup makes the claim writable by it.
          securityContext:
            runAsNonRoot: true
            runAsUser: {{uid}}
            runAsGroup: {{uid}}
            fsGroup: {{uid}}
          initContainers:
            - name: clone
              image: {{image}}
              command: ["sh", "-c"]
              args:
                - |
                  # Clone once; the config comes from the ConfigMap on every run (.agents/ is not in git).
                  set -e
                  [ -d /work/repo/.git ] || git clone "$EVOLVE_GIT_URL" /work/repo
                  mkdir -p /work/home /work/repo/.agents/evolve
                  # What `evolve init` does: evolve's state stays out of git.
                  [ -e /work/repo/.agents/.gitignore ] || printf '*\\n' > /work/repo/.agents/.gitignore
                  cp /etc/evolve/config.toml /work/repo/.agents/evolve/config.toml
              env:
                - name: EVOLVE_GIT_URL
                  value: {{git_url}}
                - name: HOME
                  value: /work/home
              securityContext:
                allowPrivilegeEscalation: false
              volumeMounts:
                - name: work
                  mountPath: /work
                - name: config
                  mountPath: /etc/evolve
                  readOnly: true
          containers:
            - name: evolve
              image: {{image}}
              command: ["sh", "-c"]
              args:
                - |
                  # sh is PID 1: forward SIGTERM to evolve (it interrupts the agent and records `interrupted`),
                  # and count 75 (busy, rate-limited) as a skipped tick, not a failed Job.
                  trap 'kill -TERM $pid 2>/dev/null' TERM INT
                  {{evolve}} --repo /work/repo fire & pid=$!
                  wait $pid; rc=$?
                  while kill -0 $pid 2>/dev/null; do wait $pid; rc=$?; done
                  [ $rc -eq 75 ] && rc=0
                  exit $rc
              env:
                - name: HOME
                  value: /work/home
                # What every fire, its gate and its agent find programs on (the toolchain: see the top).
                - name: PATH
                  value: {{path}}
              envFrom:
                # The agent's credentials (e.g. ANTHROPIC_API_KEY); never in this file.
                - secretRef:
                    name: evolve-agent
                    optional: true
              securityContext:
                allowPrivilegeEscalation: false
              volumeMounts:
                - name: work
                  mountPath: /work
          volumes:
            - name: work
              persistentVolumeClaim:
                claimName: evolve-{{name}}-work
            - name: config
              configMap:
                name: evolve-{{name}}-config
"""
