/*
 * kubeconfig.h — upstream connection settings: where the API server is and
 * how to authenticate to it, from one kubeconfig file (kubectl's loading
 * rules for a single file, exec credential plugins included) or from the
 * in-cluster ServiceAccount mount.
 *
 * Loaded once at startup; the result is immutable and handed to the upstream
 * client. The struct is public because the upstream client reads its fields.
 */
#ifndef KWC_KUBECONFIG_H
#define KWC_KUBECONFIG_H

#include <stdbool.h>
#include <stddef.h>

/* Bound on the kubeconfig and on every file it references. */
#define KCFG_MAX_FILE (4u << 20)
/* Bound on YAML nodes in a kubeconfig (scalars, sequences, mappings, aliases). */
#define KCFG_MAX_NODES 100000
/* Bound on YAML nesting depth; a real kubeconfig nests about 7 deep. */
#define KCFG_MAX_DEPTH 64
/* Where kubelet mounts the ServiceAccount token, CA and namespace. */
#define KCFG_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"

/* The default bound on one run of an exec credential plugin. */
#define KCFG_EXEC_TIMEOUT_MS 30000

/*
 * A user's exec credential plugin (client.authentication.k8s.io, as client-go's
 * exec authenticator reads it). Strings are owned, NUL-terminated.
 */
enum kcfg_interactive {
    KCFG_INTERACTIVE_NEVER,
    KCFG_INTERACTIVE_IF_AVAILABLE, /* runs without a terminal: kwc has none */
};
struct kcfg_exec {
    char *command; /* a bare name (looked up on $PATH at each run) or an
                      absolute path (a relative one was resolved against
                      the kubeconfig's directory, as client-go does) */
    char **args;   /* argv[1..], nargs of them */
    size_t nargs;
    char **env; /* "NAME=value", nenv of them, added to kwc's environment */
    size_t nenv;
    char *api_version; /* client.authentication.k8s.io/v1 or /v1beta1 */
    enum kcfg_interactive interactive;
    char *install_hint;  /* NULL when none: shown when the command is missing */
    char *exec_info;     /* KUBERNETES_EXEC_INFO: the ExecCredential request
                            JSON (spec.interactive false; spec.cluster when
                            provideClusterInfo), ending in a newline as Go's
                            encoder writes it */
    unsigned timeout_ms; /* one run's bound (KCFG_EXEC_TIMEOUT_MS unless the
                            caller sets it: --exec-plugin-timeout) */
};

/*
 * Every field is NULL/0 when the kubeconfig does not set it; all strings and
 * buffers are owned by the struct. The PEM buffers are also NUL-terminated
 * (not counted in *_len), so they can be handed to OpenSSL either way.
 */
struct kcfg {
    char *server;                  /* "https://10.0.0.1:6443": http(s) scheme, no trailing slash */
    char *tls_server_name;         /* overrides the SNI and verification name */
    bool insecure_skip_tls_verify; /* never set together with ca_pem */
    unsigned char *ca_pem;         /* certificate-authority(-data) contents */
    size_t ca_pem_len;
    unsigned char *cert_pem; /* client-certificate(-data); set iff key_pem is */
    size_t cert_pem_len;
    unsigned char *key_pem; /* client-key(-data) */
    size_t key_pem_len;
    char *token;      /* bearer token */
    char *token_file; /* absolute path, readable at load time; re-read it per
                         request or periodically (bound tokens rotate). When set
                         it takes precedence over token, as in client-go. */
    char *username;   /* basic auth; never set together with a token */
    char *password;
    char *context; /* names resolved, for logs (user is NULL for an anonymous context) */
    char *cluster;
    char *user;
    char *namespace;        /* the context's namespace, if any */
    struct kcfg_exec *exec; /* the user's exec plugin: then no other credential
                               is set (token, tokenFile, basic, client cert) */
};

/*
 * Parse kubeconfig YAML text (len bytes, need not be NUL-terminated).
 *   base_dir: directory that relative certificate/key/token file paths are
 *             resolved against — the kubeconfig's own directory (NULL = ".").
 *   context:  context to use; NULL means the file's current-context.
 * Referenced files are read now (regular files only, at most KCFG_MAX_FILE
 * bytes each); tokenFile is only checked for readability.
 * Returns 0 and *out (new, kcfg_free it), or:
 *   KWC_ECONFIG       invalid YAML or kubeconfig (missing/duplicate names, ...)
 *   KWC_EUNSUPPORTED  the selected user needs an auth-provider plugin or an
 *                     exec plugin with interactiveMode Always, or the cluster
 *                     needs proxy-url
 *   KWC_ETOOBIG       input or a referenced file over its bound
 *   -errno            a referenced file could not be read
 * and on error writes a one-line message for a person into err (errlen bytes,
 * always NUL-terminated; err may be NULL): what is wrong and how to fix it.
 */
int kcfg_parse(const char *yaml, size_t len, const char *base_dir, const char *context,
               struct kcfg **out, char *err, size_t errlen);

/*
 * kcfg_parse() on the file at path (any readable file, pipes included, at
 * most KCFG_MAX_FILE bytes), with base_dir = the file's directory.
 * Returns as kcfg_parse(); -errno if path itself cannot be read.
 */
int kcfg_load_file(const char *path, const char *context, struct kcfg **out, char *err,
                   size_t errlen);

/*
 * In-cluster settings, as client-go's InClusterConfig:
 *   server     https://host:port (an IPv6 host is bracketed); host and port are
 *              $KUBERNETES_SERVICE_HOST / $KUBERNETES_SERVICE_PORT, passed in by
 *              the caller (NULL or empty: not in a cluster, KWC_ECONFIG)
 *   ca_pem     sa_dir/ca.crt if it exists (otherwise the system roots apply)
 *   token_file sa_dir/token, which must be readable
 *   namespace  sa_dir/namespace if it exists, whitespace trimmed
 *   names      context and cluster "in-cluster", user "serviceaccount"
 * sa_dir NULL means KCFG_SA_DIR. Returns as kcfg_parse().
 */
int kcfg_in_cluster(const char *sa_dir, const char *host, const char *port, struct kcfg **out,
                    char *err, size_t errlen);

/* Free k and wipe its secrets (token, password, private key). Accepts NULL. */
void kcfg_free(struct kcfg *k);

/* The bearer token to send now: tokenFile read afresh (trailing whitespace
 * cut, at most 64 KiB), else token. Returns a new string, or NULL when there
 * is none or the file cannot be read (then *err_no says why, else 0). */
char *kcfg_bearer_token(const struct kcfg *k, int *err_no);

/* Split server into host (IPv6 brackets removed) and port (the scheme's
 * default when absent); *tls for https. Truncates to the buffers. */
void kcfg_server_hostport(const char *server, bool *tls, char *host, size_t hl, char *port,
                          size_t pl);

#endif
