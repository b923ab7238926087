/*
 * config_test.c — proxy/config.c: flags, the --config YAML file, validation.
 *
 * Expected values come from the option table's documented defaults
 * (include/kwc/config.h), the flags and files written here, and the rules the
 * header states: flags win over the file, one of --upstream/--kubeconfig,
 * loopback only unless --insecure-allow-remote, bools as Go's strconv.ParseBool.
 * Config files live in a fresh mkdtemp directory per test. The environment's
 * KUBERNETES_SERVICE_HOST (read by cfg_parse) is unset first.
 * --listen names are resolved through the system resolver: only "localhost"
 * (which /etc/hosts answers) and a name under .invalid (RFC 6761: never
 * resolves) are used. Expected addresses are checked against the address
 * families' own rules (127.0.0.0/8, ::1) and an independent getaddrinfo
 * call, the TLS versions against OpenSSL's constants, regex messages
 * against libc's own regerror, and the automatic connection cap against
 * getrlimit with the documented reserve of 512 and floor of 64.
 */
#include "kwc/config.h"

#include "kwc/base.h"
#include "kwc/disco.h"
#include "kwc/pace.h"
#include "kwc/upstream.h"
#include "tap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

static char err[512];

#define UP "--upstream", "http://127.0.0.1:8080"
#define DD "--data-dir", "/tmp/kwc-config-test-data"

/* cfg_parse over "kwc" plus the NULL-terminated arguments. */
static int
parse(struct kwc_config *c, ...)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = xstrdup("kwc");
    va_list ap;
    va_start(ap, c);
    for (const char *a; (a = va_arg(ap, const char *)) != NULL && argc < 63;)
        argv[argc++] = xstrdup(a);
    va_end(ap);
    argv[argc] = NULL;
    memset(err, 0, sizeof err);
    int rc = cfg_parse(argc, argv, c, err, sizeof err);
    for (int i = 0; i < argc; i++)
        free(argv[i]);
    return rc;
}

static int
err_has(const char *needle)
{
    int found = strstr(err, needle) != NULL;
    if (!found)
        printf("#   message: \"%s\"\n#   lacks:   \"%s\"\n", err, needle);
    return found;
}

/* A rejected configuration: KWC_ECONFIG and a message naming what is wrong. */
static void
rejected_at(int rc, const char *needle, const char *what, const char *file, int line)
{
    if (!tap_ok(rc == KWC_ECONFIG, file, line, what))
        printf("#   got %d, want KWC_ECONFIG\n", rc);
    char w[256];
    snprintf(w, sizeof w, "%s: message names \"%s\"", what, needle);
    tap_ok(err_has(needle), file, line, w);
}
#define rejected(rc, needle, what) rejected_at((rc), (needle), (what), __FILE__, __LINE__)

/* ---- temp files ---------------------------------------------------------- */

static char tmpdir[64];
static char paths[32][128];
static int npaths;

static const char *
write_yaml(const char *text)
{
    if (!tmpdir[0]) {
        strcpy(tmpdir, "/tmp/kwc_config_test.XXXXXX");
        if (!mkdtemp(tmpdir)) {
            perror("mkdtemp");
            exit(2);
        }
    }
    if (npaths == (int)KWC_ARRAY_LEN(paths)) {
        fprintf(stderr, "write_yaml: too many files\n");
        exit(2);
    }
    char *p = paths[npaths];
    snprintf(p, sizeof paths[0], "%s/c%d.yaml", tmpdir, npaths);
    npaths++;
    FILE *f = fopen(p, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        perror(p);
        exit(2);
    }
    return p;
}

static void
cleanup_files(void)
{
    for (int i = 0; i < npaths; i++)
        unlink(paths[i]);
    npaths = 0;
    if (tmpdir[0])
        rmdir(tmpdir);
    tmpdir[0] = '\0';
}

/* ---- tests --------------------------------------------------------------- */

static void
test_defaults(void)
{
    struct kwc_config c;
    is_int(parse(&c, UP, DD, NULL), 0, "minimal flags");
    is_str(c.upstream, "http://127.0.0.1:8080", "upstream");
    is_str(c.data_dir, "/tmp/kwc-config-test-data", "data-dir");
    is_str(c.kubeconfig, NULL, "no kubeconfig");
    is_str(c.context, NULL, "no context");
    is_str(c.resources, "auto", "resources: auto");
    ok(c.auto_resources, "auto: caches on demand");
    is_str(c.resources_exclude, "v1/events,events.k8s.io/v1/events,coordination.k8s.io/v1/leases",
           "events and leases excluded");
    is_int(c.cache_start_timeout, 10000, "cache-start-timeout 10s");
    is_int(c.cache_idle_timeout, 600000, "cache-idle-timeout 10m");
    is_int(c.cache_disk_budget, 2147483648L, "cache-disk-budget 2Gi");
    is_int(c.max_caches, 256, "max-caches");
    is_int(c.cache_conns, 256 + 32,
           "auto: a cache connection per cache requests may run, and 32 "
           "for those kwc starts itself");
    is_str(c.config_file, NULL, "no config file");
    is_str(c.port_file, NULL, "no port file");
    is_str(c.listen, "127.0.0.1:8001", "listen default");
    is_str(c.listen_host, "127.0.0.1", "listen host");
    is_int(c.listen_port, 8001, "listen port");
    ok(c.listen_loopback, "loopback");
    is_str(c.log_level_s, "info", "log level text");
    is_int(c.log_level, LOG_INFO, "log level");
    is_int(c.upstream_connect_timeout_ms, 5000, "connect timeout");
    is_int(c.upstream_timeout_ms, 60000, "upstream timeout");
    ok(!c.insecure_allow_remote, "insecure-allow-remote off");
    is_int(c.max_response_buffer, 1048576, "max-response-buffer");
    is_int(c.max_request_buffer, 1048576, "max-request-buffer");
    cfg_fini(&c);
    cfg_fini(&c); /* twice is harmless */
    cfg_fini(NULL);
}

static void
test_flag_forms(void)
{
    struct kwc_config c;
    is_int(parse(&c, "--upstream=https://h:6443", "--data-dir=/d", "--listen=127.0.0.1:0",
                 "--log-level=debug", "--resources=v1/pods,apps/v1/deployments",
                 "--port-file=/tmp/p", "--upstream-timeout=0", "--upstream-connect-timeout=2",
                 "--max-response-buffer=4096", "--max-request-buffer", "8192", NULL),
           0, "--flag=value");
    is_str(c.upstream, "https://h:6443", "upstream");
    is_str(c.data_dir, "/d", "data-dir");
    is_int(c.listen_port, 0, "port 0");
    is_int(c.log_level, LOG_DEBUG, "debug");
    is_str(c.resources, "v1/pods,apps/v1/deployments", "resources");
    is_str(c.port_file, "/tmp/p", "port-file");
    is_int(c.upstream_timeout_ms, 0, "upstream-timeout 0 (none)");
    is_int(c.upstream_connect_timeout_ms, 2000, "connect timeout");
    is_int(c.max_response_buffer, 4096, "max-response-buffer");
    is_int(c.max_request_buffer, 8192, "max-request-buffer, separate value");
    cfg_fini(&c);

    is_int(parse(&c, "--data-dir", "/d", "--upstream", "http://a:1", "--log-level", "warn", NULL),
           0, "--flag value");
    is_str(c.upstream, "http://a:1", "upstream");
    is_int(c.log_level, LOG_WARN, "warn");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--log-level", "error", NULL), 0, "error level");
    is_int(c.log_level, LOG_ERROR, "error");
    is_int(c.log_format, LOG_TEXT, "text logs by default");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--logging-format", "json", NULL), 0, "json logs");
    is_int(c.log_format, LOG_JSON, "json");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--logging-format", "yaml", NULL), KWC_ECONFIG,
           "--logging-format yaml");
    ok(strstr(err, "--logging-format \"yaml\": use text or json") != NULL, "says what to use");
    cfg_fini(&c);

    /* The last of a repeated flag wins. */
    is_int(parse(&c, "--upstream", "http://first:1", DD, "--upstream", "http://second:2", NULL), 0,
           "repeated flag");
    is_str(c.upstream, "http://second:2", "last value wins");
    cfg_fini(&c);

    /* A value may itself start with dashes or contain '='. */
    is_int(parse(&c, UP, "--data-dir", "--odd=dir", NULL), 0, "value that looks like a flag");
    is_str(c.data_dir, "--odd=dir", "taken verbatim");
    cfg_fini(&c);
}

static void
test_bools(void)
{
    struct kwc_config c;
    is_int(parse(&c, UP, DD, "--listen", "0.0.0.0:8001", "--insecure-allow-remote", NULL), 0,
           "bare bool flag");
    ok(c.insecure_allow_remote, "bare bool flag is true");
    cfg_fini(&c);

    static const char *const yes[] = {"--insecure-allow-remote=true", "--insecure-allow-remote=1",
                                      "--insecure-allow-remote=T", "--insecure-allow-remote=True"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(yes); i++) {
        is_int(parse(&c, UP, DD, yes[i], NULL), 0, yes[i]);
        ok(c.insecure_allow_remote, yes[i]);
        cfg_fini(&c);
    }
    is_int(parse(&c, UP, DD, "--insecure-allow-remote=false", NULL), 0, "=false");
    ok(!c.insecure_allow_remote, "=false is false");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--insecure-allow-remote=0", NULL), 0, "=0");
    ok(!c.insecure_allow_remote, "=0 is false");
    cfg_fini(&c);

    /* strconv.ParseBool rejects these. */
    static const char *const bad[] = {"--insecure-allow-remote=yes",
                                      "--insecure-allow-remote=", "--insecure-allow-remote=tRuE"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        rejected(parse(&c, UP, DD, bad[i], NULL), "--insecure-allow-remote", bad[i]);
        cfg_fini(&c);
    }
}

static void
test_ints(void)
{
    struct kwc_config c;
    static const char *const bad[] = {"abc", "-1", "1.5", "", "12x", "99999999999999999999999"};
    char what[96];
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        snprintf(what, sizeof what, "--upstream-timeout \"%s\" rejected", bad[i]);
        rejected(parse(&c, UP, DD, "--upstream-timeout", bad[i], NULL), "--upstream-timeout", what);
        cfg_fini(&c);
    }
    rejected(parse(&c, UP, DD, "--upstream-connect-timeout", "0", NULL),
             "--upstream-connect-timeout", "connect timeout 0 rejected");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--max-response-buffer", "100", NULL), "--max-response-buffer",
             "tiny response buffer rejected");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--max-request-buffer", "4095", NULL), "--max-request-buffer",
             "tiny request buffer rejected");
    cfg_fini(&c);
}

static void
test_upstream_rules(void)
{
    struct kwc_config c;
    rejected(parse(&c, UP, "--kubeconfig", "/k", DD, NULL), "--kubeconfig",
             "--upstream and --kubeconfig together");
    ok(err_has("--upstream"), "message names --upstream too");
    cfg_fini(&c);

    is_int(parse(&c, "--kubeconfig", "/k", "--context", "ctx", DD, NULL), 0,
           "--kubeconfig with --context");
    is_str(c.kubeconfig, "/k", "kubeconfig");
    is_str(c.context, "ctx", "context");
    is_str(c.upstream, NULL, "no upstream");
    cfg_fini(&c);

    rejected(parse(&c, UP, "--context", "ctx", DD, NULL), "--kubeconfig",
             "--context without --kubeconfig");
    cfg_fini(&c);

    rejected(parse(&c, DD, NULL), "--upstream", "no upstream at all");
    cfg_fini(&c);

    /* In a pod, the service account stands in for --upstream. */
    setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1", 1);
    is_int(parse(&c, DD, NULL), 0, "in a pod, no upstream flag needed");
    cfg_fini(&c);
    unsetenv("KUBERNETES_SERVICE_HOST");

    rejected(parse(&c, "--upstream", "ftp://h", DD, NULL), "ftp://h", "non-http upstream");
    cfg_fini(&c);
    rejected(parse(&c, "--upstream", "127.0.0.1:8080", DD, NULL), "--upstream",
             "upstream without a scheme");
    cfg_fini(&c);

    rejected(parse(&c, UP, NULL), "--data-dir", "missing --data-dir");
    cfg_fini(&c);
    rejected(parse(&c, UP, "--data-dir=", NULL), "--data-dir", "empty --data-dir");
    cfg_fini(&c);
}

static void
test_log_level(void)
{
    struct kwc_config c;
    static const char *const bad[] = {"verbose", "INFO", "", "warning", "2"};
    char what[64];
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        snprintf(what, sizeof what, "--log-level \"%s\"", bad[i]);
        rejected(parse(&c, UP, DD, "--log-level", bad[i], NULL), "--log-level", what);
        cfg_fini(&c);
    }
}

/* ---- listen addresses ---------------------------------------------------- */

static int
addr_port(const struct http_listen_addr *a)
{
    if (a->ss.ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)&a->ss)->sin_port);
    return ntohs(((const struct sockaddr_in6 *)&a->ss)->sin6_port);
}

/* The address as text ("127.0.0.1", "::1"); buf is returned. */
static const char *
addr_text(const struct http_listen_addr *a, char *buf, size_t len)
{
    const void *p = a->ss.ss_family == AF_INET
                        ? (const void *)&((const struct sockaddr_in *)&a->ss)->sin_addr
                        : (const void *)&((const struct sockaddr_in6 *)&a->ss)->sin6_addr;
    if (!inet_ntop(a->ss.ss_family, p, buf, (socklen_t)len))
        snprintf(buf, len, "(family %d)", a->ss.ss_family);
    return buf;
}

/* 127.0.0.0/8 or ::1, decided from the bytes. */
static int
addr_loopback(const struct http_listen_addr *a)
{
    if (a->ss.ss_family == AF_INET) {
        const unsigned char *b =
            (const unsigned char *)&((const struct sockaddr_in *)&a->ss)->sin_addr;
        return b[0] == 127;
    }
    static const unsigned char one[16] = {[15] = 1};
    return a->ss.ss_family == AF_INET6 &&
           memcmp(&((const struct sockaddr_in6 *)&a->ss)->sin6_addr, one, 16) == 0;
}

/* The only address is text, of the right family and length, with port. */
static void
one_addr_at(const struct kwc_config *c, int family, const char *text, int port, const char *what,
            const char *file, int line)
{
    char buf[INET6_ADDRSTRLEN + 16], w[160];
    snprintf(w, sizeof w, "%s: one address", what);
    if (!tap_ok(c->n_listen == 1, file, line, w)) {
        printf("#   got %zu addresses\n", c->n_listen);
        return;
    }
    const struct http_listen_addr *a = &c->listen_addrs[0];
    snprintf(w, sizeof w, "%s: family", what);
    tap_ok(a->ss.ss_family == family, file, line, w);
    snprintf(w, sizeof w, "%s: sockaddr length", what);
    tap_ok(a->len == (family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6)),
           file, line, w);
    snprintf(w, sizeof w, "%s: address %s", what, text);
    if (!tap_ok(strcmp(addr_text(a, buf, sizeof buf), text) == 0, file, line, w))
        printf("#   got %s\n", buf);
    snprintf(w, sizeof w, "%s: port %d", what, port);
    tap_ok(addr_port(a) == port, file, line, w);
}
#define one_addr(c, family, text, port, what)                                                      \
    one_addr_at((c), (family), (text), (port), (what), __FILE__, __LINE__)

static void
test_listen(void)
{
    struct kwc_config c;
    is_int(parse(&c, UP, DD, NULL), 0, "default listen");
    one_addr(&c, AF_INET, "127.0.0.1", 8001, "default 127.0.0.1:8001");
    cfg_fini(&c);
    ok(c.listen_addrs == NULL && c.n_listen == 0, "cfg_fini clears the addresses");

    is_int(parse(&c, UP, DD, "--listen", "[::1]:0", NULL), 0, "[::1]:0");
    is_str(c.listen_host, "::1", "host ::1 without brackets");
    is_int(c.listen_port, 0, "port 0");
    ok(c.listen_loopback, "::1 is loopback");
    one_addr(&c, AF_INET6, "::1", 0, "[::1]:0");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--listen", "[::1]:8001", NULL), 0, "[::1]:8001");
    one_addr(&c, AF_INET6, "::1", 8001, "[::1]:8001");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--listen", "127.1.2.3:65535", NULL), 0, "127/8 address");
    is_str(c.listen_host, "127.1.2.3", "host");
    is_int(c.listen_port, 65535, "port 65535");
    ok(c.listen_loopback, "127.1.2.3 is loopback");
    one_addr(&c, AF_INET, "127.1.2.3", 65535, "127.1.2.3:65535");
    cfg_fini(&c);

    /* Anything else needs --insecure-allow-remote; the message names the address. */
    static const struct {
        const char *listen, *addr;
    } remote[] = {{"0.0.0.0:8001", "0.0.0.0"},
                  {":8001", "0.0.0.0"},
                  {"[::]:8001", "::"},
                  {"10.1.2.3:80", "10.1.2.3"},
                  {"192.168.0.1:0", "192.168.0.1"},
                  /* not a dotted quad, so resolved as a name: glibc's
                   * getaddrinfo reads it as inet_aton does, without DNS */
                  {"10.1:80", "10.0.0.1"}};
    char what[160];
    for (size_t i = 0; i < KWC_ARRAY_LEN(remote); i++) {
        snprintf(what, sizeof what, "--listen %s refused", remote[i].listen);
        rejected(parse(&c, UP, DD, "--listen", remote[i].listen, NULL), "--insecure-allow-remote",
                 what);
        ok(err_has(remote[i].addr), "message names the non-loopback address");
        ok(err_has("authentication"), "message says why");
        cfg_fini(&c);
        snprintf(what, sizeof what, "--listen %s with --insecure-allow-remote", remote[i].listen);
        is_int(parse(&c, UP, DD, "--listen", remote[i].listen, "--insecure-allow-remote", NULL), 0,
               what);
        ok(!c.listen_loopback, "not loopback");
        cfg_fini(&c);
    }

    /* A remote literal is one address, as given. */
    is_int(parse(&c, UP, DD, "--listen", "10.1.2.3:80", "--insecure-allow-remote", NULL), 0,
           "remote with the flag");
    one_addr(&c, AF_INET, "10.1.2.3", 80, "10.1.2.3:80");
    cfg_fini(&c);

    /* ":PORT" is every address: 0.0.0.0 then [::]. */
    static const char *const every[] = {":8001", ":0"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(every); i++) {
        int port = atoi(every[i] + 1);
        is_int(parse(&c, UP, DD, "--listen", every[i], "--insecure-allow-remote", NULL), 0,
               every[i]);
        is_str(c.listen_host, "0.0.0.0", "empty host is every interface");
        is_int(c.listen_port, port, "port");
        char buf[INET6_ADDRSTRLEN];
        if (ok(c.n_listen == 2, "two addresses")) {
            ok(c.listen_addrs[0].ss.ss_family == AF_INET, "IPv4 first");
            is_str(addr_text(&c.listen_addrs[0], buf, sizeof buf), "0.0.0.0", "0.0.0.0");
            is_int(addr_port(&c.listen_addrs[0]), port, "its port");
            ok(c.listen_addrs[1].ss.ss_family == AF_INET6, "then IPv6");
            is_str(addr_text(&c.listen_addrs[1], buf, sizeof buf), "::", "::");
            is_int(addr_port(&c.listen_addrs[1]), port, "its port");
            is_int(c.listen_addrs[1].len, sizeof(struct sockaddr_in6), "IPv6 length");
        }
        ok(!c.listen_loopback, "not loopback");
        cfg_fini(&c);
    }

    static const struct {
        const char *listen, *says;
    } bad[] = {{"127.0.0.1", "HOST:PORT"},
               {"", "HOST:PORT"},
               {"foo", "[IPV6]:PORT"},
               {"[::1]", "[IPV6]:PORT"},
               {"[::1]80", "HOST:PORT"},
               {"[::1", "HOST:PORT"},
               {"127.0.0.1:", "65535"},
               {"127.0.0.1:65536", "65535"},
               {"127.0.0.1:-1", "65535"},
               {"127.0.0.1:http", "65535"},
               {"127.0.0.1:80x", "65535"},
               {"127.0.0.1:+80", "65535"},
               {"127.0.0.1: 80", "65535"},
               {"127.0.0.1:0000080", "65535"},
               {"[::1]:99999999999", "65535"},
               {"::1:80", "brackets"},
               {"::1", "brackets"},
               {"[127.0.0.1]:80", "not an IPv6 address"},
               {"[zz]:80", "not an IPv6 address"}};
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        snprintf(what, sizeof what, "--listen \"%s\" rejected", bad[i].listen);
        rejected(parse(&c, UP, DD, "--listen", bad[i].listen, NULL), "--listen", what);
        ok(err_has(bad[i].says), "message says how");
        cfg_fini(&c);
    }
    /* Leading zeros within five digits are still a port. */
    is_int(parse(&c, UP, DD, "--listen", "127.0.0.1:08001", NULL), 0, "port 08001");
    is_int(c.listen_port, 8001, "8001");
    cfg_fini(&c);

    /* A name that does not resolve: the name and the resolver's word. */
    rejected(parse(&c, UP, DD, "--listen", "kwc-test.invalid:8001", NULL), "kwc-test.invalid",
             "unresolvable name");
    ok(err_has("cannot resolve"), "message says it did not resolve");
    cfg_fini(&c);

    /* From the config file too. */
    const char *p = write_yaml("listen: \"[::1]:7000\"\n");
    is_int(parse(&c, UP, DD, "--config", p, NULL), 0, "listen from file");
    one_addr(&c, AF_INET6, "::1", 7000, "[::1]:7000 from file");
    cfg_fini(&c);
    cleanup_files();
}

/* Regression: libevhtp bound 255.255.255.255 for "localhost". The name must
 * resolve to loopback addresses only, each once, every one getaddrinfo has. */
static void
test_listen_localhost(void)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (!ok(getaddrinfo("localhost", NULL, &hints, &res) == 0, "the system resolves localhost"))
        return;
    size_t distinct = 0;
    char seen[8][INET6_ADDRSTRLEN];
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        char buf[INET6_ADDRSTRLEN];
        const void *a = ai->ai_family == AF_INET
                            ? (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr
                            : (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
        if ((ai->ai_family != AF_INET && ai->ai_family != AF_INET6) ||
            !inet_ntop(ai->ai_family, a, buf, sizeof buf))
            continue;
        size_t j = 0;
        while (j < distinct && strcmp(seen[j], buf) != 0)
            j++;
        if (j == distinct && distinct < KWC_ARRAY_LEN(seen))
            strcpy(seen[distinct++], buf);
    }
    freeaddrinfo(res);

    static const char *const forms[] = {"localhost:0", "localhost:8001"};
    for (size_t f = 0; f < KWC_ARRAY_LEN(forms); f++) {
        struct kwc_config c;
        int port = atoi(strchr(forms[f], ':') + 1);
        is_int(parse(&c, UP, DD, "--listen", forms[f], NULL), 0, forms[f]);
        is_str(c.listen_host, "localhost", "listen_host as given");
        is_int(c.listen_port, port, "listen_port");
        ok(c.listen_loopback, "localhost is loopback");
        ok(c.n_listen >= 1, "at least one address");
        is_int(c.n_listen, distinct, "every distinct address the resolver gives, once");
        for (size_t i = 0; i < c.n_listen; i++) {
            char buf[INET6_ADDRSTRLEN], w[96];
            addr_text(&c.listen_addrs[i], buf, sizeof buf);
            snprintf(w, sizeof w, "%s: %s is loopback", forms[f], buf);
            ok(addr_loopback(&c.listen_addrs[i]), w);
            ok(strcmp(buf, "255.255.255.255") != 0, "not the broadcast address");
            is_int(addr_port(&c.listen_addrs[i]), port, "port on every address");
            for (size_t j = 0; j < i; j++) {
                char other[INET6_ADDRSTRLEN];
                ok(strcmp(buf, addr_text(&c.listen_addrs[j], other, sizeof other)) != 0,
                   "no address twice");
            }
        }
        cfg_fini(&c);
    }
}

/* ---- the front end's limits ------------------------------------------------ */

/* The open-file budget, by the rule config.h documents. */
static void
test_fd_budget(void)
{
    struct kwc_config c;
    struct cfg_fd_budget b;
    is_int(parse(&c, UP, DD, "--resources", "v1/pods, v1/configmaps,", "--serving-threads", "2",
                 "--max-upstream-connections", "10", NULL),
           0, "budget flags");
    is_int(c.cache_conns, 4, "two caches per --resources entry (JSON, protobuf)");
    /* reserve: fixed + 1 listener + 3 loops (main + 2 serving) + lingering refusals */
    unsigned long reserve = CFG_FD_FIXED + 1 + 3 * CFG_FD_PER_LOOP + HTTP_LINGER_MAX;
    /* upstream: 10 passthrough (+1 per serving loop: each its ceiling share)
     * + 4 cache connections + discovery's (no reviews with --auth none), and
     * each pool's wakeup pair in each loop's upstream client */
    unsigned long up = 12 + 4 + DISCO_MAX_CONNS + 3 * 2 * UP_NPOOLS;
    is_int(cfg_fd_budget(&c, 1000, 8, false, &b, err, sizeof err), 0, "auto fits");
    is_int(b.reserve, reserve, "reserve");
    is_int(b.upstream, up, "upstream connections, an IP upstream");
    is_int(b.connections, 1000 - reserve - up, "auto: what the limit leaves");
    is_int(cfg_fd_budget(&c, 1000, 8, true, &b, err, sizeof err), 0, "a named upstream");
    is_int(b.upstream, (16 + DISCO_MAX_CONNS) * 3 + 3 * 2 * UP_NPOOLS,
           "a resolver socketpair per connection");
    is_int(cfg_fd_budget(&c, reserve + up + 64, 8, false, &b, err, sizeof err), 0,
           "the least limit");
    is_int(b.connections, 64, "at least 64 connections");
    rejected(cfg_fd_budget(&c, reserve + up + 63, 8, false, &b, err, sizeof err), "open-file limit",
             "a limit leaving fewer than 64");
    ok(err_has("ulimit -n"), "says how to raise the limit");
    ok(err_has("--max-upstream-connections"), "or what to lower");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--resources", "v1/pods,v1/configmaps", "--serving-threads", "2",
                 "--max-upstream-connections", "10", "--max-connections", "677", "--auth",
                 "delegated", "--max-review-connections", "5", NULL),
           0, "explicit --max-connections");
    up += 2 * (5 + 2); /* TokenReview and SubjectAccessReview pools, shared as above */
    is_int(cfg_fd_budget(&c, 677 + reserve + up, 8, false, &b, err, sizeof err), 0,
           "an explicit cap that fits");
    is_int(b.connections, 677, "kept as asked");
    is_int(b.upstream, up, "review pools counted with --auth delegated");
    rejected(cfg_fd_budget(&c, 676 + reserve + up, 8, false, &b, err, sizeof err),
             "--max-connections 677", "an explicit cap that does not fit");
    ok(err_has("676 or less"), "names the largest that fits");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--serving-threads", "0", NULL), 0, "serving loops: one per CPU");
    unsigned long r1, r2;
    cfg_fd_budget(&c, 100000, 1, false, &b, err, sizeof err);
    r1 = b.reserve;
    cfg_fd_budget(&c, 100000, 5, false, &b, err, sizeof err);
    r2 = b.reserve;
    is_int(r2 - r1, 4 * CFG_FD_PER_LOOP, "each serving loop reserved");
    cfg_fini(&c);

    rejected(parse(&c, UP, DD, "--max-upstream-connections", "0", NULL),
             "--max-upstream-connections", "no passthrough connection at all");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--max-review-connections", "0", NULL), "--max-review-connections",
             "no review connection at all");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--max-passthrough-buffer", "1000", NULL),
             "--max-passthrough-buffer", "a passthrough buffer below one read");
    cfg_fini(&c);
}

/* The per-source limits and the review deadline (issue 29): their
 * defaults follow the flags they are shares of; 0 turns a limit off. */
static void
test_per_source(void)
{
    struct kwc_config c;
    is_int(parse(&c, UP, DD, NULL), 0, "defaults");
    is_int(c.review_timeout_ms, 10000, "review-timeout: 10 s");
    is_int(cfg_per_source_reviews(&c), 16, "max-reviews-per-source: half of 32");
    is_int(cfg_per_source_connections(&c), 0, "per source: nothing before --max-connections");
    c.max_connections_resolved = 1000;
    is_int(cfg_per_source_connections(&c), 250, "max-connections-per-source: a quarter");
    c.max_connections_resolved = 3;
    is_int(cfg_per_source_connections(&c), 1, "...at least 1");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--max-review-connections", "1", "--max-connections", "100", NULL), 0,
           "small caps");
    is_int(cfg_per_source_reviews(&c), 1, "reviews per source: at least 1");
    is_int(cfg_per_source_connections(&c), 25, "a quarter of an explicit --max-connections");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--max-connections-per-source", "0", "--max-reviews-per-source", "0",
                 "--review-timeout", "0", NULL),
           0, "every one off");
    c.max_connections_resolved = 1000;
    is_int(cfg_per_source_connections(&c), 0, "connections per source: 0 is no limit");
    is_int(cfg_per_source_reviews(&c), 0, "reviews per source: 0 is no limit");
    is_int(c.review_timeout_ms, 0, "review-timeout 0: none of its own");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--max-connections-per-source", "7", "--max-reviews-per-source", "3",
                 "--review-timeout", "2", NULL),
           0, "explicit");
    c.max_connections_resolved = 1000;
    is_int(cfg_per_source_connections(&c), 7, "connections per source as asked");
    is_int(cfg_per_source_reviews(&c), 3, "reviews per source as asked");
    is_int(c.review_timeout_ms, 2000, "review-timeout as asked");
    cfg_fini(&c);

    const char *p = write_yaml("max-connections-per-source: 0\nmax-reviews-per-source: 5\n");
    is_int(parse(&c, UP, DD, "--config", p, NULL), 0, "from a config file");
    c.max_connections_resolved = 1000;
    is_int(cfg_per_source_connections(&c), 0, "config file: 0 is no limit");
    is_int(cfg_per_source_reviews(&c), 5, "config file: 5");
    cfg_fini(&c);

    rejected(parse(&c, UP, DD, "--review-timeout", "86401", NULL), "--review-timeout",
             "a review deadline over a day");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--max-reviews-per-source", "65537", NULL),
             "--max-reviews-per-source", "a share past any pool");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--max-connections-per-source", "-1", NULL),
             "--max-connections-per-source", "negative");
    cfg_fini(&c);
}

static void
test_limits(void)
{
    struct kwc_config c;
    is_int(parse(&c, UP, DD, NULL), 0, "defaults");
    is_int(c.max_header_bytes, 1048576, "max-header-bytes: Go's DefaultMaxHeaderBytes");
    is_int(c.request_header_timeout_ms, 32000, "request-header-timeout: kube's ReadHeaderTimeout");
    is_int(c.idle_timeout_ms, 90000, "idle-timeout: kube's IdleTimeout");
    is_int(c.max_connections, 0, "max-connections: automatic");
    is_int(c.max_connections_resolved, 0, "resolved later, by cfg_fd_budget");
    is_int(c.max_upstream_connections, 256, "max-upstream-connections: 256");
    is_int(c.max_review_connections, 32, "max-review-connections: 32");
    is_int(c.max_passthrough_buffer, 128 << 20, "max-passthrough-buffer: 128 MiB");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--max-header-bytes", "4096", "--request-header-timeout", "0",
                 "--idle-timeout", "0", "--max-connections", "10", NULL),
           0, "limits set");
    is_int(c.max_header_bytes, 4096, "max-header-bytes 4096");
    is_int(c.request_header_timeout_ms, 0, "request-header-timeout 0: none");
    is_int(c.idle_timeout_ms, 0, "idle-timeout 0: none");
    is_int(c.max_connections, 10, "max-connections 10");
    is_int(c.max_connections_resolved, 10, "an explicit cap is kept");
    cfg_fini(&c);

    rejected(parse(&c, UP, DD, "--max-header-bytes", "4095", NULL), "--max-header-bytes",
             "max-header-bytes below 4096");
    ok(err_has("4096"), "message gives the minimum");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--max-header-bytes", "-1", NULL), "--max-header-bytes",
             "negative max-header-bytes");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--request-header-timeout", "86401", NULL),
             "--request-header-timeout", "request-header-timeout over a day");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--idle-timeout", "99999999999", NULL), "--idle-timeout",
             "idle-timeout too long");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--idle-timeout", "soon", NULL), "--idle-timeout",
             "idle-timeout not a number");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--max-connections", "4294967296", NULL), "--max-connections",
             "max-connections past 32 bits");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, NULL), 0, "defaults again");
    is_int(c.shutdown_drain_ms, 10000, "shutdown-drain-grace-period: 10s");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--shutdown-drain-grace-period", "0", NULL), 0, "no drain");
    is_int(c.shutdown_drain_ms, 0, "shutdown-drain-grace-period 0: close at once");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--shutdown-drain-grace-period", "1.5s", NULL), 0, "a fraction");
    is_int(c.shutdown_drain_ms, 1500, "1.5s in ms");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--shutdown-drain-grace-period", "3601s", NULL),
             "--shutdown-drain-grace-period 1h0m1s: use 0 to 1h (0: close at once)",
             "shutdown-drain-grace-period over an hour");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--shutdown-drain-seconds", "3601", NULL),
             "--shutdown-drain-grace-period 1h0m1s", "the old name: the same bound");
    cfg_fini(&c);

    const char *p = write_yaml("max-header-bytes: 8192\nrequest-header-timeout: 5\n"
                               "idle-timeout: 7\nmax-connections: 3\n");
    is_int(parse(&c, UP, DD, "--config", p, NULL), 0, "limits from file");
    is_int(c.max_header_bytes, 8192, "max-header-bytes from file");
    is_int(c.request_header_timeout_ms, 5000, "request-header-timeout from file");
    is_int(c.idle_timeout_ms, 7000, "idle-timeout from file");
    is_int(c.max_connections_resolved, 3, "max-connections from file");
    cfg_fini(&c);
    cleanup_files();
}

/* --watch-coalesce-max-ms: the pace's bound (pace.h), 0 to 1000 ms. */
static void
test_discovery(void)
{
    struct kwc_config c;
    is_int(parse(&c, UP, DD, NULL), 0, "defaults");
    is_int(c.discovery_interval, 30000, "discovery-interval: 30s");
    ok(c.serve_discovery, "serve-discovery: on");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--discovery-interval", "1s", "--serve-discovery=false", NULL), 0,
           "the least interval, serving off");
    is_int(c.discovery_interval, 1000, "discovery-interval 1s");
    ok(!c.serve_discovery, "serve-discovery false");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--discovery-interval", "500ms", NULL), "--discovery-interval 500ms",
             "under a second");
    ok(err_has("1s to 1h"), "message gives the range");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--discovery-interval", "61m", NULL), "--discovery-interval 1h1m",
             "over an hour");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--discovery-interval", "30", NULL), "\"30\" is not a duration",
             "a bare number");
    cfg_fini(&c);
}

/* --log-summary-interval: repeating warnings (log_repeat), 0 to 1h. */
static void
test_log_summary(void)
{
    struct kwc_config c;
    is_int(parse(&c, UP, DD, NULL), 0, "defaults");
    is_int(c.log_summary_interval, 10000, "log-summary-interval: 10s");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--log-summary-interval", "0", NULL), 0, "0: every occurrence");
    is_int(c.log_summary_interval, 0, "...0");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--log-summary-interval", "500ms", NULL), 0, "500ms");
    is_int(c.log_summary_interval, 500, "...500 ms");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--log-summary-interval", "2h", NULL), "--log-summary-interval 2h",
             "over an hour");
    ok(err_has("use 0 to 1h (0: write every occurrence)"), "message gives the range");
    cfg_fini(&c);
}

static void
test_watch_coalesce(void)
{
    struct kwc_config c;
    is_int(parse(&c, UP, DD, NULL), 0, "defaults");
    is_int(c.watch_coalesce_max_ms, 25, "watch-coalesce-max-delay: 25ms");
    is_int(c.watch_coalesce_max_ms * 1000, PACE_MAX_US, "...PACE_MAX_US");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--watch-coalesce-max-delay", "0", NULL), 0, "0: never hold");
    is_int(c.watch_coalesce_max_ms, 0, "watch-coalesce-max-delay 0");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--watch-coalesce-max-delay=100ms", NULL), 0, "a value");
    is_int(c.watch_coalesce_max_ms, 100, "watch-coalesce-max-delay 100ms");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--watch-coalesce-max-delay", "1s", NULL), 0, "the most");
    is_int(c.watch_coalesce_max_ms, 1000, "watch-coalesce-max-delay 1s");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--watch-coalesce-max-delay", "1001ms", NULL),
             "--watch-coalesce-max-delay 1.001s: use 0 to 1s", "over a second");
    ok(err_has("0: never hold an event"), "message says what 0 does");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--watch-coalesce-max-delay", "-1ms", NULL),
             "--watch-coalesce-max-delay", "negative");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--watch-coalesce-max-delay", "25", NULL),
             "--watch-coalesce-max-delay: \"25\" is not a duration",
             "a new name takes no bare number");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--watch-coalesce-max-delay", NULL), "--watch-coalesce-max-delay",
             "no value");
    ok(err_has("a duration"), "...names the type");
    cfg_fini(&c);

    /* the old name: a bare number is milliseconds, as it was */
    is_int(parse(&c, UP, DD, "--watch-coalesce-max-ms", "100", NULL), 0, "the old name");
    is_int(c.watch_coalesce_max_ms, 100, "100 is 100ms");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--watch-coalesce-max-ms", "1001", NULL),
             "--watch-coalesce-max-delay 1.001s", "the old name, over a second");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--watch-coalesce-max-ms", "-1", NULL), "--watch-coalesce-max-ms",
             "the old name, negative");
    cfg_fini(&c);

    const char *p = write_yaml("watch-coalesce-max-delay: 5ms\n");
    is_int(parse(&c, UP, DD, "--config", p, NULL), 0, "from file");
    is_int(c.watch_coalesce_max_ms, 5, "watch-coalesce-max-delay from file");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--config", p, "--watch-coalesce-max-delay", "0", NULL), 0,
           "file and flag");
    is_int(c.watch_coalesce_max_ms, 0, "the flag wins");
    cfg_fini(&c);
    p = write_yaml("watch-coalesce-max-delay: 5s\n");
    rejected(parse(&c, UP, DD, "--config", p, NULL), "--watch-coalesce-max-delay 5s",
             "a bad value from file");
    cfg_fini(&c);
    cleanup_files();
}

static void
test_accept_hosts(void)
{
    struct kwc_config c;
    is_int(parse(&c, UP, DD, NULL), 0, "no --accept-hosts");
    ok(c.accept_hosts == NULL && c.accept_hosts_re == NULL, "none by default");
    ok(!cfg_accept_hosts_match(&c, "localhost"), "nothing matches without a regex");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--accept-hosts", "^(kwc|proxy)\\.example\\.com$", NULL), 0,
           "extended regex");
    ok(c.accept_hosts_re != NULL, "compiled at parse time");
    ok(cfg_accept_hosts_match(&c, "kwc.example.com"), "matches kwc.example.com");
    ok(cfg_accept_hosts_match(&c, "proxy.example.com"), "alternation (extended syntax)");
    ok(!cfg_accept_hosts_match(&c, "kwcXexample.com"), "escaped dot is literal");
    ok(!cfg_accept_hosts_match(&c, "evil.kwc.example.com"), "anchored by the regex");
    cfg_fini(&c);
    ok(c.accept_hosts_re == NULL, "cfg_fini frees the regex");

    is_int(parse(&c, UP, DD, "--accept-hosts", "example", NULL), 0, "unanchored regex");
    ok(cfg_accept_hosts_match(&c, "www.example.org"), "unanchored matches inside");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--accept-hosts=", NULL), 0, "empty --accept-hosts");
    ok(c.accept_hosts == NULL && c.accept_hosts_re == NULL, "empty is as if not given");
    ok(!cfg_accept_hosts_match(&c, "anything"), "and matches nothing");
    cfg_fini(&c);

    static const char *const bad[] = {"(", "a{2,1}", "[z-a]", "*x\\"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        regex_t re;
        int rc = regcomp(&re, bad[i], REG_EXTENDED | REG_NOSUB);
        if (rc == 0) {
            regfree(&re);
            printf("# libc accepts \"%s\": skipped\n", bad[i]);
            continue;
        }
        char msg[256];
        regerror(rc, &re, msg, sizeof msg);
        char what[96];
        snprintf(what, sizeof what, "bad regex \"%s\" rejected", bad[i]);
        rejected(parse(&c, UP, DD, "--accept-hosts", bad[i], NULL), "--accept-hosts", what);
        ok(err_has(msg), "message carries regerror's words");
        cfg_fini(&c);
    }
}

/* ---- TLS ------------------------------------------------------------------- */

static void
test_tls(void)
{
    struct kwc_config c;
    const char *cert = write_yaml("not really a PEM: config.c does not open it\n");
    const char *key = write_yaml("nor this\n");
    const char *ca = write_yaml("nor this\n");
    char missing[128];
    snprintf(missing, sizeof missing, "%s/missing.pem", tmpdir);

    is_int(parse(&c, UP, DD, NULL), 0, "plaintext by default");
    ok(!c.tls_cert_file && !c.tls_private_key_file && !c.client_ca_file, "no TLS files");
    is_str(c.tls_min_version_s, "VersionTLS12", "min version text");
    is_int(c.tls_min_version, TLS1_2_VERSION, "TLS 1.2 minimum by default");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--tls-cert-file", cert, "--tls-private-key-file", key, NULL), 0,
           "both TLS files");
    is_str(c.tls_cert_file, cert, "cert file");
    is_str(c.tls_private_key_file, key, "key file");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--tls-cert-file", cert, "--tls-private-key-file", key,
                 "--client-ca-file", ca, NULL),
           0, "TLS with a client CA");
    is_str(c.client_ca_file, ca, "client CA file");
    cfg_fini(&c);

    rejected(parse(&c, UP, DD, "--tls-cert-file", cert, NULL), "--tls-private-key-file",
             "cert without key: names the missing key");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--tls-private-key-file", key, NULL), "--tls-cert-file",
             "key without cert: names the missing cert");
    ok(err_has("without --tls-cert-file"), "says which is missing");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--tls-cert-file", cert, "--tls-private-key-file=", NULL),
             "--tls-private-key-file", "an empty key file is a missing one");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--tls-cert-file=", "--tls-private-key-file=", NULL), 0,
           "both empty: plaintext");
    ok(!c.tls_cert_file && !c.tls_private_key_file, "empty is as if not given");
    cfg_fini(&c);

    rejected(parse(&c, UP, DD, "--client-ca-file", ca, NULL), "--client-ca-file",
             "client CA without TLS");
    ok(err_has("TLS"), "message says TLS is needed");
    cfg_fini(&c);

    /* Unreadable files are named, with the system's reason. */
    rejected(parse(&c, UP, DD, "--tls-cert-file", missing, "--tls-private-key-file", key, NULL),
             missing, "missing cert file");
    ok(err_has("--tls-cert-file"), "names the flag");
    ok(err_has(strerror(ENOENT)), "says why");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--tls-cert-file", cert, "--tls-private-key-file", missing, NULL),
             missing, "missing key file");
    ok(err_has("--tls-private-key-file"), "names the flag");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--tls-cert-file", cert, "--tls-private-key-file", key,
                   "--client-ca-file", missing, NULL),
             missing, "missing client CA file");
    ok(err_has("--client-ca-file"), "names the flag");
    cfg_fini(&c);

    static const struct {
        const char *name;
        int version;
    } good[] = {{"VersionTLS12", TLS1_2_VERSION},
                {"VersionTLS13", TLS1_3_VERSION},
                {"1.2", TLS1_2_VERSION},
                {"1.3", TLS1_3_VERSION}};
    for (size_t i = 0; i < KWC_ARRAY_LEN(good); i++) {
        is_int(parse(&c, UP, DD, "--tls-min-version", good[i].name, NULL), 0, good[i].name);
        is_int(c.tls_min_version, good[i].version, "OpenSSL's constant");
        cfg_fini(&c);
    }
    static const char *const old[] = {"VersionTLS10", "VersionTLS11", "1.0", "1.1"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(old); i++) {
        rejected(parse(&c, UP, DD, "--tls-min-version", old[i], NULL), "--tls-min-version", old[i]);
        ok(err_has("not supported"), "old versions: not supported");
        cfg_fini(&c);
    }
    static const char *const bad[] = {"", "tls13", "VersionTLS14", "versiontls12", "1.2 "};
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        char what[64];
        snprintf(what, sizeof what, "--tls-min-version \"%s\"", bad[i]);
        rejected(parse(&c, UP, DD, "--tls-min-version", bad[i], NULL), "--tls-min-version", what);
        ok(err_has("VersionTLS12") && err_has("VersionTLS13"), "message lists the names");
        cfg_fini(&c);
    }

    is_int(parse(&c, UP, DD, NULL), 0, "--tls-kernel: default");
    is_str(c.tls_kernel_s, "auto", "--tls-kernel: auto by default");
    is_int(c.tls_kernel, HTTP_TLS_KERNEL_AUTO, "--tls-kernel: the probe decides");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--tls-kernel", "off", NULL), 0, "--tls-kernel off");
    is_int(c.tls_kernel, HTTP_TLS_KERNEL_OFF, "--tls-kernel off: OpenSSL's records");
    cfg_fini(&c);
    static const char *const bad_kernel[] = {"", "on", "yes", "Auto", "off "};
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad_kernel); i++) {
        char what[64];
        snprintf(what, sizeof what, "--tls-kernel \"%s\"", bad_kernel[i]);
        rejected(parse(&c, UP, DD, "--tls-kernel", bad_kernel[i], NULL), "--tls-kernel", what);
        ok(err_has("auto or off"), "--tls-kernel: the message lists the values");
        cfg_fini(&c);
    }

    char text[512];
    snprintf(text, sizeof text,
             "tls-cert-file: %s\ntls-private-key-file: %s\nclient-ca-file: %s\n"
             "tls-min-version: VersionTLS13\ntls-kernel: off\n",
             cert, key, ca);
    const char *p = write_yaml(text);
    is_int(parse(&c, UP, DD, "--config", p, NULL), 0, "TLS from file");
    is_str(c.tls_cert_file, cert, "cert from file");
    is_int(c.tls_min_version, TLS1_3_VERSION, "min version from file");
    is_int(c.tls_kernel, HTTP_TLS_KERNEL_OFF, "--tls-kernel from file");
    cfg_fini(&c);

    /* TLS does not stand in for authentication. */
    rejected(parse(&c, UP, DD, "--listen", "0.0.0.0:8443", "--tls-cert-file", cert,
                   "--tls-private-key-file", key, "--auth", "none", NULL),
             "--insecure-allow-remote", "remote with TLS but no authentication needs the flag");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--listen", "0.0.0.0:8443", "--tls-cert-file", cert,
                 "--tls-private-key-file", key, "--insecure-allow-remote", NULL),
           0, "remote with TLS and the flag");
    cfg_fini(&c);
    cleanup_files();
}

static void
test_auth(void)
{
    struct kwc_config c;
    const char *cert = write_yaml("not a PEM\n");
    const char *key = write_yaml("nor this\n");
    is_int(parse(&c, UP, DD, NULL), 0, "plaintext");
    ok(!c.auth_delegated, "plaintext: --auth none by default");
    is_int(c.token_cache_ttl_ms, 120000, "token TTL 2m as kube");
    is_int(c.authz_allow_ttl_ms, 300000, "allow TTL 5m as kube");
    is_int(c.authz_deny_ttl_ms, 30000, "deny TTL 30s as kube");
    ok(!c.anonymous_auth, "anonymous off by default");
    ok(!c.forward_token, "impersonate by default");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--tls-cert-file", cert, "--tls-private-key-file", key, NULL), 0,
           "TLS");
    ok(c.auth_delegated, "TLS: --auth delegated by default");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--tls-cert-file", cert, "--tls-private-key-file", key, "--auth",
                 "none", NULL),
           0, "TLS with --auth none");
    ok(!c.auth_delegated, "...is none");
    cfg_fini(&c);
    is_int(
        parse(&c, UP, DD, "--auth", "delegated", "--passthrough-identity", "forward-token", NULL),
        0, "delegated over loopback plaintext");
    ok(c.auth_delegated && c.forward_token, "...with forward-token");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--auth", "basic", NULL), "--auth \"basic\"", "unknown --auth");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--passthrough-identity", "x", NULL), "--passthrough-identity",
             "unknown --passthrough-identity");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--authorization-webhook-cache-authorized-ttl", "100000", NULL),
             "--authorization-webhook-cache-authorized-ttl 27h46m40s: use 0 to 24h",
             "TTL over a day");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--authentication-token-webhook-cache-ttl", "25h", NULL),
             "--authentication-token-webhook-cache-ttl 25h: use 0 to 24h", "token TTL over a day");
    cfg_fini(&c);
    /* kube's values, as the operator wrote them */
    is_int(parse(&c, UP, DD, "--authorization-webhook-cache-authorized-ttl", "2m",
                 "--authorization-webhook-cache-unauthorized-ttl=500ms",
                 "--authentication-token-webhook-cache-ttl", "1h30m", NULL),
           0, "kube's durations");
    is_int(c.authz_allow_ttl_ms, 120000, "2m");
    is_int(c.authz_deny_ttl_ms, 500, "500ms: kept below a second");
    is_int(c.token_cache_ttl_ms, 5400000, "1h30m");
    is_int(c.n_notes, 0, "no note for durations");
    cfg_fini(&c);
    /* a remote listener: TLS and delegated auth, or the insecure flag */
    rejected(parse(&c, UP, DD, "--listen", "0.0.0.0:8001", NULL),
             "TLS and delegated authentication", "remote plaintext refused");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--listen", "0.0.0.0:8001", "--tls-cert-file", cert,
                   "--tls-private-key-file", key, "--auth", "none", NULL),
             "--insecure-allow-remote", "remote TLS without auth refused");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--listen", "0.0.0.0:8001", "--tls-cert-file", cert,
                 "--tls-private-key-file", key, NULL),
           0, "remote TLS with delegated auth (the default) accepted");
    cfg_fini(&c);
    /* the data dir's policies */
    is_str((parse(&c, UP, DD, NULL), c.on_corrupt_cache), "rebuild",
           "--on-corrupt-cache rebuild by default");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--on-corrupt-cache", "wipe", NULL), "rebuild",
             "unknown policy names the choices");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--max-staleness", "100000", NULL), "--max-staleness",
             "staleness over a day");
    cfg_fini(&c);
}

static void
test_args(void)
{
    struct kwc_config c;
    rejected(parse(&c, UP, DD, "--nope", NULL), "--nope", "unknown flag");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--nope=1", NULL), "--nope", "unknown flag with a value");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "-v", NULL), "-v", "single-dash flag");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "extra", NULL), "extra", "positional argument");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--log-level", NULL), "--log-level", "missing value at the end");
    cfg_fini(&c);
    rejected(parse(&c, UP, "--data-dir", NULL), "--data-dir", "missing --data-dir value");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--config", NULL), "--config", "missing --config value");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--", NULL), "--", "bare --");
    cfg_fini(&c);

    is_int(parse(&c, "--help", NULL), CFG_SHOW_HELP, "--help");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--help", NULL), CFG_SHOW_HELP, "--help after other flags");
    cfg_fini(&c);
    is_int(parse(&c, "--version", NULL), CFG_SHOW_VERSION, "--version");
    cfg_fini(&c);

    /* The usage text lists every option. */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cfg_usage(f);
    fclose(f);
    static const char *const flags[] = {"--upstream",
                                        "--kubeconfig",
                                        "--context",
                                        "--listen",
                                        "--data-dir",
                                        "--resources",
                                        "--config",
                                        "--log-level",
                                        "--port-file",
                                        "--insecure-allow-remote",
                                        "--max-header-bytes",
                                        "--request-header-timeout",
                                        "--idle-timeout",
                                        "--max-connections",
                                        "--accept-hosts",
                                        "--tls-cert-file",
                                        "--tls-private-key-file",
                                        "--tls-min-version",
                                        "--client-ca-file",
                                        "--help",
                                        "--version"};
    char what[64];
    for (size_t i = 0; i < KWC_ARRAY_LEN(flags); i++) {
        snprintf(what, sizeof what, "usage lists %s", flags[i]);
        ok(buf && strstr(buf, flags[i]), what);
    }
    free(buf);
}

static void
test_config_file(void)
{
    struct kwc_config c;
    const char *p = write_yaml("# kwc settings\n"
                               "upstream: http://from-file:1\n"
                               "data-dir: /from/file\n"
                               "listen: \"127.0.0.2:9000\"\n"
                               "log-level: debug\n"
                               "upstream-timeout: 7\n"
                               "insecure-allow-remote: false\n"
                               "resources: 'v1/pods'\n");
    is_int(parse(&c, "--config", p, NULL), 0, "file alone");
    is_str(c.upstream, "http://from-file:1", "upstream from file");
    is_str(c.data_dir, "/from/file", "data-dir from file");
    is_str(c.listen_host, "127.0.0.2", "listen from file");
    is_int(c.listen_port, 9000, "port from file");
    is_int(c.log_level, LOG_DEBUG, "log level from file");
    is_int(c.upstream_timeout_ms, 7000, "int from file");
    is_str(c.resources, "v1/pods", "quoted string from file");
    is_int(c.upstream_connect_timeout_ms, 5000, "unset keys keep defaults");
    cfg_fini(&c);

    /* Flags win, before or after --config. */
    is_int(
        parse(&c, "--upstream", "http://from-flag:2", "--config", p, "--log-level", "warn", NULL),
        0, "file and flags");
    is_str(c.upstream, "http://from-flag:2", "flag before --config wins");
    is_int(c.log_level, LOG_WARN, "flag after --config wins");
    is_str(c.data_dir, "/from/file", "file value where no flag");
    is_int(c.upstream_timeout_ms, 7000, "file int where no flag");
    cfg_fini(&c);

    rejected(parse(&c, UP, DD, "--config=", NULL), "--config", "empty --config= rejected");
    cfg_fini(&c);
    char arg[160];
    snprintf(arg, sizeof arg, "--config=%s", p);
    is_int(parse(&c, arg, "--data-dir", "/flag", NULL), 0, "--config=FILE");
    is_str(c.data_dir, "/flag", "flag wins over --config=FILE");
    cfg_fini(&c);

    /* The file may supply one of --upstream/--kubeconfig; both is still wrong. */
    rejected(parse(&c, "--config", p, "--kubeconfig", "/k", NULL), "--kubeconfig",
             "file upstream plus flag kubeconfig");
    cfg_fini(&c);

    /* An empty file or one with only comments sets nothing. */
    p = write_yaml("");
    is_int(parse(&c, UP, DD, "--config", p, NULL), 0, "empty file");
    is_str(c.listen, "127.0.0.1:8001", "empty file: defaults");
    cfg_fini(&c);
    p = write_yaml("# nothing\n");
    is_int(parse(&c, UP, DD, "--config", p, NULL), 0, "comment-only file");
    cfg_fini(&c);
    cleanup_files();
}

static void
test_config_file_errors(void)
{
    struct kwc_config c;
    const char *p = write_yaml("upstream: http://h:1\nlistne: 127.0.0.1:1\n");
    rejected(parse(&c, DD, "--config", p, NULL), "listne", "unknown key named");
    cfg_fini(&c);

    p = write_yaml("upstream:\n  url: http://h:1\n");
    rejected(parse(&c, DD, "--config", p, NULL), p, "nested mapping rejected");
    cfg_fini(&c);

    p = write_yaml("resources:\n  - v1/pods\n  - v1/nodes\n");
    rejected(parse(&c, UP, DD, "--config", p, NULL), p, "sequence rejected");
    cfg_fini(&c);

    p = write_yaml("upstream: &a http://h:1\nresources: *a\n");
    rejected(parse(&c, DD, "--config", p, NULL), p, "alias rejected");
    cfg_fini(&c);

    p = write_yaml("just a string\n");
    rejected(parse(&c, UP, DD, "--config", p, NULL), p, "scalar document rejected");
    cfg_fini(&c);

    p = write_yaml("- a\n- b\n");
    rejected(parse(&c, UP, DD, "--config", p, NULL), p, "top-level sequence rejected");
    cfg_fini(&c);

    p = write_yaml("upstream: [unclosed\n");
    rejected(parse(&c, DD, "--config", p, NULL), p, "YAML syntax error");
    cfg_fini(&c);

    p = write_yaml("upstream-timeout: soon\n");
    rejected(parse(&c, UP, DD, "--config", p, NULL), "upstream-timeout", "bad int in file");
    cfg_fini(&c);

    p = write_yaml("insecure-allow-remote: yes\n");
    rejected(parse(&c, UP, DD, "--config", p, NULL), "insecure-allow-remote",
             "YAML 1.1 'yes' is not a ParseBool value");
    cfg_fini(&c);

    const char *inner = write_yaml("log-level: debug\n");
    char text[256];
    snprintf(text, sizeof text, "config: %s\n", inner);
    p = write_yaml(text);
    rejected(parse(&c, UP, DD, "--config", p, NULL), p, "a file naming another file");
    cfg_fini(&c);

    char missing[128];
    snprintf(missing, sizeof missing, "%s/does-not-exist.yaml", tmpdir);
    rejected(parse(&c, UP, DD, "--config", missing, NULL), missing, "missing file named");
    cfg_fini(&c);

    /* Flags cannot rescue a bad file. */
    p = write_yaml("bogus: 1\n");
    rejected(parse(&c, UP, DD, "--config", p, "--upstream", "http://x:1", NULL), "bogus",
             "bad file rejected even with good flags");
    cfg_fini(&c);
    cleanup_files();
}

/* Kube-style values: Go durations and quantities, with messages that say
 * what is wrong and what works. */
static void
test_kube_values(void)
{
    struct kwc_config c;
    is_int(parse(&c, UP, DD, "--cache-idle-timeout", "2m30s", "--cache-start-timeout=1.5s",
                 "--cache-disk-budget", "512Mi", "--resources", "v1/pods", NULL),
           0, "duration and quantity flags");
    is_int(c.cache_idle_timeout, 150000, "2m30s");
    is_int(c.cache_start_timeout, 1500, "1.5s");
    is_int(c.cache_disk_budget, 536870912, "512Mi");
    ok(!c.auto_resources, "an explicit list");
    is_int(c.cache_conns, 2, "explicit: two caches per entry");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--cache-idle-timeout", "0", NULL), 0, "0 alone");
    is_int(c.cache_idle_timeout, 0, "0: never");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--cache-idle-timeout", "300", NULL), "\"300\" is not a duration",
             "a bare number is no duration");
    ok(err_has("--cache-idle-timeout") && err_has("5m"), "the flag, and an example");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--cache-disk-budget", "1GB", NULL), "--cache-disk-budget",
             "1GB is not a quantity");
    ok(err_has("4Gi"), "the message shows the form");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--cache-start-timeout", "-1s", NULL), "--cache-start-timeout",
             "negative refused");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--max-caches", "0", NULL), "--max-caches 0", "0 caches refused");
    cfg_fini(&c);
}

/* ---- kube's conventions (issue 31, part 5) ------------------------------- */

/* The only note of the last parse, or NULL (and a diagnostic) if not one. */
static const char *
only_note(const struct kwc_config *c)
{
    if (c->n_notes != 1) {
        printf("#   %zu notes:\n", c->n_notes);
        for (size_t i = 0; i < c->n_notes; i++)
            printf("#     %s\n", c->notes[i]);
        return NULL;
    }
    return c->notes[0];
}

/* Every flag that took seconds: a bare number is still seconds, noted once
 * with what to write; a Go duration is taken as it is, without a note. */
static void
test_seconds_flags(void)
{
    struct kwc_config c;
    char what[160], want[256], arg[96];
#define SECS_ROW_SECS(flag, field)                                                                 \
    do {                                                                                           \
        snprintf(what, sizeof what, "--%s 7", flag);                                               \
        is_int(parse(&c, UP, DD, "--" flag, "7", NULL), 0, what);                                  \
        is_int(c.field, 7000, "7 is seven seconds, kept in ms");                                   \
        snprintf(want, sizeof want,                                                                \
                 "--%s=7: a bare number is read as seconds; this is deprecated, write 7s", flag);  \
        is_str(only_note(&c), want, "the note says what to write");                                \
        cfg_fini(&c);                                                                              \
        snprintf(arg, sizeof arg, "--%s=1m30s", flag);                                             \
        is_int(parse(&c, UP, DD, arg, "--" flag, "1m30s", NULL), 0, arg);                          \
        is_int(c.field, 90000, "1m30s");                                                           \
        is_int(c.n_notes, 0, "a duration: no note");                                               \
        cfg_fini(&c);                                                                              \
        snprintf(what, sizeof what, "--%s 1.5s", flag);                                            \
        is_int(parse(&c, UP, DD, "--" flag, "1.5s", NULL), 0, what);                               \
        is_int(c.field, 1500, "a fraction of a second kept");                                      \
        cfg_fini(&c);                                                                              \
        snprintf(what, sizeof what, "--%s 10x", flag);                                             \
        rejected(parse(&c, UP, DD, "--" flag, "10x", NULL),                                        \
                 "--" flag ": \"10x\" is not a duration", what);                                   \
        ok(err_has("1h30m") && err_has("a bare number is seconds"), "...and what is one");         \
        cfg_fini(&c);                                                                              \
    } while (0);
#define SECS_ROW_(flag, field)
#define SECS_ROW_STR(flag, field)
#define SECS_ROW_STRS(flag, field)
#define SECS_ROW_INT(flag, field)
#define SECS_ROW_BOOL(flag, field)
#define SECS_ROW_DUR(flag, field)
#define SECS_ROW_QTY(flag, field)
#define SECS_ROW(flag, field, type, group, def, help) SECS_ROW_##type(flag, field)
    CFG_OPTIONS(SECS_ROW)
#undef SECS_ROW

    /* each note once, however often the flag is given */
    is_int(parse(&c, UP, DD, "--idle-timeout", "5", "--idle-timeout", "5", NULL), 0, "twice");
    ok(only_note(&c) != NULL, "one note");
    cfg_fini(&c);
    /* "0" is Go's too: no note */
    is_int(parse(&c, UP, DD, "--upstream-timeout", "0", NULL), 0, "0");
    is_int(c.n_notes, 0, "0 needs no unit");
    cfg_fini(&c);
    /* the bounds hold in the new units */
    rejected(parse(&c, UP, DD, "--upstream-connect-timeout", "500ms", NULL),
             "--upstream-connect-timeout 500ms: use 1s to 24h", "connect timeout under 1s");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--bookmark-interval", "2h", NULL),
             "--bookmark-interval 2h: use 1s to 1h", "bookmarks every 2h");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--max-staleness", "86401", NULL),
             "--max-staleness 24h0m1s: use 0 to 24h", "staleness over a day");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--history-max-age", "0", NULL), "--history-max-age 0s: at least 1s",
             "no history");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--history-max-age", "168h", NULL), 0, "a week of history");
    is_int(c.history_max_age_ms, 168L * 3600 * 1000, "168h");
    cfg_fini(&c);

    /* a config file: the same, the note naming the file */
    const char *p = write_yaml("upstream-timeout: 7\nidle-timeout: 2m\n");
    is_int(parse(&c, UP, DD, "--config", p, NULL), 0, "from a file");
    is_int(c.upstream_timeout_ms, 7000, "file: 7 is seconds");
    is_int(c.idle_timeout_ms, 120000, "file: 2m");
    snprintf(want, sizeof want,
             "--config %s: upstream-timeout=7: a bare number is read as seconds; this is "
             "deprecated, write 7s",
             p);
    is_str(only_note(&c), want, "the file's note names the file and key");
    cfg_fini(&c);
    p = write_yaml("review-timeout: soon\n");
    rejected(parse(&c, UP, DD, "--config", p, NULL), "review-timeout: \"soon\" is not a duration",
             "a bad duration in a file");
    ok(err_has(p), "...names the file");
    cfg_fini(&c);
    cleanup_files();
}

/* Every size: a quantity (1Mi, 2G) or bare bytes, no note. */
static void
test_quantity_flags(void)
{
    struct kwc_config c;
    char what[160];
#define QTY_ROW_QTY(flag, field)                                                                   \
    do {                                                                                           \
        snprintf(what, sizeof what, "--%s 1Mi", flag);                                             \
        is_int(parse(&c, UP, DD, "--" flag, "1Mi", NULL), 0, what);                                \
        is_int(c.field, 1048576, "1Mi");                                                           \
        cfg_fini(&c);                                                                              \
        snprintf(what, sizeof what, "--%s=2M and 2097152", flag);                                  \
        is_int(parse(&c, UP, DD, "--" flag "=2M", NULL), 0, what);                                 \
        is_int(c.field, 2000000, "2M: decimal");                                                   \
        cfg_fini(&c);                                                                              \
        is_int(parse(&c, UP, DD, "--" flag, "2097152", NULL), 0, what);                            \
        is_int(c.field, 2097152, "bare bytes");                                                    \
        is_int(c.n_notes, 0, "bare bytes are not deprecated");                                     \
        cfg_fini(&c);                                                                              \
        snprintf(what, sizeof what, "--%s 1MB", flag);                                             \
        rejected(parse(&c, UP, DD, "--" flag, "1MB", NULL), "--" flag ": \"1MB\" is not a size",   \
                 what);                                                                            \
        ok(err_has("512Mi"), "...and an example");                                                 \
        cfg_fini(&c);                                                                              \
    } while (0);
#define QTY_ROW_STR(flag, field)
#define QTY_ROW_STRS(flag, field)
#define QTY_ROW_INT(flag, field)
#define QTY_ROW_BOOL(flag, field)
#define QTY_ROW_DUR(flag, field)
#define QTY_ROW_SECS(flag, field)
#define QTY_ROW(flag, field, type, group, def, help) QTY_ROW_##type(flag, field)
    CFG_OPTIONS(QTY_ROW)
#undef QTY_ROW
    is_int(parse(&c, UP, DD, NULL), 0, "defaults");
    is_int(c.cache_map_size, 64L << 30, "cache-map-size 64Gi");
    is_int(c.watch_window, 64 << 20, "watch-window 64Mi");
    is_int(c.max_list_buffer, 256 << 10, "max-list-buffer 256Ki");
    is_int(c.history_max_bytes, 4L << 30, "history-max-bytes 4Gi");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--cache-map-size=16Gi", "--max-header-bytes", "512k", NULL), 0,
           "the issue's values");
    is_int(c.cache_map_size, 16L << 30, "16Gi");
    is_int(c.max_header_bytes, 512000, "512k");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--max-header-bytes", "4095", NULL),
             "--max-header-bytes 4095: at least 4096", "the bound is still bytes");
    cfg_fini(&c);
}

/* The renamed flags: both names work; the old one is noted with what to
 * write, and its bare numbers keep their old unit. */
static void
test_aliases(void)
{
    struct kwc_config c;
    is_int(parse(&c, UP, DD, "--rv-wait-ms", "300", NULL), 0, "--rv-wait-ms 300");
    is_int(c.rv_wait_ms, 300, "300 ms");
    is_str(only_note(&c), "--rv-wait-ms=300 is deprecated, write --rv-wait-timeout=300ms",
           "noted: the new name and the value in its form");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--rv-wait-timeout=300ms", NULL), 0, "--rv-wait-timeout 300ms");
    is_int(c.rv_wait_ms, 300, "300 ms");
    is_int(c.n_notes, 0, "the new name: no note");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--rv-wait-ms=1500", NULL), 0, "--rv-wait-ms=1500");
    is_str(only_note(&c), "--rv-wait-ms=1500 is deprecated, write --rv-wait-timeout=1.5s",
           "1500 ms is 1.5s");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--rv-wait-ms", "2s", NULL), 0, "a duration under the old name");
    is_int(c.rv_wait_ms, 2000, "2s");
    is_str(only_note(&c), "--rv-wait-ms=2s is deprecated, write --rv-wait-timeout=2s",
           "noted with the value as given");
    cfg_fini(&c);
    rejected(parse(&c, UP, DD, "--rv-wait-timeout", "61s", NULL),
             "--rv-wait-timeout 1m1s: use 0 to 1m", "the bound, in the new units");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--watch-workers", "3", NULL), 0, "--watch-workers 3");
    is_int(c.serving_threads, 3, "folded into --serving-threads");
    is_str(only_note(&c), "--watch-workers=3 is deprecated, write --serving-threads=3",
           "noted: serving loops do what watch workers did");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--shutdown-drain-seconds", "20", NULL), 0,
           "--shutdown-drain-seconds");
    is_int(c.shutdown_drain_ms, 20000, "20 s");
    is_str(only_note(&c),
           "--shutdown-drain-seconds=20 is deprecated, write --shutdown-drain-grace-period=20s",
           "seconds under the old name");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--watch-coalesce-max-ms=5", NULL), 0, "--watch-coalesce-max-ms");
    is_str(only_note(&c),
           "--watch-coalesce-max-ms=5 is deprecated, write --watch-coalesce-max-delay=5ms",
           "ms under the old name");
    cfg_fini(&c);
    is_int(parse(&c, UP, DD, "--log-format", "json", NULL), 0, "--log-format json");
    is_int(c.log_format, LOG_JSON, "json");
    is_str(only_note(&c), "--log-format=json is deprecated, write --logging-format=json",
           "kube's name");
    cfg_fini(&c);
    /* a bool-less alias still needs its value */
    rejected(parse(&c, UP, DD, "--log-format", NULL), "--log-format needs a value",
             "an alias without its value");
    cfg_fini(&c);

    const char *p = write_yaml("rv-wait-ms: 300\nlog-format: json\n");
    is_int(parse(&c, UP, DD, "--config", p, NULL), 0, "old names in a file");
    is_int(c.rv_wait_ms, 300, "file: 300 ms");
    is_int(c.log_format, LOG_JSON, "file: json");
    is_int(c.n_notes, 2, "a note each");
    char want[256];
    snprintf(want, sizeof want,
             "--config %s: rv-wait-ms: 300 is deprecated, write rv-wait-timeout: 300ms", p);
    is_str(c.n_notes == 2 ? c.notes[0] : NULL, want, "the file's note, in the file's form");
    snprintf(want, sizeof want,
             "--config %s: log-format: json is deprecated, write logging-format: json", p);
    is_str(c.n_notes == 2 ? c.notes[1] : NULL, want, "...for each key");
    cfg_fini(&c);
    p = write_yaml("rv-wait-timeout: 300ms\nlogging-format: json\n");
    is_int(parse(&c, UP, DD, "--config", p, "--rv-wait-ms", "100", NULL), 0, "new names in a file");
    is_int(c.rv_wait_ms, 100, "the old flag still wins over the file");
    is_int(c.n_notes, 1, "only the flag's note");
    cfg_fini(&c);
    cleanup_files();
}

/* A flag definition line: "      --NAME" then a space or the end. */
static int
count_defs(const char *help, const char *flag)
{
    int n = 0;
    size_t fl = strlen(flag);
    for (const char *l = help; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *f = strncmp(l, "      --", 8) == 0   ? l + 8
                        : strncmp(l, "  -h, --", 8) == 0 ? l + 8
                                                         : NULL;
        if (f && strncmp(f, flag, fl) == 0 && (f[fl] == ' ' || f[fl] == '\n'))
            n++;
    }
    return n;
}

/* --help as kube's components print it (pflag + component-base). */
static void
test_help(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cfg_usage(f);
    fclose(f);
    /* kube's headers, in kube's order, each once */
    static const char *const heads[] = {"Serving",        "Upstream",      "Cache",     "Watch",
                                        "Authentication", "Authorization", "Operations"};
    const char *at = buf;
    for (size_t i = 0; i < KWC_ARRAY_LEN(heads); i++) {
        char h[64];
        snprintf(h, sizeof h, "\n\n%s flags:\n\n", heads[i]);
        const char *p = strstr(buf, h);
        ok(p && p >= at && !strstr(p + 1, h), h + 2);
        at = p ? p : at;
    }
    /* every line within 100 columns; continuation lines at the description
     * column of their section */
    size_t maxcol = 0, col = 0;
    int misaligned = 0;
    for (const char *l = buf; *l;) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
        maxcol = n > maxcol ? n : maxcol;
        if (strncmp(l, "      --", 8) == 0 || strncmp(l, "  -h, --", 8) == 0) {
            /* the description starts after the run of spaces past the flag */
            const char *d = l + 8 + strcspn(l + 8, " \n");
            if (strncmp(d, " duration", 9) == 0 || strncmp(d, " int", 4) == 0 ||
                strncmp(d, " string", 7) == 0 || strncmp(d, " quantity", 9) == 0)
                d += 1 + strcspn(d + 1, " \n");
            d += strspn(d, " ");
            size_t c0 = (size_t)(d - l);
            if (col && c0 != col) {
                printf("#   not at column %zu: %.*s\n", col, (int)n, l);
                misaligned++;
            }
            col = c0;
        } else if (n > 0 && l[0] == ' ' && col) {
            if (strspn(l, " ") != col) {
                printf("#   not at column %zu: %.*s\n", col, (int)n, l);
                misaligned++;
            }
        } else {
            col = 0; /* a header or blank line: a new section */
        }
        l = e ? e + 1 : l + n;
    }
    ok(maxcol <= CFG_HELP_COLS, "no line over 100 columns");
    if (maxcol > CFG_HELP_COLS)
        printf("#   widest: %zu\n", maxcol);
    is_int(misaligned, 0, "continuations at the description column");
    /* every flag exactly once; the old names hidden */
    char what[96];
    int bad = 0;
#define HELP_ROW(flag, field, type, group, def, help)                                              \
    if (count_defs(buf, flag) != 1) {                                                              \
        printf("#   --%s defined %d times\n", flag, count_defs(buf, flag));                        \
        bad++;                                                                                     \
    }
    CFG_OPTIONS(HELP_ROW)
#undef HELP_ROW
    is_int(bad, 0, "every flag once");
    is_int(count_defs(buf, "help") + count_defs(buf, "version"), 2, "--help and --version once");
#define HIDDEN(old, now, bare)                                                                     \
    snprintf(what, sizeof what, "--%s hidden", old);                                               \
    ok(count_defs(buf, old) == 0, what);
    CFG_ALIASES(HIDDEN)
#undef HIDDEN
    /* pflag's type names and defaults */
    static const char *const has[] = {"      --upstream-timeout duration ",
                                      "      --cache-map-size quantity ",
                                      "      --resources strings ",
                                      "      --max-caches int ",
                                      "      --logging-format string ",
                                      "      --access-log  ",
                                      "  -h, --help ",
                                      "(default 1m0s)",
                                      "(default 64Gi)",
                                      "(default [auto])",
                                      "(default 256)",
                                      "(default \"text\")",
                                      "(default true)",
                                      "(default 25ms)"};
    for (size_t i = 0; i < KWC_ARRAY_LEN(has); i++) {
        snprintf(what, sizeof what, "has '%s'", has[i]);
        ok(strstr(buf, has[i]) != NULL, what);
    }
    const char *ms = strstr(buf, "      --max-staleness duration");
    const char *next = ms ? strstr(ms + 1, "\n      --") : NULL;
    ok(ms && next && !memmem(ms, (size_t)(next - ms), "(default", 8), "a zero default not shown");
    free(buf);
}

int
main(void)
{
    TAP_RUN(test_kube_values);
    unsetenv("KUBERNETES_SERVICE_HOST");
    TAP_RUN(test_defaults);
    TAP_RUN(test_flag_forms);
    TAP_RUN(test_bools);
    TAP_RUN(test_ints);
    TAP_RUN(test_upstream_rules);
    TAP_RUN(test_log_level);
    TAP_RUN(test_listen);
    TAP_RUN(test_listen_localhost);
    TAP_RUN(test_limits);
    TAP_RUN(test_fd_budget);
    TAP_RUN(test_watch_coalesce);
    TAP_RUN(test_discovery);
    TAP_RUN(test_log_summary);
    TAP_RUN(test_accept_hosts);
    TAP_RUN(test_tls);
    TAP_RUN(test_auth);
    TAP_RUN(test_per_source);
    TAP_RUN(test_args);
    TAP_RUN(test_config_file);
    TAP_RUN(test_config_file_errors);
    TAP_RUN(test_seconds_flags);
    TAP_RUN(test_quantity_flags);
    TAP_RUN(test_aliases);
    TAP_RUN(test_help);
    return tap_done();
}
