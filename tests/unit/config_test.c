/*
 * config_test.c — proxy/config.c: flags, the --config YAML file, validation.
 *
 * Expected values come from the option table's documented defaults
 * (include/kwc/config.h), the flags and files written here, and the rules the
 * header states: flags win over the file, one of --upstream/--kubeconfig,
 * loopback only unless --insecure-allow-remote, bools as Go's strconv.ParseBool.
 * Config files live in a fresh mkdtemp directory per test. The environment's
 * KUBERNETES_SERVICE_HOST (read by cfg_parse) is unset first.
 */
#include "kwc/config.h"

#include "kwc/base.h"
#include "tap.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    is_str(c.resources, NULL, "no resources");
    is_str(c.config_file, NULL, "no config file");
    is_str(c.port_file, NULL, "no port file");
    is_str(c.listen, "127.0.0.1:8001", "listen default");
    is_str(c.listen_host, "127.0.0.1", "listen host");
    is_int(c.listen_port, 8001, "listen port");
    ok(c.listen_loopback, "loopback");
    is_str(c.log_level_s, "info", "log level text");
    is_int(c.log_level, LOG_INFO, "log level");
    is_int(c.upstream_connect_timeout, 5, "connect timeout");
    is_int(c.upstream_timeout, 60, "upstream timeout");
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
    is_int(c.upstream_timeout, 0, "upstream-timeout 0 (none)");
    is_int(c.upstream_connect_timeout, 2, "connect timeout");
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

static void
test_listen(void)
{
    struct kwc_config c;
    is_int(parse(&c, UP, DD, "--listen", "[::1]:0", NULL), 0, "[::1]:0");
    is_str(c.listen_host, "::1", "host ::1 without brackets");
    is_int(c.listen_port, 0, "port 0");
    ok(c.listen_loopback, "::1 is loopback");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--listen", "127.1.2.3:65535", NULL), 0, "127/8 address");
    is_str(c.listen_host, "127.1.2.3", "host");
    is_int(c.listen_port, 65535, "port 65535");
    ok(c.listen_loopback, "127.1.2.3 is loopback");
    cfg_fini(&c);

    is_int(parse(&c, UP, DD, "--listen", "localhost:9", NULL), 0, "localhost");
    ok(c.listen_loopback, "localhost is loopback");
    cfg_fini(&c);

    /* Anything else needs --insecure-allow-remote. */
    static const char *const remote[] = {"0.0.0.0:8001", ":8001",         "[::]:8001",
                                         "10.1.2.3:80",  "192.168.0.1:0", "example.com:80"};
    char what[96];
    for (size_t i = 0; i < KWC_ARRAY_LEN(remote); i++) {
        snprintf(what, sizeof what, "--listen %s refused", remote[i]);
        rejected(parse(&c, UP, DD, "--listen", remote[i], NULL), "--insecure-allow-remote", what);
        cfg_fini(&c);
        snprintf(what, sizeof what, "--listen %s with --insecure-allow-remote", remote[i]);
        is_int(parse(&c, UP, DD, "--listen", remote[i], "--insecure-allow-remote", NULL), 0, what);
        ok(!c.listen_loopback, "not loopback");
        cfg_fini(&c);
    }

    is_int(parse(&c, UP, DD, "--listen", ":8001", "--insecure-allow-remote", NULL), 0, ":8001");
    is_str(c.listen_host, "0.0.0.0", "empty host is every interface");
    is_int(c.listen_port, 8001, "port");
    cfg_fini(&c);

    static const char *const bad[] = {"127.0.0.1",
                                      "127.0.0.1:",
                                      "127.0.0.1:65536",
                                      "127.0.0.1:-1",
                                      "127.0.0.1:http",
                                      "127.0.0.1:80x",
                                      ""};
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        snprintf(what, sizeof what, "--listen \"%s\" rejected", bad[i]);
        rejected(parse(&c, UP, DD, "--listen", bad[i], NULL), "--listen", what);
        cfg_fini(&c);
    }
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
    static const char *const flags[] = {
        "--upstream",  "--kubeconfig", "--context",   "--listen",    "--data-dir",
        "--resources", "--config",     "--log-level", "--port-file", "--insecure-allow-remote",
        "--help",      "--version"};
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
    is_int(c.upstream_timeout, 7, "int from file");
    is_str(c.resources, "v1/pods", "quoted string from file");
    is_int(c.upstream_connect_timeout, 5, "unset keys keep defaults");
    cfg_fini(&c);

    /* Flags win, before or after --config. */
    is_int(
        parse(&c, "--upstream", "http://from-flag:2", "--config", p, "--log-level", "warn", NULL),
        0, "file and flags");
    is_str(c.upstream, "http://from-flag:2", "flag before --config wins");
    is_int(c.log_level, LOG_WARN, "flag after --config wins");
    is_str(c.data_dir, "/from/file", "file value where no flag");
    is_int(c.upstream_timeout, 7, "file int where no flag");
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

int
main(void)
{
    unsetenv("KUBERNETES_SERVICE_HOST");
    TAP_RUN(test_defaults);
    TAP_RUN(test_flag_forms);
    TAP_RUN(test_bools);
    TAP_RUN(test_ints);
    TAP_RUN(test_upstream_rules);
    TAP_RUN(test_log_level);
    TAP_RUN(test_listen);
    TAP_RUN(test_args);
    TAP_RUN(test_config_file);
    TAP_RUN(test_config_file_errors);
    return tap_done();
}
