/* An LD_PRELOAD shim that makes chosen I/O calls fail, for tests/test_nemeses.py (issue 15).

   EVIO_OPS    comma-separated calls to fail: write, pwrite, fsync, rename (renameat, fdatasync too)
   EVIO_MATCH  only calls on a path containing this text (the fd's /proc/self/fd link, or a rename's
               source or target name)
   EVIO_AFTER  the first N matching calls succeed (default 0)
   EVIO_TIMES  then this many fail (default 0: every one after)
   EVIO_ERRNO  the errno they fail with (default ENOSPC)
   EVIO_LOG    a file that gets one line per injected failure ("op path"), so a test knows it hit

   The real calls are found with dlsym(RTLD_NEXT); nothing else is changed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);

static const char *ops = "";
static const char *match = "";
static long after, times, seen, failed;
static int err = ENOSPC;
static const char *logpath;

__attribute__((constructor)) static void evio_init(void) {
    real_write = dlsym(RTLD_NEXT, "write");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_pwrite64 = dlsym(RTLD_NEXT, "pwrite64");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_rename = dlsym(RTLD_NEXT, "rename");
    real_renameat = dlsym(RTLD_NEXT, "renameat");
    const char *v;
    if ((v = getenv("EVIO_OPS"))) ops = v;
    if ((v = getenv("EVIO_MATCH"))) match = v;
    if ((v = getenv("EVIO_AFTER"))) after = atol(v);
    if ((v = getenv("EVIO_TIMES"))) times = atol(v);
    if ((v = getenv("EVIO_ERRNO"))) err = atoi(v);
    logpath = getenv("EVIO_LOG");
}

static int wants(const char *op) {
    size_t n = strlen(op);
    for (const char *p = ops; (p = strstr(p, op)); p += n)
        if ((p == ops || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}

/* Whether this call fails: it is one of EVIO_OPS on a matching path, past EVIO_AFTER, within EVIO_TIMES. */
static int inject(const char *op, const char *path) {
    if (!*match || !wants(op) || !path || !strstr(path, match)) return 0;
    if (++seen <= after || (times && failed >= times)) return 0;
    failed++;
    if (logpath) {
        int fd = open(logpath, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0) {
            char line[4200];
            int len = snprintf(line, sizeof line, "%s %s\n", op, path);
            if (len > 0) real_write(fd, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
            close(fd);
        }
    }
    errno = err;
    return 1;
}

static int fd_inject(const char *op, int fd) {
    if (!*match || !wants(op)) return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return 0;
    path[n] = '\0';
    return inject(op, path);
}

ssize_t write(int fd, const void *buf, size_t n) {
    if (fd_inject("write", fd)) return -1;
    return real_write(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    if (fd_inject("pwrite", fd)) return -1;
    return real_pwrite(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    if (fd_inject("pwrite", fd)) return -1;
    return real_pwrite64(fd, buf, n, off);
}

int fsync(int fd) {
    if (fd_inject("fsync", fd)) return -1;
    return real_fsync(fd);
}

int fdatasync(int fd) {
    if (fd_inject("fsync", fd)) return -1;
    return real_fdatasync(fd);
}

int rename(const char *a, const char *b) {
    if (inject("rename", strstr(a, match) ? a : b)) return -1;
    return real_rename(a, b);
}

int renameat(int da, const char *a, int db, const char *b) {
    if (inject("rename", strstr(a, match) ? a : b)) return -1;
    return real_renameat(da, a, db, b);
}
