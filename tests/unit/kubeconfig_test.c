/*
 * kubeconfig_test.c — kcfg_parse / kcfg_load_file / kcfg_in_cluster.
 *
 * Expected values come from the YAML and fixture text written here and in
 * tests/unit/fixtures/kubeconfig/ (base64 fields are checked against the
 * plain text that was encoded). Files the code must read are written to a
 * fresh mkdtemp directory per test and removed afterwards.
 */
#include "kwc/kubeconfig.h"

#include "kwc/base.h"
#include "tap.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char err[512];

/* ---- helpers ------------------------------------------------------------ */

static int
parse(const char *yaml, const char *base_dir, const char *context, struct kcfg **k)
{
    memset(err, 'X', sizeof err); /* so a missing NUL would show */
    return kcfg_parse(yaml, strlen(yaml), base_dir, context, k, err, sizeof err);
}

static char *
tmpdir_new(void)
{
    char *d = xstrdup("/tmp/kcfg_test.XXXXXX");
    if (!mkdtemp(d)) {
        perror("mkdtemp");
        exit(2);
    }
    return d;
}

static int
rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void
tmpdir_free(char *d)
{
    nftw(d, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(d);
}

static void
write_file(const char *dir, const char *name, const void *data, size_t len)
{
    char *path = xasprintf("%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
    free(path);
}

static void
write_str(const char *dir, const char *name, const char *s)
{
    write_file(dir, name, s, strlen(s));
}

/* Directory of this source file: make runs the tests from the repository root. */
static char *
fixtures_dir(void)
{
    const char *f = __FILE__;
    const char *slash = strrchr(f, '/');
    return xasprintf("%.*s/fixtures/kubeconfig", slash ? (int)(slash - f) : 1, slash ? f : ".");
}

/* ---- valid kubeconfigs ---------------------------------------------------- */

#define MINIMAL                                                                                    \
    "apiVersion: v1\n"                                                                             \
    "kind: Config\n"                                                                               \
    "current-context: dev\n"                                                                       \
    "clusters:\n"                                                                                  \
    "- name: dev-cluster\n"                                                                        \
    "  cluster:\n"                                                                                 \
    "    server: https://10.0.0.1:6443\n"                                                          \
    "contexts:\n"                                                                                  \
    "- name: dev\n"                                                                                \
    "  context:\n"                                                                                 \
    "    cluster: dev-cluster\n"                                                                   \
    "    user: dev-user\n"                                                                         \
    "users:\n"                                                                                     \
    "- name: dev-user\n"                                                                           \
    "  user:\n"                                                                                    \
    "    token: abc.def\n"

static void
test_minimal(void)
{
    struct kcfg *k = NULL;
    is_int(parse(MINIMAL, NULL, NULL, &k), 0, "minimal parses");
    if (!k)
        return;
    is_str(k->server, "https://10.0.0.1:6443", "server");
    is_str(k->context, "dev", "context from current-context");
    is_str(k->cluster, "dev-cluster", "cluster");
    is_str(k->user, "dev-user", "user");
    is_str(k->token, "abc.def", "token");
    ok(!k->namespace && !k->token_file && !k->username && !k->password, "unset fields NULL");
    ok(!k->ca_pem && !k->cert_pem && !k->key_pem && !k->tls_server_name, "no TLS material");
    ok(!k->insecure_skip_tls_verify, "verify by default");
    kcfg_free(k);
    kcfg_free(NULL);
    ok(1, "kcfg_free(NULL)");
}

static void
test_server_forms(void)
{
    static const struct {
        const char *server, *want;
    } cases[] = {
        {"https://10.0.0.1:6443/", "https://10.0.0.1:6443"},
        {"https://api.example.com//", "https://api.example.com"},
        {"http://127.0.0.1:8080", "http://127.0.0.1:8080"},
        {"'https://[fd00::1]:6443/'", "https://[fd00::1]:6443"},
        {"https://lb.example.com/k8s/clusters/c-1/", "https://lb.example.com/k8s/clusters/c-1"},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(cases); i++) {
        char *y = xasprintf("current-context: c\n"
                            "clusters: [{name: c, cluster: {server: %s}}]\n"
                            "contexts: [{name: c, context: {cluster: c}}]\n",
                            cases[i].server);
        struct kcfg *k = NULL;
        is_int(parse(y, NULL, NULL, &k), 0, cases[i].server);
        is_str(k ? k->server : NULL, cases[i].want, "trailing slash stripped");
        ok(k && !k->user, "a context without user is anonymous");
        kcfg_free(k);
        free(y);
    }
}

#define TWO_CONTEXTS                                                                               \
    "current-context: dev\n"                                                                       \
    "clusters:\n"                                                                                  \
    "- name: dev-cluster\n"                                                                        \
    "  cluster: {server: 'https://dev.example:6443'}\n"                                            \
    "- name: prod-cluster\n"                                                                       \
    "  cluster:\n"                                                                                 \
    "    server: https://prod.example:443\n"                                                       \
    "    tls-server-name: kubernetes.default.svc\n"                                                \
    "contexts:\n"                                                                                  \
    "- name: dev\n"                                                                                \
    "  context: {cluster: dev-cluster, user: dev-user}\n"                                          \
    "- name: prod\n"                                                                               \
    "  context: {cluster: prod-cluster, user: prod-user, namespace: payments}\n"                   \
    "users:\n"                                                                                     \
    "- name: dev-user\n"                                                                           \
    "  user: {token: dev-token}\n"                                                                 \
    "- name: prod-user\n"                                                                          \
    "  user: {username: admin, password: \"s3cr3t: yes\"}\n"

static void
test_context_choice(void)
{
    static const struct {
        const char *ask, *context, *cluster, *server, *ns, *tls_name;
    } cases[] = {
        {NULL, "dev", "dev-cluster", "https://dev.example:6443", NULL, NULL},
        {"", "dev", "dev-cluster", "https://dev.example:6443", NULL, NULL},
        {"dev", "dev", "dev-cluster", "https://dev.example:6443", NULL, NULL},
        {"prod", "prod", "prod-cluster", "https://prod.example:443", "payments",
         "kubernetes.default.svc"},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(cases); i++) {
        struct kcfg *k = NULL;
        is_int(parse(TWO_CONTEXTS, NULL, cases[i].ask, &k), 0, "parses");
        if (!k)
            continue;
        is_str(k->context, cases[i].context, "context");
        is_str(k->cluster, cases[i].cluster, "cluster");
        is_str(k->server, cases[i].server, "server");
        is_str(k->namespace, cases[i].ns, "namespace");
        is_str(k->tls_server_name, cases[i].tls_name, "tls-server-name");
        kcfg_free(k);
    }
}

static void
test_basic_auth(void)
{
    struct kcfg *k = NULL;
    is_int(parse(TWO_CONTEXTS, NULL, "prod", &k), 0, "parses");
    if (!k)
        return;
    is_str(k->username, "admin", "username");
    is_str(k->password, "s3cr3t: yes", "password (quoted)");
    ok(!k->token && !k->token_file, "no token");
    kcfg_free(k);
}

/* Plain text of the base64 values below. */
static const char CA_PEM[] =
    "-----BEGIN CERTIFICATE-----\nY2EtZGF0YQ==\n-----END CERTIFICATE-----\n";
static const char CERT_PEM[] =
    "-----BEGIN CERTIFICATE-----\nY2xpZW50LWRhdGE=\n-----END CERTIFICATE-----\n";
static const char KEY_PEM[] =
    "-----BEGIN EC PRIVATE KEY-----\na2V5LWRhdGE=\n-----END EC PRIVATE KEY-----\n";
#define CA_B64                                                                                     \
    "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tClkyRXRaR0YwWVE9PQotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg=="
#define CERT_B64                                                                                   \
    "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tClkyeHBaVzUwTFdSaGRHRT0KLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0t" \
    "LQo="
#define KEY_B64                                                                                    \
    "LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCmEyVjVMV1JoZEdFPQotLS0tLUVORCBFQyBQUklWQVRFIEtFWS0t" \
    "LS0tCg=="

static void
test_data_fields(void)
{
    const char *y = "current-context: kind\n"
                    "clusters:\n"
                    "- name: kind\n"
                    "  cluster:\n"
                    "    server: https://127.0.0.1:40000\n"
                    "    certificate-authority-data: " CA_B64 "\n"
                    "contexts:\n"
                    "- {name: kind, context: {cluster: kind, user: kind}}\n"
                    "users:\n"
                    "- name: kind\n"
                    "  user:\n"
                    "    client-certificate-data: " CERT_B64 "\n"
                    /* folded over lines, as some tools write it */
                    "    client-key-data: |\n"
                    "      LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tCmEyVjVMV1JoZEdFPQotLS0t\n"
                    "      LUVORCBFQyBQUklWQVRFIEtFWS0tLS0tCg==\n";
    struct kcfg *k = NULL;
    is_int(parse(y, NULL, NULL, &k), 0, "parses");
    if (!k)
        return;
    is_mem(k->ca_pem, k->ca_pem_len, CA_PEM, strlen(CA_PEM), "certificate-authority-data");
    is_mem(k->cert_pem, k->cert_pem_len, CERT_PEM, strlen(CERT_PEM), "client-certificate-data");
    is_mem(k->key_pem, k->key_pem_len, KEY_PEM, strlen(KEY_PEM), "client-key-data (multi-line)");
    ok(k->ca_pem[k->ca_pem_len] == '\0' && k->key_pem[k->key_pem_len] == '\0', "NUL-terminated");
    kcfg_free(k);
}

static void
test_insecure(void)
{
    static const struct {
        const char *v;
        bool want;
    } cases[] = {{"true", true},   {"True", true}, {"yes", true},    {"on", true},
                 {"false", false}, {"no", false},  {"FALSE", false}, {"~", false}};
    for (size_t i = 0; i < KWC_ARRAY_LEN(cases); i++) {
        char *y = xasprintf("current-context: c\n"
                            "clusters:\n"
                            "- name: c\n"
                            "  cluster:\n"
                            "    server: https://h\n"
                            "    insecure-skip-tls-verify: %s\n"
                            "contexts: [{name: c, context: {cluster: c}}]\n",
                            cases[i].v);
        struct kcfg *k = NULL;
        is_int(parse(y, NULL, NULL, &k), 0, cases[i].v);
        ok(k && k->insecure_skip_tls_verify == cases[i].want, "insecure-skip-tls-verify value");
        kcfg_free(k);
        free(y);
    }
}

static void
test_token_file(void)
{
    char *d = tmpdir_new();
    write_str(d, "sa-token", "eyJhbGciOi.token\n");
    const char *y = "current-context: c\n"
                    "clusters: [{name: c, cluster: {server: 'https://h:6443'}}]\n"
                    "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
                    "users:\n"
                    "- name: u\n"
                    "  user:\n"
                    "    token: static-token\n"
                    "    tokenFile: sa-token\n";
    struct kcfg *k = NULL;
    is_int(parse(y, d, NULL, &k), 0, "token + tokenFile parse");
    char *want = xasprintf("%s/sa-token", d);
    is_str(k ? k->token_file : NULL, want, "tokenFile resolved against base_dir, absolute");
    is_str(k ? k->token : NULL, "static-token", "token kept");
    kcfg_free(k);
    free(want);

    /* base_dir relative to the working directory: token_file is still absolute. */
    char *cwd = getcwd(NULL, 0);
    if (chdir("/tmp") == 0) {
        const char *rel = strrchr(d, '/') + 1;
        k = NULL;
        is_int(parse(y, rel, NULL, &k), 0, "relative base_dir");
        ok(k && k->token_file && k->token_file[0] == '/', "token_file absolute");
        want = xasprintf("/tmp/%s/sa-token", rel);
        is_str(k ? k->token_file : NULL, want, "made absolute against the cwd");
        free(want);
        kcfg_free(k);
        ok(chdir(cwd) == 0, "back to cwd");
    }
    free(cwd);
    tmpdir_free(d);
}

static void
test_fixture_files(void)
{
    char *fx = fixtures_dir();
    char *path = xasprintf("%s/files.yaml", fx);
    struct kcfg *k = NULL;
    is_int(kcfg_load_file(path, NULL, &k, err, sizeof err), 0, "files.yaml loads");
    if (k) {
        static const char ca[] = "-----BEGIN CERTIFICATE-----\nZml4dHVyZS1jYQ==\n"
                                 "-----END CERTIFICATE-----\n";
        static const char crt[] = "-----BEGIN CERTIFICATE-----\nZml4dHVyZS1jbGllbnQ=\n"
                                  "-----END CERTIFICATE-----\n";
        static const char key[] = "-----BEGIN PRIVATE KEY-----\nZml4dHVyZS1rZXk=\n"
                                  "-----END PRIVATE KEY-----\n";
        is_str(k->server, "https://fixture.example:6443", "server, slash stripped");
        is_str(k->tls_server_name, "api.fixture.example", "tls-server-name");
        is_str(k->namespace, "fixtures", "namespace");
        is_mem(k->ca_pem, k->ca_pem_len, ca, strlen(ca), "ca.crt next to the kubeconfig");
        is_mem(k->cert_pem, k->cert_pem_len, crt, strlen(crt), "pki/client.crt");
        is_mem(k->key_pem, k->key_pem_len, key, strlen(key), "./pki/client.key");
        kcfg_free(k);
    }
    k = NULL;
    is_int(kcfg_load_file(path, "token", &k, err, sizeof err), 0, "token context");
    if (k) {
        ok(k->token_file && k->token_file[0] == '/', "token_file is absolute");
        const char *tail = "fixtures/kubeconfig/token";
        size_t tl = strlen(tail), n = k->token_file ? strlen(k->token_file) : 0;
        ok(n > tl && strcmp(k->token_file + n - tl, tail) == 0, "token_file is the fixture");
        ok(!k->token, "tokenFile is not read into token");
        kcfg_free(k);
    }
    free(path);

    k = NULL;
    path = xasprintf("%s/data.yaml", fx);
    is_int(kcfg_load_file(path, NULL, &k, err, sizeof err), 0, "data.yaml (kind-style) loads");
    if (k) {
        is_mem(k->ca_pem, k->ca_pem_len, CA_PEM, strlen(CA_PEM), "ca");
        is_mem(k->key_pem, k->key_pem_len, KEY_PEM, strlen(KEY_PEM), "key");
        kcfg_free(k);
    }
    free(path);

    k = NULL;
    path = xasprintf("%s/exec.yaml", fx);
    is_int(kcfg_load_file(path, NULL, &k, err, sizeof err), 0, "exec.yaml (EKS-style) loads");
    if (k && k->exec) {
        is_str(k->exec->command, "aws", "a bare command stays a $PATH name");
        is_int((int)k->exec->nargs, 4, "args");
        is_str(k->exec->args[3], "demo", "args in order");
        is_int((int)k->exec->nenv, 1, "env");
        is_str(k->exec->env[0], "AWS_PROFILE=demo", "env as NAME=value");
        is_int(k->exec->interactive, KCFG_INTERACTIVE_IF_AVAILABLE, "v1beta1 default: IfAvailable");
        is_str(k->exec->exec_info,
               "{\"kind\":\"ExecCredential\",\"apiVersion\":\"client.authentication.k8s.io/"
               "v1beta1\",\"spec\":{\"interactive\":false}}\n",
               "KUBERNETES_EXEC_INFO without provideClusterInfo");
    } else {
        ok(0, "exec.yaml has an exec plugin");
        printf("#   %s\n", err);
    }
    kcfg_free(k);
    free(path);

    path = xasprintf("%s/no-such.yaml", fx);
    is_int(kcfg_load_file(path, NULL, &k, err, sizeof err), -ENOENT, "missing kubeconfig");
    ok(strstr(err, "no-such.yaml") != NULL, err);
    free(path);
    free(fx);
}

/* A kubeconfig whose errors name the file it was loaded from. */
static void
test_load_file_errors(void)
{
    char *d = tmpdir_new();
    struct kcfg *k = NULL;
    write_str(d, "empty.yaml", "# nothing here\n");
    char *path = xasprintf("%s/empty.yaml", d);
    is_int(kcfg_load_file(path, NULL, &k, err, sizeof err), KWC_ECONFIG, "empty file");
    ok(strstr(err, path) && strstr(err, "empty"), err);
    free(path);

    path = xasprintf("%s/big.yaml", d);
    char *big = xmalloc(KCFG_MAX_FILE + 1);
    memset(big, '#', KCFG_MAX_FILE + 1);
    write_file(d, "big.yaml", big, KCFG_MAX_FILE + 1);
    is_int(kcfg_load_file(path, NULL, &k, err, sizeof err), KWC_ETOOBIG, "kubeconfig > 4 MiB");
    ok(strstr(err, "4 MiB") != NULL, err);
    free(path);

    /* exactly 4 MiB is allowed (a comment-only file: empty) */
    big[KCFG_MAX_FILE - 1] = '\n';
    write_file(d, "max.yaml", big, KCFG_MAX_FILE);
    path = xasprintf("%s/max.yaml", d);
    is_int(kcfg_load_file(path, NULL, &k, err, sizeof err), KWC_ECONFIG, "4 MiB exactly is read");
    ok(strstr(err, "empty") != NULL, err);
    free(path);

    /* a referenced CA file over the limit */
    write_file(d, "big.crt", big, KCFG_MAX_FILE + 1);
    const char *y = "current-context: c\n"
                    "clusters: [{name: c, cluster: {server: 'https://h', "
                    "certificate-authority: big.crt}}]\n"
                    "contexts: [{name: c, context: {cluster: c}}]\n";
    is_int(parse(y, d, NULL, &k), KWC_ETOOBIG, "referenced file > 4 MiB");
    ok(strstr(err, "big.crt") && strstr(err, "4 MiB"), err);
    free(big);

    is_int(kcfg_load_file(d, NULL, &k, err, sizeof err), -EISDIR, "a directory");
    ok(!k, "no result");
    tmpdir_free(d);
}

/* ---- errors ---------------------------------------------------------------- */

#define HDR_C "current-context: c\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
#define CL_C "clusters: [{name: c, cluster: {server: 'https://h'}}]\n"

static const struct bad {
    const char *what, *yaml, *context;
    int rc;
    const char *want1, *want2; /* substrings of the message */
} bad_cases[] = {
    {"empty", "", NULL, KWC_ECONFIG, "empty", NULL},
    {"comments only", "# hello\n", NULL, KWC_ECONFIG, "empty", NULL},
    {"explicit null", "~\n", NULL, KWC_ECONFIG, "empty", NULL},
    {"root list", "- a\n- b\n", NULL, KWC_ECONFIG, "mapping", "a list"},
    {"root scalar", "hello\n", NULL, KWC_ECONFIG, "mapping", "a string"},
    {"bad YAML", "clusters: [\n", NULL, KWC_ECONFIG, "not valid YAML", "line"},
    {"bad indentation", "a:\n  b: 1\n c: 2\n", NULL, KWC_ECONFIG, "not valid YAML", NULL},
    {"undefined alias", "a: *nope\n", NULL, KWC_ECONFIG, "not valid YAML", NULL},
    {"binary", "\x01\x02\xff\xfe", NULL, KWC_ECONFIG, "not valid YAML", NULL},
    {"context not found", HDR_C CL_C "users: [{name: u, user: {}}]\n", "prod", KWC_ECONFIG,
     "\"prod\"", "contexts: c)"},
    {"no current-context",
     "contexts: [{name: dev, context: {cluster: c}}, {name: staging, context: {cluster: "
     "c}}]\n" CL_C,
     NULL, KWC_ECONFIG, "current-context", "dev, staging"},
    {"current-context dangling", "current-context: gone\n" CL_C, NULL, KWC_ECONFIG, "\"gone\"",
     "contexts: none"},
    {"cluster not found", HDR_C "clusters: [{name: other, cluster: {server: 'https://h'}}]\n", NULL,
     KWC_ECONFIG, "cluster \"c\"", "clusters: other"},
    {"user not found", HDR_C CL_C "users: [{name: someone, user: {token: t}}]\n", NULL, KWC_ECONFIG,
     "user \"u\"", "users: someone"},
    {"context without cluster",
     "current-context: c\ncontexts: [{name: c, context: {user: u}}]\n" CL_C, NULL, KWC_ECONFIG,
     "\"c\"", "cluster"},
    {"context without context:", "current-context: c\ncontexts: [{name: c}]\n" CL_C, NULL,
     KWC_ECONFIG, "\"c\"", "cluster"},
    {"cluster without server", HDR_C "clusters: [{name: c, cluster: {tls-server-name: x}}]\n", NULL,
     KWC_ECONFIG, "cluster \"c\"", "server"},
    {"server without scheme", HDR_C "clusters: [{name: c, cluster: {server: '10.0.0.1:6443'}}]\n",
     NULL, KWC_ECONFIG, "10.0.0.1:6443", "https://"},
    {"server with no host", HDR_C "clusters: [{name: c, cluster: {server: 'https://'}}]\n", NULL,
     KWC_ECONFIG, "no host", NULL},
    {"server is a mapping", HDR_C "clusters: [{name: c, cluster: {server: {a: 1}}}]\n", NULL,
     KWC_ECONFIG, "server", "must be a string"},
    {"duplicate cluster", HDR_C CL_C "clusters: []\n", NULL, KWC_ECONFIG, "clusters", "twice"},
    {"duplicate cluster name",
     HDR_C "clusters:\n- {name: dup, cluster: {server: 'https://a'}}\n"
           "- {name: dup, cluster: {server: 'https://b'}}\n",
     NULL, KWC_ECONFIG, "\"dup\"", "unique"},
    {"duplicate context name",
     "contexts:\n- {name: twin, context: {cluster: c}}\n- {name: twin, context: {cluster: "
     "c}}\n" CL_C,
     "twin", KWC_ECONFIG, "\"twin\"", "unique"},
    {"duplicate user name", HDR_C CL_C "users: [{name: u, user: {}}, {name: u, user: {}}]\n", NULL,
     KWC_ECONFIG, "\"u\"", "unique"},
    {"duplicate key",
     HDR_C "clusters: [{name: c, cluster: {server: 'https://a', server: 'https://b'}}]\n", NULL,
     KWC_ECONFIG, "server", "twice"},
    {"clusters not a list", HDR_C "clusters: {c: {server: 'https://h'}}\n", NULL, KWC_ECONFIG,
     "clusters", "list"},
    {"entry without name", HDR_C "clusters: [{cluster: {server: 'https://h'}}]\n", NULL,
     KWC_ECONFIG, "clusters[0]", "name"},
    {"entry not a mapping", HDR_C "clusters: [c]\n", NULL, KWC_ECONFIG, "clusters[0]", "mapping"},
    {"cluster: is a list", HDR_C "clusters: [{name: c, cluster: [1]}]\n", NULL, KWC_ECONFIG,
     "cluster", "mapping"},
    {"exec user with a token",
     HDR_C CL_C "users: [{name: u, user: {token: t, exec: {command: aws, apiVersion: "
                "client.authentication.k8s.io/v1beta1}}}]\n",
     NULL, KWC_ECONFIG, "user \"u\" sets both exec and a token", "remove one"},
    {"auth-provider user", HDR_C CL_C "users: [{name: u, user: {auth-provider: {name: gcp}}}]\n",
     NULL, KWC_EUNSUPPORTED, "user \"u\"", "exec credential plugin"},
    {"impersonation", HDR_C CL_C "users: [{name: u, user: {token: t, as: admin}}]\n", NULL,
     KWC_EUNSUPPORTED, "user \"u\"", "impersonation"},
    {"proxy-url",
     HDR_C "clusters: [{name: c, cluster: {server: 'https://h', "
           "proxy-url: 'http://p:3128'}}]\n",
     NULL, KWC_EUNSUPPORTED, "cluster \"c\"", "proxy-url"},
    {"cert without key",
     HDR_C CL_C "users: [{name: u, user: {client-certificate-data: " CERT_B64 "}}]\n", NULL,
     KWC_ECONFIG, "user \"u\"", "no client key"},
    {"key without cert", HDR_C CL_C "users: [{name: u, user: {client-key-data: " KEY_B64 "}}]\n",
     NULL, KWC_ECONFIG, "user \"u\"", "no client certificate"},
    {"ca file and data",
     HDR_C "clusters: [{name: c, cluster: {server: 'https://h', "
           "certificate-authority: ca.crt, certificate-authority-data: " CA_B64 "}}]\n",
     NULL, KWC_ECONFIG, "cluster \"c\"", "both"},
    {"insecure with CA",
     HDR_C "clusters: [{name: c, cluster: {server: 'https://h', "
           "insecure-skip-tls-verify: true, certificate-authority-data: " CA_B64 "}}]\n",
     NULL, KWC_ECONFIG, "cluster \"c\"", "insecure-skip-tls-verify"},
    {"insecure not a bool",
     HDR_C "clusters: [{name: c, cluster: {server: 'https://h', "
           "insecure-skip-tls-verify: maybe}}]\n",
     NULL, KWC_ECONFIG, "\"maybe\"", "true or false"},
    {"token and basic auth",
     HDR_C CL_C "users: [{name: u, user: {token: t, username: a, password: b}}]\n", NULL,
     KWC_ECONFIG, "user \"u\"", "only one"},
    {"bad base64",
     HDR_C "clusters: [{name: c, cluster: {server: 'https://h', "
           "certificate-authority-data: 'not base64!'}}]\n",
     NULL, KWC_ECONFIG, "certificate-authority-data", "base64"},
    {"data not PEM",
     HDR_C "clusters: [{name: c, cluster: {server: 'https://h', "
           "certificate-authority-data: bm90IGEgcGVtIGZpbGU=}}]\n",
     NULL, KWC_ECONFIG, "certificate-authority-data", "PEM"},
    {"missing CA file",
     HDR_C "clusters: [{name: c, cluster: {server: 'https://h', "
           "certificate-authority: /nonexistent/kcfg/ca.pem}}]\n",
     NULL, -ENOENT, "/nonexistent/kcfg/ca.pem", "cluster \"c\""},
    {"missing key file",
     HDR_C CL_C "users: [{name: u, user: {client-certificate-data: " CERT_B64
                ", client-key: /nonexistent/kcfg/key.pem}}]\n",
     NULL, -ENOENT, "/nonexistent/kcfg/key.pem", "user \"u\""},
    {"missing tokenFile", HDR_C CL_C "users: [{name: u, user: {tokenFile: /nonexistent/kcfg/t}}]\n",
     NULL, -ENOENT, "/nonexistent/kcfg/t", "tokenFile"},
    {"directory as CA",
     HDR_C "clusters: [{name: c, cluster: {server: 'https://h', "
           "certificate-authority: /tmp}}]\n",
     NULL, -EISDIR, "\"/tmp\"", NULL},
    {"device as CA",
     HDR_C "clusters: [{name: c, cluster: {server: 'https://h', "
           "certificate-authority: /dev/null}}]\n",
     NULL, -EINVAL, "/dev/null", "regular file"},
    {"NUL in a value", HDR_C "clusters: [{name: c, cluster: {server: \"https://h\\0x\"}}]\n", NULL,
     KWC_ECONFIG, "server", "NUL"},
    {"control characters escaped", "current-context: \"\\e[31mred\"\n", NULL, KWC_ECONFIG,
     "\"\\x1b[31mred\"", NULL},
};

static void
test_errors(void)
{
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad_cases); i++) {
        const struct bad *b = &bad_cases[i];
        struct kcfg *k = (struct kcfg *)&k; /* must be overwritten with NULL */
        int rc = parse(b->yaml, "/nonexistent-base", b->context, &k);
        if (rc != b->rc)
            printf("#   %s: %s\n", b->what, err);
        is_int(rc, b->rc, b->what);
        ok(k == NULL, "no result on error");
        ok(memchr(err, '\0', sizeof err) && err[0], "a message");
        ok(strstr(err, b->want1) != NULL, b->want1);
        if (b->want2)
            ok(strstr(err, b->want2) != NULL, b->want2);
        if (!strstr(err, b->want1) || (b->want2 && !strstr(err, b->want2)))
            printf("#   message: %s\n", err);
        ok(!strchr(err, '\n'), "one line");
    }
}

/* Errors in referenced files that need a real directory. */
static void
test_file_errors(void)
{
    char *d = tmpdir_new();
    struct kcfg *k = NULL;
    write_str(d, "notpem.crt", "just some text\n");
    const char *y = "current-context: c\n"
                    "clusters: [{name: c, cluster: {server: 'https://h', "
                    "certificate-authority: notpem.crt}}]\n"
                    "contexts: [{name: c, context: {cluster: c}}]\n";
    is_int(parse(y, d, NULL, &k), KWC_ECONFIG, "CA file that is not PEM");
    ok(strstr(err, "notpem.crt") && strstr(err, "PEM"), err);

    char *fifo = xasprintf("%s/fifo.crt", d);
    ok(mkfifo(fifo, 0600) == 0, "mkfifo");
    y = "current-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://h', certificate-authority: fifo.crt}}]\n"
        "contexts: [{name: c, context: {cluster: c}}]\n";
    is_int(parse(y, d, NULL, &k), -EINVAL, "a FIFO is refused without blocking");
    ok(strstr(err, "regular file") != NULL, err);
    free(fifo);
    tmpdir_free(d);
}

static void
test_small_err_buffer(void)
{
    struct kcfg *k = NULL;
    char small[8];
    memset(small, 'X', sizeof small);
    is_int(kcfg_parse("", 0, NULL, NULL, &k, small, sizeof small), KWC_ECONFIG, "empty");
    ok(memchr(small, '\0', sizeof small) != NULL, "truncated message NUL-terminated");
    is_int(kcfg_parse("[", 1, NULL, NULL, &k, NULL, 0), KWC_ECONFIG, "err may be NULL");
}

/* ---- bounds ------------------------------------------------------------------ */

static void
test_bounds(void)
{
    struct kcfg *k = NULL;
    /* Over the size limit: refused before parsing, whatever the content. */
    size_t n = KCFG_MAX_FILE + 1;
    char *big = xmalloc(n);
    memset(big, ' ', n);
    is_int(kcfg_parse(big, n, NULL, NULL, &k, err, sizeof err), KWC_ETOOBIG, "input > 4 MiB");
    ok(strstr(err, "4 MiB") != NULL, err);

    /* Deep nesting. */
    memset(big, '[', 100000);
    is_int(kcfg_parse(big, 100000, NULL, NULL, &k, err, sizeof err), KWC_ECONFIG, "deep [[[[");
    ok(strstr(err, "nests deeper") != NULL, err);

    /* Too many nodes: a flow list of KCFG_MAX_NODES + 1 scalars. */
    size_t p = (size_t)sprintf(big, "x: [");
    for (int i = 0; i <= KCFG_MAX_NODES; i++)
        p += (size_t)sprintf(big + p, "0,");
    big[p++] = ']';
    is_int(kcfg_parse(big, p, NULL, NULL, &k, err, sizeof err), KWC_ECONFIG, "too many nodes");
    ok(strstr(err, "YAML nodes") != NULL, err);
    free(big);

    /* Billion laughs: aliases are shared by the loader, never expanded. */
    const char *laughs = MINIMAL "extensions:\n"
                                 "- &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
                                 "- &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                                 "- &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
                                 "- &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                                 "- &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
                                 "- &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
                                 "- &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n"
                                 "- &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
                                 "- &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]\n";
    is_int(parse(laughs, NULL, NULL, &k), 0, "alias bomb in an ignored field parses");
    is_str(k ? k->server : NULL, "https://10.0.0.1:6443", "and the config is intact");
    kcfg_free(k);

    /* Aliases where values are read work like copies. */
    const char *aliased = "current-context: c\n"
                          "clusters: [{name: c, cluster: &cl {server: 'https://shared'}},"
                          " {name: d, cluster: *cl}]\n"
                          "contexts: [{name: c, context: {cluster: d}}]\n";
    k = NULL;
    is_int(parse(aliased, NULL, NULL, &k), 0, "aliased cluster");
    is_str(k ? k->server : NULL, "https://shared", "server through the alias");
    kcfg_free(k);

    /* Only the first YAML document counts. */
    k = NULL;
    is_int(parse(MINIMAL "---\nthis: [is not read\n", NULL, NULL, &k), 0, "second document");
    kcfg_free(k);
}

/* ---- garbage ---------------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint64_t
next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int garbage_bad;

static void
try_bytes(const char *s, size_t len)
{
    struct kcfg *k = NULL;
    err[0] = 'X';
    err[1] = '\0';
    int rc = kcfg_parse(s, len, "/nonexistent-base", NULL, &k, err, sizeof err);
    if ((rc == 0) != (k != NULL) || (rc != 0 && (!err[0] || !strcmp(err, "X"))))
        garbage_bad++;
    kcfg_free(k);
}

static void
test_garbage(void)
{
    const char *seed = TWO_CONTEXTS;
    size_t len = strlen(seed);
    char buf[4096];

    /* Every prefix of a valid kubeconfig. */
    for (size_t i = 0; i <= len; i++)
        try_bytes(seed, i);
    /* Random byte flips. */
    for (int round = 0; round < 3000; round++) {
        memcpy(buf, seed, len);
        int flips = 1 + (int)(next_rand() % 4);
        for (int f = 0; f < flips; f++)
            buf[next_rand() % len] = (char)next_rand();
        try_bytes(buf, len);
    }
    /* Random bytes, random lengths, sometimes printable only. */
    for (int round = 0; round < 2000; round++) {
        size_t n = next_rand() % sizeof buf;
        bool text = round & 1;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = next_rand();
            buf[i] = text ? "{}[]:,-&*!|>'\"#%@` \n\tab0"[r % 25] : (char)r;
        }
        try_bytes(buf, n);
    }
    is_int(garbage_bad, 0, "garbage: result iff 0, a message on every error");
}

/* ---- in-cluster -------------------------------------------------------------- */

static void
test_in_cluster(void)
{
    static const char ca[] = "-----BEGIN CERTIFICATE-----\nY2x1c3Rlci1jYQ==\n"
                             "-----END CERTIFICATE-----\n";
    char *d = tmpdir_new();
    struct kcfg *k = NULL;

    is_int(kcfg_in_cluster(d, "10.96.0.1", "443", &k, err, sizeof err), -ENOENT, "no token");
    ok(!k, "no result");
    ok(strstr(err, "token") && strstr(err, d), err);

    write_str(d, "token", "eyJ.in-cluster.token");
    is_int(kcfg_in_cluster(d, "10.96.0.1", "443", &k, err, sizeof err), 0, "token only");
    if (k) {
        is_str(k->server, "https://10.96.0.1:443", "server");
        ok(!k->ca_pem && !k->namespace && !k->token, "no CA, no namespace, token not inlined");
        kcfg_free(k);
    }

    write_str(d, "ca.crt", ca);
    write_str(d, "namespace", "kube-system\n");
    k = NULL;
    is_int(kcfg_in_cluster(d, "10.96.0.1", "443", &k, err, sizeof err), 0, "full mount");
    if (k) {
        char *tf = xasprintf("%s/token", d);
        is_str(k->token_file, tf, "token_file");
        is_mem(k->ca_pem, k->ca_pem_len, ca, strlen(ca), "ca.crt");
        is_str(k->namespace, "kube-system", "namespace, newline trimmed");
        ok(k->context && k->cluster && k->user, "names set for logs");
        free(tf);
        kcfg_free(k);
    }

    static const struct {
        const char *host, *port, *want;
    } hosts[] = {
        {"fd00::1", "443", "https://[fd00::1]:443"},
        {"[fd00::1]", "6443", "https://[fd00::1]:6443"},
        {"2001:db8::10", "443", "https://[2001:db8::10]:443"},
        {"kubernetes.default.svc", "443", "https://kubernetes.default.svc:443"},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(hosts); i++) {
        k = NULL;
        is_int(kcfg_in_cluster(d, hosts[i].host, hosts[i].port, &k, err, sizeof err), 0,
               hosts[i].host);
        is_str(k ? k->server : NULL, hosts[i].want, "server");
        kcfg_free(k);
    }

    static const struct {
        const char *host, *port, *want;
    } bad[] = {
        {NULL, "443", "KUBERNETES_SERVICE_HOST"},
        {"", "443", "KUBERNETES_SERVICE_HOST"},
        {"10.0.0.1", NULL, "KUBERNETES_SERVICE_PORT"},
        {"10.0.0.1", "0", "\"0\""},
        {"10.0.0.1", "70000", "\"70000\""},
        {"10.0.0.1", "44a", "\"44a\""},
        {"10.0.0.1", "0000443", "\"0000443\""},
        {"evil/host", "443", "\"evil/host\""},
        {"[10.0.0.1]", "443", "\"[10.0.0.1]\""},
        {"a b", "443", "\"a b\""},
    };
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad); i++) {
        k = NULL;
        is_int(kcfg_in_cluster(d, bad[i].host, bad[i].port, &k, err, sizeof err), KWC_ECONFIG,
               bad[i].want);
        ok(!k && strstr(err, bad[i].want), err);
    }

    write_str(d, "ca.crt", "garbage");
    k = NULL;
    is_int(kcfg_in_cluster(d, "10.0.0.1", "443", &k, err, sizeof err), KWC_ECONFIG,
           "ca.crt not PEM");
    ok(strstr(err, "ca.crt") != NULL, err);
    tmpdir_free(d);
}

static void
test_server_hostport(void)
{
    static const struct {
        const char *server, *host, *port;
        bool tls;
    } cases[] = {
        {"https://10.0.0.1:6443", "10.0.0.1", "6443", true},
        {"https://api.example.com", "api.example.com", "443", true},
        {"http://127.0.0.1:8080/prefix", "127.0.0.1", "8080", false},
        {"http://localhost", "localhost", "80", false},
        {"https://[fd00::1]:6443", "fd00::1", "6443", true},
        {"https://[::1]", "::1", "443", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool tls;
        char host[64], port[16];
        kcfg_server_hostport(cases[i].server, &tls, host, sizeof host, port, sizeof port);
        ok(tls == cases[i].tls && strcmp(host, cases[i].host) == 0 &&
               strcmp(port, cases[i].port) == 0,
           cases[i].server);
    }
}

static void
test_bearer_token_rotates(void)
{
    char dir[] = "/tmp/kwc-kcfg-tok-XXXXXX";
    if (!mkdtemp(dir))
        abort();
    char path[128];
    snprintf(path, sizeof path, "%s/token", dir);
    char stat_tok[] = "static";
    struct kcfg k = {.token = stat_tok, .token_file = path};
    FILE *f = fopen(path, "w");
    fputs("first-token\n", f);
    fclose(f);
    int e;
    char *t = kcfg_bearer_token(&k, &e);
    is_str(t, "first-token", "tokenFile wins over token, newline cut");
    free(t);
    f = fopen(path, "w");
    fputs("rotated", f);
    fclose(f);
    t = kcfg_bearer_token(&k, &e);
    is_str(t, "rotated", "the file is read afresh");
    free(t);
    unlink(path);
    t = kcfg_bearer_token(&k, &e);
    ok(t == NULL && e == ENOENT, "a missing file: NULL and errno");
    rmdir(dir);
    struct kcfg only = {.token = stat_tok};
    t = kcfg_bearer_token(&only, &e);
    is_str(t, "static", "no file: the token");
    free(t);
}

int
main(void)
{
    TAP_RUN(test_minimal);
    TAP_RUN(test_server_forms);
    TAP_RUN(test_context_choice);
    TAP_RUN(test_basic_auth);
    TAP_RUN(test_data_fields);
    TAP_RUN(test_insecure);
    TAP_RUN(test_token_file);
    TAP_RUN(test_fixture_files);
    TAP_RUN(test_load_file_errors);
    TAP_RUN(test_errors);
    TAP_RUN(test_file_errors);
    TAP_RUN(test_small_err_buffer);
    TAP_RUN(test_bounds);
    TAP_RUN(test_garbage);
    TAP_RUN(test_in_cluster);
    TAP_RUN(test_server_hostport);
    TAP_RUN(test_bearer_token_rotates);
    return tap_done();
}
