/*
 * config.h — kwc's settings: flags, an optional YAML config file with the same
 * keys, and their validation. Parsed once at start into one immutable struct
 * that is passed down; nothing reads a tunable from a global.
 */
#ifndef KWC_CONFIG_H
#define KWC_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "kwc/http.h"
#include "kwc/kinds.h"
#include "kwc/log.h"

/*
 * The option table: X(flag, field, type, group, default, help), the flags
 * as kube's components spell them (pflag); keys of --config files are the
 * flag names without the dashes. Types (as --help names them):
 *   STR   a string ("string");
 *   STRS  a comma-separated list, kept as written ("strings");
 *   INT   a non-negative integer ("int");
 *   BOOL  true or false, as Go's strconv.ParseBool; bare: true;
 *   DUR   a Go duration such as 30s, 5m or 1h30m, kept in milliseconds
 *         ("duration"), at most 24h;
 *   SECS  a DUR that took whole seconds before: a bare integer is still
 *         seconds, with a deprecation note; not capped at 24h, so every
 *         SECS row has its range checked in cfg_parse;
 *   QTY   a byte count as a Kubernetes quantity such as 512Mi or 4096, kept
 *         in bytes ("quantity").
 * Groups: the --help sections, in kube's order (cfg_usage).
 * Old names that still work are CFG_ALIASES (config.c).
 */
#define CFG_OPTIONS(X)                                                                             \
    X("upstream", upstream, STR, UPSTREAM, NULL,                                                   \
      "API server to front, e.g. http://127.0.0.1:8080 (or use --kubeconfig)")                     \
    X("kubeconfig", kubeconfig, STR, UPSTREAM, NULL,                                               \
      "kubeconfig with the upstream server and credentials")                                       \
    X("context", context, STR, UPSTREAM, NULL, "kubeconfig context (default: current-context)")    \
    X("listen", listen, STR, SERVING, "127.0.0.1:8001",                                            \
      "address to serve on: IP:PORT, [IPV6]:PORT, :PORT (every address) or NAME:PORT (each "       \
      "address the name resolves to); port 0 picks one")                                           \
    X("serving-threads", serving_threads, INT, SERVING, "0",                                       \
      "event loops serving client connections, each one's TLS, HTTP/2, requests and watch "        \
      "streams (0: one per CPU); the main loop accepts and runs the caches")                       \
    X("data-dir", data_dir, STR, CACHE, NULL,                                                      \
      "directory for the LMDB cache (created with its parents if missing)")                        \
    X("resources", resources, STRS, CACHE, "auto",                                                 \
      "auto: cache every resource the upstream's discovery lists as listable and watchable "       \
      "(built-in and custom, aggregated APIs excepted), each started by its first list or watch; " \
      "or a comma-separated group/version/resource list (v1/pods,apps/v1/deployments) of the "     \
      "only caches, started with kwc and waited for by /readyz")                                   \
    X("resources-exclude", resources_exclude, STRS, CACHE, KINDS_EXCLUDE_DEFAULT,                  \
      "auto: resources never cached (their requests pass through), as group/version/resource "     \
      "with * for any part (*/leases, v1/secrets, example.com/*/*); empty: none")                  \
    X("max-caches", max_caches, INT, CACHE, "256",                                                 \
      "auto: caches requests may have running at once (a resource in JSON and in protobuf is "     \
      "two; those kwc starts itself do not count); past it a resource's requests pass through "    \
      "until an idle cache stops")                                                                 \
    X("cache-start-timeout", cache_start_timeout, DUR, CACHE, "10s",                               \
      "auto: how long a request that starts a cache (or finds it starting) waits for its first "   \
      "sync before it passes through to the upstream (0: never waits)")                            \
    X("cache-idle-timeout", cache_idle_timeout, DUR, CACHE, "10m",                                 \
      "auto: a cache no request has read and nobody watches for this long stops its upstream "     \
      "watch (and its upstream connection); its data stays on disk (see --cache-disk-budget) and " \
      "it resumes from its resourceVersion at the next request (0: never stops)")                  \
    X("cache-disk-budget", cache_disk_budget, QTY, CACHE, "2Gi",                                   \
      "auto: on-disk bytes the data of stopped caches may keep; past it the least recently used "  \
      "stopped cache's data is dropped (it lists again when used)")                                \
    X("protobuf-resources", protobuf_resources, STRS, CACHE, NULL,                                 \
      "built-in resources whose protobuf cache (for clients that ask for "                         \
      "application/vnd.kubernetes.protobuf) starts with kwc, by name (pods) or as in "             \
      "--resources; the other built-in ones start at their first protobuf request; none: all "     \
      "wait (default: pods, nodes, services, endpoints, endpointslices, configmaps, secrets, "     \
      "namespaces, persistentvolumes, persistentvolumeclaims, csidrivers, csinodes, "              \
      "runtimeclasses, networkpolicies)")                                                          \
    X("config", config_file, STR, OPS, NULL, "YAML file of these options (flags win)")             \
    X("log-level", log_level_s, STR, OPS, "info", "debug, info, warn or error")                    \
    X("logging-format", log_format_s, STR, OPS, "text",                                            \
      "text (one line per event) or json (one JSON object per line: time, level, msg, fields)")    \
    X("access-log", access_log, BOOL, OPS, "false",                                                \
      "log one line per request (method, path, protocol, user, code, bytes, duration, source) at " \
      "info; --log-level debug logs them too")                                                     \
    X("port-file", port_file, STR, OPS, NULL, "write the bound port here once listening")          \
    X("upstream-connect-timeout", upstream_connect_timeout_ms, SECS, UPSTREAM, "5s",               \
      "time allowed to connect to the upstream")                                                   \
    X("upstream-timeout", upstream_timeout_ms, SECS, UPSTREAM, "60s",                              \
      "time allowed for the upstream's response headers (0: none)")                                \
    X("insecure-allow-remote", insecure_allow_remote, BOOL, SERVING, "false",                      \
      "serve on a non-loopback address without TLS and delegated authentication (unsafe: with "    \
      "--auth none every caller acts as kwc)")                                                     \
    X("max-header-bytes", max_header_bytes, QTY, SERVING, "1Mi",                                   \
      "largest request head (request line + headers) accepted; at least 4Ki")                      \
    X("request-header-timeout", request_header_timeout_ms, SECS, SERVING, "32s",                   \
      "time allowed from connect to the end of a request head, TLS handshake included (0: none)")  \
    X("idle-timeout", idle_timeout_ms, SECS, SERVING, "90s",                                       \
      "how long a keep-alive connection may wait for its next request (0: none)")                  \
    X("max-connections", max_connections, INT, SERVING, "0",                                       \
      "open client connections at most, watch streams and tunnels included (0: what the "          \
      "open-file limit leaves after the upstream connections and a reserve; see the descriptor "   \
      "budget in docs/operations.md)")                                                             \
    X("max-connections-per-source", max_connections_per_source, INT, SERVING, NULL,                \
      "open client connections from one IP address (an IPv4-mapped IPv6 address counts as its "    \
      "IPv4 one); past it, that address's new connections are refused like those past "            \
      "--max-connections, so one address cannot take every connection (0: no limit; default: a "   \
      "quarter of --max-connections)")                                                             \
    X("http2-max-streams-per-connection", http2_max_streams, INT, SERVING, "100",                  \
      "HTTP/2: concurrent streams a client may open on one connection (kube's flag); more are "    \
      "refused")                                                                                   \
    X("shutdown-drain-grace-period", shutdown_drain_ms, SECS, SERVING, "10s",                      \
      "on SIGTERM/SIGINT kwc stops accepting, ends its watch streams and gives the requests in "   \
      "progress (lists, gets, passthroughs) this long to finish before it closes them; a second "  \
      "signal closes at once (0: close at once)")                                                  \
    X("shutdown-delay-duration", shutdown_delay, DUR, SERVING, "10s",                              \
      "on SIGTERM /readyz fails at once while everything else, new connections and watches "       \
      "included, is served as before for this long, so that load balancers and a Service's "       \
      "endpoints stop sending new connections before the drain (--shutdown-drain-grace-period) "   \
      "begins; kube-apiserver's flag (SIGINT and a second signal skip it; 0: none)")               \
    X("max-upstream-connections", max_upstream_connections, INT, UPSTREAM, "256",                  \
      "connections to the upstream for the requests kwc passes through (long ones such as "        \
      "watches and logs included); more wait for one. kwc's own lists and watches and its "        \
      "reviews have connections of their own")                                                     \
    X("max-review-connections", max_review_connections, INT, AUTHN, "32",                          \
      "--auth delegated: connections to the upstream for TokenReviews, and as many for "           \
      "SubjectAccessReviews; more reviews wait for one")                                           \
    X("max-reviews-per-source", max_reviews_per_source, INT, AUTHN, NULL,                          \
      "--auth delegated: TokenReviews that requests from one IP address may have in flight or "    \
      "waiting for a connection (and as many SubjectAccessReviews of callers not "                 \
      "authenticated); past it, or past twice as many TokenReviews rejected in the last second, "  \
      "that address's requests that need another are answered 429 at once instead of queuing "     \
      "before other callers' (0: no limit; default: half of --max-review-connections)")            \
    X("review-timeout", review_timeout_ms, SECS, AUTHN, "10s",                                     \
      "--auth delegated: time a TokenReview or SubjectAccessReview may take from when it is "      \
      "asked, waiting for a review connection included; past it the caller gets what a failed "    \
      "review gives (401, or 500 for authorization) and nothing is cached (0: only "               \
      "--upstream-timeout)")                                                                       \
    X("max-passthrough-buffer", max_passthrough_buffer, QTY, SERVING, "128Mi",                     \
      "passthrough response bytes queued to all clients together; past it, reading from the "      \
      "upstream pauses for the passthroughs that hold the most")                                   \
    X("max-held-body-buffer", max_held_body_buffer, QTY, SERVING, "64Mi",                          \
      "HTTP/2 request-body bytes held for all clients together while their requests wait for "     \
      "authentication (each connection holds at most its 1 MiB window); past it such a stream is " \
      "refused (RST_STREAM REFUSED_STREAM)")                                                       \
    X("accept-hosts", accept_hosts, STR, SERVING, NULL,                                            \
      "without TLS, requests must name a loopback Host (localhost, 127.0.0.0/8, ::1) unless "      \
      "this POSIX extended regex matches the Host without its port (unanchored: use ^...$)")       \
    X("tls-cert-file", tls_cert_file, STR, SERVING, NULL,                                          \
      "serve HTTPS with this PEM certificate (chain); needs --tls-private-key-file")               \
    X("tls-private-key-file", tls_private_key_file, STR, SERVING, NULL,                            \
      "PEM private key for --tls-cert-file")                                                       \
    X("tls-min-version", tls_min_version_s, STR, SERVING, "VersionTLS12",                          \
      "oldest TLS version accepted: VersionTLS12 or VersionTLS13 (or 1.2, 1.3)")                   \
    X("tls-kernel", tls_kernel_s, STR, SERVING, "auto",                                            \
      "kernel TLS: auto lets the kernel make the TLS records (kTLS) when it has the tls TCP ULP "  \
      "(probed at start; the log says which path serves), off leaves every record to OpenSSL")     \
    X("client-ca-file", client_ca_file, STR, AUTHN, NULL,                                          \
      "verify client certificates presented against these PEM CAs (needs TLS)")                    \
    X("max-response-buffer", max_response_buffer, QTY, SERVING, "1Mi",                             \
      "bytes buffered per client before reading from the upstream pauses")                         \
    X("max-request-buffer", max_request_buffer, QTY, SERVING, "1Mi",                               \
      "request-body bytes buffered before reading from the client pauses")                         \
    X("cache-map-size", cache_map_size, QTY, CACHE, "64Gi",                                        \
      "address space reserved for the LMDB cache; the largest it can grow")                        \
    X("too-large-rv", too_large_rv, STR, CACHE, "pass",                                            \
      "a list/get rv the cache has not reached after the wait: pass it upstream or answer 504")    \
    X("rv-wait-timeout", rv_wait_ms, DUR, CACHE, "3s",                                             \
      "how long a list/get waits for the cache to reach its resourceVersion (at most 1m)")         \
    X("max-list-buffer", max_list_buffer, QTY, CACHE, "256Ki",                                     \
      "bytes of a cached list queued per client before kwc waits for it to read")                  \
    X("watch-budget", watch_budget, QTY, WATCH, "256Ki",                                           \
      "bytes queued per watcher before it stops getting live events and catches up from disk")     \
    X("watch-window", watch_window, QTY, WATCH, "64Mi",                                            \
      "recent events kept in memory per watched resource; lagging watchers inside it catch up "    \
      "without reading LMDB")                                                                      \
    X("watch-coalesce-max-delay", watch_coalesce_max_ms, DUR, WATCH, "25ms",                       \
      "the longest a watch event waits, when a watch worker is busy, so that one write carries "   \
      "several events to a watcher (0: never: every event is written at once; at most 1s)")        \
    X("bookmark-interval", bookmark_interval_ms, SECS, WATCH, "60s",                               \
      "how often watchers that allow bookmarks get one (1s to 1h)")                                \
    X("discovery-interval", discovery_interval, DUR, UPSTREAM, "30s",                              \
      "how often kwc reads the upstream's discovery again (a 304 when nothing changed)")           \
    X("serve-discovery", serve_discovery, BOOL, CACHE, "true",                                     \
      "answer discovery requests (/api, /apis and below, /version) from kwc's copy of the "        \
      "upstream's answers (--serve-discovery=false passes them through)")                          \
    X("history-max-events", history_max_events, INT, CACHE, "2000000",                             \
      "events kept per resource for watch resumes and exact reads (oldest dropped first)")         \
    X("history-max-bytes", history_max_bytes, QTY, CACHE, "4Gi",                                   \
      "bytes of history kept per resource")                                                        \
    X("history-max-age", history_max_age_ms, SECS, CACHE, "1h",                                    \
      "age of the oldest history event kept (whole seconds: a fraction counts as one more)")       \
    X("on-corrupt-cache", on_corrupt_cache, STR, CACHE, "rebuild",                                 \
      "a damaged --data-dir at start: rebuild (wipe it), move-aside (keep it as "                  \
      "data.mdb.corrupt-TIME) or fail (exit 2); the first two list again from the upstream")       \
    X("auth", auth_mode, STR, AUTHN, NULL,                                                         \
      "delegated: callers are authenticated (client certificate, TokenReview) and authorized "     \
      "(SubjectAccessReview) by the upstream; none: every caller acts as kwc, like kubectl "       \
      "proxy (loopback only). Default: delegated with TLS, else none")                             \
    X("anonymous-auth", anonymous_auth, BOOL, AUTHN, "false",                                      \
      "delegated: a request without credentials is system:anonymous instead of a 401")             \
    X("authentication-token-webhook-cache-ttl", token_cache_ttl_ms, SECS, AUTHN, "2m",             \
      "how long a TokenReview answer is cached (0: not cached; at most 24h)")                      \
    X("authorization-webhook-cache-authorized-ttl", authz_allow_ttl_ms, SECS, AUTHZ, "5m",         \
      "how long a SubjectAccessReview allow is cached (0: not cached; at most 24h)")               \
    X("authorization-webhook-cache-unauthorized-ttl", authz_deny_ttl_ms, SECS, AUTHZ, "30s",       \
      "how long a SubjectAccessReview deny is cached (0: not cached; at most 24h)")                \
    X("passthrough-identity", passthrough_identity, STR, UPSTREAM, "impersonate",                  \
      "delegated: who requests kwc passes upstream act as: impersonate (kwc's credentials with "   \
      "Impersonate-* of the caller) or forward-token (a bearer caller's own token; certificate "   \
      "callers are impersonated)")                                                                 \
    X("max-staleness", max_staleness_ms, SECS, CACHE, "0",                                         \
      "a cache whose upstream watch sent no event or bookmark for this long leaves service "       \
      "(its requests pass through) until one arrives (0: never; at most 24h)")                     \
    X("takeover", takeover, BOOL, OPS, "false",                                                    \
      "take over from the kwc running on --data-dir (a binary upgrade): it hands over its "        \
      "listening sockets and the data dir and drains; no connection is refused, watches resume "   \
      "without a relist. Give the same flags (--listen included)")                                 \
    X("exec-plugin-timeout", exec_plugin_timeout, DUR, UPSTREAM, "30s",                            \
      "the longest one run of the kubeconfig's exec credential plugin may take; past it the "      \
      "plugin (its process group) is killed and run again after a backoff (100ms to 10m)")         \
    X("log-summary-interval", log_summary_interval, DUR, OPS, "10s",                               \
      "a warning that repeats while its cause lasts (an upstream away: every cache's retry, "      \
      "every passthrough's failure) is written at its first occurrence, then once per interval "   \
      "as one line with counts, and as recovered after an interval without it (0: every "          \
      "occurrence is written; at most 1h)")

/*
 * Old flag names that still work: X(old, new, bare), old hidden from --help
 * as pflag hides a deprecated flag, each use noted (cfg_parse's notes).
 * bare: milliseconds a bare integer under the old name stands for (the
 * unit the old name took), 0 when the value is passed as it is.
 */
#define CFG_ALIASES(X)                                                                             \
    X("log-format", "logging-format", 0)                                                           \
    X("rv-wait-ms", "rv-wait-timeout", 1)                                                          \
    X("watch-coalesce-max-ms", "watch-coalesce-max-delay", 1)                                      \
    X("shutdown-drain-seconds", "shutdown-drain-grace-period", 1000)                               \
    X("watch-workers", "serving-threads", 0)

struct cfg_regex; /* opaque: see cfg_accept_hosts_match */

struct kwc_config {
#define CFG_FIELD_STR(field) char *field;
#define CFG_FIELD_STRS(field) char *field;
#define CFG_FIELD_INT(field) long field;
#define CFG_FIELD_BOOL(field) bool field;
#define CFG_FIELD_DUR(field) long field;  /* ms */
#define CFG_FIELD_SECS(field) long field; /* ms */
#define CFG_FIELD_QTY(field) long field;  /* bytes */
#define CFG_FIELD(flag, field, type, group, def, help) CFG_FIELD_##type(field)
    CFG_OPTIONS(CFG_FIELD)
#undef CFG_FIELD
#undef CFG_FIELD_STR
#undef CFG_FIELD_STRS
#undef CFG_FIELD_INT
#undef CFG_FIELD_BOOL
#undef CFG_FIELD_DUR
#undef CFG_FIELD_SECS
#undef CFG_FIELD_QTY
    enum log_level log_level;
    enum log_format log_format;
    /* Deprecation notes (an old flag name, a bare number of seconds), each
     * saying what to write instead, one line apiece and each once: main
     * logs them at start, when logging is set up. */
    char **notes;
    size_t n_notes;
    /*
     * Resolved from listen, in the order to bind: one address for an IP
     * literal, 0.0.0.0 then [::] for ":PORT" (bind [::] with IPV6_V6ONLY),
     * every distinct address getaddrinfo gives for a name. n_listen >= 1
     * after a successful parse; every entry carries the port.
     */
    struct http_listen_addr *listen_addrs;
    size_t n_listen;
    /* The host part of listen without brackets ("0.0.0.0" for ":PORT"; a
     * name as written) and the port. Only the config's tests read them: the
     * server binds listen_addrs. */
    char *listen_host;
    int listen_port;
    bool listen_loopback; /* every listen address is in 127.0.0.0/8 or is ::1 */
    /* max_connections, with 0 resolved by cfg_fd_budget (0 until then). */
    unsigned max_connections_resolved;
    /* max_connections_per_source and max_reviews_per_source are -1 when
     * not given: see cfg_per_source_connections and cfg_per_source_reviews. */
    /* Connections of kwc's own upstream pool: one per cache (each has at
     * most one request in flight), a built-in resource counting twice
     * (JSON and protobuf). */
    unsigned cache_conns;
    /* --resources auto: caches start on demand (catalog.h) */
    bool auto_resources;
    /* tls_min_version_s as OpenSSL's TLS1_2_VERSION or TLS1_3_VERSION. */
    int tls_min_version;
    /* tls_kernel_s resolved */
    enum http_tls_kernel tls_kernel;
    /* --auth resolved: delegated authentication and authorization */
    bool auth_delegated;
    bool forward_token; /* --passthrough-identity=forward-token */
    /* accept_hosts compiled at parse time; NULL when not given (or given
     * empty). Owned by the config; match with cfg_accept_hosts_match. */
    struct cfg_regex *accept_hosts_re;
};

#define CFG_SHOW_HELP 1    /* cfg_parse: --help was asked for (printed) */
#define CFG_SHOW_VERSION 2 /* cfg_parse: --version was asked for (printed) */

/*
 * Parse argv (and the --config file it names). Returns 0, CFG_SHOW_HELP,
 * CFG_SHOW_VERSION, or KWC_ECONFIG with a one-line message for a person in err
 * (what is wrong and how to fix it). Empty --accept-hosts, --tls-cert-file,
 * --tls-private-key-file and --client-ca-file are as if not given (NULL).
 * May block: a --listen name is resolved (getaddrinfo), TLS files are checked
 * with access(R_OK) but not opened. Call cfg_fini on every return.
 */
int cfg_parse(int argc, char **argv, struct kwc_config *out, char *err, size_t errlen);
void cfg_fini(struct kwc_config *c);

/*
 * The open-file budget (the README's "The descriptor budget"). kwc may hold at once:
 *   client connections: --max-connections (watch streams, and tunnels
 *     twice: their upstream socket counts as a taken connection);
 *   upstream connections: the pools' caps (--max-upstream-connections,
 *     cache_conns, DISCO_MAX_CONNS, 2 x --max-review-connections with --auth
 *     delegated),
 *     x3 when the upstream is a host name (curl's threaded resolver holds a
 *     socketpair while it resolves for a new connection), + 2 per pool
 *     (each curl multi handle's wakeup socketpair);
 *   a reserve: CFG_FD_FIXED (stdio, LMDB's data and lock files, the data
 *     dir's lock, the main loop's epoll and signal fds, evdns's socket,
 *     files kwc opens briefly: /proc for /metrics, the TLS files, the port
 *     file), the listeners, CFG_FD_PER_LOOP per event loop (the main one
 *     and the serving loops: epoll, the mailbox's and the watch worker's
 *     eventfds, the upstream identity's mailbox, a tunnel's resolver
 *     socket, hand-over fds) and
 *     HTTP_LINGER_MAX refused connections being drained.
 * limit: the RLIMIT_NOFILE soft limit (raise it to the hard limit first);
 * ncpu: what --serving-threads 0 resolves to. Returns 0 with out filled
 * (out->connections: --max-connections, or what the limit leaves when it is
 * 0), or KWC_ECONFIG with a message that says what to change: an explicit
 * --max-connections that does not fit, or a limit leaving fewer than
 * CFG_MIN_AUTO_CONNS. Pure (no syscalls).
 */
#define CFG_FD_FIXED 32
#define CFG_FD_PER_LOOP 8
#define CFG_MIN_AUTO_CONNS 64
struct cfg_fd_budget {
    unsigned long limit, reserve, upstream, connections;
};
int cfg_fd_budget(const struct kwc_config *c, unsigned long limit, unsigned ncpu,
                  bool upstream_name, struct cfg_fd_budget *out, char *err, size_t errlen);

/*
 * Whether --accept-hosts matches host (the Host header without its port,
 * NUL-terminated); false when --accept-hosts was not given. The compiled
 * regex stays opaque behind this call (config owns it, no <regex.h> in this
 * header). Thread-safe (glibc's regexec on a shared compiled regex).
 */
bool cfg_accept_hosts_match(const struct kwc_config *c, const char *host);

/*
 * The per-source limits as resolved (0: no limit). Connections: the flag, or
 * a quarter of max_connections_resolved (at least 1; 0 while that is 0).
 * Reviews: the flag, or half of --max-review-connections (at least 1), so
 * one address leaves at least half of each review pool to the others.
 * Pure.
 */
unsigned cfg_per_source_connections(const struct kwc_config *c);
unsigned cfg_per_source_reviews(const struct kwc_config *c);
/*
 * --help as kube's components print it (pflag's FlagUsagesWrapped in
 * component-base's PrintSections): a section per group with kube's header
 * ("Serving flags:"), then "      --flag type   description (default X)"
 * aligned per section and wrapped at CFG_HELP_COLS; aliases hidden.
 */
#define CFG_HELP_COLS 100
void cfg_usage(FILE *f);

#endif
