/* tools_dl.h: libmicrohttpd and libcurl, loaded at first use (dlopen)
 * instead of at every start of `sluice`.
 *
 * Linked normally, the two pull about 30 shared libraries (GnuTLS, OpenSSL,
 * Kerberos, LDAP, ...) into every process; from a dropped page cache the
 * dynamic loader reads and relocates them before main(), about 50 ms of a
 * cold `sluice run` that uses none of them. tools_dl.c defines the library
 * functions Sluice calls (MHD_start_daemon, curl_easy_perform, ...) as thin
 * wrappers that forward to the real ones, resolved the first time any is
 * called, so the call sites stay the library's own API.
 *
 * Call tools_dl_mhd / tools_dl_curl before the first use to get a clear
 * error when the library is missing; a wrapper called while its library
 * cannot be loaded returns the library's own failure value (NULL, MHD_NO,
 * CURLE_FAILED_INIT). Thread-safe.
 *
 * SLUICE_DL_MICROHTTPD / SLUICE_DL_CURL, when set (and the process is not
 * setuid), name the one file to dlopen instead of the sonames: for tests of
 * the missing-library message, or a library outside the loader's path. Read
 * once, at the first use. */
#ifndef SLUICE_TOOLS_DL_H
#define SLUICE_TOOLS_DL_H

#include "common.h"

/* Loads libmicrohttpd; 0, or -ENOENT with a sentence in err (may be NULL). */
int tools_dl_mhd(struct sl_err *err);
/* Loads libcurl; 0, or -ENOENT with a sentence in err (may be NULL). */
int tools_dl_curl(struct sl_err *err);

#endif
