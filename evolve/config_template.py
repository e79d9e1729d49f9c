"""The commented config file ``evolve init`` writes; every key of docs/DESIGN.md §10 with its default."""

TEMPLATE = """\
# evolve configuration: .agents/evolve/config.toml (all keys optional; defaults shown).
# Precedence: built-in defaults < this file < EVOLVE_<SECTION>_<KEY> env < command-line flags.
# Unknown keys and wrong types are errors (exit 78) that name the key and this file.

[agent]
# runner = "claude"          # claude | codex | gemini | command | http
# argv = ["claude"]          # claude/codex/gemini: the binary (+ fixed args); command: argv template with
#                            # {prompt_file} {report_file} {session_id} {mode} {work_json} {cycle}
# model = ""                 # claude / codex / gemini / http
# permission_mode = "acceptEdits"   # claude's mode; codex: a sandbox_mode (default workspace-write);
#                                   # gemini: an --approval-mode (default auto_edit)
# allowed_tools = []
# timeout_s = 1800           # hard limit per agent run; the agent's process group is killed
# idle_timeout_s = 600       # no output for this long = hung
# heartbeat_s = 30           # agent.heartbeat log line every this many seconds while the agent runs
# transient_retries = 2      # retries of a run that failed on a 5xx/overloaded/network error
# retry_backoff_s = 30       # first backoff; doubles per retry (a rate limit waits for its reset instead)
# max_turns = 0              # 0 = not passed
# max_budget_usd = 0         # 0 = not passed
# base_url = ""              # http runner; codex: a Responses API provider; gemini: GOOGLE_GEMINI_BASE_URL
# api_key_env = "OPENAI_API_KEY"   # http / codex: env var holding the bearer token (never written anywhere)
# message_budget_chars = 200000   # http runner: history characters per call; the pinned system messages
#                                 # are subtracted once, then the oldest turns are dropped first
# pass_env = []              # extra env names (or PREFIX_*) the agent gets; it always gets PATH, HOME, locale,
#                            # TMPDIR, USER, SHELL, TERM, proxies/CA/XDG dirs, git identity, EVOLVE_*, and
#                            # claude: ANTHROPIC_* CLAUDE_*; codex: CODEX_* OPENAI_* (+ api_key_env);
#                            # gemini: GEMINI_* GOOGLE_*; command: ANTHROPIC_* CLAUDE_* OPENAI_* + api_key_env.
#                            # Nothing else (GITHUB_TOKEN, AWS_*...) unless listed, e.g. ["AWS_*"] for Bedrock

[context]
# streak_limit = 2           # heavy cycles before a hand-off; EVOLVE_CONTEXT_STREAK_LIMIT wins over this
# heavy_pct = 40             # occupancy (input + cache) / window at or above this is a heavy cycle
# returning_fresh_start_turns = 8   # 0 = turn-gap rule disabled
# autocompact_pct = 40       # CLAUDE_AUTOCOMPACT_PCT_OVERRIDE given to the claude runner (codex: with
#                            # context_window, -c model_auto_compact_token_limit; gemini: `evolve setup`)
# context_window = 0         # 0 = from the agent's own report (gemini: 1048576)

[fire]
# max_cycles = 5             # per fire; --cycles overrides
# max_minutes = 55
# max_cost_usd = 0           # 0 = no cap
# mode = "burst"             # burst (may write DORMANT) | loop (logs blocked.jsonl instead)

[schedule]
# cron = "*/30 * * * *"      # 5 fields, or 6 with seconds first (`evolve daemon`; `evolve install` renders it)
# timezone = "UTC"           # an IANA zone; UTC avoids the DST hours
# jitter_s = 0               # up to this many seconds of random delay per fire; systemd timers use it as
#                            # RandomizedDelaySec (0 there = a tenth of the interval, at most 120 s)

[daemon]
# grace_s = 30               # on SIGTERM/SIGINT, wait this long for a running fire to record `interrupted`

[work]
# beads_command = ["bd", "ready", "--json"]
# generators = []            # list of argv lists
# max_attempts = 3
# quality = false            # high, then medium severity harvested findings first
# beads_only = false         # skip goals
# probe_timeout_s = 30       # tracker (bd ready) and generator commands
# goal_timeout_s = 60        # one GOALS check
# goals_timeout_s = 300      # all GOALS checks of one measurement
# max_new_work = 20          # follow-up items queued per agent report (0-1000); the rest are logged, dropped
# claim_visibility_minutes = 0   # another tool's in_progress claim older than this is taken over;
#                                # 0 = fire.max_minutes (an hour when that is 0)
# pass_env = []              # extra env names for the tracker (bd) and generators (BEADS_* always passes)

[gate]
# commands = []              # list of argv lists, run in order after the agent
# timeout_s = 1800
# pass_env = []              # extra env names for gate commands and GOALS checks; they get only PATH, HOME,
#                            # LANG, LC_*, TZ, TMPDIR, USER, LOGNAME, SHELL, TERM, EVOLVE_FIRE_ID otherwise

[breaker]
# max_consecutive_failures = 3
# cooldown_minutes = 30

[git]
# commit = true
# push = false
# run_hooks = false          # true: evolve's own git runs the repo's hooks (never with evolve's secrets)
# sign = false               # true: evolve's commits are signed (gpg gets GNUPGHOME, GPG_TTY, SSH_AUTH_SOCK)
# timeout_s = 300            # one git command's limit, also capped by what is left of [fire] max_minutes;
#                            # a git command that times out fails its step (its process group is killed)
# isolation = "worktree"     # the agent works in evolve's own worktree; green commits land on your branch
#                            # by fast-forward only (your edits and commits are never touched); "none":
#                            # the agent works in your checkout (only when nobody else works in it)
# worktree_dir = ""          # default .agents/evolve/worktree (a stable path: agent sessions resume)
# max_file_mb = 50           # a landing that adds or grows a file past this stays unlanded (0 = no limit)
# setaside_keep_days = 30    # set-aside refs (refs/evolve/...) older than this are dropped; 0 = kept

[land]
# remote = "origin"          # with [git] push: git push <remote> <sha>:<branch> for what landed

[workspace]
# What the agent's worktree needs so the gate tests the code that lands (see README "What the gate sees").
# setup = []                 # argv lists run in the worktree when it is made and when an input changes,
#                            # e.g. [["python3", "-m", "venv", ".venv"], [".venv/bin/pip", "install", "-e", "."]]
# inputs = ["pyproject.toml", "setup.*", "requirements*.txt", "*.lock", "package*.json", "pnpm-lock.yaml", "go.sum"]
#                            # files (globs, at the worktree's top) whose change runs setup again
# link = []                  # checkout paths linked into the worktree, e.g. ["node_modules"]
# copy = []                  # checkout paths copied in, e.g. a gitignored ["local.conf"] the tests read
# path = []                  # worktree dirs put first on PATH for setup, the gate, goal checks and the
#                            # agent: [".venv/bin"]
# setup_timeout_s = 1800     # all setup commands together; the process group is killed after it
# pass_env = []              # extra env names for setup commands (a private registry's token)
# probe = true               # before claiming work, check that the gate imports the worktree's code
#                            # (exit 78 with the fix if not); `evolve doctor` shows what it sees

[halt]
# kill_ttl_days = 7          # hand-written KILL/STOP older than this are ignored (evolve stop/kill: no TTL)
# governor_cmd = []          # argv; exit 3 halts with governor_budget_burned (EVOLVE_GOVERNOR_CMD)
#                            # never a shell: ["bash", "-c", "exit 3"], not "exit 3" (refused at load)
# timeout_s = 30             # governor timeout (EVOLVE_HALT_TIMEOUT)
# pass_env = []              # extra env names for the governor (e.g. the key it reads spend with)

[notify]
# command = []               # argv run on halt, breaker open, hand-off and regression (never a shell);
#                            # the event is JSON on its stdin; best effort, never changes the exit code
# timeout_s = 10             # the notify command's process group is killed after this long
# pass_env = []              # extra env names for the notify command (e.g. a webhook URL variable)

[sandbox]
# The agent, gate commands, setup and goal checks run in bubblewrap (apt-get install bubblewrap): only
# their worktree, their CLI's own files and the paths below writable; config, markers, the ledger, the
# checkout, .git and $HOME read-only (docs/DESIGN.md §8.6).
# mode = "auto"              # auto: bubblewrap where it starts, else unsandboxed with a warning in
#                            # doctor/status; "required": a fire refuses (exit 78) without it; "off"
# network = "all"            # "none": no network at all (--unshare-net; the model API too)
# writable = []              # extra absolute (or ~/) paths they may write, e.g. ["~/.cache/go-build"]

[retention]
# Applied at the end of every fire to evolve's own files under .agents/evolve/; 0 = no limit.
# run_log_max_mb = 50        # one run log: past this, its head and tail are kept (capped while written)
# runs_max_age_days = 30     # runs/: logs older than this are removed
# runs_max_total_mb = 500    # runs/: oldest logs removed until the directory is under this
# fires_max_mb = 10          # fires.jsonl: the newest lines are kept
# cron_log_max_mb = 10       # cron.log: the newest lines are kept
# baselines_max_age_days = 90  # fitness-baselines/: older snapshots are removed
# baselines_max_count = 200  # fitness-baselines/: the newest this many are kept

[metrics]
# textfile_dir = ""          # node_exporter textfile dir: evolve-<repo>-<hash>.prom rewritten after every fire
"""
