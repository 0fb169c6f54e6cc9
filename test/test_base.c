/* The error table, the last-error buffer and the log line format. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gb_error.h"
#include "gb_log.h"

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
