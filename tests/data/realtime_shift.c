/* LD_PRELOAD shim that shifts only the real-time clock of the process it is loaded into.
 *
 * clock_gettime(CLOCK_REALTIME[_COARSE]), gettimeofday and time return the real time plus an offset in
 * nanoseconds (a little-endian int64) read from the file named by $REALTIME_SHIFT_FILE, which is
 * mapped, so a test steps the clock of a running process by writing to the file. CLOCK_MONOTONIC
 * and sleeps are untouched (libfaketime moves the monotonic clock too, or breaks time.sleep).
 * Build: gcc -shared -fPIC -O2 -o realtime_shift.so realtime_shift.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *offset_ns;
static int (*real_clock_gettime)(clockid_t, struct timespec *);

static int64_t shift(void) {
    if (!offset_ns) {
        const char *path = getenv("REALTIME_SHIFT_FILE");
        if (!path) return 0;
        int fd = open(path, O_RDONLY);
        if (fd < 0) return 0;
        void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) return 0;
        offset_ns = p;
    }
    return *offset_ns;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (!real_clock_gettime) real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real_clock_gettime(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        int64_t ns = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec + shift();
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    (void)tz;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    return 0;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
