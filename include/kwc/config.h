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

#include "kwc/log.h"

/*
 * The option table: X(flag, field, type, default, metavar, help).
 * Types: STR, INT (a non-negative integer), BOOL, LEVEL (a log level).
 * Keys of --config files are the flag names without the dashes.
 */
#define CFG_OPTIONS(X)                                                                             \
    X("upstream", upstream, STR, NULL, "URL",                                                      \
      "API server to front, e.g. http://127.0.0.1:8080 (or use --kubeconfig)")                     \
    X("kubeconfig", kubeconfig, STR, NULL, "FILE",                                                 \
      "kubeconfig with the upstream server and credentials")                                       \
    X("context", context, STR, NULL, "NAME", "kubeconfig context (default: current-context)")     \
    X("listen", listen, STR, "127.0.0.1:8001", "ADDR:PORT", "address to serve on (port 0: pick)") \
    X("data-dir", data_dir, STR, NULL, "DIR", "directory for the LMDB cache (created if missing)") \
    X("resources", resources, STR, NULL, "LIST",                                                   \
      "comma-separated group/version/resource to cache (default: common kinds)")                   \
    X("config", config_file, STR, NULL, "FILE", "YAML file of these options (flags win)")         \
    X("log-level", log_level_s, STR, "info", "LEVEL", "debug, info, warn or error")               \
    X("port-file", port_file, STR, NULL, "FILE", "write the bound port here once listening")      \
    X("upstream-connect-timeout", upstream_connect_timeout, INT, "5", "SECONDS",                   \
      "time allowed to connect to the upstream")                                                   \
    X("upstream-timeout", upstream_timeout, INT, "60", "SECONDS",                                  \
      "time allowed for the upstream's response headers (0: none)")                               \
    X("insecure-allow-remote", insecure_allow_remote, BOOL, "false", "",                           \
      "serve without authentication on a non-loopback address (unsafe)")                          \
    X("max-response-buffer", max_response_buffer, INT, "1048576", "BYTES",                         \
      "bytes buffered per client before reading from the upstream pauses")                        \
    X("max-request-buffer", max_request_buffer, INT, "1048576", "BYTES",                           \
      "request-body bytes buffered before reading from the client pauses")                        \
    X("cache-map-size", cache_map_size, INT, "68719476736", "BYTES",                               \
      "address space reserved for the LMDB cache; the largest it can grow")                       \
    X("too-large-rv", too_large_rv, STR, "pass", "pass|504",                                       \
      "a list/get rv the cache has not reached after the wait: pass it upstream or answer 504")   \
    X("rv-wait-ms", rv_wait_ms, INT, "3000", "MS",                                                 \
      "how long a list/get waits for the cache to reach its resourceVersion")                     \
    X("max-list-buffer", max_list_buffer, INT, "262144", "BYTES",                                  \
      "bytes of a cached list queued per client before kwc waits for it to read")                 \
    X("watch-workers", watch_workers, INT, "0", "N",                                               \
      "threads serving watch streams (0: one per CPU)")                                           \
    X("watch-budget", watch_budget, INT, "262144", "BYTES",                                        \
      "bytes queued per watcher before it stops getting live events and catches up from disk")    \
    X("watch-window", watch_window, INT, "67108864", "BYTES",                                      \
      "recent events kept in memory per watched resource; lagging watchers inside it catch up "   \
      "without reading LMDB")                                                                     \
    X("bookmark-interval", bookmark_interval, INT, "60", "SECONDS",                                \
      "how often watchers that allow bookmarks get one")                                          \
    X("history-max-events", history_max_events, INT, "2000000", "N",                               \
      "events kept per resource for watch resumes and exact reads (oldest dropped first)")        \
    X("history-max-bytes", history_max_bytes, INT, "4294967296", "BYTES",                          \
      "bytes of history kept per resource")                                                        \
    X("history-max-age", history_max_age, INT, "3600", "SECONDS",                                  \
      "age of the oldest history event kept")

struct kwc_config {
#define CFG_FIELD_STR(flag, field, type, def, meta, help) char *field;
#define CFG_FIELD_INT(flag, field, type, def, meta, help) long field;
#define CFG_FIELD_BOOL(flag, field, type, def, meta, help) bool field;
#define CFG_FIELD(flag, field, type, def, meta, help) CFG_FIELD_##type(flag, field, type, def, meta, help)
    CFG_OPTIONS(CFG_FIELD)
#undef CFG_FIELD
#undef CFG_FIELD_STR
#undef CFG_FIELD_INT
#undef CFG_FIELD_BOOL
    enum log_level log_level;
    /* resolved from listen */
    char *listen_host;
    int listen_port;
    bool listen_loopback;
};

#define CFG_SHOW_HELP 1    /* cfg_parse: --help was asked for (printed) */
#define CFG_SHOW_VERSION 2 /* cfg_parse: --version was asked for (printed) */

/*
 * Parse argv (and the --config file it names). Returns 0, CFG_SHOW_HELP,
 * CFG_SHOW_VERSION, or KWC_ECONFIG with a one-line message for a person in err
 * (what is wrong and how to fix it).
 */
int cfg_parse(int argc, char **argv, struct kwc_config *out, char *err, size_t errlen);
void cfg_fini(struct kwc_config *c);
void cfg_usage(FILE *f);

#endif
