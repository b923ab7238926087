/*
 * config.c — flags and the --config YAML file into struct kwc_config.
 * Order: defaults, then the config file, then flags (flags win). Every
 * message says what is wrong and how to fix it.
 */
#include "kwc/config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "kwc/base.h"

#define CFG_FILE_MAX (1024 * 1024)

enum opt_type { T_STR, T_INT, T_BOOL };

struct opt {
    const char *flag;
    size_t off;
    enum opt_type type;
    const char *def, *meta, *help;
};

static const struct opt opts[] = {
#define CFG_T_STR T_STR
#define CFG_T_INT T_INT
#define CFG_T_BOOL T_BOOL
#define CFG_ROW(flag, field, type, def, meta, help)                                                \
    {flag, offsetof(struct kwc_config, field), CFG_T_##type, def, meta, help},
    CFG_OPTIONS(CFG_ROW)
#undef CFG_ROW
};

static const struct opt *
find_opt(const char *name, size_t len)
{
    for (size_t i = 0; i < KWC_ARRAY_LEN(opts); i++)
        if (strlen(opts[i].flag) == len && memcmp(opts[i].flag, name, len) == 0)
            return &opts[i];
    return NULL;
}

#define fail(err, errlen, ...) kwc_errf((err), (errlen), KWC_ECONFIG, __VA_ARGS__)

/* Store one value; src names where it came from for messages ("--listen", "config.yaml: listen"). */
static int
set_opt(struct kwc_config *c, const struct opt *o, const char *val, const char *src, char *err,
        size_t errlen)
{
    void *slot = (char *)c + o->off;
    switch (o->type) {
    case T_STR:
        free(*(char **)slot);
        *(char **)slot = val ? xstrdup(val) : NULL;
        return 0;
    case T_INT: {
        char *end;
        errno = 0;
        long v = strtol(val, &end, 10);
        if (errno || end == val || *end || v < 0)
            return fail(err, errlen, "%s: \"%s\" is not a non-negative whole number", src, val);
        *(long *)slot = v;
        return 0;
    }
    case T_BOOL: {
        bool b;
        if (kwc_parse_bool(val, strlen(val), &b) != 0)
            return fail(err, errlen, "%s: \"%s\" is not true or false", src, val);
        *(bool *)slot = b;
        return 0;
    }
    }
    return 0;
}

static int
load_file(struct kwc_config *c, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(err, errlen, "--config %s: %s", path, strerror(errno));
    char *buf = xmalloc(CFG_FILE_MAX + 1);
    size_t n = fread(buf, 1, CFG_FILE_MAX + 1, f);
    fclose(f);
    if (n > CFG_FILE_MAX) {
        free(buf);
        return fail(err, errlen, "--config %s: larger than %d bytes", path, CFG_FILE_MAX);
    }
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_string(&p, (const unsigned char *)buf, n);
    int rc = 0, depth = 0;
    char *key = NULL;
    bool done = false;
    while (!done && rc == 0) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            rc = fail(err, errlen, "--config %s: line %zu: %s", path, p.problem_mark.line + 1,
                      p.problem ? p.problem : "invalid YAML");
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        case YAML_MAPPING_START_EVENT:
            if (++depth > 1)
                rc = fail(err, errlen,
                          "--config %s: line %zu: values must be plain scalars (key: value)", path,
                          ev.start_mark.line + 1);
            break;
        case YAML_MAPPING_END_EVENT:
            depth--;
            break;
        case YAML_SEQUENCE_START_EVENT:
        case YAML_ALIAS_EVENT:
            rc = fail(err, errlen, "--config %s: line %zu: values must be plain scalars (key: value)",
                      path, ev.start_mark.line + 1);
            break;
        case YAML_SCALAR_EVENT: {
            const char *v = (const char *)ev.data.scalar.value;
            if (depth != 1) {
                rc = fail(err, errlen, "--config %s: the file must be a mapping of option: value",
                          path);
            } else if (!key) {
                key = xstrdup(v);
            } else {
                const struct opt *o = find_opt(key, strlen(key));
                char src[512];
                snprintf(src, sizeof(src), "--config %s: %s", path, key);
                if (!o)
                    rc = fail(err, errlen, "--config %s: unknown option \"%s\" (see kwc --help)",
                              path, key);
                else if (strcmp(key, "config") == 0)
                    rc = fail(err, errlen, "--config %s: a config file cannot name another", path);
                else
                    rc = set_opt(c, o, v, src, err, errlen);
                free(key);
                key = NULL;
            }
            break;
        }
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    free(key);
    yaml_parser_delete(&p);
    free(buf);
    return rc;
}

void
cfg_usage(FILE *f)
{
    fprintf(f, "usage: kwc (--upstream URL | --kubeconfig FILE [--context NAME]) --data-dir DIR\n"
               "           [--listen ADDR:PORT] [--resources LIST] [--config FILE] [options]\n\n"
               "kwc is a watch-cache reverse proxy for the Kubernetes API.\n\n");
    for (size_t i = 0; i < KWC_ARRAY_LEN(opts); i++) {
        char left[64];
        snprintf(left, sizeof(left), "--%s%s%s", opts[i].flag, opts[i].meta[0] ? " " : "",
                 opts[i].meta);
        fprintf(f, "  %-34s %s", left, opts[i].help);
        if (opts[i].def && opts[i].type != T_BOOL)
            fprintf(f, " [%s]", opts[i].def);
        fprintf(f, "\n");
    }
    fprintf(f, "  %-34s %s\n  %-34s %s\n", "--help", "show this help", "--version",
            "show the version");
}

static int
resolve_listen(struct kwc_config *c, char *err, size_t errlen)
{
    const char *l = c->listen;
    const char *colon = strrchr(l, ':');
    if (!colon)
        return fail(err, errlen, "--listen \"%s\": expected ADDR:PORT, e.g. 127.0.0.1:8001", l);
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || port < 0 || port > 65535)
        return fail(err, errlen, "--listen \"%s\": port must be 0-65535", l);
    size_t hl = (size_t)(colon - l);
    if (hl >= 2 && l[0] == '[' && l[hl - 1] == ']')
        c->listen_host = xstrndup(l + 1, hl - 2);
    else if (hl == 0)
        c->listen_host = xstrdup("0.0.0.0");
    else
        c->listen_host = xstrndup(l, hl);
    c->listen_port = (int)port;
    c->listen_loopback = strncmp(c->listen_host, "127.", 4) == 0 ||
                         strcmp(c->listen_host, "::1") == 0 ||
                         strcmp(c->listen_host, "localhost") == 0;
    return 0;
}

int
cfg_parse(int argc, char **argv, struct kwc_config *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < KWC_ARRAY_LEN(opts); i++)
        if (opts[i].def && set_opt(c, &opts[i], opts[i].def, opts[i].flag, err, errlen) != 0)
            return KWC_ECONFIG;

    /* First pass: --help, --version, --config. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return CFG_SHOW_HELP;
        if (strcmp(argv[i], "--version") == 0)
            return CFG_SHOW_VERSION;
        const char *cfgfile = NULL;
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            cfgfile = argv[i + 1];
        else if (strncmp(argv[i], "--config=", 9) == 0)
            cfgfile = argv[i] + 9;
        if (cfgfile) {
            int rc = load_file(c, cfgfile, err, errlen);
            if (rc)
                return rc;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0)
            return fail(err, errlen, "unexpected argument \"%s\" (options start with --; see kwc --help)", a);
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        const struct opt *o = find_opt(name, nl);
        if (!o)
            return fail(err, errlen, "unknown option \"--%.*s\" (see kwc --help)", (int)nl, name);
        const char *val;
        if (eq) {
            val = eq + 1;
        } else if (o->type == T_BOOL) {
            val = "true";
        } else {
            if (i + 1 >= argc)
                return fail(err, errlen, "--%s needs a value: --%s %s", o->flag, o->flag, o->meta);
            val = argv[++i];
        }
        char src[128];
        snprintf(src, sizeof(src), "--%s", o->flag);
        if (set_opt(c, o, val, src, err, errlen) != 0)
            return KWC_ECONFIG;
    }

    if (log_level_parse(c->log_level_s, &c->log_level) != 0)
        return fail(err, errlen, "--log-level \"%s\": use debug, info, warn or error",
                    c->log_level_s);
    if (c->upstream && c->kubeconfig)
        return fail(err, errlen, "--upstream and --kubeconfig both given: pass only one");
    if (c->context && !c->kubeconfig)
        return fail(err, errlen, "--context needs --kubeconfig FILE");
    if (!c->upstream && !c->kubeconfig && !getenv("KUBERNETES_SERVICE_HOST"))
        return fail(err, errlen, "no upstream: pass --upstream URL or --kubeconfig FILE "
                                 "(in a pod, the service account is used)");
    if (c->upstream && strncmp(c->upstream, "http://", 7) != 0 &&
        strncmp(c->upstream, "https://", 8) != 0)
        return fail(err, errlen, "--upstream \"%s\": must start with http:// or https://",
                    c->upstream);
    if (!c->data_dir || !*c->data_dir)
        return fail(err, errlen, "missing --data-dir DIR (where kwc keeps its LMDB cache)");
    if (c->upstream_connect_timeout == 0)
        return fail(err, errlen, "--upstream-connect-timeout must be at least 1 second");
    if (c->max_response_buffer < 4096 || c->max_request_buffer < 4096)
        return fail(err, errlen, "--max-response-buffer and --max-request-buffer must be at least 4096");
    if (strcmp(c->too_large_rv, "pass") != 0 && strcmp(c->too_large_rv, "504") != 0)
        return fail(err, errlen, "--too-large-rv \"%s\": use pass (ask the upstream) or 504 "
                                 "(answer like kube-apiserver's watch cache)", c->too_large_rv);
    if (c->rv_wait_ms > 60000)
        return fail(err, errlen, "--rv-wait-ms %ld: at most 60000 (kube-apiserver waits 3000)",
                    c->rv_wait_ms);
    if (c->max_list_buffer < 16384)
        return fail(err, errlen, "--max-list-buffer must be at least 16384");
    if (c->history_max_events < 1 || c->history_max_bytes < 1 || c->history_max_age < 1)
        return fail(err, errlen, "--history-max-events, --history-max-bytes and --history-max-age "
                                 "must be at least 1 (they bound how far back watches resume)");
    if (c->watch_workers > 256)
        return fail(err, errlen, "--watch-workers %ld: at most 256 (0 picks one per CPU)",
                    c->watch_workers);
    if (c->watch_budget < 16384)
        return fail(err, errlen, "--watch-budget must be at least 16384 bytes");
    if (c->watch_window < 65536)
        return fail(err, errlen, "--watch-window must be at least 65536 bytes (it holds the "
                                 "recent events lagging watchers catch up from)");
    if (c->bookmark_interval < 1 || c->bookmark_interval > 3600)
        return fail(err, errlen, "--bookmark-interval %ld: use 1 to 3600 seconds (kube: 60)",
                    c->bookmark_interval);
    if (resolve_listen(c, err, errlen) != 0)
        return KWC_ECONFIG;
    if (!c->listen_loopback && !c->insecure_allow_remote)
        return fail(err, errlen,
                    "--listen %s: kwc has no authentication yet, so it only serves loopback; "
                    "add --insecure-allow-remote to serve other hosts anyway",
                    c->listen);
    return 0;
}

void
cfg_fini(struct kwc_config *c)
{
    if (!c)
        return;
#define CFG_FREE_STR(field) free(c->field);
#define CFG_FREE_INT(field)
#define CFG_FREE_BOOL(field)
#define CFG_FREE(flag, field, type, def, meta, help) CFG_FREE_##type(field)
    CFG_OPTIONS(CFG_FREE)
#undef CFG_FREE
    free(c->listen_host);
    memset(c, 0, sizeof(*c));
}
