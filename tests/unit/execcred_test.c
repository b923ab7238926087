/*
 * execcred_test.c — a kubeconfig's exec plugin as kcfg_parse reads it
 * (kcfg_exec.c) and the plugin's answer as excred_parse reads it
 * (execcred.c), and when a credential is refreshed. Running the plugin (child
 * processes, pipes, timeouts) is tests/integration/33_exec.py's.
 *
 * Expected values are written here from client-go's behaviour
 * (tools/clientcmd validation and defaults, plugin/pkg/client/auth/exec).
 */
#include "kwc/execcred.h"

#include "kwc/base.h"
#include "kwc/kubeconfig.h"
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char err[512];

#define KC_HEAD                                                                                    \
    "apiVersion: v1\nkind: Config\ncurrent-context: t\n"                                           \
    "contexts: [{name: t, context: {cluster: c, user: u}}]\n"

static int
parse_kc(const char *yaml, struct kcfg **k)
{
    return kcfg_parse(yaml, strlen(yaml), "/base/dir", NULL, k, err, sizeof err);
}

/* ---- the kubeconfig ----------------------------------------------------- */

static void
test_kubeconfig_exec(void)
{
    struct kcfg *k = NULL;
    const char *y = KC_HEAD
        "clusters: [{name: c, cluster: {server: 'https://h:6443/', tls-server-name: api.example,\n"
        "  certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==,\n"
        "  extensions: [{name: client.authentication.k8s.io/exec, extension: {z: 1, a: [x, 2.5, "
        "on, ~, '7']}}]}}]\n"
        "users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: "
        "bin/plugin, args: [a, ''], env: [{name: A, value: '1'}, {name: B}], interactiveMode: "
        "Never, installHint: 'brew install it', provideClusterInfo: true}}}]\n";
    is_int(parse_kc(y, &k), 0, "an exec user loads");
    if (!k || !k->exec) {
        printf("#   %s\n", err);
        kcfg_free(k);
        return;
    }
    const struct kcfg_exec *e = k->exec;
    is_str(e->command, "/base/dir/bin/plugin", "a relative path: against the kubeconfig's dir");
    is_int((int)e->nargs, 2, "args");
    is_str(e->args[1], "", "an empty arg kept");
    is_int((int)e->nenv, 2, "env");
    is_str(e->env[0], "A=1", "env NAME=value");
    is_str(e->env[1], "B=", "env without value: empty");
    is_int(e->interactive, KCFG_INTERACTIVE_NEVER, "Never");
    is_str(e->install_hint, "brew install it", "installHint");
    is_int((int)e->timeout_ms, KCFG_EXEC_TIMEOUT_MS, "the default bound");
    /* encoding/json of clientauthentication/v1 ExecCredential: field order as
     * declared, the server as written, CA data base64, config keys sorted
     * (YAML through sigs.k8s.io/yaml), YAML 1.1 scalars typed */
    is_str(e->exec_info,
           "{\"kind\":\"ExecCredential\",\"apiVersion\":\"client.authentication.k8s.io/v1\","
           "\"spec\":{\"cluster\":{\"server\":\"https://h:6443/\",\"tls-server-name\":"
           "\"api.example\",\"certificate-authority-data\":"
           "\"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==\",\"config\":{\"a\":[\"x\",2.5,true,null,"
           "\"7\"],\"z\":1}},\"interactive\":false}}\n",
           "KUBERNETES_EXEC_INFO with the cluster");
    kcfg_free(k);

    k = NULL;
    is_int(parse_kc(KC_HEAD "clusters: [{name: c, cluster: {server: 'http://h', "
                            "insecure-skip-tls-verify: true}}]\n"
                            "users: [{name: u, user: {exec: {apiVersion: "
                            "client.authentication.k8s.io/v1beta1, command: /abs/p, "
                            "provideClusterInfo: true}}}]\n",
                    &k),
           0, "v1beta1 without interactiveMode loads");
    if (k && k->exec) {
        is_str(k->exec->command, "/abs/p", "an absolute command as is");
        is_int(k->exec->interactive, KCFG_INTERACTIVE_IF_AVAILABLE, "v1beta1's default");
        is_str(k->exec->exec_info,
               "{\"kind\":\"ExecCredential\",\"apiVersion\":\"client.authentication.k8s.io/"
               "v1beta1\",\"spec\":{\"cluster\":{\"server\":\"http://h\",\"insecure-skip-tls-"
               "verify\":true,\"config\":null},\"interactive\":false}}\n",
               "no extension: config null (a RawExtension)");
    }
    kcfg_free(k);
}

static const struct {
    const char *what, *exec;
    int rc;
    const char *want;
} bad_exec[] = {
    {"no command", "{apiVersion: client.authentication.k8s.io/v1, interactiveMode: Never}",
     KWC_ECONFIG, "command must be specified"},
    {"no apiVersion", "{command: p, interactiveMode: Never}", KWC_ECONFIG,
     "apiVersion must be specified"},
    {"v1alpha1", "{command: p, apiVersion: client.authentication.k8s.io/v1alpha1}", KWC_ECONFIG,
     "removed in Kubernetes 1.24"},
    {"v1 without interactiveMode", "{command: p, apiVersion: client.authentication.k8s.io/v1}",
     KWC_ECONFIG, "interactiveMode must be specified"},
    {"Always", "{command: p, apiVersion: client.authentication.k8s.io/v1, interactiveMode: Always}",
     KWC_EUNSUPPORTED, "interactiveMode Always needs a terminal"},
    {"bad mode", "{command: p, apiVersion: client.authentication.k8s.io/v1, interactiveMode: Yes}",
     KWC_ECONFIG, "invalid interactiveMode \"Yes\""},
    {"env without name",
     "{command: p, apiVersion: client.authentication.k8s.io/v1, interactiveMode: Never, env: "
     "[{value: x}]}",
     KWC_ECONFIG, "env variable name must be specified"},
    {"args not a list",
     "{command: p, apiVersion: client.authentication.k8s.io/v1, interactiveMode: Never, args: a}",
     KWC_ECONFIG, "args must be a list"},
};

static void
test_kubeconfig_exec_errors(void)
{
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad_exec); i++) {
        char *y = xasprintf(KC_HEAD "clusters: [{name: c, cluster: {server: 'https://h'}}]\n"
                                    "users: [{name: u, user: {exec: %s}}]\n",
                            bad_exec[i].exec);
        struct kcfg *k = NULL;
        is_int(parse_kc(y, &k), bad_exec[i].rc, bad_exec[i].what);
        ok(!k && strstr(err, bad_exec[i].want) && strstr(err, "user \"u\" exec"), bad_exec[i].want);
        if (!strstr(err, bad_exec[i].want))
            printf("#   message: %s\n", err);
        free(y);
    }
}

/* ---- the plugin's answer ------------------------------------------------ */

static int
parse_out(const char *s, struct excred_cred **c)
{
    return excred_parse(s, strlen(s), "client.authentication.k8s.io/v1", c, err, sizeof err);
}

static void
test_parse_token(void)
{
    struct excred_cred *c = NULL;
    is_int(parse_out("{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":"
                     "\"ExecCredential\",\"status\":{\"token\":\"abc\",\"expirationTimestamp\":"
                     "\"2030-01-02T03:04:05Z\"},\"spec\":{}}\n",
                     &c),
           0, "a token with an expiry");
    if (c) {
        is_str(c->bearer_line, "Authorization: Bearer abc", "the header line");
        ok(c->expiry == 1893553445.0, "expirationTimestamp as Unix time");
        ok(!c->cert_pem, "no certificate");
    }
    excred_cred_free(c);
    c = NULL;
    is_int(parse_out("{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":"
                     "\"ExecCredential\",\"status\":{\"token\":\"t\",\"expirationTimestamp\":"
                     "\"2030-01-02T05:04:05.5+02:00\"}}",
                     &c),
           0, "an offset and fractional seconds");
    if (c)
        ok(c->expiry == 1893553445.5, "offset applied");
    excred_cred_free(c);
    c = NULL;
    is_int(
        parse_out("{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":"
                  "\"ExecCredential\",\"status\":{\"token\":\"t\",\"expirationTimestamp\":null}}",
                  &c),
        0, "no expiry");
    if (c)
        ok(c->expiry == 0, "never expires");
    excred_cred_free(c);
}

static const struct {
    const char *what, *out, *want;
} bad_out[] = {
    {"not JSON", "Token: abc", "it is not JSON"},
    {"no kind", "{\"apiVersion\":\"client.authentication.k8s.io/v1\"}",
     "couldn't get version/kind"},
    {"wrong version",
     "{\"apiVersion\":\"client.authentication.k8s.io/v1beta1\",\"kind\":\"ExecCredential\"}",
     "configured to use API version client.authentication.k8s.io/v1, plugin returned version "
     "client.authentication.k8s.io/v1beta1"},
    {"wrong kind", "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"Token\"}",
     "kind Token is not ExecCredential"},
    {"no status",
     "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\"}",
     "didn't return a status field"},
    {"empty status",
     "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":"
     "{\"token\":\"\"}}",
     "didn't return a token or cert/key pair"},
    {"cert without key",
     "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":"
     "{\"clientCertificateData\":\"x\"}}",
     "only certificate or key, not both"},
    {"cert not PEM",
     "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":"
     "{\"clientCertificateData\":\"x\",\"clientKeyData\":\"y\"}}",
     "clientCertificateData is not PEM"},
    {"bad time",
     "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":"
     "{\"token\":\"t\",\"expirationTimestamp\":\"2030-01-02 03:04:05\"}}",
     "is not an RFC 3339 time"},
    {"token with a line break",
     "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":"
     "{\"token\":\"a\\r\\nX-Evil: 1\"}}",
     "holds a control character"},
    {"status of numbers",
     "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":"
     "{\"token\":5}}",
     "status must be an object of strings"},
};

static void
test_parse_errors(void)
{
    for (size_t i = 0; i < KWC_ARRAY_LEN(bad_out); i++) {
        struct excred_cred *c = (struct excred_cred *)&c;
        is_int(parse_out(bad_out[i].out, &c), KWC_EPARSE, bad_out[i].what);
        ok(!c && strstr(err, bad_out[i].want) && !strchr(err, '\n'), bad_out[i].want);
        if (!strstr(err, bad_out[i].want))
            printf("#   message: %s\n", err);
    }
}

static void
test_refresh_at(void)
{
    ok(excred_refresh_at(1000, 0) == 0, "no expiry: no refresh");
    ok(excred_refresh_at(1000, 1010) == 1008, "10 s: with a fifth left");
    ok(excred_refresh_at(1000, 1000 + 900) == 1720, "15 min (EKS): 3 min before");
    ok(excred_refresh_at(1000, 1000 + 3600) == 1000 + 3300, "1 h: 5 min before at most");
    ok(excred_refresh_at(1000, 990) == 990, "already expired: now");
}

int
main(void)
{
    TAP_RUN(test_kubeconfig_exec);
    TAP_RUN(test_kubeconfig_exec_errors);
    TAP_RUN(test_parse_token);
    TAP_RUN(test_parse_errors);
    TAP_RUN(test_refresh_at);
    return tap_done();
}
