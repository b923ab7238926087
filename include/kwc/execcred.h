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
 * Threads: the plugin runs, its state changes and excred_new / excred_free
 * / excred_on_change / excred_current / excred_counts are the owner's loop
 * (base's thread). The credential itself is read from any thread (the
 * serving loops' upstream clients share it through their uplinks):
 * excred_acquire, excred_unauthorized and excred_why are safe anywhere, under
 * a mutex held only to copy a pointer or a few bytes (never across I/O), and a
 * credential lives while anyone holds a reference, so a rotation on the owner's
 * loop never frees one a transfer on another loop is setting up with. No
 * callback from inside a call of this API: runs start and changes are told
 * from the owner's loop's own events.
 */
#ifndef KWC_EXECCRED_H
#define KWC_EXECCRED_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* One credential, immutable once made (but for unauthorized, under the
 * excred's mutex); counted references (excred_acquire). */
struct excred_cred {
    atomic_uint refs;        /* 1 when made; excred_cred_free drops one */
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
/* Drop a reference (any thread); the last one frees (secrets wiped). NULL ok. */
void excred_cred_free(struct excred_cred *c);

/* When to run the plugin again for a credential received at now (Unix
 * seconds) that expires at expiry: once a fifth of its lifetime or five
 * minutes (whichever is less) remain. 0 when it never expires. */
double excred_refresh_at(double now, double expiry);

/* The plugin's state on base; e is borrowed and must outlive it. The first
 * run starts from the loop. */
struct excred *excred_new(struct event_base *base, const struct kcfg_exec *e);
/* Kills a running plugin (its process group) and reaps it. Accepts NULL. */
void excred_free(struct excred *x);

/* The credential to send now, or NULL: none yet, the last one expired, or a
 * 401 made it suspect and a new run is due. The owner's loop: valid until
 * its next turn. */
const struct excred_cred *excred_current(struct excred *x);

/* The same from any thread, with a reference of the caller's (drop it with
 * excred_cred_free once its bytes are copied where they go). */
struct excred_cred *excred_acquire(struct excred *x);

/* Owner's loop: fn(arg) runs on it after every change that may let a
 * request that found no credential go (a new one; a suspect one kept after a
 * failed run). One hook; NULL removes it. */
void excred_on_change(struct excred *x, void (*fn)(void *arg), void *arg);

/* Any thread. The upstream answered 401 to a request made with credential
 * gen: if that is still the current one and has not had its 401 yet, it is
 * suspect at once (excred_acquire gives NULL: requests wait, on every loop)
 * and the plugin runs again on the owner's loop (not before EXEC_MIN_401_MS
 * after the last run began). */
void excred_unauthorized(struct excred *x, uint64_t gen);

/* Any thread: why there is no credential, for messages, into buf: the last
 * failure, or "waiting for the exec plugin". */
void excred_why(struct excred *x, char *buf, size_t len);

/* Counters for tests and /metrics: runs started, runs failed. */
void excred_counts(const struct excred *x, uint64_t *runs, uint64_t *failures);

#endif
