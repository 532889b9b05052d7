/*
 * monosleep: keep a process's sleeps on the kernel's clocks while libfaketime
 * shifts its wall clock. Preload it BEFORE libfaketime:
 *
 *   LD_PRELOAD="var/faketime/monosleep.so /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
 *   FAKETIME="+600" FAKETIME_DONT_FAKE_MONOTONIC=1
 *
 * Why: Python 3.11's time.sleep() waits with
 * clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, deadline). libfaketime 0.9.10
 * rewrites that absolute deadline with the wall clock's offset, so the kernel
 * gets a time it refuses (EINVAL, "Invalid argument"); faking the monotonic
 * clock as well makes the deadline consistent but threading waits then hang
 * (wolfcw/libfaketime#426). A monotonic (or boot-time, or CPU-time) deadline has
 * nothing to do with the wall clock, so every clock but CLOCK_REALTIME goes
 * straight to the kernel here; a CLOCK_REALTIME sleep still goes to libfaketime,
 * which maps the shifted deadline back to the real one.
 *
 * Built by infra/faketime (gcc, at test set-up) into var/; never committed as a binary.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_nanosleep_fn)(clockid_t, int, const struct timespec *, struct timespec *);

/* The kernel's clock_nanosleep; like glibc's, it returns the error number (not -1 and errno). */
static int kernel_clock_nanosleep(clockid_t clock_id, int flags, const struct timespec *request,
                                  struct timespec *remain) {
    int saved = errno;
    long rc = syscall(SYS_clock_nanosleep, clock_id, flags, request, remain);
    int error = rc == 0 ? 0 : errno;
    errno = saved; /* clock_nanosleep never sets errno */
    return error;
}

int clock_nanosleep(clockid_t clock_id, int flags, const struct timespec *request,
                    struct timespec *remain) {
    static clock_nanosleep_fn next; /* libfaketime's (or glibc's) clock_nanosleep */
    if (clock_id != CLOCK_REALTIME) {
        return kernel_clock_nanosleep(clock_id, flags, request, remain);
    }
    if (next == NULL) {
        /* A benign race: every thread finds the same address. */
        next = (clock_nanosleep_fn)dlsym(RTLD_NEXT, "clock_nanosleep");
        if (next == NULL) {
            return kernel_clock_nanosleep(clock_id, flags, request, remain);
        }
    }
    return next(clock_id, flags, request, remain);
}
