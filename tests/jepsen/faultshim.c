/* An LD_PRELOAD shim that makes a node's disk misbehave on request (built by the test at start).
 *
 * JL_FAULT_CONTROL names a control file holding "<generation> <mode> <count>":
 *   eio N    the next N fsync/fdatasync calls on a file under JL_FAULT_SCOPE that was written since its
 *            last fsync fail with EIO, as a disk whose writeback failed does (the kernel then marks the
 *            pages clean: the data stays readable from the page cache but is not on disk);
 *   short N  the next N pwrite calls under JL_FAULT_SCOPE write half of what they were given.
 * Each injected fault claims a file "<control>.<generation>.<k>" with O_EXCL, so that N holds across
 * the node's threads, its re-exec and restarts; the claim says what was lost:
 *   "<mode> <inode> <inode generation> <first byte> <end> <path>"
 * and becomes "healed ..." if the same file is later rewritten over that range and fsynced. The test
 * applies the unhealed losses to the image when it emulates a power failure.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAXFD 65536
#define MAXLOST 64

static int64_t dirty_lo[MAXFD], dirty_hi[MAXFD]; /* bytes written since the fd's last fsync */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static const char *control, *scope;
static double last_read = -1;
static long gen, count;
static char mode[16];

struct lost { unsigned long ino; unsigned int version; int64_t lo, hi; char claim[4200]; };
static struct lost lost[MAXLOST];
static int nlost;

static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_write)(int, const void *, size_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);

__attribute__((constructor)) static void init(void) {
    real_pwrite = dlsym(RTLD_NEXT, "pwrite64");
    real_write = dlsym(RTLD_NEXT, "write");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    control = getenv("JL_FAULT_CONTROL");
    scope = getenv("JL_FAULT_SCOPE");
}

/* Re-read the control file at most every 50 ms. Called with the lock held. */
static void refresh(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double now = ts.tv_sec + ts.tv_nsec / 1e9;
    if (!control || now - last_read < 0.05) return;
    last_read = now;
    gen = 0;
    int fd = open(control, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[128];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[n > 0 ? n : 0] = 0;
    if (sscanf(buf, "%ld %15s %ld", &gen, mode, &count) != 3) gen = 0;
}

static int fd_path(int fd, char *out, size_t size) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, size - 1);
    if (n < 0) return 0;
    out[n] = 0;
    return 1;
}

static int armed(const char *what, int fd, char *path, size_t size) {
    if (!gen || strcmp(mode, what) != 0 || !scope || fd < 0 || fd >= MAXFD) return 0;
    return fd_path(fd, path, size) && strncmp(path, scope, strlen(scope)) == 0;
}

/* Take one fault of the current generation, if any is left; record what it loses. */
static int claim(const char *what, int fd, int64_t lo, int64_t hi, const char *path) {
    for (long k = 0; k < count; k++) {
        char name[4200];
        snprintf(name, sizeof name, "%s.%ld.%ld", control, gen, k);
        int c = open(name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (c < 0) {
            if (errno == EEXIST) continue;
            return 0;
        }
        struct stat st;
        unsigned int version = 0;
        fstat(fd, &st);
        ioctl(fd, FS_IOC_GETVERSION, &version);
        char line[4400];
        int len = snprintf(line, sizeof line, "%s %lu %u %lld %lld %s\n", what, (unsigned long)st.st_ino,
                           version, (long long)lo, (long long)hi, path);
        real_write(c, line, len); /* not our write(): the lock is held */
        close(c);
        if (nlost < MAXLOST) {
            struct lost *l = &lost[nlost++];
            l->ino = st.st_ino; l->version = version; l->lo = lo; l->hi = hi;
            snprintf(l->claim, sizeof l->claim, "%s", name);
        }
        return 1;
    }
    return 0;
}

static void mark(int fd, int64_t lo, int64_t hi) {
    if (fd < 0 || fd >= MAXFD || hi <= lo) return;
    if (dirty_hi[fd] <= dirty_lo[fd]) { dirty_lo[fd] = lo; dirty_hi[fd] = hi; return; }
    if (lo < dirty_lo[fd]) dirty_lo[fd] = lo;
    if (hi > dirty_hi[fd]) dirty_hi[fd] = hi;
}

/* A successful fsync of a file rewritten over a lost range makes that range durable again. */
static void heal(int fd) {
    if (!nlost) return;
    struct stat st;
    unsigned int version = 0;
    if (fstat(fd, &st) != 0) return;
    ioctl(fd, FS_IOC_GETVERSION, &version);
    for (int i = 0; i < nlost; i++) {
        struct lost *l = &lost[i];
        if (l->ino != st.st_ino || l->version != version || dirty_lo[fd] > l->lo || dirty_hi[fd] < l->hi) continue;
        int c = open(l->claim, O_WRONLY | O_TRUNC | O_CLOEXEC);
        if (c >= 0) {
            char line[128];
            int len = snprintf(line, sizeof line, "healed %lu %u %lld %lld -\n", l->ino, l->version,
                               (long long)l->lo, (long long)l->hi);
            real_write(c, line, len);
            close(c);
        }
        lost[i] = lost[--nlost];
        i--;
    }
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    char path[4096];
    size_t len = n;
    pthread_mutex_lock(&lock);
    refresh();
    if (n > 1 && armed("short", fd, path, sizeof path) && claim("short", fd, off + n / 2, off + n, path))
        len = n / 2;
    pthread_mutex_unlock(&lock);
    ssize_t r = real_pwrite(fd, buf, len, off);
    if (r > 0) {
        pthread_mutex_lock(&lock);
        mark(fd, off, off + r);
        pthread_mutex_unlock(&lock);
    }
    return r;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) { return pwrite64(fd, buf, n, off); }

ssize_t write(int fd, const void *buf, size_t n) {
    off_t at = lseek(fd, 0, SEEK_CUR); /* -1 for pipes and sockets: nothing to track */
    ssize_t r = real_write(fd, buf, n);
    if (r > 0 && at >= 0) {
        pthread_mutex_lock(&lock);
        mark(fd, at, at + r);
        pthread_mutex_unlock(&lock);
    }
    return r;
}

static int sync_fd(int fd, int (*real)(int)) {
    char path[4096];
    pthread_mutex_lock(&lock);
    refresh();
    int dirty = fd >= 0 && fd < MAXFD && dirty_hi[fd] > dirty_lo[fd];
    if (dirty && armed("eio", fd, path, sizeof path) && claim("eio", fd, dirty_lo[fd], dirty_hi[fd], path)) {
        dirty_lo[fd] = dirty_hi[fd] = 0; /* the kernel forgets the failed pages: a retry succeeds */
        pthread_mutex_unlock(&lock);
        errno = EIO;
        return -1;
    }
    pthread_mutex_unlock(&lock);
    int r = real(fd);
    if (r == 0 && fd >= 0 && fd < MAXFD) {
        pthread_mutex_lock(&lock);
        if (dirty) heal(fd);
        dirty_lo[fd] = dirty_hi[fd] = 0;
        pthread_mutex_unlock(&lock);
    }
    return r;
}

int fsync(int fd) { return sync_fd(fd, real_fsync); }

int fdatasync(int fd) { return sync_fd(fd, real_fdatasync); }
