"""Process exit codes (docs/DESIGN.md §9); 75 and 78 are BSD sysexits that schedulers understand."""

OK = 0
ERROR = 1
USAGE = 2
TEMPFAIL = 75  # busy, rate-limited: try again at the next trigger
CONFIG = 78
SIGINT = 130
SIGTERM = 143
