/* The calling thread's name and CPU share (see gb_thread.h). */
#define GB_COMPONENT "runtime"

#include <stdatomic.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gb_log.h"
#include "gb_thread.h"

void gb_thread_name(const char *name) {
    char n[16]; /* the kernel keeps 15 characters and the NUL */
    size_t len = strlen(name);
    if (len > sizeof n - 1)
        len = sizeof n - 1;
    memcpy(n, name, len);
    n[len] = '\0';
    (void)pthread_setname_np(pthread_self(), n);
}

static void gb_thread_lower(void) {
    id_t tid = (id_t)syscall(SYS_gettid);
    errno = 0;
    int now = getpriority(PRIO_PROCESS, tid);
    if (now == -1 && errno != 0)
        return;
    long steps = GB_BACKGROUND_NICE;
    const char *v = getenv("GPULAUNCH_BACKGROUND_NICE");
    if (v && *v) {
        char *end;
        long n = strtol(v, &end, 10);
        static atomic_int said;
        if (*end == '\0' && n >= 0 && n <= 19)
            steps = n;
        else if (!atomic_exchange(&said, 1))
            GB_WARN("GPULAUNCH_BACKGROUND_NICE=%s is not a number from 0 to 19: background threads "
                    "run %d nice steps below training (the default)",
                    v, GB_BACKGROUND_NICE);
    }
    int want = now + (int)steps;
    (void)setpriority(PRIO_PROCESS, tid, want > 19 ? 19 : want);
}

void gb_thread_background(const char *name) {
    gb_thread_lower(); /* before the name: a thread seen by its name runs lower already */
    gb_thread_name(name);
}
