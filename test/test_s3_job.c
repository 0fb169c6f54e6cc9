/* A training job (dp_train under gpulaunch) with S3 as its durable tier,
 * against moto behind test/s3_proxy.py (s3_fixture.h): draining through an
 * outage, restoring from S3 alone, and a notice whose drain outlasts the
 * deadline. Without GPL_S3_PYTHON the tests skip, saying how to run them. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_s3.h"
#include "harness.h"
#include "s3_fixture.h"

TestSuite(s3, .init = setup, .fini = teardown, .timeout = 60);

/* ---- a training job with S3 as its durable tier -------------------------------- */

#define GL GPL_BUILD_DIR "/launcher/gpulaunch"
#define DP GPL_BUILD_DIR "/examples/dp_train"

/* 2 workers of dp_train with 8 MiB of state each, a checkpoint every 20 steps
 * into `local`, drained to s3://ckpts/job7 (none when !durable). */
/* dp_train, 2 ranks, checkpointing every 20 steps to local and, when durable,
 * draining to s3://BUCKET/job7; grace: the launcher's --shutdown-timeout (NULL:
 * its default). */
static void start_job_grace(proc *p, const char *local, const char *steps, const char *sleep_ms,
                            int durable, const char *grace) {
    char *argv[32];
    int n = 0;
    argv[n++] = GL;
    argv[n++] = "--standalone";
    argv[n++] = "--nproc-per-node";
    argv[n++] = "2";
    if (grace) {
        argv[n++] = "--shutdown-timeout";
        argv[n++] = (char *)grace;
    }
    char *job[] = {DP,   "--steps",          (char *)steps,    "--global-batch",
                   "32", "--print-every",    "100000",         "--state-mib",
                   "8",  "--checkpoint-dir", (char *)local,    "--checkpoint-every",
                   "20", "--step-sleep-ms",  (char *)sleep_ms, NULL};
    for (int i = 0; job[i]; i++)
        argv[n++] = job[i];
    if (durable) {
        argv[n++] = "--checkpoint-durable";
        argv[n++] = "s3://" BUCKET "/job7";
    }
    argv[n] = NULL;
    cr_assert_eq(proc_start(p, argv, NULL), 0);
}

static void start_job(proc *p, const char *local, const char *steps, const char *sleep_ms,
                      int durable) {
    start_job_grace(p, local, steps, sleep_ms, durable, NULL);
}

static void rank0_sha(const proc *p, char out[65]) {
    const char *s = strstr(p->out, "rank 0 params_sha256 ");
    cr_assert_not_null(s, "%s", p->out);
    cr_assert_eq(sscanf(s, "rank 0 params_sha256 %64s", out), 1);
}

Test(s3, a_job_drains_to_s3_goes_on_through_an_outage_and_restores_from_s3_alone, .timeout = 180) {
    NEED_SERVER();
    servers(1, 0, "0");
    setenv("GPULAUNCH_S3_PART_BYTES", "5242880", 1); /* 8 MiB a rank: a multipart upload */
    setenv("GPULAUNCH_S3_RETRIES", "2", 1);
    char local[128], ref[128], cmd[300];
    snprintf(local, sizeof local, "%s/nvme", dir);
    snprintf(ref, sizeof ref, "%s/ref", dir);
    ctl("fail?code=503&n=3"); /* SlowDown at first: retried */
    proc p;
    start_job(&p, local, "150", "30", 1);
    cr_assert(proc_expect(&p, "durable: every rank", 30000), "%s", p.out);
    ctl("down"); /* S3 gone for a second while the job trains: drains fail, training goes on */
    usleep(1200000);
    ctl("up");
    int st = proc_wait(&p, 90000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "drain to the durable tier of step") != NULL &&
                  strstr(p.out, "training goes on") != NULL,
              "a drain failed during the outage, said with the tier: %s", p.out);
    /* the last checkpoint (step 140), made complete in S3 by gpl_ckpt_wait */
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    char buf[128];
    size_t len = 0;
    gb_err e = GB_ERR_INIT;
    cr_assert_eq(ckpt_s3_get(s, "step-000000000140/COMPLETE", buf, sizeof buf, &len, &e), GPL_OK,
                 "%s", e.msg);
    ckpt_s3_close(s);
    /* every local disk gone: the job restores from S3 alone, bitwise */
    snprintf(cmd, sizeof cmd, "rm -rf %s", local);
    cr_assert_eq(system(cmd), 0);
    start_job(&p, local, "140", "0", 1);
    st = proc_wait(&p, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    cr_expect(strstr(p.out, "resumed from the checkpoint of step 140") != NULL, "%s", p.out);
    cr_expect(strstr(p.out, "fetched from the durable tier s3://" BUCKET "/job7") != NULL, "%s",
              p.out);
    char got[65], want[65];
    rank0_sha(&p, got);
    start_job(&p, ref, "140", "0", 0); /* the same 140 steps, never interrupted */
    st = proc_wait(&p, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    rank0_sha(&p, want);
    cr_expect_str_eq(got, want, "restored from S3 %s, uninterrupted %s", got, want);
}

/* A notice whose drain to S3 cannot finish before the deadline (every part
 * held up at the server): the launcher still exits 143 within the grace, says
 * which step is the newest durable one, and S3 holds no COMPLETE marker of the
 * preempted step: a job without its disks restores that older step. */
Test(s3, a_notice_whose_drain_outlasts_the_deadline_names_the_newest_durable_step, .timeout = 180) {
    NEED_SERVER();
    servers(1, 0, "0");
    setenv("GPULAUNCH_S3_PART_BYTES", "5242880", 1);
    setenv("GPULAUNCH_S3_RETRIES", "2", 1);
    char local[128], cmd[300];
    snprintf(local, sizeof local, "%s/nvme", dir);
    proc p;
    start_job_grace(&p, local, "100000", "30", 1, "6");
    cr_assert(proc_expect(&p, "durable: every rank", 30000), "%s", p.out);
    ctl("delay-part?ms=30000"); /* from now on no part reaches S3 in time */
    usleep(1500000);
    uint64_t t0 = now_ms();
    kill(p.pid, SIGTERM);
    int st = proc_wait(&p, 30000);
    uint64_t took = now_ms() - t0;
    ctl("delay-part?ms=0");
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 143, "status %d after %llu ms: %s", st,
              (unsigned long long)took, p.out);
    /* the workers end themselves: the drain in flight is dropped at the deadline */
    cr_expect(took < 6000 && strstr(p.out, "sending SIGKILL") == NULL,
              "exit %llu ms after the notice (grace 6 s): %s", (unsigned long long)took, p.out);
    const char *w = strstr(p.out, " written on this node but not durable before the deadline");
    cr_assert_not_null(w, "%s", p.out);
    long written = -1, durable = -1;
    while (w > p.out && strncmp(w, "checkpoint: step ", 17) != 0)
        w--;
    sscanf(w, "checkpoint: step %ld", &written);
    const char *d = strstr(p.out, "the newest durable step is ");
    cr_assert_not_null(d, "%s", p.out);
    sscanf(d, "the newest durable step is %ld", &durable);
    cr_assert(written > durable && durable >= 20, "written %ld, durable %ld: %s", written, durable,
              p.out);
    cr_log_info("notice with S3 held up: exit 143 after %llu ms (grace 6 s), step %ld written "
                "locally, newest durable step %ld",
                (unsigned long long)took, written, durable);
    ckpt_s3 *s = open_ok("s3://" BUCKET "/job7");
    char key[96], buf[128];
    size_t len = 0;
    gb_err e = GB_ERR_INIT;
    snprintf(key, sizeof key, "step-%012ld/COMPLETE", written);
    cr_expect_neq(ckpt_s3_get(s, key, buf, sizeof buf, &len, &e), GPL_OK,
                  "the undrained step %ld is marked COMPLETE in S3", written);
    snprintf(key, sizeof key, "step-%012ld/COMPLETE", durable);
    cr_expect_eq(ckpt_s3_get(s, key, buf, sizeof buf, &len, &e), GPL_OK, "%s", e.msg);
    ckpt_s3_close(s);
    /* every local disk gone: the newest durable step is what comes back */
    snprintf(cmd, sizeof cmd, "rm -rf %s", local);
    cr_assert_eq(system(cmd), 0);
    char steps[32], want[96];
    snprintf(steps, sizeof steps, "%ld", durable);
    start_job(&p, local, steps, "0", 1);
    st = proc_wait(&p, 60000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d: %s", st, p.out);
    snprintf(want, sizeof want, "resumed from the checkpoint of step %ld", durable);
    cr_expect(strstr(p.out, want) != NULL, "%s", p.out);
}
