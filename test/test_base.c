/* The error table, the last-error buffer, the log line format, the
 * worker's side of the progress channel and what /proc says of a process
 * (its state, its handlers, what it holds). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gb_error.h"
#include "gb_log.h"
#include "gb_proc.h"
#include "gb_procstat.h"
#include "gb_progress.h"

#define GB_COMPONENT "test"

Test(error, every_code_has_a_name_and_message) {
#define CHECK_(name, value, msg)                                                                   \
    cr_expect_str_eq(gpl_result_name(name), #name);                                                \
    cr_expect_str_eq(gpl_strerror(name), msg);
    GPL_RESULTS(CHECK_)
#undef CHECK_
    cr_expect_str_eq(gpl_result_name((gpl_result_t)9999), "GPL_ERR_UNKNOWN");
    cr_expect_str_eq(gpl_strerror((gpl_result_t)9999), "unknown error");
}

Test(error, first_error_wins) {
    gb_err e = GB_ERR_INIT;
    cr_expect_str_eq(gb_errmsg(&e), "success");
    cr_expect_eq(gb_seterr(&e, GPL_ERR_TIMEOUT, "rank %d timed out", 3), GPL_ERR_TIMEOUT);
    cr_expect_eq(gb_seterr(&e, GPL_ERR_CLOSED, "later"), GPL_ERR_CLOSED);
    cr_expect_eq(e.code, GPL_ERR_TIMEOUT);
    cr_expect_str_eq(gb_errmsg(&e), "rank 3 timed out");
    gb_clearerr(&e);
    cr_expect_eq(e.code, GPL_OK);
    cr_expect_eq(gb_seterr(NULL, GPL_ERR_LIMIT, "x"), GPL_ERR_LIMIT);
}

Test(error, long_messages_are_cut_not_overflowed) {
    gb_err e = GB_ERR_INIT;
    char big[2 * GB_ERRMSG_MAX];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    gb_seterr(&e, GPL_ERR_LIMIT, "%s", big);
    cr_expect_eq(strlen(e.msg), GB_ERRMSG_MAX - 1);
}

Test(log, level_parsing) {
    cr_expect_eq(gb_log_parse_level("debug"), GB_LOG_DEBUG);
    cr_expect_eq(gb_log_parse_level("INFO"), GB_LOG_INFO);
    cr_expect_eq(gb_log_parse_level("warning"), GB_LOG_WARN);
    cr_expect_eq(gb_log_parse_level("0"), GB_LOG_ERROR);
    cr_expect_eq(gb_log_parse_level("loud"), -1);
    cr_expect_eq(gb_log_parse_level(NULL), -1);
}

static int side_effects;
static int touch(void) { return ++side_effects; }

Test(log, lines_are_whole_and_tagged_and_filtered) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    gb_log_set_fd(fds[1]);
    gb_log_set_level(GB_LOG_WARN);
    GB_INFO("hidden %d", touch());
    cr_expect_eq(side_effects, 0, "arguments below the level must not be evaluated");
    GB_WARN("visible %d", 42);
    close(fds[1]);
    char buf[512] = {0};
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    cr_assert_gt(n, 0);
    char want[64];
    snprintf(want, sizeof want, " %d test W visible 42\n", (int)getpid());
    cr_expect(strstr(buf, want) != NULL, "got: %s", buf);
    cr_expect_eq(buf[4], '-');
    cr_expect_eq(buf[23], 'Z', "UTC millisecond timestamp first: %s", buf);
    cr_expect_eq(strchr(buf, '\n'), buf + n - 1, "exactly one line");
}

Test(log, level_from_environment) {
    setenv("GPULAUNCH_LOG_LEVEL", "debug", 1);
    cr_expect_eq(gb_log_level(), GB_LOG_DEBUG);
}

/* A region of one slot as the launcher makes it, named in the environment. */
static gb_progress_slot *progress_region(void) {
    int fd = memfd_create("test-progress", 0);
    cr_assert(fd >= 0);
    size_t bytes = gb_progress_region_bytes(1);
    cr_assert_eq(ftruncate(fd, (off_t)bytes), 0);
    gb_progress_header *h = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cr_assert(h != MAP_FAILED);
    h->magic = GB_PROGRESS_MAGIC;
    h->version = GB_PROGRESS_VERSION;
    h->nslots = 1;
    h->slot_bytes = GB_PROGRESS_SLOT_BYTES;
    char v[32];
    snprintf(v, sizeof v, "%d:0", fd);
    setenv("GPULAUNCH_PROGRESS_SHM", v, 1);
    gb_progress_slot *s = gb_progress_attach();
    cr_assert(s != NULL);
    return s;
}

#define COLL_ROUNDS 200000

/* One thread's collectives (a DDP hook's begin and its future's end run on
 * other threads than the step): inside each, the slot must say that the
 * rank waits in a collective. */
static void *coll_thread(void *arg) {
    gb_progress_slot *s = arg;
    long seen_idle = 0;
    for (int i = 0; i < COLL_ROUNDS; i++) {
        gb_progress_coll_begin();
        if (atomic_load(&s->coll_since_ns) == 0)
            seen_idle++;
        gb_progress_coll_end();
        gb_progress_step(i);
    }
    return (void *)seen_idle;
}

Test(progress, collectives_and_steps_from_several_threads) {
    gb_progress_slot *s = progress_region();
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, coll_thread, s), 0);
    long idle = 0;
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(t[i], &r);
        idle += (long)r;
    }
    cr_expect_eq(idle, 0, "%ld times a thread inside a collective saw none in progress", idle);
    cr_expect_eq(atomic_load(&s->steps), 2 * COLL_ROUNDS, "steps %llu of %d reports",
                 (unsigned long long)atomic_load(&s->steps), 2 * COLL_ROUNDS);
    cr_expect_eq(atomic_load(&s->coll_since_ns), 0, "no collective is left in progress");
    cr_expect_geq(atomic_load(&s->colls), 1);
}

static void on_sig(int sig) { (void)sig; }

/* The watchdog sends the stack signal only to a process catching it: one
 * that dropped its handler (an interpreter in its exit) would die of it.
 * (This process itself: a forked child would speak to Criterion's runner.) */
Test(proc, a_handler_is_seen_and_its_removal_too) {
    int sig = SIGRTMIN + 3;
    struct sigaction sa = {.sa_handler = on_sig}, old;
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(sig, &sa, &old), 0);
    cr_expect_eq(gb_proc_catches(getpid(), sig), 1);
    cr_expect_eq(gb_proc_catches(getpid(), SIGRTMIN + 4), 0);
    sa.sa_handler = SIG_DFL;
    cr_assert_eq(sigaction(sig, &sa, NULL), 0);
    cr_expect_eq(gb_proc_catches(getpid(), sig), 0);
    sigaction(sig, &old, NULL);
    cr_expect_eq(gb_proc_catches(getpid(), 0), -1);
    cr_expect_eq(gb_proc_catches(getpid(), 65), -1);
    cr_expect_eq(gb_proc_catches(-1, sig), -1); /* no such process */
}

/* What a process holds, as the launcher's /metrics and the soaks read it:
 * a descriptor opened and a child forked are counted, and gone again once
 * closed and reaped; this process from outside (its pid) reads the same. */
Test(proc, descriptors_threads_and_children_are_counted) {
    gb_procstat a, b;
    cr_assert_eq(gb_procstat_read(0, &a), 0);
    cr_expect_geq(a.threads, 1);
    cr_expect_gt(a.rss_bytes, 0);
    cr_expect_geq(a.vm_bytes, a.rss_bytes);
    cr_expect_geq(a.cpu_s, 0);
    double now = (double)time(NULL);
    cr_expect(a.start_unix_s > now - 3600 && a.start_unix_s <= now + 1, "started %.0f, now %.0f",
              a.start_unix_s, now);
    long fds = gb_procstat_fds(0), kids = gb_procstat_children(0);
    /* its own count leaves out the descriptor it reads through; by pid it is one more */
    cr_expect_eq(gb_procstat_fds(getpid()), fds + 1);
    int fd = dup(0);
    cr_assert_geq(fd, 0);
    cr_expect_eq(gb_procstat_fds(0), fds + 1);
    close(fd);
    cr_expect_eq(gb_procstat_fds(0), fds);
    pid_t c = fork();
    if (c == 0) { /* before any assertion: the child's would reach Criterion's runner */
        pause();
        _exit(0);
    }
    cr_assert_geq(c, 0);
    cr_expect_eq(gb_procstat_children(0), kids + 1);
    kill(c, SIGKILL);
    cr_expect_eq(gb_procstat_children(getpid()), kids + 1, "a zombie is still a child");
    waitpid(c, NULL, 0);
    cr_expect_eq(gb_procstat_children(0), kids);
    cr_expect_eq(gb_procstat_read(c, &b), -1, "a reaped process is gone");
    cr_expect_eq(b.rss_bytes, -1);
    cr_expect_lt(gb_procstat_cpu_exact_s(c), 0, "a reaped process has no CPU time");
}

/* The scheduler's nanosecond count sees a millisecond of work, where clock
 * ticks (10 ms) would not. */
Test(proc, exact_cpu_time_sees_a_millisecond) {
    double t0 = gb_procstat_cpu_exact_s(0);
    cr_assert_geq(t0, 0);
    volatile unsigned long x = 0;
    double t1;
    do {
        for (int i = 0; i < 100000; i++)
            x += (unsigned long)i;
        t1 = gb_procstat_cpu_exact_s(0);
    } while (t1 - t0 < 0.001 && t1 - t0 >= 0);
    cr_expect_geq(t1 - t0, 0.001);
    cr_expect_lt(t1 - t0, 1.0, "%.3f s for a millisecond's loop", t1 - t0);
    cr_expect_geq(gb_procstat_cpu_exact_s(getpid()), t1, "by pid the same process");
}
