/*
 * route.c — request target -> struct route_req, mirroring kube-apiserver's
 * RequestInfoFactory.NewRequestInfo (k8s.io/apiserver/pkg/endpoints/request/
 * requestinfo.go): the path is percent-decoded before it is split, a "watch"
 * segment after the group/version is the legacy watch form, "namespaces/X/Y"
 * names a namespaced resource unless Y is a namespace subresource
 * (status, finalize), and a GET without a name is a list or a watch.
 * All strings live in one arena sized from the input, so nothing here allocates
 * more than a small multiple of the (bounded) target length.
 */
#include "kwc/route.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kwc/base.h"

const char *
route_verb_name(enum route_verb v)
{
    switch (v) {
#define ROUTE_VERB_CASE(e, s)                                                                      \
    case e:                                                                                        \
        return s;
        ROUTE_VERBS(ROUTE_VERB_CASE)
#undef ROUTE_VERB_CASE
    }
    return "other";
}

void
route_fini(struct route_req *r)
{
    if (!r)
        return;
    free(r->arena_);
    memset(r, 0, sizeof(*r));
}

/* Bump allocator over the arena: decoded strings are never longer than their input. */
struct arena {
    char *p;
    size_t used, cap;
};

static char *
arena_put(struct arena *a, const char *s, size_t n)
{
    char *d = a->p + a->used;
    memcpy(d, s, n);
    d[n] = '\0';
    a->used += n + 1;
    return d;
}

/*
 * Go's url.ParseQuery as net/http's Request.URL.Query() uses it (errors
 * ignored): pairs split on '&'; a pair containing ';' is dropped; a pair whose
 * key or value has a bad escape is dropped; the others are kept.
 */
static void
parse_query(struct arena *a, const char *q, size_t len, struct route_query *out)
{
    static const struct {
        const char *key;
        size_t off;
    } keys[] = {
        {"resourceVersion", offsetof(struct route_query, resource_version)},
        {"resourceVersionMatch", offsetof(struct route_query, resource_version_match)},
        {"limit", offsetof(struct route_query, limit)},
        {"continue", offsetof(struct route_query, continue_token)},
        {"labelSelector", offsetof(struct route_query, label_selector)},
        {"fieldSelector", offsetof(struct route_query, field_selector)},
        {"timeoutSeconds", offsetof(struct route_query, timeout_seconds)},
        {"watch", offsetof(struct route_query, watch)},
        {"allowWatchBookmarks", offsetof(struct route_query, allow_watch_bookmarks)},
        {"sendInitialEvents", offsetof(struct route_query, send_initial_events)},
        {"pretty", offsetof(struct route_query, pretty)},
    };
    size_t i = 0;
    while (i < len) {
        size_t end = i;
        while (end < len && q[end] != '&')
            end++;
        size_t pairlen = end - i;
        const char *pair = q + i;
        i = end + 1;
        if (pairlen == 0 || memchr(pair, ';', pairlen))
            continue;
        const char *eqp = memchr(pair, '=', pairlen);
        size_t eq = eqp ? (size_t)(eqp - pair) : pairlen;
        size_t mark = a->used;
        char *k = a->p + a->used;
        size_t klen;
        if (kwc_pct_decode(pair, eq, true, k, &klen) != 0)
            continue;
        a->used += klen + 1;
        const char *vraw = eqp ? eqp + 1 : pair + pairlen;
        size_t vrawlen = eqp ? pairlen - eq - 1 : 0;
        char *v = a->p + a->used;
        size_t vlen;
        if (kwc_pct_decode(vraw, vrawlen, true, v, &vlen) != 0) {
            a->used = mark;
            continue;
        }
        a->used += vlen + 1;
        for (size_t j = 0; j < KWC_ARRAY_LEN(keys); j++) {
            const char **slot = (const char **)((char *)out + keys[j].off);
            if (*slot == NULL && strlen(keys[j].key) == klen && memcmp(k, keys[j].key, klen) == 0)
                *slot = v;
        }
    }
}

static enum route_verb
method_verb(const char *m)
{
    if (strcmp(m, "GET") == 0 || strcmp(m, "HEAD") == 0)
        return ROUTE_GET;
    if (strcmp(m, "POST") == 0)
        return ROUTE_CREATE;
    if (strcmp(m, "PUT") == 0)
        return ROUTE_UPDATE;
    if (strcmp(m, "PATCH") == 0)
        return ROUTE_PATCH;
    if (strcmp(m, "DELETE") == 0)
        return ROUTE_DELETE;
    return ROUTE_OTHER;
}

int
route_parse(const char *method, const char *target, size_t len, struct route_req *out)
{
    memset(out, 0, sizeof(*out));
    if (len > ROUTE_MAX_TARGET)
        return KWC_ETOOBIG;
    if (len == 0 || target[0] != '/')
        return KWC_EPARSE;

    /* Worst case: the path twice, plus every query byte and two NULs per
     * parameter ("&&&" is three empty parameters). */
    struct arena a = {.p = xmalloc(3 * len + 64), .cap = 3 * len + 64};
    out->arena_ = a.p;

    const char *qm = memchr(target, '?', len);
    size_t plen = qm ? (size_t)(qm - target) : len;
    char *path = a.p;
    size_t dlen;
    if (kwc_pct_decode(target, plen, false, path, &dlen) != 0 || memchr(path, '\0', dlen))
        return KWC_EPARSE;
    a.used = dlen + 1;
    out->path = path;
    if (qm)
        parse_query(&a, qm + 1, len - plen - 1, &out->q);

    /* Split like Go's splitPath: trim '/' at both ends, then split on every
     * '/', keeping empty segments ("namespaces//pods" has namespace ""). */
    char *segbuf = arena_put(&a, path, dlen);
    char *parts[64];
    size_t n = 0;
    char *b = segbuf, *e = segbuf + dlen;
    while (b < e && *b == '/')
        b++;
    while (e > b && e[-1] == '/')
        *--e = '\0';
    while (b < e) {
        if (n == KWC_ARRAY_LEN(parts))
            return 0; /* deeper than any resource path: a non-resource request */
        char *slash = memchr(b, '/', (size_t)(e - b));
        parts[n++] = b;
        if (!slash)
            break;
        *slash = '\0';
        b = slash + 1;
    }

    size_t at;
    if (n >= 2 && strcmp(parts[0], "api") == 0) {
        out->group = "";
        out->version = parts[1];
        at = 2;
    } else if (n >= 3 && strcmp(parts[0], "apis") == 0) {
        out->group = parts[1];
        out->version = parts[2];
        at = 3;
    } else {
        return 0; /* /version, /api, /apis, /apis/G, /healthz, ... */
    }
    if (at == n)
        return 0; /* discovery: /api/v1, /apis/G/V */

    out->is_resource = true;
    out->verb = method_verb(method);
    if (strcmp(parts[at], "watch") == 0 || strcmp(parts[at], "proxy") == 0) {
        bool watch = parts[at][0] == 'w';
        if (watch)
            out->legacy_watch = true;
        out->verb = watch ? ROUTE_WATCH : ROUTE_PROXY;
        at++;
    }
    size_t rest = n - at;
    char **p = parts + at;
    if (rest >= 1 && strcmp(p[0], "namespaces") == 0) {
        if (rest > 1) {
            out->namespace_ = p[1];
            if (rest > 2 && strcmp(p[2], "status") != 0 && strcmp(p[2], "finalize") != 0) {
                p += 2;
                rest -= 2;
            }
        }
    }
    if (rest >= 3 && out->verb != ROUTE_PROXY)
        out->subresource = p[2];
    if (rest >= 2)
        out->name = p[1];
    if (rest >= 1)
        out->resource = p[0];
    /* As in kube-apiserver, "namespaces/X" has namespace X too (authorization
     * sees it), except for PATCH namespaces/X: a server-side-apply create of a
     * namespace is not "inside" it. The store keys namespaces by name alone. */
    if (out->verb == ROUTE_PATCH && rest == 2 && strcmp(p[0], "namespaces") == 0)
        out->namespace_ = NULL;

    if (!out->name && out->verb == ROUTE_GET) {
        bool w = out->q.watch && kwc_query_bool(out->q.watch, strlen(out->q.watch));
        out->verb = w ? ROUTE_WATCH : ROUTE_LIST;
    }
    if (!out->name && out->verb == ROUTE_DELETE)
        out->verb = ROUTE_DELETECOLLECTION;
    return 0;
}

/* One clause of an Accept header: type/subtype and whether it has parameters. */
struct media_clause {
    const char *type, *sub;
    size_t type_len, sub_len;
    bool params;
};

static bool
clause_is(const struct media_clause *c, const char *type, const char *sub)
{
    return c->type_len == strlen(type) && memcmp(c->type, type, c->type_len) == 0 &&
           c->sub_len == strlen(sub) && memcmp(c->sub, sub, c->sub_len) == 0;
}

/* The clause's serializer: JSON, protobuf, OTHER for one kwc leaves to the
 * upstream (YAML, parameters), or -1 for none kube has. */
static int
clause_media(const struct media_clause *c, bool protobuf)
{
    bool json = clause_is(c, "application", "json") || clause_is(c, "application", "*") ||
                clause_is(c, "*", "*");
    bool pb = protobuf && clause_is(c, "application", "vnd.kubernetes.protobuf");
    bool yaml = clause_is(c, "application", "yaml");
    if (!json && !pb && !yaml)
        return -1;
    if (yaml || c->params)
        return ROUTE_MEDIA_OTHER;
    return json ? ROUTE_MEDIA_JSON : ROUTE_MEDIA_PROTOBUF;
}

enum route_media
route_negotiate(const char *accept, bool protobuf)
{
    if (!accept)
        return ROUTE_MEDIA_JSON;
    struct media_clause cl[32];
    size_t n = 0;
    for (const char *s = accept; *s && n < KWC_ARRAY_LEN(cl);) {
        size_t l = strcspn(s, ",");
        const char *e = s + l;
        while (s < e && (*s == ' ' || *s == '\t'))
            s++;
        const char *semi = memchr(s, ';', (size_t)(e - s));
        const char *te = semi ? semi : e;
        while (te > s && (te[-1] == ' ' || te[-1] == '\t'))
            te--;
        const char *slash = memchr(s, '/', (size_t)(te - s));
        bool star = te == s + 1 && *s == '*'; /* goautoneg reads "*" as \*\/\* */
        if (slash || star) {                  /* else goautoneg skips the clause */
            struct media_clause *c = &cl[n++];
            c->type = s;
            c->type_len = star ? 1 : (size_t)(slash - s);
            c->sub = star ? s : slash + 1;
            c->sub_len = star ? 1 : (size_t)(te - slash - 1);
            c->params = semi != NULL;
        }
        s = *e ? e + 1 : e;
    }
    if (n == KWC_ARRAY_LEN(cl))
        return ROUTE_MEDIA_OTHER; /* an odd header: the upstream negotiates */
    if (!accept[0])
        return ROUTE_MEDIA_JSON; /* an empty header counts as absent */
    if (n == 0)
        return ROUTE_MEDIA_OTHER; /* no clause goautoneg reads: kube's 406 */
    /* goautoneg's order: specific types, then type/\*, then \*\/\* (stable) */
    for (int rank = 0; rank < 3; rank++) {
        for (size_t i = 0; i < n; i++) {
            bool wt = cl[i].type_len == 1 && cl[i].type[0] == '*';
            bool ws = cl[i].sub_len == 1 && cl[i].sub[0] == '*';
            if ((wt ? 2 : ws ? 1 : 0) != rank)
                continue;
            int m = clause_media(&cl[i], protobuf);
            if (m >= 0)
                return (enum route_media)m;
        }
    }
    return ROUTE_MEDIA_OTHER; /* kube's 406: the upstream says it */
}

bool
route_wants_pretty(const struct route_query *q, const char *user_agent)
{
    if (q->pretty && q->pretty[0]) {
        bool b = false;
        kwc_parse_bool(q->pretty, strlen(q->pretty), &b);
        return b;
    }
    if (!user_agent)
        return false;
    return strncmp(user_agent, "curl", 4) == 0 || strncmp(user_agent, "Wget", 4) == 0 ||
           strncmp(user_agent, "Mozilla/5.0", 11) == 0;
}

void
route_decide_req(const struct route_req *r, enum decide_verb verb, bool has_selector,
                 const char *selector_error, struct decide_req *out)
{
    *out = (struct decide_req){
        .verb = verb,
        .resource_version = r->q.resource_version,
        .resource_version_match = r->q.resource_version_match,
        .limit = r->q.limit,
        .continue_token = r->q.continue_token,
        .timeout_seconds = r->q.timeout_seconds,
        .send_initial_events = r->q.send_initial_events,
        .has_selector = has_selector,
        .selector_error = selector_error,
    };
}

/* ---- route_accept: kube's negotiation with parameters ---- */

#define ACCEPT_MAX_PARAMS 16

struct span {
    const char *p;
    size_t n;
};

struct accept_clause {
    struct span type, sub;
    float q;
    size_t n_params;
    struct span key[ACCEPT_MAX_PARAMS], val[ACCEPT_MAX_PARAMS];
};

static struct span
trim_spaces(const char *p, size_t n)
{
    while (n && *p == ' ')
        p++, n--;
    while (n && p[n - 1] == ' ')
        n--;
    return (struct span){p, n};
}

static bool
span_is(struct span s, const char *lit)
{
    return s.n == strlen(lit) && memcmp(s.p, lit, s.n) == 0;
}

/* A q= value longer than this is over parse_accept's bounds. */
#define ACCEPT_Q_MAX 63

/* strconv.ParseFloat(s, 32) as goautoneg keeps it: the value, 0 on a syntax
 * error (a range error keeps its infinity). n <= ACCEPT_Q_MAX. */
static float
go_parse_q(const char *p, size_t n)
{
    char buf[ACCEPT_Q_MAX + 1];
    if (n == 0 || n >= sizeof buf || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' ||
        *p == '\f' || *p == '\v')
        return 0;
    memcpy(buf, p, n);
    buf[n] = '\0';
    const char *digits = buf + (buf[0] == '+' || buf[0] == '-');
    if ((digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) && !strpbrk(buf, "pP"))
        return 0; /* Go's hex floats need an exponent */
    char *end;
    float f = strtof(buf, &end);
    return *end ? 0 : f;
}

/* Next element of s split on c (goautoneg's nextSplitElement); *more: c was
 * found. */
static void
next_elem(struct span *s, char c, struct span *item, bool *more)
{
    const char *hit = memchr(s->p, c, s->n);
    if (!hit) {
        *item = *s;
        *s = (struct span){s->p + s->n, 0};
        *more = false;
    } else {
        *item = (struct span){s->p, (size_t)(hit - s->p)};
        *s = (struct span){hit + 1, s->n - (size_t)(hit - s->p) - 1};
        *more = true;
    }
}

/* goautoneg.ParseAccept into cl; the count, or -1 when over the bounds. */
static int
parse_accept(const char *header, struct accept_clause *cl, size_t max)
{
    struct span rest = {header, strlen(header)};
    size_t n = 0;
    while (rest.n > 0) {
        struct span part, media, t, sub;
        bool more;
        next_elem(&rest, ',', &part, &more);
        part = trim_spaces(part.p, part.n);
        struct span pr = part;
        bool has_params;
        next_elem(&pr, ';', &media, &has_params);
        struct span mr = media;
        bool slash;
        next_elem(&mr, '/', &t, &slash);
        t = trim_spaces(t.p, t.n);
        if (mr.n == 0) {
            /* no subtype: only "*" is a clause ("*" and "*\/" alike) */
            if (!span_is(t, "*"))
                continue;
            sub = (struct span){"*", 1};
        } else {
            struct span second = mr;
            next_elem(&mr, '/', &second, &slash);
            if (mr.n > 0)
                continue; /* "a/b/c" */
            sub = trim_spaces(second.p, second.n);
        }
        if (n == max)
            return -1;
        struct accept_clause *c = &cl[n++];
        *c = (struct accept_clause){.type = t, .sub = sub, .q = 1.0f};
        if (!has_params)
            continue;
        while (pr.n > 0) {
            struct span param, k, v;
            bool eq, more_eq;
            next_elem(&pr, ';', &param, &more);
            next_elem(&param, '=', &k, &eq);
            if (param.n == 0)
                continue; /* no '=' or nothing after it */
            struct span vv = param;
            next_elem(&vv, '=', &v, &more_eq);
            if (vv.n != 0)
                continue; /* "k=v=w" */
            k = trim_spaces(k.p, k.n);
            if (span_is(k, "q")) {
                if (v.n > ACCEPT_Q_MAX)
                    return -1; /* Go reads "0.5000...0001" of any length */
                c->q = go_parse_q(v.p, v.n);
                continue;
            }
            v = trim_spaces(v.p, v.n);
            size_t i;
            for (i = 0; i < c->n_params && !(c->key[i].n == k.n && !memcmp(c->key[i].p, k.p, k.n));
                 i++)
                ;
            if (i == ACCEPT_MAX_PARAMS)
                return -1;
            if (i == c->n_params)
                c->n_params++;
            c->key[i] = k;
            c->val[i] = v; /* a map: the last value wins */
        }
    }
    return (int)n;
}

static bool
accept_less(const struct accept_clause *a, const struct accept_clause *b)
{
    if (a->q > b->q)
        return true;
    if (!span_is(a->type, "*") && span_is(b->type, "*"))
        return true;
    return !span_is(a->sub, "*") && span_is(b->sub, "*");
}

enum accept_ser { SER_JSON, SER_YAML, SER_PB };

/* acceptMediaTypeOptions for one (clause, serializer): 1 admitted (and
 * *conv: 0 none, 1 as=POM v1, 2 POML v1, 3 another admitted conversion;
 * *plain: no parameter beyond as/g/v/pretty; *pretty), 0 refused, -1 a
 * parameter kwc cannot judge (sv=). */
static int
accept_options(const struct accept_clause *c, enum accept_ser ser, bool status, int *conv,
               bool *plain, bool *pretty)
{
    struct span as = {"", 0}, g = {"", 0}, v = {"", 0};
    bool convert = false;
    *plain = true;
    *pretty = false;
    for (size_t i = 0; i < c->n_params; i++) {
        struct span k = c->key[i], val = c->val[i];
        if (span_is(k, "as") || span_is(k, "g") || span_is(k, "v")) {
            convert = true;
            *(k.p[0] == 'a' ? &as : k.p[0] == 'g' ? &g : &v) = val;
        } else if (span_is(k, "stream")) {
            /* kube: refused without a stream serializer (YAML) or when the
             * endpoint disallows the schema; DefaultEndpointRestrictions (a
             * Status's) allows "watch" as every resource's endpoint does */
            if (val.n > 0 && (ser == SER_YAML || !span_is(val, "watch")))
                return 0;
            *plain = false;
        } else if (span_is(k, "sv")) {
            if (val.n > 0)
                return -1; /* the endpoint's server version decides */
            *plain = false;
        } else if (span_is(k, "pretty")) {
            *pretty = span_is(val, "1");
        } else {
            *plain = false; /* export and unrecognised parameters */
        }
    }
    *conv = 0;
    if (!convert)
        return 1;
    if (status)
        return 0; /* DefaultEndpointRestrictions: no conversion */
    bool meta_gv = span_is(g, "meta.k8s.io") && (span_is(v, "v1") || span_is(v, "v1beta1"));
    bool pom = span_is(as, "PartialObjectMetadata"),
         poml = span_is(as, "PartialObjectMetadataList");
    if (!meta_gv)
        return 0;
    if (span_is(as, "Table")) {
        if (ser == SER_PB)
            return 0;
        *conv = 3;
        return 1;
    }
    if (!pom && !poml)
        return 0;
    *conv = span_is(v, "v1") ? (pom ? 1 : 2) : 3;
    return 1;
}

static void
accept_negotiate(const char *accept, bool protobuf, bool status, struct route_accept *out)
{
    *out = (struct route_accept){.media = ROUTE_MEDIA_OTHER};
    if (!accept || !accept[0]) {
        out->media = ROUTE_MEDIA_JSON;
        return;
    }
    struct accept_clause cl[ROUTE_ACCEPT_MAX_CLAUSES];
    int n = parse_accept(accept, cl, KWC_ARRAY_LEN(cl));
    if (n < 0)
        return; /* over the bounds: Go's sort of more than 12 clauses is not
                 * stable (pdqsort), so kwc cannot know kube's winner */
    /* sort.Sort: insertion sort at this size */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && accept_less(&cl[j], &cl[j - 1]); j--) {
            struct accept_clause t = cl[j];
            cl[j] = cl[j - 1];
            cl[j - 1] = t;
        }
    static const char *const subs[] = {"json", "yaml", "vnd.kubernetes.protobuf"};
    for (int i = 0; i < n; i++) {
        const struct accept_clause *c = &cl[i];
        for (int s = SER_JSON; s <= SER_PB; s++) {
            bool match = span_is(c->type, "*")
                             ? span_is(c->sub, "*")
                             : span_is(c->type, "application") &&
                                   (span_is(c->sub, "*") || span_is(c->sub, subs[s]));
            if (!match)
                continue;
            int conv;
            bool plain, pretty;
            int ok = accept_options(c, (enum accept_ser)s, status, &conv, &plain, &pretty);
            if (ok < 0)
                return;
            if (ok == 0 || (s == SER_PB && !protobuf && conv == 0))
                continue; /* refused; a custom resource's plain protobuf: its
                           * StandardSerializers (AllowsMediaTypeTransform) */
            /* the winner */
            out->pretty = pretty;
            if (s == SER_YAML || !plain || conv == 3)
                return;
            out->as = conv == 1 ? ROUTE_AS_POM : conv == 2 ? ROUTE_AS_POML : ROUTE_AS_NONE;
            out->media = s == SER_PB ? ROUTE_MEDIA_PROTOBUF : ROUTE_MEDIA_JSON;
            return;
        }
    }
    out->none = true;
}

void
route_accept(const char *accept, bool protobuf, struct route_accept *out)
{
    accept_negotiate(accept, protobuf, false, out);
}

void
route_accept_status(const char *accept, struct route_accept *out)
{
    accept_negotiate(accept, true, true, out);
}
