/* launch_bench: how fast gpulaunch starts and stops workers.
 *
 *   launch_bench [--runs N] [--nproc P] [--launcher PATH]
 *
 * 1. Runs `gpulaunch --standalone --nproc-per-node P --no-python /bin/true`
 *    N times: median and p90 wall time, the launcher's peak RSS.
 * 2. Crash probe: P workers (this program in worker mode); rank 0 exits 1
 *    after 300 ms and records when; the others record when SIGTERM reaches
 *    them. Prints the worst crash-to-SIGTERM latency over N runs.
 * 3. With --torchrun CMD (e.g. "torchrun"), the same no-op launch through it. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs argv; returns wall seconds, *maxrss_kib of the child (and the
 * descendants it waited for), *status. */
static double run(char *const argv[], long *maxrss_kib, int *status, int quiet) {
    double t0 = now_s();
    pid_t p = fork();
    if (p == 0) {
        if (quiet) {
            int fd = open("/dev/null", O_WRONLY);
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    struct rusage ru;
    int st = 0;
    while (wait4(p, &st, 0, &ru) < 0 && errno == EINTR)
        ;
    *maxrss_kib = ru.ru_maxrss;
    *status = st;
    return now_s() - t0;
}

/* ---- worker mode for the crash probe ---- */

static char stamp_path[512];

static void write_stamp(double t) {
    char buf[64];
    int n = snprintf(buf, sizeof buf, "%.9f\n", t);
    int fd = open(stamp_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        if (write(fd, buf, (size_t)n) != n)
            _exit(3);
        close(fd);
    }
}

static void on_term(int sig) {
    write_stamp(now_s());
    _exit(0);
}

static int worker(const char *dir) {
    const char *r = getenv("RANK");
    int rank = r ? (int)strtol(r, NULL, 10) : 0;
    snprintf(stamp_path, sizeof stamp_path, "%s/t.%d", dir, rank);
    if (rank == 0) {
        usleep(300000);
        write_stamp(now_s());
        _exit(1);
    }
    signal(SIGTERM, on_term);
    for (;;)
        pause();
}

static double read_stamp(const char *dir, int rank) {
    char path[512];
    snprintf(path, sizeof path, "%s/t.%d", dir, rank);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    double t = -1;
    if (fscanf(f, "%lf", &t) != 1)
        t = -1;
    fclose(f);
    unlink(path);
    return t;
}

/* Runs argv `runs` times; prints "launch_bench NAME nproc= runs= median p90 peak RSS".
 * Returns -1 when a run fails. */
static int measure(const char *name, char *const argv[], int runs, int nproc) {
    double *wall = calloc((size_t)runs, sizeof *wall);
    long rss_max = 0;
    if (wall == NULL)
        return -1;
    for (int i = 0; i < runs; i++) {
        long rss;
        int st;
        wall[i] = run(argv, &rss, &st, 1);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "launch_bench: %s failed (status %d)\n", name, st);
            free(wall);
            return -1;
        }
        if (rss > rss_max)
            rss_max = rss;
    }
    qsort(wall, (size_t)runs, sizeof *wall, cmp_double);
    int p90 = (runs * 9) / 10 < runs ? (runs * 9) / 10 : runs - 1;
    printf("launch_bench %s nproc=%d runs=%d median_wall_ms=%.1f p90_wall_ms=%.1f "
           "peak_rss_mib=%.1f\n",
           name, nproc, runs, wall[runs / 2] * 1e3, wall[p90] * 1e3, (double)rss_max / 1024.0);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--worker") == 0)
        return worker(argv[2]);
    int runs = 20, nproc = 8;
    const char *launcher = GPL_LAUNCHER_BIN, *torchrun = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = (int)strtol(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--nproc") == 0 && i + 1 < argc)
            nproc = (int)strtol(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--launcher") == 0 && i + 1 < argc)
            launcher = argv[++i];
        else if (strcmp(argv[i], "--torchrun") == 0 && i + 1 < argc)
            torchrun = argv[++i];
        else {
            fprintf(stderr, "usage: launch_bench [--runs N] [--nproc P] [--launcher PATH] "
                            "[--torchrun CMD]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 10000 || nproc < 2 || nproc > 256) {
        fprintf(stderr, "launch_bench: --runs 1..10000, --nproc 2..256\n");
        return 2;
    }
    char np[16];
    snprintf(np, sizeof np, "%d", nproc);
    char *a[] = {
        (char *)launcher, "--standalone", "--nproc-per-node", np, "--no-python", "/bin/true", NULL};
    if (measure("gpulaunch", a, runs, nproc) != 0)
        return 1;

    /* crash probe */
    char dir[] = "/tmp/launch-bench-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0)
        return 1;
    self[sl] = 0;
    double worst = 0, sum = 0;
    int probes = runs < 10 ? runs : 10;
    for (int i = 0; i < probes; i++) {
        char *c[] = {(char *)launcher,
                     "--standalone",
                     "--nproc-per-node",
                     np,
                     "--no-python",
                     self,
                     "--worker",
                     dir,
                     NULL};
        long rss;
        int st;
        run(c, &rss, &st, 1);
        double crash = read_stamp(dir, 0), late = 0;
        for (int r = 1; r < nproc; r++) {
            double t = read_stamp(dir, r);
            if (t < 0 || crash < 0) {
                fprintf(stderr, "launch_bench: rank %d recorded no SIGTERM\n", r);
                return 1;
            }
            if (t - crash > late)
                late = t - crash;
        }
        sum += late;
        if (late > worst)
            worst = late;
    }
    rmdir(dir);
    printf("launch_bench crash_to_sigterm nproc=%d runs=%d mean_ms=%.2f worst_ms=%.2f\n", nproc,
           probes, sum / probes * 1e3, worst * 1e3);

    if (torchrun) {
        char *t[] = {(char *)torchrun,
                     "--standalone",
                     "--nproc_per_node",
                     np,
                     "--no_python",
                     "/bin/true",
                     NULL};
        if (measure("torchrun", t, runs, nproc) != 0)
            return 1;
    }
    return 0;
}
