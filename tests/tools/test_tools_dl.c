/* test_tools_dl.c: libmicrohttpd and libcurl loaded at first use
 * (tools_dl.c), when they cannot be:
 * - a library file that does not exist (SLUICE_DL_MICROHTTPD / SLUICE_DL_CURL
 *   naming it): tools_dl_mhd / tools_dl_curl return -ENOENT with a sentence
 *   naming the library, what needs it and the loader's reason; every
 *   wrapper returns the library's own failure value (NULL, MHD_NO,
 *   CURLE_FAILED_INIT) and the void ones do nothing; the callers' message
 *   (serve_client_global_init) is that sentence;
 * - a library that loads but lacks the functions (libc named instead):
 *   -ENOENT, the sentence names the first missing function;
 * - the same override naming the real library loads it (so the override
 *   is what made the cases above fail; skipped where the library is not
 *   installed).
 * The outcome is decided once per process, so each case runs in a child of
 * its own; the child reports the first failed check by its exit status and
 * a line on standard error. */
#include <curl/curl.h>
#include <errno.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "serve_client.h"
#include "testutil.h"
#include "tools_dl.h"

#define MISSING "/nonexistent-sluice-test/libmissing.so"

/* In the child: prints the failed check and exits with its line number. */
#define CHECK(c)                                                                          \
    do {                                                                                  \
        if (!(c)) {                                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c);         \
            _exit(__LINE__ % 250 + 1);                                                    \
        }                                                                                 \
    } while (0)

/* Runs fn in a child with `var` set to `value`; its exit status (0: every
 * check passed; 77: skipped). */
static int in_child(const char *var, const char *value, void (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (setenv(var, value, 1) < 0)
            _exit(200);
        fn();
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void mhd_missing(void)
{
    struct sl_err err = {{0}};
    CHECK(tools_dl_mhd(&err) == -ENOENT);
    CHECK(strstr(err.msg, "cannot load libmicrohttpd (needed by sluice serve)") != NULL);
    CHECK(strstr(err.msg, MISSING) != NULL); /* dlerror's reason names the file */
    CHECK(tools_dl_mhd(NULL) == -ENOENT);    /* the same, remembered; err may be NULL */
    struct sl_err again = {{0}};
    CHECK(tools_dl_mhd(&again) == -ENOENT && !strcmp(again.msg, err.msg));
    CHECK(MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, NULL, NULL,
                           MHD_OPTION_END) == NULL);
    char body[] = "x";
    CHECK(MHD_create_response_from_buffer(1, body, MHD_RESPMEM_PERSISTENT) == NULL);
    CHECK(MHD_create_response_from_callback(1, 1, NULL, NULL, NULL) == NULL);
    CHECK(MHD_add_response_header(NULL, "a", "b") == MHD_NO);
    CHECK(MHD_queue_response(NULL, 200, NULL) == MHD_NO);
    CHECK(MHD_get_daemon_info(NULL, MHD_DAEMON_INFO_BIND_PORT) == NULL);
    CHECK(MHD_get_connection_info(NULL, MHD_CONNECTION_INFO_CLIENT_ADDRESS) == NULL);
    CHECK(MHD_lookup_connection_value(NULL, MHD_HEADER_KIND, "Host") == NULL);
    MHD_destroy_response(NULL); /* not forwarded: nothing to call */
    MHD_stop_daemon(NULL);
    /* the other library is untouched by this one's failure */
    struct sl_err cerr = {{0}};
    if (tools_dl_curl(&cerr) < 0)
        CHECK(strstr(cerr.msg, "libcurl") != NULL);
}

static void curl_missing(void)
{
    struct sl_err err = {{0}};
    CHECK(tools_dl_curl(&err) == -ENOENT);
    CHECK(strstr(err.msg, "cannot load libcurl (needed by sluice bench serve)") != NULL);
    CHECK(strstr(err.msg, MISSING) != NULL);
    CHECK(tools_dl_curl(NULL) == -ENOENT);
    CHECK(curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_FAILED_INIT);
    CHECK(curl_easy_init() == NULL);
    CHECK(curl_easy_setopt(NULL, CURLOPT_URL, "http://127.0.0.1/") == CURLE_FAILED_INIT);
    CHECK(curl_easy_perform(NULL) == CURLE_FAILED_INIT);
    long code = 0;
    CHECK(curl_easy_getinfo(NULL, CURLINFO_RESPONSE_CODE, &code) == CURLE_FAILED_INIT);
    CHECK(!strcmp(curl_easy_strerror(CURLE_OK), "libcurl is not loaded"));
    CHECK(curl_slist_append(NULL, "a: b") == NULL);
    curl_slist_free_all(NULL);
    curl_easy_cleanup(NULL);
    /* what `sluice bench serve` prints: the same sentence */
    char msg[512] = "";
    CHECK(serve_client_global_init(msg, sizeof msg) == -1);
    CHECK(!strcmp(msg, err.msg));
}

static void mhd_no_symbols(void)
{
    struct sl_err err = {{0}};
    CHECK(tools_dl_mhd(&err) == -ENOENT);
    CHECK(strstr(err.msg, "libmicrohttpd (needed by sluice serve) has no MHD_start_daemon_va") !=
          NULL);
    CHECK(MHD_start_daemon(0, 0, NULL, NULL, NULL, NULL, MHD_OPTION_END) == NULL);
}

static void curl_no_symbols(void)
{
    struct sl_err err = {{0}};
    CHECK(tools_dl_curl(&err) == -ENOENT);
    CHECK(strstr(err.msg, "libcurl (needed by sluice bench serve) has no curl_global_init") != NULL);
    CHECK(curl_easy_init() == NULL);
}

static void mhd_real(void)
{
    struct sl_err err = {{0}};
    if (tools_dl_mhd(&err) < 0) {
        fprintf(stderr, "skipped: %s\n", err.msg);
        _exit(77);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    CHECK(r != NULL);
    CHECK(MHD_add_response_header(r, "X-Test", "1") == MHD_YES);
    MHD_destroy_response(r);
}

static void curl_real(void)
{
    struct sl_err err = {{0}};
    if (tools_dl_curl(&err) < 0) {
        fprintf(stderr, "skipped: %s\n", err.msg);
        _exit(77);
    }
    CHECK(strcmp(curl_easy_strerror(CURLE_OK), "libcurl is not loaded") != 0);
    CURL *c = curl_easy_init();
    CHECK(c != NULL);
    CHECK(curl_easy_setopt(c, CURLOPT_URL, "http://127.0.0.1/") == CURLE_OK);
    curl_easy_cleanup(c);
}

static void test_missing(void **state)
{
    (void)state;
    assert_int_equal(in_child("SLUICE_DL_MICROHTTPD", MISSING, mhd_missing), 0);
    assert_int_equal(in_child("SLUICE_DL_CURL", MISSING, curl_missing), 0);
}

static void test_no_symbols(void **state)
{
    (void)state;
    assert_int_equal(in_child("SLUICE_DL_MICROHTTPD", "libc.so.6", mhd_no_symbols), 0);
    assert_int_equal(in_child("SLUICE_DL_CURL", "libc.so.6", curl_no_symbols), 0);
}

static void test_real(void **state)
{
    (void)state;
    int a = in_child("SLUICE_DL_MICROHTTPD", "libmicrohttpd.so.12", mhd_real);
    int b = in_child("SLUICE_DL_CURL", "libcurl.so.4", curl_real);
    if (a == 77 && b == 77)
        skip();
    assert_true(a == 0 || a == 77);
    assert_true(b == 0 || b == 77);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing),
        cmocka_unit_test(test_no_symbols),
        cmocka_unit_test(test_real),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
