/* s3_bench: a checkpoint file's upload to S3 by the checkpoints' client
 * (runtime/ckpt/s3/: a multipart upload with parts in parallel) and its
 * download back, timed; test/bench/ckpt_bench.sh puts one `curl -T` of the
 * same file beside it (docs/performance.md). The endpoint and credentials
 * come from the environment as for any checkpoint (docs/checkpoints.md).
 *
 *   s3_bench s3://bucket/prefix FILE
 *
 * prints: s3_bench bytes=... put_s=... put_MBs=... get_s=... get_MBs=... requests=... */
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_s3.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: s3_bench s3://BUCKET/PREFIX FILE\n");
        return 2;
    }
    gb_err e = GB_ERR_INIT;
    ckpt_s3 *s = NULL;
    struct stat st;
    int fd = open(argv[2], O_RDONLY | O_CLOEXEC), out = -1, rc = 1;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror(argv[2]);
        return 1;
    }
    if (ckpt_s3_open(argv[1], &s, &e) != GPL_OK)
        goto out;
    double t0 = now_s();
    if (ckpt_s3_put_file(s, "s3_bench", fd, (uint64_t)st.st_size, NULL, NULL, &e) != GPL_OK)
        goto out;
    double put = now_s() - t0;
    char back[4096];
    snprintf(back, sizeof back, "%s.back", argv[2]);
    out = open(back, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    uint64_t size = 0;
    t0 = now_s();
    if (out < 0 || ckpt_s3_get_file(s, "s3_bench", out, &size, NULL, NULL, &e) != GPL_OK)
        goto out;
    double get = now_s() - t0;
    unlink(back);
    ckpt_s3_stats ss;
    ckpt_s3_stats_get(s, &ss);
    double mb = (double)st.st_size / 1e6;
    printf("s3_bench bytes=%lld put_s=%.3f put_MBs=%.1f get_s=%.3f get_MBs=%.1f requests=%llu "
           "retries=%llu\n",
           (long long)st.st_size, put, mb / put, get, mb / get, (unsigned long long)ss.requests,
           (unsigned long long)ss.retries);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "s3_bench: %s\n", gb_errmsg(&e));
    if (out >= 0)
        close(out);
    close(fd);
    if (s)
        ckpt_s3_close(s);
    return rc;
}
