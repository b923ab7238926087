/*
 * kcfg_yaml.c — the kubeconfig loader's helpers (kcfg_int.h): quoting names
 * from the file for messages, reading referenced files with bounds, and typed
 * access to libyaml document nodes (a key given twice is an error, null is
 * absent). No state of its own.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem, explicit_bzero */
#endif
#include "kcfg_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kwc/kubeconfig.h"

/* ---- messages ---- */

/* Bytes from the file, made safe for a terminal: non-printable and non-ASCII as \xHH. */
void
kcy_put_escaped(char *buf, size_t cap, size_t *pos, const char *s, size_t len, size_t max)
{
    size_t p = *pos;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        char tmp[5];
        int n;
        if (i >= max) {
            n = snprintf(tmp, sizeof tmp, "...");
        } else if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\') {
            tmp[0] = (char)ch;
            n = 1;
        } else {
            n = snprintf(tmp, sizeof tmp, "\\x%02x", ch);
        }
        if (p + (size_t)n + 1 > cap)
            break;
        memcpy(buf + p, tmp, (size_t)n);
        p += (size_t)n;
        if (i >= max)
            break;
    }
    buf[p] = '\0';
    *pos = p;
}

struct kcy_qname
kcy_qn(const char *s, size_t len)
{
    struct kcy_qname q;
    size_t p = 1;
    q.s[0] = '"';
    kcy_put_escaped(q.s, sizeof q.s - 1, &p, s, len, KCY_NAME_SHOWN);
    q.s[p++] = '"';
    q.s[p] = '\0';
    return q;
}

struct kcy_qname
kcy_qs(const char *s)
{
    return kcy_qn(s, strlen(s));
}

/* ---- files -------------------------------------------------------------- */

/*
 * Read at most max bytes of path into a new buffer (NUL-terminated, not
 * counted). regular_only refuses anything but a regular file with -EINVAL and
 * never blocks opening a FIFO. Returns 0, -errno or KWC_ETOOBIG.
 */
int
kcy_read_file(const char *path, size_t max, bool regular_only, unsigned char **out, size_t *outlen)
{
    int flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | (regular_only ? O_NONBLOCK : 0);
    unsigned char *buf = NULL;
    size_t cap, n = 0;
    struct stat st;
    int rc = 0;

    int fd = open(path, flags);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = -EISDIR;
        goto out;
    }
    if (regular_only && !S_ISREG(st.st_mode)) {
        rc = -EINVAL;
        goto out;
    }
    if (S_ISREG(st.st_mode) && (uintmax_t)st.st_size > max) {
        rc = KWC_ETOOBIG;
        goto out;
    }
    /* One byte past max tells "exactly max" from "more". */
    cap = S_ISREG(st.st_mode) && st.st_size > 0 && (size_t)st.st_size <= max
              ? (size_t)st.st_size + 1
              : (max < 65536 ? max + 1 : 65536);
    buf = xmalloc(cap + 1);
    for (;;) {
        if (n == cap) {
            if (cap > max)
                break;
            cap = cap * 2 > max + 1 ? max + 1 : cap * 2;
            buf = xrealloc(buf, cap + 1);
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            goto out;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (n > max) {
        rc = KWC_ETOOBIG;
        goto out;
    }
    buf[n] = '\0';
    *out = buf;
    *outlen = n;
    buf = NULL;
out:
    if (buf) {
        explicit_bzero(buf, n);
        free(buf);
    }
    close(fd);
    return rc;
}

const char *
kcy_file_reason(int rc)
{
    if (rc == KWC_ETOOBIG)
        return "larger than the 4 MiB limit";
    if (rc == -EINVAL)
        return "not a regular file";
    return kwc_strerror(rc);
}

/* path resolved against base_dir (NULL or "" = "."), new. */
char *
kcy_join_path(const char *base_dir, const char *path)
{
    if (path[0] == '/' || !base_dir || !*base_dir)
        return xstrdup(path);
    return xasprintf("%s/%s", base_dir, path);
}

/* path made absolute against the working directory, new in *out. */
int
kcy_abs_path(const char *path, char **out)
{
    if (path[0] == '/') {
        *out = xstrdup(path);
        return 0;
    }
    char *cwd = getcwd(NULL, 0);
    if (!cwd)
        return -errno;
    while (path[0] == '.' && path[1] == '/')
        path += 2;
    *out = xasprintf("%s/%s", strcmp(cwd, "/") == 0 ? "" : cwd, path);
    free(cwd);
    return 0;
}

bool
kcy_looks_pem(const unsigned char *p, size_t len)
{
    return memmem(p, len, "-----BEGIN ", 11) != NULL;
}

/* ---- YAML access -------------------------------------------------------- */

yaml_node_t *
kcy_node_at(struct kcy_ctx *c, int idx)
{
    return yaml_document_get_node(c->doc, idx);
}

bool
kcy_is_null(const yaml_node_t *n)
{
    if (!n)
        return true;
    if (n->type != YAML_SCALAR_NODE)
        return false;
    if (n->tag && strcmp((const char *)n->tag, YAML_NULL_TAG) == 0)
        return true;
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    size_t len = n->data.scalar.length;
    return len == 0 || (len == 1 && v[0] == '~') ||
           (len == 4 && (!memcmp(v, "null", 4) || !memcmp(v, "Null", 4) || !memcmp(v, "NULL", 4)));
}

const char *
kcy_kind_name(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_SCALAR_NODE:
        return "a string";
    case YAML_SEQUENCE_NODE:
        return "a list";
    case YAML_MAPPING_NODE:
        return "a mapping";
    default:
        return "empty";
    }
}

/*
 * The value under key in map (NULL map = empty), NULL if absent or null.
 * A key given twice is an error: which one kubectl would pick is not obvious.
 */
int
kcy_map_get(struct kcy_ctx *c, const yaml_node_t *map, const char *key, const char *where,
            yaml_node_t **out)
{
    yaml_node_t *found = NULL;
    bool seen = false;
    size_t klen = strlen(key);
    *out = NULL;
    if (!map)
        return 0;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = kcy_node_at(c, p->key);
        if (!k || k->type != YAML_SCALAR_NODE || k->data.scalar.length != klen ||
            memcmp(k->data.scalar.value, key, klen) != 0)
            continue;
        if (seen)
            return KCY_FAIL(c, KWC_ECONFIG, "%s: key %s appears twice; keep one", where, key);
        seen = true;
        found = kcy_node_at(c, p->value);
    }
    *out = kcy_is_null(found) ? NULL : found;
    return 0;
}

/* Scalar text of n without NULs, borrowed from the document. */
int
kcy_scalar(struct kcy_ctx *c, const yaml_node_t *n, const char *key, const char *where,
           const char **s, size_t *len)
{
    if (n->type != YAML_SCALAR_NODE)
        return KCY_FAIL(c, KWC_ECONFIG, "%s: %s must be a string, not %s", where, key,
                        kcy_kind_name(n));
    *s = (const char *)n->data.scalar.value;
    *len = n->data.scalar.length;
    if (memchr(*s, '\0', *len))
        return KCY_FAIL(c, KWC_ECONFIG, "%s: %s contains a NUL byte", where, key);
    return 0;
}

/* String field, new in *out; NULL when absent, null or empty. */
int
kcy_get_str(struct kcy_ctx *c, const yaml_node_t *map, const char *key, const char *where,
            char **out)
{
    yaml_node_t *n;
    const char *s;
    size_t len;
    int rc;
    *out = NULL;
    if ((rc = kcy_map_get(c, map, key, where, &n)) || !n)
        return rc;
    if ((rc = kcy_scalar(c, n, key, where, &s, &len)))
        return rc;
    if (len)
        *out = xstrndup(s, len);
    return 0;
}

/* Boolean field as YAML 1.1 reads it (what kubectl's YAML library accepts). */
int
kcy_get_bool(struct kcy_ctx *c, const yaml_node_t *map, const char *key, const char *where,
             bool *out)
{
    const char *const yes[] = {"y",  "Y",  "yes",  "Yes",  "YES", "on",
                               "On", "ON", "true", "True", "TRUE"};
    const char *const no[] = {"n",   "N",   "no",    "No",    "NO",   "off",
                              "Off", "OFF", "false", "False", "FALSE"};
    yaml_node_t *n;
    const char *s;
    size_t len;
    int rc;
    *out = false;
    if ((rc = kcy_map_get(c, map, key, where, &n)) || !n)
        return rc;
    if ((rc = kcy_scalar(c, n, key, where, &s, &len)))
        return rc;
    for (size_t i = 0; i < KWC_ARRAY_LEN(yes); i++) {
        if (strlen(yes[i]) == len && memcmp(yes[i], s, len) == 0) {
            *out = true;
            return 0;
        }
        if (strlen(no[i]) == len && memcmp(no[i], s, len) == 0)
            return 0;
    }
    return KCY_FAIL(c, KWC_ECONFIG, "%s: %s must be true or false, not %s", where, key,
                    kcy_qn(s, len).s);
}

/* Is key present with a non-null value? */
int
kcy_has_key(struct kcy_ctx *c, const yaml_node_t *map, const char *key, const char *where,
            bool *out)
{
    yaml_node_t *n;
    int rc = kcy_map_get(c, map, key, where, &n);
    *out = n != NULL;
    return rc;
}

/* Mapping field (NULL when absent or null). */
int
kcy_get_map(struct kcy_ctx *c, const yaml_node_t *map, const char *key, const char *where,
            yaml_node_t **out)
{
    int rc = kcy_map_get(c, map, key, where, out);
    if (rc == 0 && *out && (*out)->type != YAML_MAPPING_NODE)
        rc = KCY_FAIL(c, KWC_ECONFIG, "%s: %s must be a mapping, not %s", where, key,
                      kcy_kind_name(*out));
    if (rc)
        *out = NULL;
    return rc;
}
