/* What the progress channel costs (docs/health.md, docs/performance.md):
 * 1. per report, in a process attached to a real region: gpl_progress and a
 *    gpl_progress_wait_begin/end pair, against the anchor a channel with a
 *    system call would cost (one write(2) of the step to a pipe);
 * 2. per training step: dp_train under the launcher with the channel, the
 *    watchdog and 0.5 s summaries on, against the same job with them off
 *    (--progress-timeout 0 --stats-interval 0: no channel at all), runs
 *    alternated, medians.
 * usage: progress_bench [--reports N] [--runs R] [--steps S] [--nproc P] */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gb_progress.h"
#include "gpulaunch/gpulaunch.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int micro(long reports) {
    int fd = memfd_create("bench-progress", MFD_CLOEXEC);
    size_t bytes = gb_progress_region_bytes(1);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0)
        return 1;
    gb_progress_header *h = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED)
        return 1;
    h->magic = GB_PROGRESS_MAGIC;
    h->version = GB_PROGRESS_VERSION;
    h->nslots = 1;
    h->slot_bytes = GB_PROGRESS_SLOT_BYTES;
    char v[32];
    snprintf(v, sizeof v, "%d:0", fd);
    setenv("GPULAUNCH_PROGRESS_SHM", v, 1);
    gpl_progress(0); /* attach */
    double t0 = now_s();
    for (long i = 1; i <= reports; i++)
        gpl_progress(i);
    double step_ns = (now_s() - t0) / (double)reports * 1e9;
    t0 = now_s();
    for (long i = 1; i <= reports; i++) {
        gpl_progress_wait_begin();
        gpl_progress_wait_end();
    }
    double pair_ns = (now_s() - t0) / (double)reports * 1e9;
    const gb_progress_slot *s = (const gb_progress_slot *)((char *)h + GB_PROGRESS_SLOT_BYTES);
    if (atomic_load(&s->steps) != (uint64_t)reports + 1 ||
        atomic_load(&s->colls) != (uint64_t)reports) {
        fprintf(stderr, "progress_bench: the slot did not count the reports\n");
        return 1;
    }
    int p[2];
    if (pipe(p) != 0)
        return 1;
    long n = reports / 10;
    t0 = now_s();
    for (long i = 1; i <= n; i++) {
        char line[32];
        int l = snprintf(line, sizeof line, "%ld\n", i);
        if (write(p[1], line, (size_t)l) != l)
            return 1;
        if (i % 512 == 0) { /* drain, as the launcher would */
            char buf[65536];
            if (read(p[0], buf, sizeof buf) < 0)
                return 1;
        }
    }
    double pipe_ns = (now_s() - t0) / (double)n * 1e9;
    printf("per report (%ld reports): gpl_progress %.1f ns, a collective's "
           "wait_begin+end %.1f ns; anchor, write(2) to a pipe: %.1f ns\n",
           reports, step_ns, pair_ns, pipe_ns);
    return 0;
}

/* The job's wall time, seconds; -1 on failure. */
static double job(const char *gl, const char *dp, int on, int steps, int nproc) {
    char st[16], np[16];
    snprintf(st, sizeof st, "%d", steps);
    snprintf(np, sizeof np, "%d", nproc);
    char *on_args[] = {(char *)gl,
                       "--standalone",
                       "--nproc-per-node",
                       np,
                       "--progress-timeout",
                       "30",
                       "--stats-interval",
                       "0.5",
                       (char *)dp,
                       "--steps",
                       st,
                       "--print-every",
                       "1000000",
                       NULL};
    char *off_args[] = {(char *)gl,
                        "--standalone",
                        "--nproc-per-node",
                        np,
                        "--progress-timeout",
                        "0",
                        "--stats-interval",
                        "0",
                        (char *)dp,
                        "--steps",
                        st,
                        "--print-every",
                        "1000000",
                        NULL};
    double t0 = now_s();
    pid_t pid = fork();
    if (pid == 0) {
        int nul = open("/dev/null", O_WRONLY);
        dup2(nul, 1);
        dup2(nul, 2);
        execv(gl, on ? on_args : off_args);
        _exit(127);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
        return -1;
    return now_s() - t0;
}

int main(int argc, char **argv) {
    long reports = 10000000;
    int runs = 5, steps = 3000, nproc = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--reports") == 0)
            reports = strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--runs") == 0)
            runs = (int)strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--steps") == 0)
            steps = (int)strtol(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--nproc") == 0)
            nproc = (int)strtol(argv[i + 1], NULL, 10);
    }
    if (micro(reports) != 0)
        return 1;
    unsetenv("GPULAUNCH_PROGRESS_SHM");
    setenv("PET_SHM_MIN", "16m", 0);
    setenv("PET_PREEMPTION_SOURCE", "none", 0);
    double on[64], off[64];
    if (runs > 64)
        runs = 64;
    for (int r = 0; r < runs; r++) {
        off[r] = job(GPL_LAUNCHER_BIN, GPL_DP_BIN, 0, steps, nproc);
        on[r] = job(GPL_LAUNCHER_BIN, GPL_DP_BIN, 1, steps, nproc);
        if (on[r] < 0 || off[r] < 0) {
            fprintf(stderr, "progress_bench: a dp_train job failed\n");
            return 1;
        }
    }
    double mon = median(on, runs), moff = median(off, runs);
    printf("dp_train, %d workers x %d steps, %d runs each, medians: channel + watchdog + 0.5 s "
           "summaries %.1f us/step, off %.1f us/step: %+.2f %%\n",
           nproc, steps, runs, mon / steps * 1e6, moff / steps * 1e6, (mon - moff) / moff * 100);
    return 0;
}
