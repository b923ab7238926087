/*
 * config.c — flags and the --config YAML file into struct kwc_config.
 * Order: defaults, then the config file, then flags (flags win), then the
 * checks and the resolved fields (listen addresses, the connection cap, the
 * TLS version, the compiled --accept-hosts). Every message says what is
 * wrong and how to fix it.
 */
#include "kwc/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <regex.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <yaml.h>

#include "kwc/base.h"
#include "kwc/disco.h"
#include "kwc/kinds.h"
#include "kwc/store.h"
#include "kwc/pace.h"
#include "kwc/upstream.h"

#define CFG_FILE_MAX (1024 * 1024)
/* Timeouts become int milliseconds in the server. */
#define CFG_MAX_TIMEOUT_S 86400
/* Auto mode: upstream connections kept for the caches kwc starts itself
 * (--protobuf-resources, CRDs and APIServices), beyond --max-caches. */
#define CFG_OWN_CACHES 32
/* --watch-coalesce-max-ms: at most a second of added latency. */
#define CFG_MAX_COALESCE_MS 1000
_Static_assert(PACE_MAX_US == 25 * 1000,
               "--watch-coalesce-max-ms's default (config.h) is PACE_MAX_US");

enum opt_type { T_STR, T_INT, T_BOOL, T_DUR, T_QTY };

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
#define CFG_T_DUR T_DUR
#define CFG_T_QTY T_QTY
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

/* Store one value; src names where it came from for messages ("--listen", "config.yaml: listen").
 */
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
    case T_DUR: {
        uint64_t ms;
        if (kwc_parse_duration(val, &ms) != 0 || ms > (uint64_t)CFG_MAX_TIMEOUT_S * 1000)
            return fail(err, errlen,
                        "%s: \"%s\" is not a duration such as 30s, 5m or 1h30m (Go's form: a "
                        "number and a unit of ms, s, m or h; 0 alone; at most 24h)",
                        src, val);
        *(long *)slot = (long)ms;
        return 0;
    }
    case T_QTY: {
        uint64_t b;
        if (kwc_parse_quantity(val, &b) != 0 || b > (uint64_t)LONG_MAX)
            return fail(err, errlen,
                        "%s: \"%s\" is not a size such as 512Mi, 4Gi or 1000000 (a quantity as "
                        "Kubernetes writes one: bytes, or a suffix Ki Mi Gi Ti or k M G T)",
                        src, val);
        *(long *)slot = (long)b;
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
            rc = fail(err, errlen,
                      "--config %s: line %zu: values must be plain scalars (key: value)", path,
                      ev.start_mark.line + 1);
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
               "           [--listen HOST:PORT] [--resources LIST] [--config FILE] [options]\n\n"
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

/* The port of --listen: 1 to 5 digits, 0-65535 (strtol would allow "+1", " 1"). */
static int
parse_port(const char *p, int *out)
{
    long v = 0;
    size_t n = 0;
    for (; p[n] >= '0' && p[n] <= '9' && n < 6; n++)
        v = v * 10 + (p[n] - '0');
    if (n == 0 || p[n] || v > 65535)
        return -1;
    *out = (int)v;
    return 0;
}

/* Append sa with port set, unless the same address is there already. */
static void
add_listen(struct kwc_config *c, const struct sockaddr *sa, int port)
{
    struct http_listen_addr a;
    memset(&a, 0, sizeof(a));
    if (sa->sa_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)&a.ss;
        const struct sockaddr_in *src = (const struct sockaddr_in *)sa;
        in->sin_family = AF_INET;
        in->sin_addr = src->sin_addr;
        in->sin_port = htons((uint16_t)port);
        a.len = sizeof(*in);
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&a.ss;
        const struct sockaddr_in6 *src = (const struct sockaddr_in6 *)sa;
        in6->sin6_family = AF_INET6;
        in6->sin6_addr = src->sin6_addr;
        in6->sin6_scope_id = src->sin6_scope_id;
        in6->sin6_port = htons((uint16_t)port);
        a.len = sizeof(*in6);
    }
    /* Only the fields set above differ: a is zeroed, so bytes compare. */
    for (size_t i = 0; i < c->n_listen; i++)
        if (c->listen_addrs[i].len == a.len && memcmp(&c->listen_addrs[i].ss, &a.ss, a.len) == 0)
            return;
    c->listen_addrs = xrealloc(c->listen_addrs, (c->n_listen + 1) * sizeof(*c->listen_addrs));
    c->listen_addrs[c->n_listen++] = a;
}

static bool
is_loopback(const struct http_listen_addr *a)
{
    if (a->ss.ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)&a->ss)->sin_addr.s_addr) >> 24) == 127;
    return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)&a->ss)->sin6_addr);
}

/* host is a literal (numeric) or a name (resolved); adds every IPv4/IPv6 address. */
static int
resolve_host(struct kwc_config *c, const char *host, bool numeric, int family, int port, char *err,
             size_t errlen)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = numeric ? AI_NUMERICHOST : 0;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) {
        if (numeric)
            return fail(err, errlen,
                        "--listen \"%s\": \"%s\" is not an IPv6 address (brackets are for IPv6 "
                        "literals, e.g. [::1]:8001)",
                        c->listen, host);
        return fail(err, errlen,
                    "--listen \"%s\": cannot resolve \"%s\": %s (use an IP address, or a name "
                    "in /etc/hosts or DNS)",
                    c->listen, host, rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
    }
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next)
        if (ai->ai_family == AF_INET || ai->ai_family == AF_INET6)
            add_listen(c, ai->ai_addr, port);
    freeaddrinfo(res);
    if (c->n_listen == 0)
        return fail(err, errlen, "--listen \"%s\": \"%s\" has no IPv4 or IPv6 address", c->listen,
                    host);
    return 0;
}

/*
 * listen -> listen_addrs, listen_host, listen_port, listen_loopback.
 * "[V6]:PORT" one IPv6 literal; ":PORT" 0.0.0.0 and [::]; "HOST:PORT" an
 * IPv4 literal or a name, every distinct address it resolves to.
 */
static int
resolve_listen(struct kwc_config *c, char *err, size_t errlen)
{
    const char *l = c->listen, *colon;
    const char *form = "expected HOST:PORT, [IPV6]:PORT or :PORT (e.g. 127.0.0.1:8001)";
    char *host;
    if (l[0] == '[') {
        const char *close = strchr(l, ']');
        if (!close || close[1] != ':')
            return fail(err, errlen, "--listen \"%s\": %s", l, form);
        colon = close + 1;
        host = xstrndup(l + 1, (size_t)(close - l - 1));
    } else {
        colon = strrchr(l, ':');
        if (!colon)
            return fail(err, errlen, "--listen \"%s\": %s", l, form);
        host = xstrndup(l, (size_t)(colon - l));
        if (strchr(host, ':')) {
            free(host);
            return fail(err, errlen,
                        "--listen \"%s\": put an IPv6 address in brackets, e.g. [::1]:8001", l);
        }
    }
    if (parse_port(colon + 1, &c->listen_port) != 0) {
        free(host);
        return fail(err, errlen,
                    "--listen \"%s\": the port must be a number from 0 to 65535 (0 picks a free "
                    "one), e.g. 127.0.0.1:8001",
                    l);
    }
    int rc = 0;
    if (l[0] == '[') {
        rc = resolve_host(c, host, true, AF_INET6, c->listen_port, err, errlen);
    } else if (!*host) {
        struct sockaddr_in any4 = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
        struct sockaddr_in6 any6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT};
        add_listen(c, (struct sockaddr *)&any4, c->listen_port);
        add_listen(c, (struct sockaddr *)&any6, c->listen_port);
        free(host);
        host = xstrdup("0.0.0.0");
    } else {
        struct in_addr a4;
        bool literal = inet_pton(AF_INET, host, &a4) == 1;
        rc = resolve_host(c, host, literal, literal ? AF_INET : AF_UNSPEC, c->listen_port, err,
                          errlen);
    }
    c->listen_host = host;
    if (rc != 0)
        return rc;
    c->listen_loopback = true;
    for (size_t i = 0; i < c->n_listen; i++)
        c->listen_loopback = c->listen_loopback && is_loopback(&c->listen_addrs[i]);
    return 0;
}

/* The first listen address that is not loopback, as text (for a message). */
static void
first_remote(const struct kwc_config *c, char *buf, size_t len)
{
    snprintf(buf, len, "?");
    for (size_t i = 0; i < c->n_listen; i++) {
        const struct http_listen_addr *a = &c->listen_addrs[i];
        if (is_loopback(a))
            continue;
        if (a->ss.ss_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)&a->ss)->sin_addr, buf,
                      (socklen_t)len);
        else
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)&a->ss)->sin6_addr, buf,
                      (socklen_t)len);
        return;
    }
}

/* Non-empty entries of a comma-separated list. */
static unsigned
count_entries(const char *list)
{
    unsigned n = 0;
    for (const char *s = list; *s;) {
        size_t l = strcspn(s, ",");
        bool blank = true;
        for (size_t i = 0; i < l; i++)
            blank &= s[i] == ' ';
        n += !blank;
        s += l + (s[l] == ',');
    }
    return n;
}

int
cfg_fd_budget(const struct kwc_config *c, unsigned long limit, unsigned ncpu, bool upstream_name,
              struct cfg_fd_budget *out, char *err, size_t errlen)
{
    unsigned long loops = 1 + (c->watch_workers > 0 ? (unsigned long)c->watch_workers : ncpu);
    unsigned long conns =
        (unsigned long)c->max_upstream_connections + c->cache_conns + DISCO_MAX_CONNS;
    if (c->auth_delegated)
        conns += 2 * (unsigned long)c->max_review_connections;
    *out = (struct cfg_fd_budget){
        .limit = limit,
        .reserve = CFG_FD_FIXED + c->n_listen + CFG_FD_PER_LOOP * loops + HTTP_LINGER_MAX,
        .upstream = conns * (upstream_name ? 3 : 1) + 2 * UP_NPOOLS,
    };
    unsigned long kept = out->reserve + out->upstream;
    unsigned long left = limit > kept ? limit - kept : 0;
    if (left > UINT32_MAX)
        left = UINT32_MAX;
    if (c->max_connections > 0) {
        if ((unsigned long)c->max_connections > left)
            return fail(err, errlen,
                        "--max-connections %ld does not fit the open-file limit %lu: %lu "
                        "descriptors are kept for upstream connections (--max-upstream-connections "
                        "%ld, --max-review-connections %ld, %u for the caches) and %lu for "
                        "listeners, event loops, LMDB and refused connections; lower "
                        "--max-connections to %lu or less, or raise the limit (ulimit -n, "
                        "systemd's LimitNOFILE=)",
                        c->max_connections, limit, out->upstream, c->max_upstream_connections,
                        c->max_review_connections, c->cache_conns, out->reserve, left);
        out->connections = (unsigned long)c->max_connections;
        return 0;
    }
    if (left < CFG_MIN_AUTO_CONNS)
        return fail(err, errlen,
                    "the open-file limit %lu leaves %lu client connections (at least %d needed) "
                    "after %lu descriptors for upstream connections (--max-upstream-connections "
                    "%ld, --max-review-connections %ld, %u for the caches) and %lu for listeners, "
                    "event loops, LMDB and refused connections: raise the limit to %lu or more "
                    "(ulimit -n, systemd's LimitNOFILE=), or lower --max-upstream-connections",
                    limit, left, CFG_MIN_AUTO_CONNS, out->upstream, c->max_upstream_connections,
                    c->max_review_connections, c->cache_conns, out->reserve,
                    kept + CFG_MIN_AUTO_CONNS);
    out->connections = left;
    return 0;
}

/* "" means not given: free it and leave NULL. */
static void
empty_is_unset(char **s)
{
    if (*s && !**s) {
        free(*s);
        *s = NULL;
    }
}

static int
check_readable(const char *flag, const char *path, char *err, size_t errlen)
{
    if (access(path, R_OK) != 0)
        return fail(err, errlen, "--%s %s: cannot read it: %s (give a readable PEM file)", flag,
                    path, strerror(errno));
    return 0;
}

/* TLS files, version and the client CA. */
static int
check_tls(struct kwc_config *c, char *err, size_t errlen)
{
    const char *v = c->tls_min_version_s;
    if (strcmp(v, "VersionTLS12") == 0 || strcmp(v, "1.2") == 0)
        c->tls_min_version = TLS1_2_VERSION;
    else if (strcmp(v, "VersionTLS13") == 0 || strcmp(v, "1.3") == 0)
        c->tls_min_version = TLS1_3_VERSION;
    else if (strcmp(v, "VersionTLS10") == 0 || strcmp(v, "VersionTLS11") == 0 ||
             strcmp(v, "1.0") == 0 || strcmp(v, "1.1") == 0)
        return fail(err, errlen,
                    "--tls-min-version %s: TLS 1.0 and 1.1 are not supported; use VersionTLS12 "
                    "or VersionTLS13",
                    v);
    else
        return fail(err, errlen,
                    "--tls-min-version \"%s\": use VersionTLS12 or VersionTLS13 (or 1.2, 1.3)", v);
    if (strcmp(c->tls_kernel_s, "auto") == 0)
        c->tls_kernel = HTTP_TLS_KERNEL_AUTO;
    else if (strcmp(c->tls_kernel_s, "off") == 0)
        c->tls_kernel = HTTP_TLS_KERNEL_OFF;
    else
        return fail(err, errlen, "--tls-kernel \"%s\": use auto or off", c->tls_kernel_s);

    if (c->tls_cert_file && !c->tls_private_key_file)
        return fail(err, errlen,
                    "--tls-cert-file given without --tls-private-key-file: pass both (or "
                    "neither, for plain HTTP)");
    if (c->tls_private_key_file && !c->tls_cert_file)
        return fail(err, errlen,
                    "--tls-private-key-file given without --tls-cert-file: pass both (or "
                    "neither, for plain HTTP)");
    if (c->client_ca_file && !c->tls_cert_file)
        return fail(err, errlen,
                    "--client-ca-file needs TLS: add --tls-cert-file and --tls-private-key-file");
    if (c->tls_cert_file && check_readable("tls-cert-file", c->tls_cert_file, err, errlen))
        return KWC_ECONFIG;
    if (c->tls_private_key_file &&
        check_readable("tls-private-key-file", c->tls_private_key_file, err, errlen))
        return KWC_ECONFIG;
    if (c->client_ca_file && check_readable("client-ca-file", c->client_ca_file, err, errlen))
        return KWC_ECONFIG;
    return 0;
}

/* Opaque in config.h: see cfg_accept_hosts_match. */
struct cfg_regex {
    regex_t re;
};

static int
compile_accept_hosts(struct kwc_config *c, char *err, size_t errlen)
{
    if (!c->accept_hosts)
        return 0;
    struct cfg_regex *re = xmalloc(sizeof(*re));
    int rc = regcomp(&re->re, c->accept_hosts, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
        char msg[256];
        regerror(rc, &re->re, msg, sizeof(msg));
        free(re);
        return fail(err, errlen,
                    "--accept-hosts \"%s\": not a POSIX extended regex: %s (e.g. "
                    "'^kwc\\.example\\.com$')",
                    c->accept_hosts, msg);
    }
    c->accept_hosts_re = re;
    return 0;
}

int
cfg_parse(int argc, char **argv, struct kwc_config *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < KWC_ARRAY_LEN(opts); i++)
        if (opts[i].def && set_opt(c, &opts[i], opts[i].def, opts[i].flag, err, errlen) != 0)
            return KWC_ECONFIG;
    /* defaults that depend on other flags: -1 until given */
    c->max_connections_per_source = -1;
    c->max_reviews_per_source = -1;

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
            return fail(err, errlen,
                        "unexpected argument \"%s\" (options start with --; see kwc --help)", a);
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
    if (log_format_parse(c->log_format_s, &c->log_format) != 0)
        return fail(err, errlen, "--log-format \"%s\": use text or json", c->log_format_s);
    if (c->upstream && c->kubeconfig)
        return fail(err, errlen, "--upstream and --kubeconfig both given: pass only one");
    if (c->context && !c->kubeconfig)
        return fail(err, errlen, "--context needs --kubeconfig FILE");
    if (!c->upstream && !c->kubeconfig && !getenv("KUBERNETES_SERVICE_HOST"))
        return fail(err, errlen,
                    "no upstream: pass --upstream URL or --kubeconfig FILE "
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
        return fail(err, errlen,
                    "--max-response-buffer and --max-request-buffer must be at least 4096");
    if (strcmp(c->too_large_rv, "pass") != 0 && strcmp(c->too_large_rv, "504") != 0)
        return fail(err, errlen,
                    "--too-large-rv \"%s\": use pass (ask the upstream) or 504 "
                    "(answer like kube-apiserver's watch cache)",
                    c->too_large_rv);
    if (c->rv_wait_ms > 60000)
        return fail(err, errlen, "--rv-wait-ms %ld: at most 60000 (kube-apiserver waits 3000)",
                    c->rv_wait_ms);
    if (c->max_list_buffer < 16384)
        return fail(err, errlen, "--max-list-buffer must be at least 16384");
    if (c->history_max_events < 1 || c->history_max_bytes < 1 || c->history_max_age < 1)
        return fail(err, errlen,
                    "--history-max-events, --history-max-bytes and --history-max-age "
                    "must be at least 1 (they bound how far back watches resume)");
    if (strcmp(c->on_corrupt_cache, "rebuild") != 0 &&
        strcmp(c->on_corrupt_cache, "move-aside") != 0 && strcmp(c->on_corrupt_cache, "fail") != 0)
        return fail(err, errlen,
                    "--on-corrupt-cache \"%s\": use rebuild (wipe a damaged data dir and list "
                    "again), move-aside (keep it as data.mdb.corrupt-TIME) or fail (exit 2)",
                    c->on_corrupt_cache);
    if (c->max_staleness < 0 || c->max_staleness > 86400)
        return fail(err, errlen,
                    "--max-staleness %ld: use 0 (off) to 86400 seconds; upstreams "
                    "send a bookmark about every 60 s, so pick more than 60",
                    c->max_staleness);
    if (c->watch_workers > 256)
        return fail(err, errlen, "--watch-workers %ld: at most 256 (0 picks one per CPU)",
                    c->watch_workers);
    if (c->watch_budget < 16384)
        return fail(err, errlen, "--watch-budget must be at least 16384 bytes");
    if (c->watch_window < 65536)
        return fail(err, errlen,
                    "--watch-window must be at least 65536 bytes (it holds the "
                    "recent events lagging watchers catch up from)");
    if (c->watch_coalesce_max_ms > CFG_MAX_COALESCE_MS)
        return fail(err, errlen,
                    "--watch-coalesce-max-ms %ld: use 0 (never hold an event) to %d ms (the "
                    "latency a busy watch worker may add to let one write carry several events)",
                    c->watch_coalesce_max_ms, CFG_MAX_COALESCE_MS);
    if (c->bookmark_interval < 1 || c->bookmark_interval > 3600)
        return fail(err, errlen, "--bookmark-interval %ld: use 1 to 3600 seconds (kube: 60)",
                    c->bookmark_interval);
    if (c->discovery_interval < 1000 || c->discovery_interval > 3600 * 1000)
        return fail(err, errlen, "--discovery-interval %.3gs: use 1s to 1h",
                    (double)c->discovery_interval / 1000.0);
    if (c->log_summary_interval > 3600 * 1000)
        return fail(err, errlen,
                    "--log-summary-interval %.3gs: use 0 (write every occurrence) to 1h",
                    (double)c->log_summary_interval / 1000.0);
    if (c->max_header_bytes < 4096)
        return fail(err, errlen,
                    "--max-header-bytes %ld: at least 4096 (the request line and headers must "
                    "fit; Go's default is 1048576)",
                    c->max_header_bytes);
    if (c->request_header_timeout > CFG_MAX_TIMEOUT_S)
        return fail(err, errlen, "--request-header-timeout %ld: use 0 (none) to %d seconds",
                    c->request_header_timeout, CFG_MAX_TIMEOUT_S);
    if (c->idle_timeout > CFG_MAX_TIMEOUT_S)
        return fail(err, errlen, "--idle-timeout %ld: use 0 (none) to %d seconds", c->idle_timeout,
                    CFG_MAX_TIMEOUT_S);
    if (c->max_connections > (long)UINT32_MAX)
        return fail(err, errlen,
                    "--max-connections %ld: at most %lu (0 picks from the open-file limit)",
                    c->max_connections, (unsigned long)UINT32_MAX);
    c->max_connections_resolved = (unsigned)c->max_connections;
    if (c->shutdown_drain > 3600)
        return fail(err, errlen, "--shutdown-drain-seconds %ld: use 0 (close at once) to 3600",
                    c->shutdown_drain);
    if (c->http2_max_streams < 1 || c->http2_max_streams > 65536)
        return fail(err, errlen,
                    "--http2-max-streams-per-connection %ld: use 1 to 65536 (kube: 100)",
                    c->http2_max_streams);
    if (c->max_upstream_connections < 1 || c->max_upstream_connections > 65536)
        return fail(err, errlen,
                    "--max-upstream-connections %ld: use 1 to 65536 (requests past it wait for a "
                    "connection)",
                    c->max_upstream_connections);
    if (c->max_review_connections < 1 || c->max_review_connections > 65536)
        return fail(err, errlen,
                    "--max-review-connections %ld: use 1 to 65536 (reviews past it wait for a "
                    "connection)",
                    c->max_review_connections);
    if (c->max_connections_per_source > (long)UINT32_MAX)
        return fail(err, errlen, "--max-connections-per-source %ld: at most %lu (0: no limit)",
                    c->max_connections_per_source, (unsigned long)UINT32_MAX);
    if (c->max_reviews_per_source > 65536)
        return fail(err, errlen,
                    "--max-reviews-per-source %ld: use 0 (no limit) to 65536 (default: half of "
                    "--max-review-connections)",
                    c->max_reviews_per_source);
    if (c->review_timeout > CFG_MAX_TIMEOUT_S)
        return fail(err, errlen,
                    "--review-timeout %ld: use 0 (only --upstream-timeout) to %d seconds",
                    c->review_timeout, CFG_MAX_TIMEOUT_S);
    if (c->max_held_body_buffer < 65536)
        return fail(err, errlen,
                    "--max-held-body-buffer %ld: at least 65536 bytes (one stream's window)",
                    c->max_held_body_buffer);
    if (c->max_passthrough_buffer < 65536)
        return fail(err, errlen,
                    "--max-passthrough-buffer %ld: at least 65536 bytes (one upstream read)",
                    c->max_passthrough_buffer);
    empty_is_unset(&c->resources);
    if (!c->resources)
        c->resources = xstrdup("auto");
    c->auto_resources = strcmp(c->resources, "auto") == 0;
    if (c->max_caches < 1 || c->max_caches > STORE_MAX_RESOURCES)
        return fail(err, errlen, "--max-caches %ld: use 1 to %d", c->max_caches,
                    STORE_MAX_RESOURCES);
    /* one upstream connection per cache (each has at most one request in
     * flight, and over HTTP/1.1 a watch holds one); a built-in resource
     * listed counts twice (JSON and protobuf); auto: the caches requests
     * start, and room for those kwc starts itself (the protobuf defaults,
     * discovery's sources), which --max-caches does not count */
    c->cache_conns = c->auto_resources ? (unsigned)c->max_caches + CFG_OWN_CACHES
                                       : 2 * count_entries(c->resources);
    empty_is_unset(&c->accept_hosts);
    empty_is_unset(&c->tls_cert_file);
    empty_is_unset(&c->tls_private_key_file);
    empty_is_unset(&c->client_ca_file);
    if (check_tls(c, err, errlen) != 0)
        return KWC_ECONFIG;
    if (compile_accept_hosts(c, err, errlen) != 0)
        return KWC_ECONFIG;
    if (resolve_listen(c, err, errlen) != 0)
        return KWC_ECONFIG;
    empty_is_unset(&c->auth_mode);
    if (!c->auth_mode)
        c->auth_delegated = c->tls_cert_file != NULL;
    else if (strcmp(c->auth_mode, "delegated") == 0)
        c->auth_delegated = true;
    else if (strcmp(c->auth_mode, "none") != 0)
        return fail(err, errlen,
                    "--auth \"%s\": use delegated (the upstream authenticates and authorizes "
                    "each caller) or none (every caller acts as kwc, loopback only)",
                    c->auth_mode);
    if (strcmp(c->passthrough_identity, "impersonate") != 0 &&
        strcmp(c->passthrough_identity, "forward-token") != 0)
        return fail(err, errlen,
                    "--passthrough-identity \"%s\": use impersonate (kwc's credentials with "
                    "Impersonate-* headers) or forward-token (the caller's own bearer token)",
                    c->passthrough_identity);
    c->forward_token = strcmp(c->passthrough_identity, "forward-token") == 0;
    if (c->token_cache_ttl < 0 || c->authz_allow_ttl < 0 || c->authz_deny_ttl < 0 ||
        c->token_cache_ttl > 86400 || c->authz_allow_ttl > 86400 || c->authz_deny_ttl > 86400)
        return fail(err, errlen, "the webhook cache TTLs take 0 (no caching) to 86400 seconds");
    if (!c->listen_loopback && !c->insecure_allow_remote &&
        !(c->auth_delegated && c->tls_cert_file)) {
        char addr[INET6_ADDRSTRLEN];
        first_remote(c, addr, sizeof(addr));
        return fail(err, errlen,
                    "--listen %s: %s is not a loopback address; kwc serves other hosts only "
                    "with TLS and delegated authentication (--tls-cert-file, "
                    "--tls-private-key-file, --auth delegated), or with --insecure-allow-remote",
                    c->listen, addr);
    }
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
#define CFG_FREE_DUR(field)
#define CFG_FREE_QTY(field)
#define CFG_FREE(flag, field, type, def, meta, help) CFG_FREE_##type(field)
    CFG_OPTIONS(CFG_FREE)
#undef CFG_FREE
    free(c->listen_host);
    free(c->listen_addrs);
    if (c->accept_hosts_re)
        regfree(&c->accept_hosts_re->re);
    free(c->accept_hosts_re);
    memset(c, 0, sizeof(*c));
}

bool
cfg_accept_hosts_match(const struct kwc_config *c, const char *host)
{
    return c->accept_hosts_re && regexec(&c->accept_hosts_re->re, host, 0, NULL, 0) == 0;
}

unsigned
cfg_per_source_connections(const struct kwc_config *c)
{
    if (c->max_connections_per_source >= 0)
        return (unsigned)c->max_connections_per_source;
    /* a quarter: one address can take no more than that, and it takes four
     * to refuse everyone; 0 while max_connections is not resolved */
    unsigned m = c->max_connections_resolved;
    return m ? (m / 4 ? m / 4 : 1) : 0;
}

unsigned
cfg_per_source_reviews(const struct kwc_config *c)
{
    if (c->max_reviews_per_source >= 0)
        return (unsigned)c->max_reviews_per_source;
    long half = c->max_review_connections / 2;
    return half > 0 ? (unsigned)half : 1;
}
