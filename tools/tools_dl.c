/* tools_dl.c: see tools_dl.h. */
#define CURL_DISABLE_TYPECHECK 1 /* curl_easy_setopt is defined below, not a macro */
#include "tools_dl.h"

#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One library: its candidate names (soname first), the symbols to resolve
 * and where their addresses go. */
struct dl_sym {
    const char *name;
    void **slot;
};

struct dl_lib {
    const char *what;      /* for the error: "libmicrohttpd (sluice serve)" */
    const char *env;       /* names the one file to load instead (tools_dl.h) */
    const char *names[3];  /* tried in order, NULL-terminated */
    const struct dl_sym *syms;
    pthread_once_t once;
    int ret;               /* 0 or -ENOENT, set once */
    char why[256];
};

/* Opens the first name that loads and resolves every symbol; on any failure
 * nothing is kept (every slot stays NULL). */
static void dl_open(struct dl_lib *l)
{
    void *h = NULL;
    const char *msg = "not found";
    const char *only = secure_getenv(l->env);
    const char *one[2] = {only, NULL};
    const char *const *names = only && *only ? one : l->names;
    for (int i = 0; names[i] && !h; i++) {
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h)
            msg = dlerror();
    }
    if (!h) {
        snprintf(l->why, sizeof l->why, "cannot load %s: %s", l->what, msg ? msg : "not found");
        l->ret = -ENOENT;
        return;
    }
    void *addr[32];
    int n = 0;
    for (; l->syms[n].name; n++) {
        addr[n] = dlsym(h, l->syms[n].name);
        if (!addr[n]) {
            snprintf(l->why, sizeof l->why, "%s has no %s (too old?)", l->what, l->syms[n].name);
            dlclose(h);
            l->ret = -ENOENT;
            return;
        }
    }
    for (int i = 0; i < n; i++)
        *l->syms[i].slot = addr[i];
    l->ret = 0; /* the handle stays open for the life of the process */
}

/* ---- libmicrohttpd ------------------------------------------------------ */

static struct {
    struct MHD_Daemon *(*start_daemon_va)(unsigned, uint16_t, MHD_AcceptPolicyCallback, void *,
                                          MHD_AccessHandlerCallback, void *, va_list);
    void (*stop_daemon)(struct MHD_Daemon *);
    const union MHD_DaemonInfo *(*get_daemon_info)(struct MHD_Daemon *, enum MHD_DaemonInfoType,
                                                   ...);
    const union MHD_ConnectionInfo *(*get_connection_info)(struct MHD_Connection *,
                                                           enum MHD_ConnectionInfoType, ...);
    const char *(*lookup_connection_value)(struct MHD_Connection *, enum MHD_ValueKind,
                                           const char *);
    struct MHD_Response *(*create_from_buffer)(size_t, void *, enum MHD_ResponseMemoryMode);
    struct MHD_Response *(*create_from_callback)(uint64_t, size_t, MHD_ContentReaderCallback,
                                                 void *, MHD_ContentReaderFreeCallback);
    enum MHD_Result (*add_response_header)(struct MHD_Response *, const char *, const char *);
    enum MHD_Result (*queue_response)(struct MHD_Connection *, unsigned, struct MHD_Response *);
    void (*destroy_response)(struct MHD_Response *);
} mhd;

static const struct dl_sym mhd_syms[] = {
    {"MHD_start_daemon_va", (void **)&mhd.start_daemon_va},
    {"MHD_stop_daemon", (void **)&mhd.stop_daemon},
    {"MHD_get_daemon_info", (void **)&mhd.get_daemon_info},
    {"MHD_get_connection_info", (void **)&mhd.get_connection_info},
    {"MHD_lookup_connection_value", (void **)&mhd.lookup_connection_value},
    {"MHD_create_response_from_buffer", (void **)&mhd.create_from_buffer},
    {"MHD_create_response_from_callback", (void **)&mhd.create_from_callback},
    {"MHD_add_response_header", (void **)&mhd.add_response_header},
    {"MHD_queue_response", (void **)&mhd.queue_response},
    {"MHD_destroy_response", (void **)&mhd.destroy_response},
    {NULL, NULL},
};

static struct dl_lib mhd_lib = {
    .what = "libmicrohttpd (needed by sluice serve)",
    .env = "SLUICE_DL_MICROHTTPD",
    .names = {"libmicrohttpd.so.12", "libmicrohttpd.so", NULL},
    .syms = mhd_syms,
    .once = PTHREAD_ONCE_INIT,
};

static void mhd_open(void)
{
    dl_open(&mhd_lib);
}

int tools_dl_mhd(struct sl_err *err)
{
    (void)pthread_once(&mhd_lib.once, mhd_open);
    if (mhd_lib.ret < 0 && err)
        sl_err_set(err, "%s", mhd_lib.why);
    return mhd_lib.ret;
}

struct MHD_Daemon *MHD_start_daemon(unsigned int flags, uint16_t port, MHD_AcceptPolicyCallback apc,
                                    void *apc_cls, MHD_AccessHandlerCallback dh, void *dh_cls, ...)
{
    if (tools_dl_mhd(NULL) < 0)
        return NULL;
    va_list ap;
    va_start(ap, dh_cls);
    struct MHD_Daemon *d = mhd.start_daemon_va(flags, port, apc, apc_cls, dh, dh_cls, ap);
    va_end(ap);
    return d;
}

void MHD_stop_daemon(struct MHD_Daemon *daemon)
{
    if (tools_dl_mhd(NULL) == 0)
        mhd.stop_daemon(daemon);
}

/* The info types Sluice asks for take no further argument. */
const union MHD_DaemonInfo *MHD_get_daemon_info(struct MHD_Daemon *daemon,
                                                enum MHD_DaemonInfoType info_type, ...)
{
    return tools_dl_mhd(NULL) < 0 ? NULL : mhd.get_daemon_info(daemon, info_type);
}

const union MHD_ConnectionInfo *MHD_get_connection_info(struct MHD_Connection *connection,
                                                        enum MHD_ConnectionInfoType info_type, ...)
{
    return tools_dl_mhd(NULL) < 0 ? NULL : mhd.get_connection_info(connection, info_type);
}

const char *MHD_lookup_connection_value(struct MHD_Connection *connection, enum MHD_ValueKind kind,
                                        const char *key)
{
    return tools_dl_mhd(NULL) < 0 ? NULL : mhd.lookup_connection_value(connection, kind, key);
}

struct MHD_Response *MHD_create_response_from_buffer(size_t size, void *buffer,
                                                     enum MHD_ResponseMemoryMode mode)
{
    return tools_dl_mhd(NULL) < 0 ? NULL : mhd.create_from_buffer(size, buffer, mode);
}

struct MHD_Response *MHD_create_response_from_callback(uint64_t size, size_t block_size,
                                                       MHD_ContentReaderCallback crc, void *crc_cls,
                                                       MHD_ContentReaderFreeCallback crfc)
{
    return tools_dl_mhd(NULL) < 0 ? NULL
                                  : mhd.create_from_callback(size, block_size, crc, crc_cls, crfc);
}

enum MHD_Result MHD_add_response_header(struct MHD_Response *response, const char *header,
                                        const char *content)
{
    return tools_dl_mhd(NULL) < 0 ? MHD_NO : mhd.add_response_header(response, header, content);
}

enum MHD_Result MHD_queue_response(struct MHD_Connection *connection, unsigned int status_code,
                                   struct MHD_Response *response)
{
    return tools_dl_mhd(NULL) < 0 ? MHD_NO
                                  : mhd.queue_response(connection, status_code, response);
}

void MHD_destroy_response(struct MHD_Response *response)
{
    if (tools_dl_mhd(NULL) == 0)
        mhd.destroy_response(response);
}

/* ---- libcurl ------------------------------------------------------------ */

static struct {
    CURLcode (*global_init)(long);
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
    CURLcode (*easy_perform)(CURL *);
    CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
    void (*easy_cleanup)(CURL *);
    const char *(*easy_strerror)(CURLcode);
    struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
    void (*slist_free_all)(struct curl_slist *);
} cu;

static const struct dl_sym curl_syms[] = {
    {"curl_global_init", (void **)&cu.global_init},
    {"curl_easy_init", (void **)&cu.easy_init},
    {"curl_easy_setopt", (void **)&cu.easy_setopt},
    {"curl_easy_perform", (void **)&cu.easy_perform},
    {"curl_easy_getinfo", (void **)&cu.easy_getinfo},
    {"curl_easy_cleanup", (void **)&cu.easy_cleanup},
    {"curl_easy_strerror", (void **)&cu.easy_strerror},
    {"curl_slist_append", (void **)&cu.slist_append},
    {"curl_slist_free_all", (void **)&cu.slist_free_all},
    {NULL, NULL},
};

static struct dl_lib curl_lib = {
    .what = "libcurl (needed by sluice bench serve)",
    .env = "SLUICE_DL_CURL",
    .names = {"libcurl.so.4", "libcurl.so", NULL},
    .syms = curl_syms,
    .once = PTHREAD_ONCE_INIT,
};

static void curl_open(void)
{
    dl_open(&curl_lib);
}

int tools_dl_curl(struct sl_err *err)
{
    (void)pthread_once(&curl_lib.once, curl_open);
    if (curl_lib.ret < 0 && err)
        sl_err_set(err, "%s", curl_lib.why);
    return curl_lib.ret;
}

CURLcode curl_global_init(long flags)
{
    return tools_dl_curl(NULL) < 0 ? CURLE_FAILED_INIT : cu.global_init(flags);
}

CURL *curl_easy_init(void)
{
    return tools_dl_curl(NULL) < 0 ? NULL : cu.easy_init();
}

/* The argument's type follows from the option's range, as in curl.h's
 * CURLOPTTYPE_* (long, object pointer, function pointer, curl_off_t, blob). */
CURLcode curl_easy_setopt(CURL *curl, CURLoption option, ...)
{
    if (tools_dl_curl(NULL) < 0)
        return CURLE_FAILED_INIT;
    va_list ap;
    va_start(ap, option);
    CURLcode rc;
    if (option < CURLOPTTYPE_OBJECTPOINT) {
        long v = va_arg(ap, long);
        rc = cu.easy_setopt(curl, option, v);
    } else if (option < CURLOPTTYPE_FUNCTIONPOINT) {
        void *v = va_arg(ap, void *);
        rc = cu.easy_setopt(curl, option, v);
    } else if (option < CURLOPTTYPE_OFF_T) {
        void (*v)(void) = va_arg(ap, void (*)(void));
        rc = cu.easy_setopt(curl, option, v);
    } else if (option < CURLOPTTYPE_BLOB) {
        curl_off_t v = va_arg(ap, curl_off_t);
        rc = cu.easy_setopt(curl, option, v);
    } else {
        void *v = va_arg(ap, void *);
        rc = cu.easy_setopt(curl, option, v);
    }
    va_end(ap);
    return rc;
}

CURLcode curl_easy_perform(CURL *curl)
{
    return tools_dl_curl(NULL) < 0 ? CURLE_FAILED_INIT : cu.easy_perform(curl);
}

/* Every CURLINFO takes one pointer to the result. */
CURLcode curl_easy_getinfo(CURL *curl, CURLINFO info, ...)
{
    if (tools_dl_curl(NULL) < 0)
        return CURLE_FAILED_INIT;
    va_list ap;
    va_start(ap, info);
    void *p = va_arg(ap, void *);
    va_end(ap);
    return cu.easy_getinfo(curl, info, p);
}

void curl_easy_cleanup(CURL *curl)
{
    if (tools_dl_curl(NULL) == 0)
        cu.easy_cleanup(curl);
}

const char *curl_easy_strerror(CURLcode code)
{
    return tools_dl_curl(NULL) < 0 ? "libcurl is not loaded" : cu.easy_strerror(code);
}

struct curl_slist *curl_slist_append(struct curl_slist *list, const char *s)
{
    return tools_dl_curl(NULL) < 0 ? NULL : cu.slist_append(list, s);
}

void curl_slist_free_all(struct curl_slist *list)
{
    if (tools_dl_curl(NULL) == 0)
        cu.slist_free_all(list);
}
