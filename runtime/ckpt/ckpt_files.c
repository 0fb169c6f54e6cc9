/* File helpers of the checkpoint room: atomic writes, SHA-256 in pieces (a
 * rank's state may be many GiB: never read whole into memory), step
 * directories, the COMPLETE marker's text. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_int.h"

void ckpt_sha256_hex(const unsigned char md[32], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[64] = '\0';
}

int ckpt_copy_hashed(int in, int out, char hex[65], uint64_t *total, ckpt_progress_fn fn,
                     void *user, uint64_t size) {
    int rc = -1;
    unsigned char md[32];
    unsigned int mdlen = 0;
    uint8_t *buf = malloc(CKPT_IO_PIECE);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    *total = 0;
    if (buf == NULL || ctx == NULL || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
        errno = ENOMEM;
        goto out;
    }
    for (;;) {
        ssize_t n = read(in, buf, CKPT_IO_PIECE);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            goto out;
        if (n == 0)
            break;
        EVP_DigestUpdate(ctx, buf, (size_t)n);
        for (ssize_t o = 0; out >= 0 && o < n;) {
            ssize_t w = write(out, buf + o, (size_t)(n - o));
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                goto out;
            o += w;
        }
        *total += (uint64_t)n;
        if (fn && fn(*total, size, user) != 0) {
            errno = ECANCELED;
            goto out;
        }
    }
    EVP_DigestFinal_ex(ctx, md, &mdlen);
    ckpt_sha256_hex(md, hex);
    rc = 0;
out:
    EVP_MD_CTX_free(ctx);
    free(buf);
    return rc;
}

int ckpt_hash_file(const char *path, char hex[65], uint64_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    *size = 0;
    if (fd < 0)
        return -1;
    int rc = ckpt_copy_hashed(fd, -1, hex, size, NULL, NULL, 0);
    close(fd);
    return rc;
}

int ckpt_fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

static int write_all(int fd, const uint8_t *p, uint64_t len) {
    while (len) {
        ssize_t w = write(fd, p, len > CKPT_IO_PIECE ? CKPT_IO_PIECE : (size_t)len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            return -1;
        }
        p += w;
        len -= (uint64_t)w;
    }
    return 0;
}

int ckpt_write_hashed(int fd, const uint8_t *p, uint64_t len, char hex[65]) {
    unsigned char md[32];
    unsigned int mdlen = 0;
    int rc = -1;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
        errno = ENOMEM;
        goto out;
    }
    /* piece by piece: the piece just hashed is still in cache when it is written */
    for (uint64_t off = 0; off < len; off += CKPT_IO_PIECE) {
        uint64_t n = len - off < CKPT_IO_PIECE ? len - off : CKPT_IO_PIECE;
        if (!EVP_DigestUpdate(ctx, p + off, (size_t)n)) {
            errno = EIO;
            goto out;
        }
        if (write_all(fd, p + off, n) != 0)
            goto out;
    }
    if (!EVP_DigestFinal_ex(ctx, md, &mdlen)) {
        errno = EIO;
        goto out;
    }
    ckpt_sha256_hex(md, hex);
    rc = 0;
out:
    EVP_MD_CTX_free(ctx);
    return rc;
}

int ckpt_write_atomic(const char *dir, const char *name, const void *data, size_t len) {
    char tmp[PATH_MAX], path[PATH_MAX];
    /* the pid keeps two ranks writing the same marker into a shared directory apart */
    snprintf(tmp, sizeof tmp, "%s/.tmp-%d-%s", dir, (int)getpid(), name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    if (write_all(fd, data, len) != 0 || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        errno = e;
        return -1;
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

void ckpt_remove_dir(const char *path) {
    DIR *d = opendir(path);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char f[PATH_MAX];
        snprintf(f, sizeof f, "%s/%s", path, e->d_name);
        unlink(f);
    }
    closedir(d);
    rmdir(path);
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int ckpt_list_steps(const char *dir, int64_t *steps, int max) {
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        long long s;
        char tail;
        if (sscanf(e->d_name, "step-%lld%c", &s, &tail) == 1 && s >= 0)
            steps[n++] = s;
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof *steps, cmp_desc);
    return n;
}

int ckpt_complete_text(char *buf, size_t len, int64_t step, int world) {
    int n =
        snprintf(buf, len, "gpulaunch-checkpoint 1\nstep %lld\nworld %d\n", (long long)step, world);
    return n < 0 || (size_t)n >= len ? -1 : n;
}

int ckpt_complete_parse(const char *buf, size_t len, int64_t step, int *world) {
    char text[128];
    if (len >= sizeof text)
        return 0;
    memcpy(text, buf, len);
    text[len] = '\0';
    long long s = -1;
    int w = 0;
    if (sscanf(text, "gpulaunch-checkpoint 1 step %lld world %d", &s, &w) != 2 || w <= 0 ||
        s != step)
        return 0;
    *world = w;
    return 1;
}

int ckpt_manifest_next(const char **l, ckpt_manifest_line *m) {
    while (**l) {
        unsigned long long size;
        int ok = sscanf(*l, "%159s %llu %64s", m->file, &size, m->sha) == 3;
        const char *nl = strchr(*l, '\n');
        *l = nl ? nl + 1 : *l + strlen(*l);
        if (ok) {
            m->size = size;
            return 1;
        }
    }
    return 0;
}
