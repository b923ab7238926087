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
/* Timeouts become int milliseconds in the server; a DUR row is capped here
 * (SECS rows have their own checks in cfg_parse). */
#define CFG_MAX_DUR_MS (24L * 3600 * 1000)
/* Auto mode: upstream connections kept for the caches kwc starts itself
 * (--protobuf-resources, CRDs and APIServices), beyond --max-caches. */
#define CFG_OWN_CACHES 32
/* --watch-coalesce-max-delay: at most a second of added latency. */
#define CFG_MAX_COALESCE_MS 1000
_Static_assert(PACE_MAX_US == 25 * 1000,
               "--watch-coalesce-max-delay's default (config.h) is PACE_MAX_US");
#define CFG_MAX_NOTES 64

enum opt_type { T_STR, T_STRS, T_INT, T_BOOL, T_DUR, T_SECS, T_QTY };
/* --help's sections, in the order kube's components print theirs. */
enum opt_group { G_SERVING, G_UPSTREAM, G_CACHE, G_WATCH, G_AUTHN, G_AUTHZ, G_OPS, G_N };
static const char *const group_names[G_N] = {
    "Serving", "Upstream", "Cache", "Watch", "Authentication", "Authorization", "Operations"};

struct opt {
    const char *flag;
    size_t off;
    enum opt_type type;
    enum opt_group group;
    const char *def, *help;
};

static const struct opt opts[] = {
#define CFG_T_STR T_STR
#define CFG_T_STRS T_STRS
#define CFG_T_INT T_INT
#define CFG_T_BOOL T_BOOL
#define CFG_T_DUR T_DUR
#define CFG_T_SECS T_SECS
#define CFG_T_QTY T_QTY
#define CFG_G_SERVING G_SERVING
#define CFG_G_UPSTREAM G_UPSTREAM
#define CFG_G_CACHE G_CACHE
#define CFG_G_WATCH G_WATCH
#define CFG_G_AUTHN G_AUTHN
#define CFG_G_AUTHZ G_AUTHZ
#define CFG_G_OPS G_OPS
#define CFG_ROW(flag, field, type, group, def, help)                                               \
    {flag, offsetof(struct kwc_config, field), CFG_T_##type, CFG_G_##group, def, help},
    CFG_OPTIONS(CFG_ROW)
#undef CFG_ROW
};

struct alias {
    const char *old, *now;
    unsigned bare_ms;
};

static const struct alias aliases[] = {
#define CFG_ALIAS(old, now, bare) {old, now, bare},
    CFG_ALIASES(CFG_ALIAS)
#undef CFG_ALIAS
};

static const struct opt *
find_opt(const char *name, size_t len)
{
    for (size_t i = 0; i < KWC_ARRAY_LEN(opts); i++)
        if (strlen(opts[i].flag) == len && memcmp(opts[i].flag, name, len) == 0)
            return &opts[i];
    return NULL;
}

/* A name as written (a flag's without "--", a file's key): its row, and
 * the alias it was given by (NULL: its own name). */
static const struct opt *
lookup(const char *name, size_t len, const struct alias **via)
{
    *via = NULL;
    for (size_t i = 0; i < KWC_ARRAY_LEN(aliases); i++)
        if (strlen(aliases[i].old) == len && memcmp(aliases[i].old, name, len) == 0) {
            *via = &aliases[i];
            return find_opt(aliases[i].now, strlen(aliases[i].now));
        }
    return find_opt(name, len);
}

#define fail(err, errlen, ...) kwc_errf((err), (errlen), KWC_ECONFIG, __VA_ARGS__)

/* Adds a deprecation note unless the same one is there (each once). */
static void note(struct kwc_config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void
note(struct kwc_config *c, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    for (size_t i = 0; i < c->n_notes; i++)
        if (strcmp(c->notes[i], buf) == 0)
            return;
    if (c->n_notes == CFG_MAX_NOTES)
        return;
    c->notes = xrealloc(c->notes, (c->n_notes + 1) * sizeof(*c->notes));
    c->notes[c->n_notes++] = xstrdup(buf);
}

/* Where a value came from, for messages: a flag or a --config file's key. */
struct src {
    const char *file;        /* NULL: a flag */
    const char *name;        /* as written: the row's name or an alias */
    const struct alias *via; /* the alias it was written as, or NULL */
};

static void
src_text(const struct src *s, char *buf, size_t len)
{
    if (s->file)
        snprintf(buf, len, "--config %s: %s", s->file, s->name);
    else
        snprintf(buf, len, "--%s", s->name);
}

/* "123": a bare whole number (the old seconds or milliseconds). */
static bool
bare_number(const char *v)
{
    size_t n = strspn(v, "0123456789");
    return n > 0 && n < 19 && !v[n];
}

/* The notes for a value given under an alias or as bare seconds: what to
 * write instead, in the same place (flag or file). */
static void
note_deprecated(struct kwc_config *c, const struct opt *o, const struct src *s, const char *val,
                long ms)
{
    char now[KWC_DURATION_LEN + 24];
    bool bare = bare_number(val) && strcmp(val, "0") != 0;
    if (s->via) {
        if (bare && s->via->bare_ms == 1000)
            snprintf(now, sizeof(now), "%ss", val);
        else if (bare && s->via->bare_ms)
            kwc_format_duration((uint64_t)ms, now, sizeof(now));
        else
            snprintf(now, sizeof(now), "%s", val);
        if (s->file)
            note(c, "--config %s: %s: %s is deprecated, write %s: %s", s->file, s->name, val,
                 o->flag, now);
        else
            note(c, "--%s=%s is deprecated, write --%s=%s", s->name, val, o->flag, now);
    } else if (o->type == T_SECS && bare) {
        char where[512];
        src_text(s, where, sizeof(where));
        note(c, "%s=%s: a bare number is read as seconds; this is deprecated, write %ss", where,
             val, val);
    }
}

/* A duration: Go's form, or a bare number of bare_ms milliseconds. */
static int
parse_dur(const char *val, unsigned bare_ms, long max, long *out)
{
    uint64_t ms;
    if (bare_ms && bare_number(val)) {
        unsigned long long v = strtoull(val, NULL, 10);
        if (v > (unsigned long long)max / bare_ms)
            return KWC_EPARSE;
        *out = (long)(v * bare_ms);
        return 0;
    }
    if (kwc_parse_duration(val, &ms) != 0 || ms > (uint64_t)max)
        return KWC_EPARSE;
    *out = (long)ms;
    return 0;
}

/* Store one value (a default, a flag, a file's key). */
static int
set_opt(struct kwc_config *c, const struct opt *o, const char *val, const struct src *s, char *err,
        size_t errlen)
{
    void *slot = (char *)c + o->off;
    char where[512];
    src_text(s, where, sizeof(where));
    switch (o->type) {
    case T_STR:
    case T_STRS:
        free(*(char **)slot);
        *(char **)slot = val ? xstrdup(val) : NULL;
        break;
    case T_INT: {
        char *end;
        errno = 0;
        long v = strtol(val, &end, 10);
        if (errno || end == val || *end || v < 0)
            return fail(err, errlen, "%s: \"%s\" is not a non-negative whole number", where, val);
        *(long *)slot = v;
        break;
    }
    case T_DUR:
    case T_SECS: {
        unsigned bare = s->via ? s->via->bare_ms : o->type == T_SECS ? 1000 : 0;
        if (parse_dur(val, bare, o->type == T_DUR ? CFG_MAX_DUR_MS : LONG_MAX, (long *)slot) != 0)
            return fail(err, errlen,
                        "%s: \"%s\" is not a duration such as 30s, 5m or 1h30m (Go's form: a "
                        "number and a unit of ms, s, m or h; 0 alone%s)",
                        where, val,
                        o->type == T_DUR ? "; at most 24h" : "; a bare number is seconds");
        break;
    }
    case T_QTY: {
        uint64_t b;
        if (kwc_parse_quantity(val, &b) != 0 || b > (uint64_t)LONG_MAX)
            return fail(err, errlen,
                        "%s: \"%s\" is not a size such as 512Mi, 4Gi or 1000000 (a quantity as "
                        "Kubernetes writes one: bytes, or a suffix Ki Mi Gi Ti or k M G T)",
                        where, val);
        *(long *)slot = (long)b;
        break;
    }
    case T_BOOL: {
        bool b;
        if (kwc_parse_bool(val, strlen(val), &b) != 0)
            return fail(err, errlen, "%s: \"%s\" is not true or false", where, val);
        *(bool *)slot = b;
        break;
    }
    }
    if (val && (s->via || o->type == T_SECS))
        note_deprecated(c, o, s, val, o->type == T_DUR || o->type == T_SECS ? *(long *)slot : 0);
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
                struct src s = {.file = path, .name = key};
                const struct opt *o = lookup(key, strlen(key), &s.via);
                if (!o)
                    rc = fail(err, errlen, "--config %s: unknown option \"%s\" (see kwc --help)",
                              path, key);
                else if (strcmp(key, "config") == 0)
                    rc = fail(err, errlen, "--config %s: a config file cannot name another", path);
                else
                    rc = set_opt(c, o, v, &s, err, errlen);
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

/* ---- --help -------------------------------------------------------------- */

/* pflag's names of the value types (Value.Type(); a bool has none). */
static const char *
type_name(enum opt_type t)
{
    static const char *const names[] = {
        [T_STR] = "string",   [T_STRS] = "strings",  [T_INT] = "int",     [T_BOOL] = "",
        [T_DUR] = "duration", [T_SECS] = "duration", [T_QTY] = "quantity"};
    return names[t];
}

/* " (default X)" as pflag writes it, "" for a zero value as pflag omits it. */
static void
default_text(const struct opt *o, char *buf, size_t len)
{
    buf[0] = '\0';
    const char *d = o->def;
    if (!d || !*d || (o->type != T_STR && o->type != T_STRS && strcmp(d, "0") == 0) ||
        strcmp(d, "false") == 0)
        return;
    if (o->type == T_STR) {
        snprintf(buf, len, " (default \"%s\")", d);
    } else if (o->type == T_STRS) {
        snprintf(buf, len, " (default [%s])", d);
    } else if (o->type == T_DUR || o->type == T_SECS) {
        uint64_t ms = 0;
        char go[KWC_DURATION_LEN];
        kwc_parse_duration(d, &ms);
        snprintf(buf, len, " (default %s)", kwc_format_duration(ms, go, sizeof(go)));
    } else {
        snprintf(buf, len, " (default %s)", d);
    }
}

/*
 * pflag's wrap(i, w, s): s in lines of at most w - i columns, each after the
 * first indented by i; "slop" lets the last words run 5 columns further
 * rather than be orphaned. One change: a word longer than a line (a list
 * default) breaks after a comma where pflag would overflow.
 */
static void
put_wrapped(FILE *f, size_t i, size_t w, const char *s)
{
    const size_t slop = 5;
    if (w - i < 24) { /* no room: a block under the flag, as pflag */
        i = 16;
        fprintf(f, "\n%*s", (int)i, "");
    }
    size_t room = w - i - slop;
    for (bool first = true; *s; first = false) {
        size_t len = strlen(s), take = len, skip = len;
        if (room + slop <= len) {
            size_t k = room; /* 1 + the last space before room (pflag's LastIndexAny) */
            while (k > 0 && s[k - 1] != ' ')
                k--;
            if (k > 1) {
                take = k - 1;
                skip = k;
            } else {
                for (k = room; k > 0 && s[k - 1] != ','; k--)
                    ;
                if (k > 0)
                    take = skip = k;
            }
        }
        if (!first)
            fprintf(f, "\n%*s", (int)i, "");
        fwrite(s, 1, take, f);
        s += skip;
    }
    fputc('\n', f);
}

struct help_line {
    char left[96];
    char text[1024];
};

void
cfg_usage(FILE *f)
{
    fprintf(f, "kwc is a watch-cache reverse proxy for the Kubernetes API.\n\n"
               "Usage:\n"
               "  kwc (--upstream URL | --kubeconfig FILE [--context NAME]) --data-dir DIR "
               "[flags]\n");
    static struct help_line lines[KWC_ARRAY_LEN(opts) + 2];
    for (int g = 0; g < G_N; g++) {
        size_t n = 0, maxlen = 0;
        for (size_t i = 0; i < KWC_ARRAY_LEN(opts); i++) {
            const struct opt *o = &opts[i];
            if ((int)o->group != g)
                continue;
            char def[256];
            default_text(o, def, sizeof(def));
            snprintf(lines[n].left, sizeof(lines[n].left), "      --%s%s%s", o->flag,
                     o->type == T_BOOL ? "" : " ", type_name(o->type));
            snprintf(lines[n].text, sizeof(lines[n].text), "%s%s", o->help, def);
            n++;
        }
        if (g == G_OPS) { /* cobra's own */
            snprintf(lines[n].left, sizeof(lines[n].left), "  -h, --help");
            snprintf(lines[n++].text, sizeof(lines[0].text), "help for kwc");
            snprintf(lines[n].left, sizeof(lines[n].left), "      --version");
            snprintf(lines[n++].text, sizeof(lines[0].text), "print the version and quit");
        }
        if (n == 0)
            continue;
        for (size_t i = 0; i < n; i++)
            if (strlen(lines[i].left) + 1 > maxlen)
                maxlen = strlen(lines[i].left) + 1;
        fprintf(f, "\n%s flags:\n\n", group_names[g]);
        for (size_t i = 0; i < n; i++) {
            fprintf(f, "%s %*s ", lines[i].left, (int)(maxlen - strlen(lines[i].left)), "");
            put_wrapped(f, maxlen + 2, CFG_HELP_COLS, lines[i].text);
        }
    }
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
    unsigned long serving = c->serving_threads > 0 ? (unsigned long)c->serving_threads : ncpu;
    unsigned long loops = 1 + serving; /* the main loop, the serving loops */
    /* the serving loops share --max-upstream-connections and
     * --max-review-connections, each its ceiling share (app.c: at most one
     * more per loop), and each has its own upstream client (its pools'
     * wakeup pairs) */
    unsigned long conns =
        (unsigned long)c->max_upstream_connections + serving + c->cache_conns + DISCO_MAX_CONNS;
    if (c->auth_delegated)
        conns += 2 * ((unsigned long)c->max_review_connections + serving);
    *out = (struct cfg_fd_budget){
        .limit = limit,
        .reserve = CFG_FD_FIXED + c->n_listen + CFG_FD_PER_LOOP * loops + HTTP_LINGER_MAX,
        .upstream = conns * (upstream_name ? 3 : 1) + 2 * UP_NPOOLS * loops,
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

/* A duration for a message: Go's form without its zero minutes and
 * seconds ("1h", "24h", "1m30s"), still a valid value for the flag. */
static const char *
dur_text(long ms, char *buf, size_t len)
{
    kwc_format_duration((uint64_t)ms, buf, len);
    size_t n = strlen(buf);
    if (n > 2 && strcmp(buf + n - 2, "0s") == 0 && (buf[n - 3] == 'm' || buf[n - 3] == 'h'))
        buf[n -= 2] = '\0';
    if (n > 2 && strcmp(buf + n - 2, "0m") == 0 && buf[n - 3] == 'h')
        buf[n - 2] = '\0';
    return buf;
}

/* A duration flag's range: "--idle-timeout 25h: use 0 to 24h (0: none)". */
static int
check_dur(const char *flag, long ms, long min, long max, const char *hint, char *err, size_t errlen)
{
    if (ms >= min && ms <= max)
        return 0;
    char v[KWC_DURATION_LEN], lo[KWC_DURATION_LEN], hi[KWC_DURATION_LEN];
    if (max == LONG_MAX)
        return fail(err, errlen, "--%s %s: at least %s%s%s", flag, dur_text(ms, v, sizeof(v)),
                    dur_text(min, lo, sizeof(lo)), hint[0] ? " " : "", hint);
    return fail(err, errlen, "--%s %s: use %s to %s%s%s", flag, dur_text(ms, v, sizeof(v)),
                min ? dur_text(min, lo, sizeof(lo)) : "0", dur_text(max, hi, sizeof(hi)),
                hint[0] ? " " : "", hint);
}

#define S_MS(n) ((long)(n)*1000)

/* Every duration's range (a SECS row has no other bound). */
static int
check_durations(const struct kwc_config *c, char *err, size_t errlen)
{
    const long day = S_MS(86400);
    const struct {
        const char *flag;
        long v, min, max;
        const char *hint;
    } d[] = {
        {"upstream-connect-timeout", c->upstream_connect_timeout_ms, S_MS(1), day, ""},
        {"upstream-timeout", c->upstream_timeout_ms, 0, day, "(0: none)"},
        {"request-header-timeout", c->request_header_timeout_ms, 0, day, "(0: none)"},
        {"idle-timeout", c->idle_timeout_ms, 0, day, "(0: none)"},
        {"review-timeout", c->review_timeout_ms, 0, day, "(0: only --upstream-timeout)"},
        {"shutdown-drain-grace-period", c->shutdown_drain_ms, 0, S_MS(3600), "(0: close at once)"},
        {"rv-wait-timeout", c->rv_wait_ms, 0, S_MS(60), "(kube-apiserver waits 3s)"},
        {"watch-coalesce-max-delay", c->watch_coalesce_max_ms, 0, CFG_MAX_COALESCE_MS,
         "(0: never hold an event; the latency a busy watch worker may add to let one write "
         "carry several events)"},
        {"bookmark-interval", c->bookmark_interval_ms, S_MS(1), S_MS(3600), "(kube: 1m)"},
        {"discovery-interval", c->discovery_interval, S_MS(1), S_MS(3600), ""},
        {"history-max-age", c->history_max_age_ms, S_MS(1), LONG_MAX,
         "(it bounds how far back watches resume)"},
        {"authentication-token-webhook-cache-ttl", c->token_cache_ttl_ms, 0, day,
         "(0: no caching; kube: 2m)"},
        {"authorization-webhook-cache-authorized-ttl", c->authz_allow_ttl_ms, 0, day,
         "(0: no caching; kube: 5m)"},
        {"authorization-webhook-cache-unauthorized-ttl", c->authz_deny_ttl_ms, 0, day,
         "(0: no caching; kube: 30s)"},
        {"max-staleness", c->max_staleness_ms, 0, day,
         "(0: off); upstreams send a bookmark about every minute, so pick more than 1m"},
        {"exec-plugin-timeout", c->exec_plugin_timeout, 100, S_MS(600),
         "(a credential plugin usually answers within a few seconds)"},
        {"log-summary-interval", c->log_summary_interval, 0, S_MS(3600),
         "(0: write every occurrence)"},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(d); i++)
        if (check_dur(d[i].flag, d[i].v, d[i].min, d[i].max, d[i].hint, err, errlen) != 0)
            return KWC_ECONFIG;
    return 0;
}

int
cfg_parse(int argc, char **argv, struct kwc_config *c, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < KWC_ARRAY_LEN(opts); i++) {
        struct src s = {.name = opts[i].flag};
        if (opts[i].def && set_opt(c, &opts[i], opts[i].def, &s, err, errlen) != 0)
            return KWC_ECONFIG;
    }
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
        char flag[128];
        snprintf(flag, sizeof(flag), "%.*s", (int)(nl < 100 ? nl : 100), name);
        struct src s = {.name = flag};
        const struct opt *o = lookup(name, nl, &s.via);
        if (!o)
            return fail(err, errlen, "unknown option \"--%.*s\" (see kwc --help)", (int)nl, name);
        const char *val;
        if (eq) {
            val = eq + 1;
        } else if (o->type == T_BOOL) {
            val = "true";
        } else {
            if (i + 1 >= argc)
                return fail(err, errlen, "--%s needs a value (a %s; see kwc --help)", flag,
                            type_name(o->type));
            val = argv[++i];
        }
        if (set_opt(c, o, val, &s, err, errlen) != 0)
            return KWC_ECONFIG;
    }

    if (log_level_parse(c->log_level_s, &c->log_level) != 0)
        return fail(err, errlen, "--log-level \"%s\": use debug, info, warn or error",
                    c->log_level_s);
    if (log_format_parse(c->log_format_s, &c->log_format) != 0)
        return fail(err, errlen, "--logging-format \"%s\": use text or json", c->log_format_s);
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
    if (check_durations(c, err, errlen) != 0)
        return KWC_ECONFIG;
    if (c->max_response_buffer < 4096 || c->max_request_buffer < 4096)
        return fail(err, errlen,
                    "--max-response-buffer and --max-request-buffer must be at least 4096");
    if (strcmp(c->too_large_rv, "pass") != 0 && strcmp(c->too_large_rv, "504") != 0)
        return fail(err, errlen,
                    "--too-large-rv \"%s\": use pass (ask the upstream) or 504 "
                    "(answer like kube-apiserver's watch cache)",
                    c->too_large_rv);
    if (c->max_list_buffer < 16384)
        return fail(err, errlen, "--max-list-buffer must be at least 16384");
    if (c->history_max_events < 1 || c->history_max_bytes < 1)
        return fail(err, errlen,
                    "--history-max-events and --history-max-bytes must be at least 1 (they bound "
                    "how far back watches resume)");
    if (strcmp(c->on_corrupt_cache, "rebuild") != 0 &&
        strcmp(c->on_corrupt_cache, "move-aside") != 0 && strcmp(c->on_corrupt_cache, "fail") != 0)
        return fail(err, errlen,
                    "--on-corrupt-cache \"%s\": use rebuild (wipe a damaged data dir and list "
                    "again), move-aside (keep it as data.mdb.corrupt-TIME) or fail (exit 2)",
                    c->on_corrupt_cache);
    if (c->serving_threads > 256 || c->serving_threads < 0)
        return fail(err, errlen, "--serving-threads %ld: 0 to 256 (0 picks one per CPU)",
                    c->serving_threads);
    if (c->watch_budget < 16384)
        return fail(err, errlen, "--watch-budget must be at least 16384 bytes");
    if (c->watch_window < 65536)
        return fail(err, errlen,
                    "--watch-window must be at least 65536 bytes (it holds the "
                    "recent events lagging watchers catch up from)");
    if (c->max_header_bytes < 4096)
        return fail(err, errlen,
                    "--max-header-bytes %ld: at least 4096 (the request line and headers must "
                    "fit; Go's default is 1048576)",
                    c->max_header_bytes);
    if (c->max_connections > (long)UINT32_MAX)
        return fail(err, errlen,
                    "--max-connections %ld: at most %lu (0 picks from the open-file limit)",
                    c->max_connections, (unsigned long)UINT32_MAX);
    c->max_connections_resolved = (unsigned)c->max_connections;
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
#define CFG_FREE_STRS(field) free(c->field);
#define CFG_FREE_INT(field)
#define CFG_FREE_BOOL(field)
#define CFG_FREE_DUR(field)
#define CFG_FREE_SECS(field)
#define CFG_FREE_QTY(field)
#define CFG_FREE(flag, field, type, group, def, help) CFG_FREE_##type(field)
    CFG_OPTIONS(CFG_FREE)
#undef CFG_FREE
    for (size_t i = 0; i < c->n_notes; i++)
        free(c->notes[i]);
    free(c->notes);
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
