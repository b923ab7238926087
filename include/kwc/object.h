/*
 * object.h — reading Kubernetes objects as the upstream sent them (JSON), on
 * the reflector's side of the data path: upstream bytes -> [object] -> store.
 * Three readers, none of which re-serialises anything, so the bytes the cache
 * keeps are byte-identical to what the upstream sent:
 *
 *   obj_meta_parse   one object -> namespace, name, rv, uid, deletion flag,
 *                    labels, the values of the caller's field paths.
 *   wframe_/wevent_  the upstream's JSON watch stream: newline-delimited
 *                    {"type":...,"object":{...}} split into lines, and one line
 *                    -> event type + the exact byte span of its "object".
 *   obj_list_        one LIST response body -> list metadata + each item's
 *                    exact byte span.
 *
 * JSON rules, the same everywhere (RFC 8259, as jansson 2.14 reads it):
 *  - valid UTF-8 only, no lone surrogate escapes (Go's encoder never emits
 *    either: it writes U+FFFD instead);
 *  - nesting up to OBJ_MAX_DEPTH values deep per object (jansson's
 *    JSON_PARSER_MAX_DEPTH, counted like jansson: every value, scalars
 *    included, is one level below its container), measured from the object
 *    itself, also when it sits inside an event line or a list;
 *  - duplicate keys are refused: Go clients decode them differently (a typed
 *    struct merges a repeated "metadata", a map replaces it), so no index kwc
 *    computes could agree with every client. Go encoders never emit them.
 *    wevent_parse and obj_list_init refuse them in the envelope;
 *    obj_meta_parse refuses them anywhere in the object;
 *  - "\u0000" is accepted inside string values (Go accepts it) but refused in
 *    any string obj_meta_parse extracts, and in keys (jansson cannot hold it).
 *    A raw NUL byte is refused anywhere (jansson alone would skip one after
 *    a number).
 *
 * wevent_parse and obj_list_init check the whole input's syntax with a small
 * validating scanner (no tree, no allocation) and locate spans with it; only
 * small parts (a Status, a bookmark, the list metadata) go through jansson.
 * The caller then runs obj_meta_parse on each object span, which parses that
 * object once with jansson: one tree per object, never one per line or list.
 *
 * Pure: no I/O, no clock. Errors: KWC_EPARSE (malformed), KWC_ETOOBIG (over a
 * bound), with a one-line reason in the caller's err buffer where offered.
 */
#ifndef KWC_OBJECT_H
#define KWC_OBJECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Default bound on one object's JSON. etcd's default request limit (1.5 MiB)
 * caps built-in objects and etcd-backed custom resources, but an aggregated API
 * server may serve larger objects; 64 MiB accepts those while bounding the
 * jansson tree of one parse (a few times the input).
 */
#define OBJ_MAX_BYTES (64u << 20)
/* Default cap on metadata.labels entries (kube sets none; this bounds the
 * selector-matching cost per object). */
#define OBJ_MAX_LABELS 8192
/* Nesting depth of one object, counted as jansson counts it. */
#define OBJ_MAX_DEPTH 2048

/* ------------------------------------------------------------------------ */
/* One object's metadata and selectable fields                               */

/*
 * A field to extract, for field selectors and indexes. path is a dotted path
 * from the object's root ("spec.nodeName", "type"); a segment of digits on an
 * array selects an element ("status.podIPs.0.ip"). A string value is taken as
 * it is, true/false as "true"/"false" and an integer in decimal (Go's
 * strconv.Format*, as kube's field sets and CRD selectableFields format
 * them). Absent, null, an object, an array or a non-integral number counts as
 * missing: the value is then `missing` ("" when NULL), as kube's field sets
 * default it (pods: "spec.hostNetwork" is "false" when unset, everything
 * else ""; see ToSelectableFields in pkg/registry/core/pod/strategy.go).
 */
struct obj_field {
    const char *path;
    const char *missing;
};

/* What obj_meta_parse extracts and its bounds. All borrowed. */
struct obj_fields_spec {
    const struct obj_field *fields;
    size_t n_fields;
    size_t max_bytes;  /* 0: OBJ_MAX_BYTES */
    size_t max_labels; /* 0: OBJ_MAX_LABELS */
};

struct obj_label {
    const char *key;
    const char *value;
};

/* Every string is NUL-terminated and owned by the struct (obj_meta_fini). */
struct obj_meta {
    const char *kind;        /* NULL when absent (list items of built-in types) */
    const char *api_version; /* NULL when absent */
    const char *namespace_;  /* "" when absent (cluster-scoped) */
    const char *name;        /* never "" */
    const char *uid;         /* "" when absent */
    uint64_t rv;             /* metadata.resourceVersion, > 0 */
    bool deleting;           /* metadata.deletionTimestamp set (not null) */
    size_t n_labels;
    const struct obj_label *labels; /* sorted by key, byte order */
    size_t n_fields;
    const char *const *fields; /* fields[i]: the value of spec->fields[i] */
    void *arena_;
};

/*
 * Parse one object (len bytes of JSON, not NUL-terminated; borrowed) and fill
 * *out. spec may be NULL (no fields, default bounds). metadata.name must be a
 * non-empty string; metadata.resourceVersion a decimal uint64 > 0 in a string
 * (Go's strconv.ParseUint rules: digits only, leading zeros allowed).
 * Returns 0, KWC_ETOOBIG (len over max_bytes, labels over max_labels) or
 * KWC_EPARSE; err (may be NULL) gets a one-line reason. *out is zeroed on
 * failure; obj_meta_fini is safe either way.
 */
int obj_meta_parse(const char *json, size_t len, const struct obj_fields_spec *spec,
                   struct obj_meta *out, char *err, size_t errlen);
void obj_meta_fini(struct obj_meta *m);

/*
 * Where metadata.resourceVersion's string value lies in an object (len bytes
 * of JSON, already validated by obj_meta_parse): json[*off, *off + *vlen),
 * quotes included, so that a copy can carry another rv (a selector-leaving
 * DELETED is the previous object at the event's rv). Returns 0, KWC_ENOTFOUND
 * or KWC_EPARSE.
 */
int obj_rv_span(const char *json, size_t len, size_t *off, size_t *vlen);

/* ------------------------------------------------------------------------ */
/* Watch stream framing                                                      */

/* Default line bound: one object at OBJ_MAX_BYTES plus its event envelope. */
#define WFRAME_MAX_LINE (OBJ_MAX_BYTES + 64u * 1024)

/*
 * Splits the upstream's watch stream into lines. kube-apiserver writes each
 * event with Go's json.Encoder: compact JSON (a newline inside a string is
 * "\n", escaped) followed by '\n', so one line is one event. Lines holding
 * only whitespace are skipped (a json.Decoder would skip them too).
 *
 * Memory: only a line that spans chunks is copied, into a buffer that never
 * exceeds max_line; a line inside one chunk is returned in place.
 */
struct wframe_splitter {
    char *buf; /* the partial line carried between chunks */
    size_t len, cap, max_line;
    bool handed_out; /* buf holds a line the caller was given */
    bool failed;     /* sticky: a line went over max_line */
};

/* max_line 0: WFRAME_MAX_LINE. */
void wframe_init(struct wframe_splitter *s, size_t max_line);
void wframe_fini(struct wframe_splitter *s);

/*
 * Take bytes from the caller's chunk (*data, *len; advanced past what was
 * consumed) until one whole line is available. Returns 1 with *line and *line_len
 * set (without the '\n'; valid until the next call on s and, when it points
 * into the chunk, as long as the chunk), 0 when the chunk is used up (any
 * partial line is kept), or KWC_ETOOBIG when a line exceeds max_line (sticky:
 * the stream cannot be resynchronised; restart the watch). Loop until it
 * returns <= 0, then feed the next chunk.
 */
int wframe_next(struct wframe_splitter *s, const char **data, size_t *len, const char **line,
                size_t *line_len);

/* Bytes of a partial line held back; non-zero at the end of a stream means
 * the upstream stopped in the middle of an event. */
size_t wframe_pending(const struct wframe_splitter *s);

/* ------------------------------------------------------------------------ */
/* One watch event line                                                      */

#define WEVENT_TYPES(X)                                                                            \
    X(WEVENT_ADDED, "ADDED")                                                                       \
    X(WEVENT_MODIFIED, "MODIFIED")                                                                 \
    X(WEVENT_DELETED, "DELETED")                                                                   \
    X(WEVENT_BOOKMARK, "BOOKMARK")                                                                 \
    X(WEVENT_ERROR, "ERROR")

enum wevent_type {
#define WEVENT_TYPE_ENUM(e, s) e,
    WEVENT_TYPES(WEVENT_TYPE_ENUM)
#undef WEVENT_TYPE_ENUM
};

struct wevent {
    enum wevent_type type;
    /* "object" is line[obj_off, obj_off + obj_len): a JSON object, exactly the
     * bytes the upstream sent, whitespace around it excluded. */
    size_t obj_off, obj_len;
    /* BOOKMARK: metadata.resourceVersion (> 0) and whether the bookmark ends
     * the initial events of a sendInitialEvents watch (annotation
     * k8s.io/initial-events-end: "true"). 0/false otherwise. */
    uint64_t rv;
    bool initial_events_end;
    /* ERROR: the Status's code, reason and message (0/""/"" when absent;
     * strings owned, wevent_fini). NULL for other types. */
    int code;
    const char *reason;
    const char *message;
    char *arena_;
};

/*
 * Parse one line (borrowed, not NUL-terminated). The whole line must be valid
 * JSON: an object with a "type" string and an "object" object, keys in any
 * order, other keys ignored (as Go's decoder ignores them), whitespace
 * anywhere JSON allows it. ADDED/MODIFIED/DELETED objects are only
 * syntax-checked here: run obj_meta_parse on the span before storing it.
 * Returns 0, KWC_EPARSE (err, may be NULL, says why); *out is zeroed on
 * failure and wevent_fini is safe either way.
 */
int wevent_parse(const char *line, size_t len, struct wevent *out, char *err, size_t errlen);
void wevent_fini(struct wevent *ev);

const char *wevent_type_name(enum wevent_type t);

/* ------------------------------------------------------------------------ */
/* LIST response items                                                       */

/* Bound on the list's "metadata" value (resourceVersion, continue, ...). */
#define OBJ_LIST_MAX_META (64u * 1024)

/*
 * A LIST response body held in memory by the caller (one page: with limit=500
 * typically a few MB). obj_list_init checks the whole body's syntax in one
 * pass and locates "items"; obj_list_next then steps over the items without
 * copying them. Extra memory is O(1) in the body size besides the small
 * jansson parse of "metadata", so the bound on a body is the caller's
 * buffering bound, not this module's. Items are only syntax-checked: run
 * obj_meta_parse on each before storing it.
 */
struct obj_list {
    const char *kind;        /* NULL when absent; owned */
    const char *api_version; /* NULL when absent; owned */
    uint64_t rv;             /* metadata.resourceVersion, > 0 */
    const char *continue_;   /* metadata.continue, "" when absent; owned */
    bool has_remaining;      /* metadata.remainingItemCount present */
    int64_t remaining;
    size_t n_items;
    const char *body_; /* borrowed */
    size_t pos_, end_; /* iteration: next item at or after pos_, "]" at end_ */
    char *arena_;
};

/*
 * Read a LIST body (borrowed: it must outlive the iteration). "items" may be
 * absent or null (no items); each item must be a JSON object. Returns 0 or
 * KWC_EPARSE / KWC_ETOOBIG (metadata over OBJ_LIST_MAX_META), with err (may
 * be NULL) saying why. *l is zeroed on failure; obj_list_fini is safe either
 * way.
 */
int obj_list_init(struct obj_list *l, const char *body, size_t len, char *err, size_t errlen);

/* The next item: returns 1 and its span in the body (body[*off, *off + *len)),
 * or 0 after the last one. */
int obj_list_next(struct obj_list *l, size_t *off, size_t *len);
void obj_list_fini(struct obj_list *l);

#endif
