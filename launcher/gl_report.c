/* The failure report (see gl_report.h). */
#include "gl_report.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "gl_gpumon.h"
#include "gl_workers.h"

void gl_report_failure(const gl_failure *f, const gl_errfile *ef, const char *ef_path,
                       const char *hostname, unsigned node_rank, const char *log_dir) {
    char when[64];
    time_t t = (time_t)f->when;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    char what[1100];
    if (f->hung)
        snprintf(what, sizeof what, "hung: %s", f->why);
    else if (f->signal)
        snprintf(what, sizeof what, "signal %d (%s)", f->signal, gl_signame(f->signal));
    else
        snprintf(what, sizeof what, "exit code %lld", (long long)f->exit_code);
    /* what the worker wrote (torch's @record), read when it failed: its
     * message and traceback as lines */
    char efs[2 * sizeof(gl_errfile) + PATH_MAX + 64] = "(none written)\n";
    if (ef) {
        size_t o = (size_t)snprintf(efs, sizeof efs, "%s\n", ef_path);
        if (ef->message[0] && o < sizeof efs)
            o += (size_t)snprintf(efs + o, sizeof efs - o, "  error      : %s\n", ef->message);
        if (ef->trace[0] && o < sizeof efs) {
            o += (size_t)snprintf(efs + o, sizeof efs - o, "  traceback  :\n");
            for (const char *p = ef->trace; *p && o < sizeof efs;) {
                size_t n = strcspn(p, "\n");
                o += (size_t)snprintf(efs + o, sizeof efs - o, "    %.*s\n", (int)n, p);
                p += n + (p[n] == '\n');
            }
        }
        if (ef->raw[0] && o < sizeof efs)
            snprintf(efs + o, sizeof efs - o, "  (not the JSON of @record; it begins:) %s\n",
                     ef->raw);
    }
    fprintf(stderr,
            "\n========== gpulaunch: job failed ==========\n"
            "first failure (root cause):\n"
            "  time       : %s\n"
            "  node       : %s (node rank %u)\n"
            "  rank       : %d (local rank %d)\n"
            "  pid        : %d\n"
            "  result     : %s\n"
            "  error file : %s"
            "  last stderr lines:\n%s",
            when, hostname, node_rank, f->rank, f->local_rank, f->pid, what, efs,
            f->tail[0] ? f->tail : "    (none)\n");
    gl_gpumon_report(stderr); /* XID errors of the job's GPUs, with their ranks */
    fprintf(stderr, "==========================================\n");
    if (log_dir && log_dir[0]) {
        char path[PATH_MAX];
        mkdir(log_dir, 0755); /* as the workers' logs would have */
        snprintf(path, sizeof path, "%s/failure.json", log_dir);
        FILE *j = fopen(path, "w");
        if (j) {
            fprintf(j,
                    "{\"time\":\"%s\",\"node\":\"%s\",\"node_rank\":%u,\"rank\":%d,"
                    "\"local_rank\":%d,\"pid\":%d,\"exit_code\":%lld,\"signal\":%d,"
                    "\"hung\":%s,\"gpu_errors\":",
                    when, hostname, node_rank, f->rank, f->local_rank, f->pid,
                    (long long)f->exit_code, f->signal, f->hung ? "true" : "false");
            gl_gpumon_json(j);
            fprintf(j, "}\n");
            fclose(j);
        }
    }
}
