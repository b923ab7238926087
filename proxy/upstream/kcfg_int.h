/*
 * kcfg_int.h — private to proxy/upstream: the kubeconfig loader's YAML
 * access and message helpers (kcfg_yaml.c), shared by kubeconfig.c (clusters,
 * users, contexts) and kcfg_exec.c (a user's exec credential plugin).
 * Every string they return is new; every message names what is wrong and how
 * to fix it (written into the ctx's err buffer through KCY_FAIL).
 */
#ifndef KWC_UPSTREAM_KCFG_INT_H
#define KWC_UPSTREAM_KCFG_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <yaml.h>

#include "kwc/base.h"

struct kcfg;

#define KCY_NAME_SHOWN 160  /* bytes of a name or path quoted in a message */
#define KCY_NAMES_SHOWN 200 /* bytes of a name list in a message */

struct kcy_ctx {
    yaml_document_t *doc;
    const char *base_dir;
    char *err;
    size_t errlen;
};

#define KCY_FAIL(c, rc, ...) kwc_errf((c)->err, (c)->errlen, (rc), __VA_ARGS__)

/* A name from the file, quoted for a message; valid until the end of the full expression. */
struct kcy_qname {
    char s[KCY_NAME_SHOWN * 4 + 8];
};

/* Bytes from the file, made safe for a terminal: non-printable and non-ASCII as \xHH. */
void kcy_put_escaped(char *buf, size_t cap, size_t *pos, const char *s, size_t len, size_t max);
struct kcy_qname kcy_qn(const char *s, size_t len);
struct kcy_qname kcy_qs(const char *s);
/*
 * Read at most max bytes of path into a new buffer (NUL-terminated, not
 * counted). regular_only refuses anything but a regular file with -EINVAL and
 * never blocks opening a FIFO. Returns 0, -errno or KWC_ETOOBIG.
 */
int kcy_read_file(const char *path, size_t max, bool regular_only, unsigned char **out,
                  size_t *outlen);
const char *kcy_file_reason(int rc);
/* path resolved against base_dir (NULL or "" = "."), new. */
char *kcy_join_path(const char *base_dir, const char *path);
/* path made absolute against the working directory, new in *out. */
int kcy_abs_path(const char *path, char **out);
bool kcy_looks_pem(const unsigned char *p, size_t len);
yaml_node_t *kcy_node_at(struct kcy_ctx *c, int idx);
bool kcy_is_null(const yaml_node_t *n);
const char *kcy_kind_name(const yaml_node_t *n);
/*
 * The value under key in map (NULL map = empty), NULL if absent or null.
 * A key given twice is an error: which one kubectl would pick is not obvious.
 */
int kcy_map_get(struct kcy_ctx *c, const yaml_node_t *map, const char *key, const char *where,
                yaml_node_t **out);
/* Scalar text of n without NULs, borrowed from the document. */
int kcy_scalar(struct kcy_ctx *c, const yaml_node_t *n, const char *key, const char *where,
               const char **s, size_t *len);
/* String field, new in *out; NULL when absent, null or empty. */
int kcy_get_str(struct kcy_ctx *c, const yaml_node_t *map, const char *key, const char *where,
                char **out);
/* Boolean field as YAML 1.1 reads it (what kubectl's YAML library accepts). */
int kcy_get_bool(struct kcy_ctx *c, const yaml_node_t *map, const char *key, const char *where,
                 bool *out);
/* Is key present with a non-null value? */
int kcy_has_key(struct kcy_ctx *c, const yaml_node_t *map, const char *key, const char *where,
                bool *out);
/* Mapping field (NULL when absent or null). */
int kcy_get_map(struct kcy_ctx *c, const yaml_node_t *map, const char *key, const char *where,
                yaml_node_t **out);

/* The exec credential plugin of the user mapping (kcfg_exec.c): fills k->exec
 * (new) when user has exec. cluster is the context's cluster mapping (for
 * KUBERNETES_EXEC_INFO; k's cluster fields are loaded already). */
struct kcfg_exec;
int kcy_load_exec(struct kcy_ctx *c, const yaml_node_t *user, const char *where,
                  const yaml_node_t *cluster, struct kcfg *k);
void kcfg_exec_free(struct kcfg_exec *e);

#endif
