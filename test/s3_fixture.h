/* test_s3's and test_s3_job's fixture (s3_fixture.c): moto's server behind
 * test/s3_proxy.py, a fake IMDS, the environment that points the client at
 * them, HTTP to their control endpoints, and test data. */
#ifndef GPL_S3_FIXTURE_H
#define GPL_S3_FIXTURE_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckpt_s3.h"

#define PROXY_PY GPL_SOURCE_DIR "/test/s3_proxy.py"
#define BUCKET "ckpts"
#define MiB (1u << 20)

typedef struct child {
    pid_t pid;
    char log[128];
} child;

extern char dir[64];
extern const char *py;
extern child moto, proxy, imds;
extern int moto_port, proxy_port, imds_port;
extern char key_id[128], secret[128], role_arn[256], sts_key[128], sts_secret[128];
extern char sts_token[CKPT_S3_TOKEN_MAX];

void spawn(child *c, const char *name, char *const argv[]);
void stop(child *c);
size_t slurp(const char *path, char *buf, size_t cap);
void show_log(const child *c);
int wait_listening(child *c);
void moto_start(void);
void moto_setup(int enforce, int free_actions);
void servers(int enforce, int free_actions, const char *proxy_clock);
/* the suite's init and fini: a temporary dir, a clean environment; servers() starts moto */
void setup(void);
void teardown(void);
long http(const char *method, const char *url, const char *const *hdrs, char *out, size_t cap);
void ctl(const char *what);
json_t *stats_of(int port, const char *path);
long stat_of(const char *a, const char *b);
unsigned char *pattern(size_t n, unsigned seed);
int file_with(const char *name, const unsigned char *b, size_t n);
int same_as(ckpt_s3 *s, const char *key, const unsigned char *b, size_t n);
ckpt_s3 *open_ok(const char *url);

#define NEED_SERVER()                                                                              \
    do {                                                                                           \
        if (py == NULL)                                                                            \
            cr_skip_test("GPL_S3_PYTHON is not set: configure with "                               \
                         "-DGPULAUNCH_S3_PYTHON=$(scripts/s3server.sh | tail -n 1) to test the "   \
                         "S3 client against moto");                                                \
    } while (0)

#endif
