/* gpulaunch: the project's one error enum, shared by the runtime, the
 * rendezvous service and the launcher. Codes are append-only. */
#ifndef GPULAUNCH_GPL_ERROR_H
#define GPULAUNCH_GPL_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(GPL_BUILDING) && defined(__GNUC__)
#define GPL_API __attribute__((visibility("default")))
#else
#define GPL_API
#endif

/* X(name, value, message). The message says what went wrong in general; the
 * per-handle or per-call last-error string says where and what to do. */
#define GPL_RESULTS(X)                                                                             \
    X(GPL_OK, 0, "success")                                                                        \
    X(GPL_ERR_INVALID_ARG, 1, "invalid argument")                                                  \
    X(GPL_ERR_NOMEM, 2, "out of memory")                                                           \
    X(GPL_ERR_SYSTEM, 3, "system call failed")                                                     \
    X(GPL_ERR_TIMEOUT, 4, "timed out")                                                             \
    X(GPL_ERR_PROTOCOL, 5, "protocol error")                                                       \
    X(GPL_ERR_AUTH, 6, "authentication failed")                                                    \
    X(GPL_ERR_CLOSED, 7, "connection closed")                                                      \
    X(GPL_ERR_LIMIT, 8, "limit exceeded")                                                          \
    X(GPL_ERR_NOT_FOUND, 9, "not found")                                                           \
    X(GPL_ERR_EXISTS, 10, "already exists")                                                        \
    X(GPL_ERR_STATE, 11, "operation not valid in this state")                                      \
    X(GPL_ERR_PEER_FAILED, 12, "a peer rank failed")                                               \
    X(GPL_ERR_ROUND_OVER, 13, "the rendezvous round is over")                                      \
    X(GPL_ERR_UNSUPPORTED, 14, "not supported by this build")                                      \
    X(GPL_ERR_CUDA, 15, "CUDA error")                                                              \
    X(GPL_ERR_NCCL, 16, "NCCL error")                                                              \
    X(GPL_ERR_CONFIG, 17, "configuration error")                                                   \
    X(GPL_ERR_PREEMPTED, 18, "checkpoint requested: the job is being preempted")                   \
    X(GPL_ERR_CORRUPT, 19, "data is corrupt")

typedef enum gpl_result {
#define GPL_RESULT_ENUM_(name, value, msg) name = value,
    GPL_RESULTS(GPL_RESULT_ENUM_)
#undef GPL_RESULT_ENUM_
} gpl_result_t;

/* "GPL_ERR_TIMEOUT" for GPL_ERR_TIMEOUT; "GPL_ERR_UNKNOWN" for a value not in the table. */
GPL_API const char *gpl_result_name(gpl_result_t r);
/* "timed out" for GPL_ERR_TIMEOUT; "unknown error" for a value not in the table. */
GPL_API const char *gpl_strerror(gpl_result_t r);

#ifdef __cplusplus
}
#endif
#endif
