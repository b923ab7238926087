/*
 * kcfg_exec.c — a kubeconfig user's exec credential plugin (users[].user.exec),
 * read as client-go reads it (tools/clientcmd: validation.go, loader.go's
 * path resolution, client_config.go's cluster extension, v1's defaults), and
 * the KUBERNETES_EXEC_INFO request it is run with (execcred.c runs it).
 *
 * What kubectl refuses is refused here with the same reason and a fix; what
 * kwc cannot honour (interactiveMode Always: kwc is a service with no
 * terminal) is refused at start instead of failing at every run.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* explicit_bzero */
#endif
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kwc/base.h"
#include "kwc/kubeconfig.h"

#include "kcfg_int.h"

#define EXEC_V1 "client.authentication.k8s.io/v1"
#define EXEC_V1BETA1 "client.authentication.k8s.io/v1beta1"
#define EXT_KEY "client.authentication.k8s.io/exec" /* client_config.go clusterExtensionKey */
#define EXT_MAX_NODES 10000 /* aliases may repeat a node: bound what is expanded */

/* ---- the cluster extension as JSON -------------------------------------- */

struct conv {
    struct kcy_ctx *c;
    size_t nodes;
};

/* A plain scalar typed as YAML 1.1 (what sigs.k8s.io/yaml hands encoding/json). */
static json_t *
typed_scalar(const yaml_node_t *n)
{
    const char *s = (const char *)n->data.scalar.value;
    size_t len = n->data.scalar.length;
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return json_stringn(s, len);
    if (kcy_is_null(n))
        return json_null();
    static const char *const yes[] = {"y",  "Y",  "yes",  "Yes",  "YES", "on",
                                      "On", "ON", "true", "True", "TRUE"};
    static const char *const no[] = {"n",   "N",   "no",    "No",    "NO",   "off",
                                     "Off", "OFF", "false", "False", "FALSE"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(yes); i++) {
        if (strlen(yes[i]) == len && memcmp(yes[i], s, len) == 0)
            return json_true();
        if (strlen(no[i]) == len && memcmp(no[i], s, len) == 0)
            return json_false();
    }
    if (len && len < 64 && strspn(s, "+-0123456789") == len) {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (!errno && end == s + len)
            return json_integer(v);
    }
    if (len && len < 64 && strspn(s, "+-.0123456789eE") == len && strpbrk(s, "0123456789")) {
        char *end;
        double v = strtod(s, &end);
        if (end == s + len)
            return json_real(v);
    }
    return json_stringn(s, len);
}

static int
to_json(struct conv *v, const yaml_node_t *n, int depth, json_t **out)
{
    *out = NULL;
    if (++v->nodes > EXT_MAX_NODES || depth > KCFG_MAX_DEPTH)
        return KCY_FAIL(v->c, KWC_ECONFIG,
                        "the cluster extension %s expands to more than %d YAML nodes (aliases "
                        "included); it is not a plugin's configuration",
                        EXT_KEY, EXT_MAX_NODES);
    if (!n || kcy_is_null(n)) {
        *out = json_null();
        return 0;
    }
    if (n->type == YAML_SCALAR_NODE) {
        *out = typed_scalar(n);
        return *out ? 0
                    : KCY_FAIL(v->c, KWC_ECONFIG, "the cluster extension %s is not UTF-8", EXT_KEY);
    }
    json_t *j = n->type == YAML_SEQUENCE_NODE ? json_array() : json_object();
    if (n->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *i = n->data.sequence.items.start; i < n->data.sequence.items.top;
             i++) {
            json_t *e;
            int rc = to_json(v, kcy_node_at(v->c, *i), depth + 1, &e);
            if (rc) {
                json_decref(j);
                return rc;
            }
            json_array_append_new(j, e);
        }
    } else if (n->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
             p++) {
            const yaml_node_t *k = kcy_node_at(v->c, p->key);
            json_t *e;
            if (!k || k->type != YAML_SCALAR_NODE ||
                memchr(k->data.scalar.value, '\0', k->data.scalar.length)) {
                json_decref(j);
                return KCY_FAIL(v->c, KWC_ECONFIG,
                                "the cluster extension %s has a key that is not a string", EXT_KEY);
            }
            int rc = to_json(v, kcy_node_at(v->c, p->value), depth + 1, &e);
            if (rc) {
                json_decref(j);
                return rc;
            }
            char *key = xstrndup((const char *)k->data.scalar.value, k->data.scalar.length);
            json_object_set_new(j, key, e);
            free(key);
        }
    }
    *out = j;
    return 0;
}

/* clusters[].cluster.extensions[name == EXT_KEY].extension as compact JSON with
 * sorted keys (what encoding/json makes of the YAML), new; NULL when absent. */
static int
extension_json(struct kcy_ctx *c, const yaml_node_t *cluster, char **out)
{
    yaml_node_t *list;
    int rc;
    *out = NULL;
    if ((rc = kcy_map_get(c, cluster, "extensions", "cluster", &list)) || !list)
        return rc;
    if (list->type != YAML_SEQUENCE_NODE)
        return KCY_FAIL(c, KWC_ECONFIG,
                        "cluster extensions must be a list of {name, extension}, not %s",
                        kcy_kind_name(list));
    for (yaml_node_item_t *i = list->data.sequence.items.start; i < list->data.sequence.items.top;
         i++) {
        const yaml_node_t *item = kcy_node_at(c, *i);
        char *name = NULL;
        yaml_node_t *ext;
        if (!item || item->type != YAML_MAPPING_NODE)
            continue;
        if ((rc = kcy_get_str(c, item, "name", "cluster extension", &name)))
            return rc;
        bool ours = name && strcmp(name, EXT_KEY) == 0;
        free(name);
        if (!ours)
            continue;
        if ((rc = kcy_map_get(c, item, "extension", "cluster extension", &ext)))
            return rc;
        struct conv v = {.c = c};
        json_t *j;
        if ((rc = to_json(&v, ext, 0, &j)))
            return rc;
        *out = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        json_decref(j);
        return 0;
    }
    return 0;
}

/* ---- KUBERNETES_EXEC_INFO ----------------------------------------------- */

static char *
b64(const unsigned char *p, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = xmalloc(4 * ((n + 2) / 3) + 1), *w = o;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        *w++ = tab[v >> 18 & 63];
        *w++ = tab[v >> 12 & 63];
        *w++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
        *w++ = i + 2 < n ? tab[v & 63] : '=';
    }
    *w = '\0';
    return o;
}

static char *
json_str(const char *s)
{
    json_t *j = json_string(s);
    char *o = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    return o ? o : xstrdup("\"\"");
}

/*
 * The ExecCredential request as client-go encodes it (encoding/json over
 * clientauthentication/v1 types, field order as declared, omitempty honoured;
 * Cluster.config is a RawExtension, which encodes as null when absent).
 */
static char *
exec_info(const char *api_version, const char *server, const struct kcfg *k, const char *config,
          bool disable_compression, bool cluster)
{
    char *spec;
    if (cluster) {
        char *srv = json_str(server),
             *tsn = k->tls_server_name ? json_str(k->tls_server_name) : NULL;
        char *ca = k->ca_pem ? b64(k->ca_pem, k->ca_pem_len) : NULL;
        spec = xasprintf("{\"cluster\":{\"server\":%s%s%s%s%s%s%s%s,\"config\":%s},"
                         "\"interactive\":false}",
                         srv, tsn ? ",\"tls-server-name\":" : "", tsn ? tsn : "",
                         k->insecure_skip_tls_verify ? ",\"insecure-skip-tls-verify\":true" : "",
                         ca ? ",\"certificate-authority-data\":\"" : "", ca ? ca : "",
                         ca ? "\"" : "", disable_compression ? ",\"disable-compression\":true" : "",
                         config ? config : "null");
        free(srv);
        free(tsn);
        free(ca);
    } else {
        spec = xstrdup("{\"interactive\":false}");
    }
    char *out = xasprintf("{\"kind\":\"ExecCredential\",\"apiVersion\":\"%s\",\"spec\":%s}\n",
                          api_version, spec);
    free(spec);
    return out;
}

/* ---- users[].user.exec -------------------------------------------------- */

static int
str_list(struct kcy_ctx *c, const yaml_node_t *map, const char *key, const char *where, char ***out,
         size_t *n)
{
    yaml_node_t *seq;
    int rc;
    if ((rc = kcy_map_get(c, map, key, where, &seq)) || !seq)
        return rc;
    if (seq->type != YAML_SEQUENCE_NODE)
        return KCY_FAIL(c, KWC_ECONFIG, "%s: %s must be a list of strings, not %s", where, key,
                        kcy_kind_name(seq));
    size_t cnt = (size_t)(seq->data.sequence.items.top - seq->data.sequence.items.start);
    *out = xcalloc(cnt + 1, sizeof(char *));
    for (size_t i = 0; i < cnt; i++) {
        const yaml_node_t *it = kcy_node_at(c, seq->data.sequence.items.start[i]);
        const char *s = "";
        size_t len = 0;
        if (it && !kcy_is_null(it) && (rc = kcy_scalar(c, it, key, where, &s, &len)))
            return rc;
        (*out)[(*n)++] = xstrndup(s, len);
    }
    return 0;
}

static int
env_list(struct kcy_ctx *c, const yaml_node_t *map, const char *where, struct kcfg_exec *e)
{
    yaml_node_t *seq;
    int rc;
    if ((rc = kcy_map_get(c, map, "env", where, &seq)) || !seq)
        return rc;
    if (seq->type != YAML_SEQUENCE_NODE)
        return KCY_FAIL(c, KWC_ECONFIG, "%s: env must be a list of {name, value}, not %s", where,
                        kcy_kind_name(seq));
    size_t cnt = (size_t)(seq->data.sequence.items.top - seq->data.sequence.items.start);
    e->env = xcalloc(cnt + 1, sizeof(char *));
    for (size_t i = 0; i < cnt; i++) {
        const yaml_node_t *it = kcy_node_at(c, seq->data.sequence.items.start[i]);
        char *name = NULL, *value = NULL;
        if (!it || it->type != YAML_MAPPING_NODE)
            return KCY_FAIL(c, KWC_ECONFIG, "%s: env[%zu] must be a mapping {name, value}", where,
                            i);
        if ((rc = kcy_get_str(c, it, "name", where, &name)) ||
            (rc = kcy_get_str(c, it, "value", where, &value))) {
            free(name);
            return rc;
        }
        if (!name || strchr(name, '=')) {
            rc = KCY_FAIL(c, KWC_ECONFIG,
                          "%s: env[%zu] %s; env variable name must be specified (and hold no "
                          "'=') to use the exec authentication plugin",
                          where, i, name ? "has a name with '='" : "has no name");
            free(name);
            free(value);
            return rc;
        }
        e->env[e->nenv++] = xasprintf("%s=%s", name, value ? value : "");
        free(name);
        free(value);
    }
    return 0;
}

static int
interactive_mode(struct kcy_ctx *c, const yaml_node_t *ex, const char *where, struct kcfg_exec *e)
{
    char *mode = NULL;
    int rc = kcy_get_str(c, ex, "interactiveMode", where, &mode);
    if (rc)
        return rc;
    if (!mode && strcmp(e->api_version, EXEC_V1) == 0)
        /* v1 has no default (clientcmd/api/v1/defaults.go) */
        rc = KCY_FAIL(c, KWC_ECONFIG,
                      "%s: interactiveMode must be specified to use the exec authentication "
                      "plugin with %s; set interactiveMode: Never",
                      where, EXEC_V1);
    else if (!mode || strcmp(mode, "IfAvailable") == 0)
        e->interactive = KCFG_INTERACTIVE_IF_AVAILABLE;
    else if (strcmp(mode, "Never") == 0)
        e->interactive = KCFG_INTERACTIVE_NEVER;
    else if (strcmp(mode, "Always") == 0)
        rc = KCY_FAIL(c, KWC_EUNSUPPORTED,
                      "%s: interactiveMode Always needs a terminal to prompt on, and kwc (a "
                      "service) has none: use a plugin that can run with interactiveMode "
                      "Never",
                      where);
    else
        rc = KCY_FAIL(c, KWC_ECONFIG,
                      "%s: invalid interactiveMode %s; use Never, IfAvailable or Always", where,
                      kcy_qs(mode).s);
    free(mode);
    return rc;
}

void
kcfg_exec_free(struct kcfg_exec *e)
{
    if (!e)
        return;
    free(e->command);
    for (size_t i = 0; i < e->nargs; i++)
        free(e->args[i]);
    free(e->args);
    for (size_t i = 0; i < e->nenv; i++) {
        explicit_bzero(e->env[i], strlen(e->env[i])); /* plugins take secrets here */
        free(e->env[i]);
    }
    free(e->env);
    free(e->api_version);
    free(e->install_hint);
    free(e->exec_info);
    free(e);
}

int
kcy_load_exec(struct kcy_ctx *c, const yaml_node_t *user, const char *where,
              const yaml_node_t *cluster, struct kcfg *k)
{
    yaml_node_t *ex;
    char w[KCY_NAME_SHOWN * 4 + 48], *config = NULL, *server = NULL, *cmd = NULL;
    bool provide = false, nocompress = false;
    int rc;

    if ((rc = kcy_get_map(c, user, "exec", where, &ex)) || !ex)
        return rc;
    snprintf(w, sizeof w, "%s exec", where);
    struct kcfg_exec *e = xcalloc(1, sizeof *e);
    e->timeout_ms = KCFG_EXEC_TIMEOUT_MS;
    if ((rc = kcy_get_str(c, ex, "command", w, &cmd)) ||
        (rc = kcy_get_str(c, ex, "apiVersion", w, &e->api_version)))
        goto out;
    if (!cmd) {
        rc = KCY_FAIL(c, KWC_ECONFIG,
                      "%s: command must be specified to use the exec authentication plugin", w);
        goto out;
    }
    if (!e->api_version) {
        rc = KCY_FAIL(c, KWC_ECONFIG,
                      "%s: apiVersion must be specified to use the exec authentication plugin "
                      "(%s or %s)",
                      w, EXEC_V1, EXEC_V1BETA1);
        goto out;
    }
    if (strcmp(e->api_version, EXEC_V1) != 0 && strcmp(e->api_version, EXEC_V1BETA1) != 0) {
        rc = KCY_FAIL(c, KWC_ECONFIG,
                      "%s: invalid apiVersion %s; use %s or %s (v1alpha1 was removed in "
                      "Kubernetes 1.24)",
                      w, kcy_qs(e->api_version).s, EXEC_V1, EXEC_V1BETA1);
        goto out;
    }
    if ((rc = interactive_mode(c, ex, w, e)) ||
        (rc = str_list(c, ex, "args", w, &e->args, &e->nargs)) || (rc = env_list(c, ex, w, e)) ||
        (rc = kcy_get_str(c, ex, "installHint", w, &e->install_hint)) ||
        (rc = kcy_get_bool(c, ex, "provideClusterInfo", w, &provide)))
        goto out;
    /* loader.go: only a command with a path separator is a file reference,
     * resolved against the kubeconfig's directory made absolute */
    if (strchr(cmd, '/') && cmd[0] != '/') {
        char *joined = kcy_join_path(c->base_dir, cmd);
        rc = kcy_abs_path(joined, &e->command);
        free(joined);
        if (rc) {
            KCY_FAIL(c, rc, "%s: cannot make command %s absolute: %s", w, kcy_qs(cmd).s,
                     kwc_strerror(rc));
            goto out;
        }
    } else {
        e->command = cmd;
        cmd = NULL;
    }
    if (provide) {
        if ((rc = kcy_get_str(c, cluster, "server", "cluster", &server)) ||
            (rc = kcy_get_bool(c, cluster, "disable-compression", "cluster", &nocompress)) ||
            (rc = extension_json(c, cluster, &config)))
            goto out;
    }
    e->exec_info =
        exec_info(e->api_version, server ? server : k->server, k, config, nocompress, provide);
    k->exec = e;
    e = NULL;
out:
    kcfg_exec_free(e);
    free(cmd);
    free(config);
    free(server);
    return rc;
}
