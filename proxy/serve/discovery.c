/*
 * discovery.c — clients' discovery requests answered from the copy of the
 * upstream's answers (see discovery.h; the copy is disco.c's).
 *
 * Per answer: a reference to the recorded doc (a refresh may replace the
 * record meanwhile; the doc stays until the answer is over), written in
 * pieces of BODY_PIECE through the body writer (pretty, gzip: body.h)
 * while the response queue stays under LIMIT; on_drain goes on.
 */
#include "kwc/discovery.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kwc/access.h"
#include "kwc/base.h"
#include "kwc/body.h"
#include "kwc/disco.h"
#include "kwc/http.h"
#include "kwc/respond.h"
#include "kwc/route.h"

#define DISCOVERY_MAGIC 0x64736376u /* "dscv" */
#define LIMIT ((size_t)256 * 1024)  /* response bytes queued before the answer waits */

struct discovery {
    uint32_t magic;
    struct disco *d;
    uint64_t rng[2]; /* Audit-IDs */
    struct discovery_stats st;
};

/* One answer in progress. */
struct dans {
    struct discovery *s;
    struct hreq *req;
    const struct disco_doc *doc;
    bool raw;    /* /version: its bytes as they are */
    bool pretty; /* asked for (?pretty=, the User-Agent) */
    struct body body;
    size_t off;
    bool ended;
    char audit_id[RESPOND_AUDIT_ID_LEN];
};

struct discovery *
discovery_new(struct disco *d)
{
    struct discovery *s = xcalloc(1, sizeof(*s));
    s->magic = DISCOVERY_MAGIC;
    s->d = d;
    respond_rng_seed(s->rng);
    return s;
}

void
discovery_free(struct discovery *s)
{
    if (!s)
        return;
    s->magic = 0;
    free(s);
}

bool
discovery_path(const char *p)
{
    if (strcmp(p, "/version") == 0)
        return true;
    if (strncmp(p, "/api", 4) != 0)
        return false;
    p += 4;
    if (*p == 's')
        p++;
    /* /api, /apis and up to two more segments below */
    for (int seg = 0; *p; seg++) {
        if (*p != '/' || seg == 2 || p[1] == '/' || p[1] == '\0')
            return false;
        p = strchrnul(p + 1, '/');
    }
    return true;
}

/* The query holds nothing but timeout= (client-go adds it to every
 * request; kube's discovery ignores it) and pretty=. */
static bool
plain_query(const char *target)
{
    const char *q = strchr(target, '?');
    if (!q)
        return true;
    for (const char *p = q + 1; *p;) {
        size_t n = strcspn(p, "&");
        size_t k = strcspn(p, "=&");
        bool known = (k == 7 && strncmp(p, "timeout", 7) == 0) ||
                     (k == 6 && strncmp(p, "pretty", 6) == 0) || n == 0;
        if (!known)
            return false;
        p += n;
        if (*p == '&')
            p++;
    }
    return true;
}

static bool
may_serve(const struct hreq *req, const struct route_req *r)
{
    if (strcmp(hreq_method(req), "GET") != 0 || hreq_has_body(req) || !discovery_path(r->path))
        return false;
    if (!plain_query(hreq_target(req, NULL)))
        return false;
    /* a pretty=1 clause in Accept: the upstream indents; kwc's copy is compact */
    const char *accept = hreq_header(req, "Accept");
    return !accept || !strstr(accept, "pretty");
}

bool
discovery_answerable(struct discovery *s, struct hreq *req, const struct route_req *r)
{
    if (!s || !s->d || !may_serve(req, r))
        return false;
    const struct disco_doc *doc = disco_doc_get(s->d, r->path, hreq_header(req, "Accept"));
    disco_doc_unref(doc);
    return doc != NULL;
}

/* ---- the answer ---- */

static void
pump(struct dans *a)
{
    if (!body_flush(&a->body) || a->ended)
        return;
    while (a->off < a->doc->len) {
        if (hresp_queued(a->req) >= LIMIT)
            return; /* on_drain goes on */
        size_t k = a->doc->len - a->off < BODY_PIECE ? a->doc->len - a->off : BODY_PIECE;
        body_write(&a->body, a->doc->body + a->off, k);
        a->off += k;
        if (body_busy(&a->body))
            return;
    }
    a->ended = true;
    body_end(&a->body);
}

static void
on_complete(void *arg)
{
    struct dans *a = arg;
    struct hreq *req = a->req;
    const struct disco_doc *doc = a->doc;
    hresp_header(req, "Audit-Id", a->audit_id);
    const char *inm = hreq_header(req, "If-None-Match");
    if (doc->etag && inm && strcmp(inm, doc->etag) == 0) {
        /* ServeHTTPWithETag: the headers it set before WriteHeader(304) */
        for (size_t i = 0; i < doc->nheaders; i++)
            if (strcasecmp(doc->headers[i].name, "Content-Type") != 0)
                hresp_header(req, doc->headers[i].name, doc->headers[i].value);
        a->s->st.not_modified++;
        hresp_start(req, 304, 0);
        hresp_end(req);
        return;
    }
    for (size_t i = 0; i < doc->nheaders; i++)
        hresp_header(req, doc->headers[i].name, doc->headers[i].value);
    if (a->raw) {
        hresp_start(req, 200, (int64_t)doc->len);
        if (doc->len)
            hresp_write(req, doc->body, doc->len);
        hresp_end(req);
        return;
    }
    /* protobuf has no pretty form (kube: no PrettySerializer) */
    bool json = doc->content_type && strncmp(doc->content_type, "application/json", 16) == 0;
    body_init(&a->body, req, json && a->pretty,
              body_accepts_gzip(hreq_header(req, "Accept-Encoding")), LIMIT / 2);
    body_start(&a->body, 200, (int64_t)doc->len);
    pump(a);
}

static void
on_drain(void *arg)
{
    pump(arg);
}

static void
on_close(void *arg)
{
    struct dans *a = arg;
    body_fini(&a->body);
    disco_doc_unref(a->doc);
    free(a);
}

static const struct hreq_handler answer_handler = {
    .on_complete = on_complete,
    .on_drain = on_drain,
    .on_close = on_close,
};

bool
discovery_take(struct discovery *s, struct hreq *req, const struct route_req *r, bool may_answer)
{
    if (!s || !discovery_path(r->path))
        return false;
    const struct disco_doc *doc = NULL;
    if (may_answer && s->d && may_serve(req, r))
        doc = disco_doc_get(s->d, r->path, hreq_header(req, "Accept"));
    if (!doc) {
        s->st.upstream++;
        return false;
    }
    s->st.cache++;
    struct dans *a = xcalloc(1, sizeof(*a));
    a->s = s;
    a->req = req;
    a->doc = doc;
    a->raw = strcmp(r->path, "/version") == 0;
    a->pretty = route_wants_pretty(&r->q, hreq_header(req, "User-Agent"));
    respond_audit_id(req, s->rng, a->audit_id);
    access_set_source(req, ACCESS_CACHE);
    hresp_low_water(req, LIMIT / 2);
    hreq_set_handler(req, &answer_handler, a);
    return true;
}

void
discovery_stats(const struct discovery *s, struct discovery_stats *out)
{
    *out = s->st;
}
