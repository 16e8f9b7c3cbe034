/* serve_model.c: MODEL to a container path and a model id (serve_model.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "serve_model.h"

/* The container a mount's manifest.json names. */
static int from_mount(const char *dir, char *path, size_t path_len, struct sl_err *err)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    FILE *f = fopen(p, "rb");
    if (!f) {
        sl_err_set(err, "%s: a directory without manifest.json (not a `sluice mount`)", dir);
        return -EINVAL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap)
            break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    if (!buf) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "container");
    int ret = 0;
    if (!cJSON_IsString(c) || strlen(c->valuestring) >= path_len) {
        sl_err_set(err, "%s: no container named in the mount's manifest.json", dir);
        ret = -EINVAL;
    } else {
        strcpy(path, c->valuestring);
    }
    cJSON_Delete(j);
    return ret;
}

int serve_model_resolve(const char *model, char *path, size_t path_len, char *id, size_t id_len,
                        struct sl_err *err)
{
    struct stat st;
    if (stat(model, &st) < 0) {
        int e = errno;
        sl_err_set(err, "%s: %s", model, strerror(e));
        return -e;
    }
    int ret = 0;
    if (S_ISDIR(st.st_mode))
        ret = from_mount(model, path, path_len, err);
    else if (strlen(model) < path_len)
        strcpy(path, model);
    else
        ret = -ENAMETOOLONG;
    if (ret < 0) {
        if (!err->msg[0])
            sl_err_set(err, "%s: the path is too long", model);
        return ret;
    }
    /* the magic only: no readahead, and its page is dropped again, so that
     * --lazy reads nothing of the model before the first request */
    char head[8] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0)
        posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    ssize_t n = fd >= 0 ? pread(fd, head, sizeof head, 0) : -1;
    if (fd >= 0) {
        posix_fadvise(fd, 0, 4096, POSIX_FADV_DONTNEED);
        close(fd);
    }
    if (n != 8 || memcmp(head, "SLUICE\x1a\n", 8)) {
        sl_err_set(err, "%s: not a .sluice container (convert a model with `sluice import`)",
                   path);
        return -EINVAL;
    }
    /* the id: the model's name without directories and .sluice */
    const char *name = S_ISDIR(st.st_mode) ? path : model;
    const char *b = strrchr(name, '/');
    b = b ? b + 1 : name;
    size_t bl = strlen(b);
    if (bl > 7 && !strcmp(b + bl - 7, ".sluice"))
        bl -= 7;
    if (bl >= id_len)
        bl = id_len - 1;
    memcpy(id, b, bl);
    id[bl] = 0;
    for (char *q = id; *q; q++)
        if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20)
            *q = '_';
    return 0;
}
