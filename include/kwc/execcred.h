/*
 * execcred.h — kwc's upstream credential from a kubeconfig's exec plugin
 * (client.authentication.k8s.io/v1 and v1beta1 ExecCredential), as
 * client-go's exec authenticator gets it: the plugin runs as a child process
 * with the kubeconfig's args and env added to kwc's environment,
 * KUBERNETES_EXEC_INFO holding the request, stdin /dev/null; its stdout is
 * the ExecCredential (token, or client certificate and key, and an optional
 * expirationTimestamp); its stderr goes to kwc's log line by line.
 *
 * Unlike client-go, which runs the plugin inside the request that needs it
 * and blocks that request, the plugin runs in the background on kwc's loop:
 * its pipes are read by libevent, each run bounded in time (kcfg_exec's
 * timeout_ms: the child's process group is killed) and in output
 * (EXEC_MAX_STDOUT), the child reaped. The credential is cached until its
 * expirationTimestamp and refreshed before it (excred_refresh_at); a 401 to
 * a request made with the current credential runs the plugin again, once
 * per credential and at most once a second (client-go's maybeRefreshCreds).
 * A failed run is logged once, with what to fix, and retried with backoff.
 *
 * Loop thread only. No callback from inside a call of this API: runs start
 * and waiters are told from the loop's own events.
 */
#ifndef KWC_EXECCRED_H
#define KWC_EXECCRED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

struct event_base;
struct kcfg_exec;
struct x509_st;
struct evp_pkey_st;
struct excred;

#define EXEC_MAX_STDOUT (1u << 20) /* past it the plugin is killed */
#define EXEC_MAX_LINE 1024         /* bytes of one stderr line logged */
#define EXEC_MAX_LINES 50          /* stderr lines logged per run */
#define EXEC_BACKOFF_MIN_MS 1000   /* retry after a failed run ... */
#define EXEC_BACKOFF_MAX_MS 30000  /* ... doubling up to this */
#define EXEC_MIN_401_MS 1000       /* a 401-driven run at most this often */

/* One credential, immutable once made. */
struct excred_cred {
    uint64_t gen;            /* 1, 2, ...: which successful run made it */
    char *bearer_line;       /* "Authorization: Bearer ..." or NULL */
    unsigned char *cert_pem; /* clientCertificateData, NUL-terminated, or NULL */
    size_t cert_pem_len;     /* ... */
    unsigned char *key_pem;  /* clientKeyData; set iff cert_pem is */
    size_t key_pem_len;      /* ... */
    struct x509_st *cert;    /* both parsed (and known to match) */
    struct evp_pkey_st *key; /* ... */
    double expiry;           /* expirationTimestamp, Unix seconds; 0: none */
    bool unauthorized;       /* a 401 came back to it: the plugin ran again */
};

/*
 * Parse a plugin's stdout (len bytes) as client-go does: a JSON object with
 * apiVersion == api_version and kind ExecCredential, status.token and/or
 * status.clientCertificateData + clientKeyData (PEM, a matching pair), an
 * optional RFC 3339 status.expirationTimestamp. Returns 0 and *out (new, gen
 * 0), or KWC_EPARSE with a one-line message for a person in err.
 */
int excred_parse(const char *out, size_t len, const char *api_version, struct excred_cred **cred,
                 char *err, size_t errlen);
void excred_cred_free(struct excred_cred *c);

/* When to run the plugin again for a credential received at now (Unix
 * seconds) that expires at expiry: once a fifth of its lifetime or five
 * minutes (whichever is less) remain. 0 when it never expires. */
double excred_refresh_at(double now, double expiry);

/* Waiting for a credential: on_ready(arg) once one is current (excred_current
 * non-NULL), from the loop; the waiter is then off the list. Embedded in
 * the waiting object; free it only after excred_unwait (or on_ready). */
struct excred_waiter {
    void (*on_ready)(void *arg);
    void *arg;
    TAILQ_ENTRY(excred_waiter) link;
    bool queued;
};

/* The plugin's state on base; e is borrowed and must outlive it. The first
 * run starts from the loop. */
struct excred *excred_new(struct event_base *base, const struct kcfg_exec *e);
/* Kills a running plugin (its process group) and reaps it. Accepts NULL. */
void excred_free(struct excred *x);

/* The credential to send now (valid until the next loop turn), or NULL: none
 * yet, the last one expired, or a 401 made it suspect and a new run is due. */
const struct excred_cred *excred_current(struct excred *x);

void excred_wait(struct excred *x, struct excred_waiter *w);
void excred_unwait(struct excred *x, struct excred_waiter *w);

/* The upstream answered 401 to a request made with credential gen: if that
 * is still the current one and has not had its 401 yet, requests wait and the
 * plugin runs again (not before EXEC_MIN_401_MS after the last run began). */
void excred_unauthorized(struct excred *x, uint64_t gen);

/* Why there is no credential, for messages: the last failure, or "waiting
 * for the exec plugin". Valid until the next loop turn. */
const char *excred_why(const struct excred *x);

/* Counters for tests and /metrics: runs started, runs failed. */
void excred_counts(const struct excred *x, uint64_t *runs, uint64_t *failures);

#endif
