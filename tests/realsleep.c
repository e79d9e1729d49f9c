/* Preloaded before libfaketime by tests/test_nemeses.py: sleeps on CLOCK_MONOTONIC go straight to
   the kernel. libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC=1 (a wall clock that steps while
   the monotonic one runs on, as on a host whose clock is set) fails them with EINVAL, and Python's
   time.sleep is clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) — every sleep of the fire would
   raise. The monotonic clock is not faked there, so the kernel's sleep is the right one. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/syscall.h>
#include <time.h>
#include <errno.h>
#include <unistd.h>

int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req, struct timespec *rem) {
    if (clock == CLOCK_MONOTONIC) {
        /* clock_nanosleep returns the error number, not -1 and errno */
        return syscall(SYS_clock_nanosleep, clock, flags, req, rem) == 0 ? 0 : errno;
    }
    int (*next)(clockid_t, int, const struct timespec *, struct timespec *) = dlsym(RTLD_NEXT, "clock_nanosleep");
    return next(clock, flags, req, rem);
}
