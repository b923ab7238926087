/*
 * front.h — the HTTP front end on kwc's HTTP server (http.h). Every request
 * goes through the same explicit stages once its head is read, before its
 * body is:
 *
 *   parse (route.h) -> Host check -> authenticate -> authorize -> route -> respond
 *
 * Routes: kwc's own endpoints (/healthz, /livez, /readyz, /metrics), upgrade tunnels
 * (exec/attach/port-forward), cached lists and gets (serve.h), and
 * passthrough to the upstream for everything else.
 */
#ifndef KWC_FRONT_H
#define KWC_FRONT_H

#include <stddef.h>

struct event_base;
struct kwc_config;
struct kcfg;
struct up_client;
struct refl;
struct refl_ingest;
struct store;
struct front;

/*
 * Bind and start serving on base. cfg, k, up and the reflectors are borrowed
 * and must outlive the front. /readyz turns 200 once every reflector has
 * synced. Returns 0 or a negative code with a message in err.
 */
int front_new(struct event_base *base, const struct kwc_config *cfg, const struct kcfg *k,
              struct up_client *up, struct store *st, struct refl_ingest *ing,
              struct refl *const *refls, size_t nrefls, struct front **out, char *err,
              size_t errlen);
/* The port actually bound (useful with --listen ADDR:0). */
int front_port(const struct front *f);
void front_free(struct front *f);

#endif
