/*
 * kubeconfig.c — upstream connection settings from a kubeconfig file or the
 * in-cluster ServiceAccount mount (see kubeconfig.h).
 *
 * Sits before the data path: main loads a struct kcfg once and the upstream
 * client reads it. Owns nothing long-lived; every call returns a new struct
 * or nothing.
 *
 * Parsing: libyaml's event parser first walks the text once to bound node
 * count and nesting (the document API has no limits of its own), then the
 * document API loads it. The loader shares aliased nodes instead of copying
 * them, and this file only walks a fixed depth below the root, so aliases
 * and cycles cost nothing. Validation follows client-go where it refuses a
 * file (duplicate names, cert without key, both file and -data, token with
 * basic auth, a CA with insecure-skip-tls-verify) so kwc and kubectl agree on
 * what a kubeconfig means; what kwc cannot honour (credential plugins,
 * impersonation, proxy-url) is refused rather than silently ignored.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem, explicit_bzero */
#endif
#include "kwc/kubeconfig.h"

#include "kwc/base.h"

#include "kcfg_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

/* ---- named lists: clusters, users, contexts ----------------------------- */

struct named {
    const char *name; /* borrowed from the document; no NUL inside */
    size_t len;
    yaml_node_t *body; /* the cluster/user/context mapping, NULL if absent */
};

struct list {
    const char *what; /* "cluster" */
    struct named *v;  /* sorted by name */
    size_t n;
};

static int
cmp_named(const void *a, const void *b)
{
    const struct named *x = a, *y = b;
    size_t m = x->len < y->len ? x->len : y->len;
    int d = memcmp(x->name, y->name, m);
    if (d)
        return d;
    return (x->len > y->len) - (x->len < y->len);
}

/*
 * Load the top-level list key ("clusters") whose entries are {name, field}
 * ("cluster"), sorted, refusing duplicate names as client-go does.
 */
static int
list_load(struct kcy_ctx *c, const yaml_node_t *root, const char *key, const char *field,
          struct list *l)
{
    yaml_node_t *seq;
    char where[64];
    int rc;

    l->what = field;
    l->v = NULL;
    l->n = 0;
    if ((rc = kcy_map_get(c, root, key, "kubeconfig", &seq)) || !seq)
        return rc;
    if (seq->type != YAML_SEQUENCE_NODE)
        return KCY_FAIL(c, KWC_ECONFIG, "kubeconfig: %s must be a list of {name, %s}, not %s", key,
                        field, kcy_kind_name(seq));
    size_t cnt = (size_t)(seq->data.sequence.items.top - seq->data.sequence.items.start);
    l->v = xcalloc(cnt, sizeof *l->v);
    for (size_t i = 0; i < cnt; i++) {
        yaml_node_t *item = kcy_node_at(c, seq->data.sequence.items.start[i]), *name;
        struct named *e = &l->v[l->n];
        snprintf(where, sizeof where, "%s[%zu]", key, i);
        if (kcy_is_null(item) || item->type != YAML_MAPPING_NODE)
            return KCY_FAIL(c, KWC_ECONFIG, "kubeconfig: %s must be a mapping with name and %s",
                            where, field);
        if ((rc = kcy_map_get(c, item, "name", where, &name)))
            return rc;
        if (!name)
            return KCY_FAIL(c, KWC_ECONFIG, "kubeconfig: %s has no name; give every %s a name",
                            where, field);
        if ((rc = kcy_scalar(c, name, "name", where, &e->name, &e->len)))
            return rc;
        if ((rc = kcy_get_map(c, item, field, where, &e->body)))
            return rc;
        l->n++;
    }
    if (l->n > 1) /* qsort(NULL, 0, ...) is undefined */
        qsort(l->v, l->n, sizeof *l->v, cmp_named);
    for (size_t i = 1; i < l->n; i++)
        if (cmp_named(&l->v[i - 1], &l->v[i]) == 0)
            return KCY_FAIL(c, KWC_ECONFIG,
                            "kubeconfig: %s name %s is defined twice in %s; names must be unique",
                            field, kcy_qn(l->v[i].name, l->v[i].len).s, key);
    return 0;
}

static const struct named *
list_find(const struct list *l, const char *name)
{
    struct named key = {.name = name, .len = strlen(name)};
    return l->n ? bsearch(&key, l->v, l->n, sizeof *l->v, cmp_named) : NULL;
}

/* "dev, staging" for messages, or "none". */
struct names {
    char s[KCY_NAMES_SHOWN + 16];
};

static struct names
list_names(const struct list *l)
{
    struct names r;
    size_t p = 0;
    snprintf(r.s, sizeof r.s, "none");
    for (size_t i = 0; i < l->n; i++) {
        char one[KCY_NAME_SHOWN * 4 + 8];
        size_t n = 0;
        kcy_put_escaped(one, sizeof one, &n, l->v[i].name, l->v[i].len, KCY_NAME_SHOWN);
        if (p + 2 + n > KCY_NAMES_SHOWN) {
            snprintf(r.s + p, sizeof r.s - p, "%s...", i ? ", " : "");
            break;
        }
        p += (size_t)snprintf(r.s + p, sizeof r.s - p, "%s%s", i ? ", " : "", one);
    }
    return r;
}

/* ---- resolving a context ------------------------------------------------ */

/* A certificate/key from a file path or -data field of body; at most one of them. */
static int
get_pem(struct kcy_ctx *c, const yaml_node_t *body, const char *fkey, const char *dkey,
        const char *where, unsigned char **pem, size_t *pemlen)
{
    char *file = NULL, *data = NULL, *path = NULL;
    int rc;

    if ((rc = kcy_get_str(c, body, fkey, where, &file)) ||
        (rc = kcy_get_str(c, body, dkey, where, &data)))
        goto out;
    if (file && data) {
        rc = KCY_FAIL(c, KWC_ECONFIG, "%s sets both %s and %s; keep one", where, fkey, dkey);
        goto out;
    }
    if (data) {
        if (kwc_base64_decode(data, strlen(data), pem, pemlen) != 0) {
            rc = KCY_FAIL(c, KWC_ECONFIG, "%s: %s is not valid base64", where, dkey);
            goto out;
        }
        *pem = xrealloc(*pem, *pemlen + 1);
        (*pem)[*pemlen] = '\0';
        if (!kcy_looks_pem(*pem, *pemlen)) {
            rc = KCY_FAIL(c, KWC_ECONFIG,
                          "%s: %s does not decode to PEM (no -----BEGIN line); it must be the "
                          "base64 of the PEM file",
                          where, dkey);
            goto out;
        }
    } else if (file) {
        path = kcy_join_path(c->base_dir, file);
        if ((rc = kcy_read_file(path, KCFG_MAX_FILE, true, pem, pemlen))) {
            KCY_FAIL(c, rc,
                     "%s: cannot read %s %s: %s (relative paths are resolved against the "
                     "kubeconfig's directory)",
                     where, fkey, kcy_qs(path).s, kcy_file_reason(rc));
            goto out;
        }
        if (!kcy_looks_pem(*pem, *pemlen)) {
            rc = KCY_FAIL(c, KWC_ECONFIG, "%s: %s %s is not PEM (no -----BEGIN line)", where, fkey,
                          kcy_qs(path).s);
            goto out;
        }
    }
out:
    if (rc && *pem) {
        explicit_bzero(*pem, *pemlen);
        free(*pem);
        *pem = NULL;
        *pemlen = 0;
    }
    if (data)
        explicit_bzero(data, strlen(data));
    free(data);
    free(file);
    free(path);
    return rc;
}

static int
check_server(struct kcy_ctx *c, char *server, const char *where)
{
    size_t len = strlen(server);
    char *host;
    if (strncasecmp(server, "https://", 8) == 0)
        host = server + 8;
    else if (strncasecmp(server, "http://", 7) == 0)
        host = server + 7;
    else
        return KCY_FAIL(c, KWC_ECONFIG,
                        "%s: server %s is not an http(s) URL; write it as https://HOST:PORT", where,
                        kcy_qs(server).s);
    for (const char *p = server; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f)
            return KCY_FAIL(c, KWC_ECONFIG, "%s: server %s contains spaces or control characters",
                            where, kcy_qs(server).s);
    while (server + len > host && server[len - 1] == '/')
        server[--len] = '\0';
    if (!*host)
        return KCY_FAIL(c, KWC_ECONFIG, "%s: server %s has no host; write it as https://HOST:PORT",
                        where, kcy_qs(server).s);
    return 0;
}

static int
load_cluster(struct kcy_ctx *c, const struct named *e, struct kcfg *k)
{
    char where[KCY_NAME_SHOWN * 4 + 32];
    bool proxy;
    int rc;

    snprintf(where, sizeof where, "cluster %s", kcy_qn(e->name, e->len).s);
    if ((rc = kcy_get_str(c, e->body, "server", where, &k->server)))
        return rc;
    if (!k->server)
        return KCY_FAIL(c, KWC_ECONFIG,
                        "%s has no server; set clusters[].cluster.server to the API server URL, "
                        "e.g. https://10.0.0.1:6443",
                        where);
    if ((rc = check_server(c, k->server, where)))
        return rc;
    if ((rc = kcy_has_key(c, e->body, "proxy-url", where, &proxy)))
        return rc;
    if (proxy)
        return KCY_FAIL(c, KWC_EUNSUPPORTED,
                        "%s sets proxy-url, which kwc does not support; remove it to connect "
                        "directly",
                        where);
    if ((rc = kcy_get_str(c, e->body, "tls-server-name", where, &k->tls_server_name)) ||
        (rc = kcy_get_bool(c, e->body, "insecure-skip-tls-verify", where,
                           &k->insecure_skip_tls_verify)) ||
        (rc = get_pem(c, e->body, "certificate-authority", "certificate-authority-data", where,
                      &k->ca_pem, &k->ca_pem_len)))
        return rc;
    if (k->insecure_skip_tls_verify && k->ca_pem)
        return KCY_FAIL(c, KWC_ECONFIG,
                        "%s sets both insecure-skip-tls-verify and a certificate authority; "
                        "remove one",
                        where);
    return 0;
}

static int
load_user(struct kcy_ctx *c, const struct named *e, const yaml_node_t *cluster, struct kcfg *k)
{
    static const char *const impersonation[] = {"as", "as-uid", "as-groups", "as-user-extra"};
    char where[KCY_NAME_SHOWN * 4 + 32];
    char *tf = NULL, *path = NULL;
    unsigned char *tok = NULL;
    size_t toklen = 0;
    bool set;
    int rc;

    snprintf(where, sizeof where, "user %s", kcy_qn(e->name, e->len).s);
    if ((rc = kcy_has_key(c, e->body, "auth-provider", where, &set)))
        return rc;
    if (set)
        return KCY_FAIL(c, KWC_EUNSUPPORTED,
                        "%s uses an auth-provider plugin, which kubectl itself no longer "
                        "supports: use the provider's exec credential plugin (e.g. "
                        "gke-gcloud-auth-plugin, kubelogin) or a token",
                        where);
    for (size_t i = 0; i < KWC_ARRAY_LEN(impersonation); i++) {
        if ((rc = kcy_has_key(c, e->body, impersonation[i], where, &set)))
            return rc;
        if (set)
            return KCY_FAIL(c, KWC_EUNSUPPORTED,
                            "%s sets %s; impersonation is not supported by kwc, use the target "
                            "identity's own credentials",
                            where, impersonation[i]);
    }
    if ((rc = get_pem(c, e->body, "client-certificate", "client-certificate-data", where,
                      &k->cert_pem, &k->cert_pem_len)) ||
        (rc = get_pem(c, e->body, "client-key", "client-key-data", where, &k->key_pem,
                      &k->key_pem_len)))
        return rc;
    if (!k->cert_pem != !k->key_pem)
        return KCY_FAIL(c, KWC_ECONFIG, "%s has a client %s but no client %s; set both", where,
                        k->cert_pem ? "certificate" : "key", k->cert_pem ? "key" : "certificate");
    if ((rc = kcy_get_str(c, e->body, "token", where, &k->token)) ||
        (rc = kcy_get_str(c, e->body, "tokenFile", where, &tf)) ||
        (rc = kcy_get_str(c, e->body, "username", where, &k->username)) ||
        (rc = kcy_get_str(c, e->body, "password", where, &k->password)))
        goto out;
    if ((k->token || tf) && (k->username || k->password)) {
        rc = KCY_FAIL(c, KWC_ECONFIG,
                      "%s sets both a token and basic auth (username/password); only one "
                      "authentication method is allowed",
                      where);
        goto out;
    }
    if ((rc = kcy_load_exec(c, e->body, where, cluster, k)))
        goto out;
    if (k->exec && (k->token || tf || k->username || k->password || k->cert_pem)) {
        /* client-go would use the static credential and never run the plugin */
        rc = KCY_FAIL(c, KWC_ECONFIG,
                      "%s sets both exec and a %s; kubectl would use the %s and never run the "
                      "plugin: remove one",
                      where, k->cert_pem ? "client certificate" : "token or basic auth",
                      k->cert_pem ? "certificate" : "static credential");
        goto out;
    }
    if (tf) {
        path = kcy_join_path(c->base_dir, tf);
        /* Read now so a typo fails at startup, as client-go does; the upstream re-reads it. */
        if ((rc = kcy_read_file(path, KCFG_MAX_FILE, true, &tok, &toklen))) {
            KCY_FAIL(c, rc, "%s: cannot read tokenFile %s: %s", where, kcy_qs(path).s,
                     kcy_file_reason(rc));
            goto out;
        }
        if ((rc = kcy_abs_path(path, &k->token_file))) {
            KCY_FAIL(c, rc, "%s: cannot make tokenFile %s absolute: %s", where, kcy_qs(path).s,
                     kwc_strerror(rc));
            goto out;
        }
    }
out:
    if (tok) {
        explicit_bzero(tok, toklen);
        free(tok);
    }
    free(tf);
    free(path);
    return rc;
}

static int
resolve(struct kcy_ctx *c, const yaml_node_t *root, const char *want, struct kcfg *k)
{
    struct list contexts = {0}, clusters = {0}, users = {0};
    const struct named *ctxe, *cle, *ue;
    char where[KCY_NAME_SHOWN * 4 + 32];
    int rc;

    if ((rc = list_load(c, root, "contexts", "context", &contexts)) ||
        (rc = list_load(c, root, "clusters", "cluster", &clusters)) ||
        (rc = list_load(c, root, "users", "user", &users)))
        goto out;

    if (want && *want) {
        k->context = xstrdup(want);
    } else {
        if ((rc = kcy_get_str(c, root, "current-context", "kubeconfig", &k->context)))
            goto out;
        if (!k->context) {
            rc = KCY_FAIL(c, KWC_ECONFIG,
                          "kubeconfig has no current-context (contexts: %s); pass --context NAME",
                          list_names(&contexts).s);
            goto out;
        }
    }
    if (!(ctxe = list_find(&contexts, k->context))) {
        rc = KCY_FAIL(c, KWC_ECONFIG, "context %s not found in kubeconfig (contexts: %s); %s",
                      kcy_qs(k->context).s, list_names(&contexts).s,
                      want && *want ? "pass --context NAME"
                                    : "fix current-context or pass --context NAME");
        goto out;
    }
    snprintf(where, sizeof where, "context %s", kcy_qs(k->context).s);
    if ((rc = kcy_get_str(c, ctxe->body, "cluster", where, &k->cluster)) ||
        (rc = kcy_get_str(c, ctxe->body, "user", where, &k->user)) ||
        (rc = kcy_get_str(c, ctxe->body, "namespace", where, &k->namespace)))
        goto out;
    if (!k->cluster) {
        rc = KCY_FAIL(c, KWC_ECONFIG,
                      "%s names no cluster; set contexts[].context.cluster (clusters: %s)", where,
                      list_names(&clusters).s);
        goto out;
    }
    if (!(cle = list_find(&clusters, k->cluster))) {
        rc = KCY_FAIL(c, KWC_ECONFIG,
                      "cluster %s (from %s) not found in kubeconfig (clusters: %s); fix the "
                      "context's cluster or add the cluster",
                      kcy_qs(k->cluster).s, where, list_names(&clusters).s);
        goto out;
    }
    if ((rc = load_cluster(c, cle, k)))
        goto out;
    if (k->user) {
        if (!(ue = list_find(&users, k->user))) {
            rc = KCY_FAIL(c, KWC_ECONFIG,
                          "user %s (from %s) not found in kubeconfig (users: %s); fix the "
                          "context's user or add the user",
                          kcy_qs(k->user).s, where, list_names(&users).s);
            goto out;
        }
        if ((rc = load_user(c, ue, cle->body, k)))
            goto out;
    }
out:
    free(contexts.v);
    free(clusters.v);
    free(users.v);
    return rc;
}

/* ---- YAML loading ------------------------------------------------------- */

static int
yaml_fail(struct kcy_ctx *c, const yaml_parser_t *p)
{
    const char *problem = p->problem ? p->problem : "out of memory";
    if (p->error == YAML_READER_ERROR)
        return KCY_FAIL(c, KWC_ECONFIG, "kubeconfig is not valid YAML: %s at byte %zu", problem,
                        p->problem_offset);
    return KCY_FAIL(c, KWC_ECONFIG, "kubeconfig is not valid YAML: %s%s%s at line %zu column %zu",
                    p->context ? p->context : "", p->context ? ", " : "", problem,
                    p->problem_mark.line + 1, p->problem_mark.column + 1);
}

/* Walk the first document's events to bound node count and depth before loading it. */
static int
prescan(struct kcy_ctx *c, const char *yaml, size_t len)
{
    yaml_parser_t p;
    yaml_event_t ev;
    size_t nodes = 0, depth = 0;
    int rc = 0;
    bool done = false;

    if (!yaml_parser_initialize(&p))
        return KCY_FAIL(c, -ENOMEM, "out of memory starting the YAML parser");
    yaml_parser_set_input_string(&p, (const unsigned char *)yaml, len);
    while (!done) {
        if (!yaml_parser_parse(&p, &ev)) {
            rc = yaml_fail(c, &p);
            break;
        }
        switch (ev.type) {
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            nodes++;
            if (++depth > KCFG_MAX_DEPTH)
                rc = KCY_FAIL(c, KWC_ECONFIG,
                              "kubeconfig nests deeper than %d levels at line %zu; it is not a "
                              "kubeconfig",
                              KCFG_MAX_DEPTH, ev.start_mark.line + 1);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            depth--;
            break;
        case YAML_SCALAR_EVENT:
        case YAML_ALIAS_EVENT:
            nodes++;
            break;
        case YAML_DOCUMENT_END_EVENT:
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
        if (!rc && nodes > KCFG_MAX_NODES)
            rc = KCY_FAIL(c, KWC_ECONFIG,
                          "kubeconfig has more than %d YAML nodes; it is not a "
                          "kubeconfig",
                          KCFG_MAX_NODES);
        if (rc)
            break;
    }
    yaml_parser_delete(&p);
    return rc;
}

int
kcfg_parse(const char *yaml, size_t len, const char *base_dir, const char *context,
           struct kcfg **out, char *err, size_t errlen)
{
    struct kcy_ctx c = {.base_dir = base_dir, .err = err, .errlen = errlen};
    yaml_parser_t p;
    yaml_document_t doc;
    bool parser = false, loaded = false;
    struct kcfg *k = NULL;
    yaml_node_t *root;
    int rc;

    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    if (len > KCFG_MAX_FILE)
        return KCY_FAIL(&c, KWC_ETOOBIG,
                        "kubeconfig is %zu bytes, over the 4 MiB limit; is this the right file?",
                        len);
    if ((rc = prescan(&c, yaml, len)))
        goto out;
    if (!yaml_parser_initialize(&p)) {
        rc = KCY_FAIL(&c, -ENOMEM, "out of memory starting the YAML parser");
        goto out;
    }
    parser = true;
    yaml_parser_set_input_string(&p, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&p, &doc)) {
        rc = yaml_fail(&c, &p);
        goto out;
    }
    loaded = true;
    c.doc = &doc;
    root = yaml_document_get_root_node(&doc);
    if (kcy_is_null(root)) {
        rc = KCY_FAIL(&c, KWC_ECONFIG,
                      "kubeconfig is empty; it needs clusters, users, contexts and a "
                      "current-context (see `kubectl config view`)");
        goto out;
    }
    if (root->type != YAML_MAPPING_NODE) {
        rc = KCY_FAIL(&c, KWC_ECONFIG,
                      "kubeconfig must be a YAML mapping (apiVersion, clusters, users, contexts, "
                      "current-context), not %s",
                      kcy_kind_name(root));
        goto out;
    }
    k = xcalloc(1, sizeof *k);
    if ((rc = resolve(&c, root, context, k)))
        goto out;
    *out = k;
    k = NULL;
out:
    kcfg_free(k);
    if (loaded)
        yaml_document_delete(&doc);
    if (parser)
        yaml_parser_delete(&p);
    return rc;
}

int
kcfg_load_file(const char *path, const char *context, struct kcfg **out, char *err, size_t errlen)
{
    unsigned char *text = NULL;
    size_t len = 0;
    char *dir;
    int rc;

    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    if ((rc = kcy_read_file(path, KCFG_MAX_FILE, false, &text, &len)))
        return kwc_errf(err, errlen, rc, "cannot read kubeconfig %s: %s", kcy_qs(path).s,
                        kcy_file_reason(rc));
    const char *slash = strrchr(path, '/');
    if (!slash)
        dir = xstrdup(".");
    else if (slash == path)
        dir = xstrdup("/");
    else
        dir = xstrndup(path, (size_t)(slash - path));
    rc = kcfg_parse((const char *)text, len, dir, context, out, err, errlen);
    if (rc && err && errlen && strstr(err, "kubeconfig") == err) {
        /* Name the file: "kubeconfig ..." becomes "kubeconfig PATH ...". */
        char *msg = xasprintf("kubeconfig %s%s", kcy_qs(path).s, err + strlen("kubeconfig"));
        snprintf(err, errlen, "%s", msg);
        free(msg);
    }
    explicit_bzero(text, len);
    free(text);
    free(dir);
    return rc;
}

/* ---- in-cluster --------------------------------------------------------- */

static bool
valid_port(const char *s)
{
    unsigned long v = 0;
    size_t n = 0;
    for (; s[n]; n++) {
        if (s[n] < '0' || s[n] > '9' || n >= 5)
            return false;
        v = v * 10 + (unsigned long)(s[n] - '0');
    }
    return n > 0 && v > 0 && v <= 65535;
}

static bool
valid_host(const char *s)
{
    if (!*s)
        return false;
    for (const char *p = s; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7f || strchr("/@?#[]", *p))
            return false;
    return true;
}

int
kcfg_in_cluster(const char *sa_dir, const char *host, const char *port, struct kcfg **out,
                char *err, size_t errlen)
{
    struct kcfg *k = NULL;
    char *path = NULL;
    unsigned char *buf = NULL;
    size_t len = 0;
    int rc;

    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    if (!sa_dir)
        sa_dir = KCFG_SA_DIR;
    if (!host || !*host || !port || !*port)
        return kwc_errf(err, errlen, KWC_ECONFIG,
                        "not running in a Kubernetes cluster: KUBERNETES_SERVICE_HOST and "
                        "KUBERNETES_SERVICE_PORT must be set; or pass a kubeconfig");
    /* An already bracketed IPv6 literal is accepted as is. */
    size_t hl = strlen(host);
    bool bracketed = hl > 2 && host[0] == '[' && host[hl - 1] == ']';
    char *inner = bracketed ? xstrndup(host + 1, hl - 2) : xstrdup(host);
    bool ok = valid_host(inner);
    bool v6 = strchr(inner, ':') != NULL;
    if (!ok || (bracketed && !v6)) {
        free(inner);
        return kwc_errf(err, errlen, KWC_ECONFIG,
                        "KUBERNETES_SERVICE_HOST %s is not a host name or IP address",
                        kcy_qs(host).s);
    }
    if (!valid_port(port)) {
        free(inner);
        return kwc_errf(err, errlen, KWC_ECONFIG,
                        "KUBERNETES_SERVICE_PORT %s is not a port number (1-65535)",
                        kcy_qs(port).s);
    }
    k = xcalloc(1, sizeof *k);
    k->server =
        v6 ? xasprintf("https://[%s]:%s", inner, port) : xasprintf("https://%s:%s", inner, port);
    free(inner);
    k->context = xstrdup("in-cluster");
    k->cluster = xstrdup("in-cluster");
    k->user = xstrdup("serviceaccount");

    /* The token must be there: without it we are not really in a pod. */
    path = xasprintf("%s/token", sa_dir);
    if ((rc = kcy_read_file(path, KCFG_MAX_FILE, true, &buf, &len))) {
        kwc_errf(err, errlen, rc,
                 "cannot read the ServiceAccount token %s: %s; is automountServiceAccountToken "
                 "disabled for this pod?",
                 kcy_qs(path).s, kcy_file_reason(rc));
        goto out;
    }
    explicit_bzero(buf, len);
    free(buf);
    buf = NULL;
    if ((rc = kcy_abs_path(path, &k->token_file))) {
        kwc_errf(err, errlen, rc, "cannot make %s absolute: %s", kcy_qs(path).s, kwc_strerror(rc));
        goto out;
    }
    free(path);

    /* No ca.crt: client-go goes on with the system roots, and so do we. */
    path = xasprintf("%s/ca.crt", sa_dir);
    rc = kcy_read_file(path, KCFG_MAX_FILE, true, &k->ca_pem, &k->ca_pem_len);
    if (rc == -ENOENT) {
        rc = 0;
    } else if (rc) {
        kwc_errf(err, errlen, rc, "cannot read the cluster CA %s: %s", kcy_qs(path).s,
                 kcy_file_reason(rc));
        goto out;
    } else if (!kcy_looks_pem(k->ca_pem, k->ca_pem_len)) {
        rc = kwc_errf(err, errlen, KWC_ECONFIG, "cluster CA %s is not PEM (no -----BEGIN line)",
                      kcy_qs(path).s);
        goto out;
    }
    free(path);

    path = xasprintf("%s/namespace", sa_dir);
    rc = kcy_read_file(path, KCFG_MAX_FILE, true, &buf, &len);
    if (rc == -ENOENT) {
        rc = 0;
    } else if (rc) {
        kwc_errf(err, errlen, rc, "cannot read the pod namespace %s: %s", kcy_qs(path).s,
                 kcy_file_reason(rc));
        goto out;
    } else {
        const char *s = (const char *)buf, *e = s + len;
        while (s < e && strchr(" \t\r\n", *s))
            s++;
        while (e > s && strchr(" \t\r\n", e[-1]))
            e--;
        if (memchr(s, '\0', (size_t)(e - s))) {
            rc = kwc_errf(err, errlen, KWC_ECONFIG, "pod namespace %s contains a NUL byte",
                          kcy_qs(path).s);
            goto out;
        }
        if (e > s)
            k->namespace = xstrndup(s, (size_t)(e - s));
    }
    *out = k;
    k = NULL;
out:
    free(buf);
    free(path);
    kcfg_free(k);
    return rc;
}

static void
free_secret(void *p, size_t len)
{
    if (p) {
        explicit_bzero(p, len);
        free(p);
    }
}

void
kcfg_free(struct kcfg *k)
{
    if (!k)
        return;
    free(k->server);
    free(k->tls_server_name);
    free(k->ca_pem);
    free(k->cert_pem);
    free_secret(k->key_pem, k->key_pem_len);
    free_secret(k->token, k->token ? strlen(k->token) : 0);
    free(k->token_file);
    free(k->username);
    free_secret(k->password, k->password ? strlen(k->password) : 0);
    free(k->context);
    free(k->cluster);
    free(k->user);
    free(k->namespace);
    kcfg_exec_free(k->exec);
    free(k);
}

char *
kcfg_bearer_token(const struct kcfg *k, int *err_no)
{
    *err_no = 0;
    if (!k->token_file)
        return k->token ? xstrdup(k->token) : NULL;
    int fd = open(k->token_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *err_no = errno;
        return NULL;
    }
    char *buf = xmalloc(65536 + 1);
    ssize_t r = read(fd, buf, 65536);
    *err_no = r < 0 ? errno : 0;
    close(fd);
    while (r > 0 &&
           (buf[r - 1] == '\n' || buf[r - 1] == '\r' || buf[r - 1] == ' ' || buf[r - 1] == '\t'))
        r--;
    if (r <= 0) {
        free(buf);
        return NULL;
    }
    buf[r] = '\0';
    return buf;
}

void
kcfg_server_hostport(const char *server, bool *tls, char *host, size_t hl, char *port, size_t pl)
{
    *tls = strncmp(server, "https://", 8) == 0;
    const char *s = server + (*tls ? 8 : strncmp(server, "http://", 7) == 0 ? 7 : 0);
    size_t n = strcspn(s, "/");
    const char *colon = NULL;
    if (s[0] == '[') {
        const char *rb = memchr(s, ']', n);
        snprintf(host, hl, "%.*s", rb ? (int)(rb - s - 1) : 0, s + 1);
        colon = rb && rb + 1 < s + n && rb[1] == ':' ? rb + 1 : NULL;
    } else {
        colon = memchr(s, ':', n);
        snprintf(host, hl, "%.*s", (int)(colon ? (size_t)(colon - s) : n), s);
    }
    if (colon)
        snprintf(port, pl, "%.*s", (int)(s + n - colon - 1), colon + 1);
    else
        snprintf(port, pl, "%s", *tls ? "443" : "80");
}
