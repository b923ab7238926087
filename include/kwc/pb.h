/*
 * pb.h — Kubernetes' protobuf wire format (application/vnd.kubernetes.protobuf),
 * read and written without the objects' schemas: kwc stores the upstream's
 * exact object bytes and only needs the envelope, WatchEvent, ListMeta,
 * Status, and the ObjectMeta fields and indexed fields its selectors read.
 * Those messages are declared in kwc's own minimal cache/k8s_min.proto (field
 * numbers are facts of the wire format: k8s.io/apimachinery generated.proto)
 * and decoded with protobuf-c.
 *
 * Shapes (proto2; Go's gogo marshallers write every non-pointer field, empty
 * strings included, in ascending field order):
 *   envelope   "k8s\0" + Unknown{1 typeMeta{1 apiVersion, 2 kind}, 2 raw,
 *              3 contentEncoding, 4 contentType}; raw is the object message
 *   object     Pod/ConfigMap/...{1 metadata ObjectMeta, 2 spec, 3 status, ...}
 *   ObjectMeta 1 name, 3 namespace, 5 uid, 6 resourceVersion, 9
 *              deletionTimestamp, 11 labels (map entries {1 key, 2 value}),
 *              12 annotations
 *   list       envelope around XxxList{1 metadata ListMeta, 2 items (repeated
 *              object messages, no envelope)}
 *   ListMeta   1 selfLink, 2 resourceVersion, 3 continue, 4 remainingItemCount
 *              (*int64: absent when nil)
 *   watch      frames of a 4-byte big-endian length + a raw WatchEvent
 *              {1 type, 2 object RawExtension{1 raw = an envelope}}
 *   Status     envelope around Status{1 metadata ListMeta, 2 status,
 *              3 message, 4 reason, 5 details (*StatusDetails), 6 code}
 *
 * kwc stores objects in their list-item form: the object message without
 * envelope (the bytes of one `items` entry, and of Unknown.raw in an event).
 *
 * Bounds: every length read from the input is checked against what remains
 * before it is used; nothing is allocated from a length the input did not
 * back with bytes. Pure: no I/O. Errors: KWC_EPARSE / KWC_ETOOBIG with a
 * one-line reason in err where offered.
 */
#ifndef KWC_PB_H
#define KWC_PB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kwc/object.h"

#define PB_CONTENT_TYPE "application/vnd.kubernetes.protobuf"
#define PB_WATCH_CONTENT_TYPE "application/vnd.kubernetes.protobuf;stream=watch"
#define PB_MAGIC "k8s\0"
#define PB_MAGIC_LEN 4
/* One watch frame: an object at OBJ_MAX_BYTES plus its event envelope. */
#define PB_MAX_FRAME (OBJ_MAX_BYTES + 64u * 1024)

/* ------------------------------------------------------------------------ */
/* Fields kwc can read from an object's protobuf bytes                      */

/*
 * A selectable field: `path` as in kinds.h (obj_field), `nums` the field
 * numbers leading to it from the object message ("spec.nodeName" of a Pod:
 * {2, 10}). A bytes value is taken as it is; a bool ("true"/"false") only
 * when `boolean`, an integer (decimal) only when not.
 *
 * Values are decoded with kwc's schema (cache/k8s_min.proto): the path must
 * be declared there, in the object message of the fields' kind (Pod,
 * Secret, Node, Namespace: the kind whose table pb_fields returned, or for
 * a caller's own array the kind declaring most of its paths), with the
 * leaf's type matching `boolean`. A path it does not declare reads as
 * `missing`, like a field selector kube does not offer for the kind.
 */
struct pb_field {
    const char *path;
    const char *missing; /* value when absent; NULL: "" */
    unsigned n;          /* 1..4 */
    uint32_t nums[4];
    bool boolean;
};

/*
 * The fields of group/resource kwc reads in protobuf: metadata.name and
 * metadata.namespace first (nums {1,1} and {1,3}), then what kinds.h lists
 * for the resource and pb.c knows the numbers of (pods: spec.nodeName and
 * more; secrets: type; nodes: spec.unschedulable; namespaces: status.phase).
 * A field selector on any other field passes through. Static array.
 */
const struct pb_field *pb_fields(const char *group, const char *resource, size_t *n);

/*
 * Parse one object message (list-item form, len bytes, borrowed) and fill
 * *out as obj_meta_parse does (kind and api_version NULL; labels sorted, a
 * repeated key keeps its last value as Go's map decoding does; fields[i] is
 * the value of fields[i] or its missing value). metadata.name non-empty,
 * metadata.resourceVersion a decimal uint64 > 0; no NUL byte in any string
 * extracted. max_bytes 0: OBJ_MAX_BYTES; max_labels 0: OBJ_MAX_LABELS,
 * counted in map entries as sent (before a repeated key collapses) so that
 * the bound holds before anything is decoded. Repeated occurrences of a
 * field follow protobuf's merge rules as Go's decoders do. Only the
 * messages on the paths read are checked (top level, ObjectMeta, the
 * messages fields[] go through): bytes kwc never looks into (containers,
 * managedFields...) are only skipped over.
 * Returns 0, KWC_EPARSE or KWC_ETOOBIG; *out zeroed on failure,
 * obj_meta_fini is safe either way.
 */
int pb_meta_parse(const void *obj, size_t len, const struct pb_field *fields, size_t n_fields,
                  size_t max_bytes, size_t max_labels, struct obj_meta *out, char *err,
                  size_t errlen);

/*
 * A copy of the object with metadata.resourceVersion set to rv (the other
 * bytes unchanged, lengths re-encoded): the rv field of the last metadata
 * occurrence is replaced (its tag bytes kept), or, when it has none, one is
 * inserted before its first field numbered above 6. New buffer in *out
 * (caller frees; NULL on failure). Returns 0 or KWC_EPARSE: rv 0, or an
 * object pb_meta_parse refuses (at any size and label count), so that the
 * copy always parses to rv with the same name, namespace and labels.
 */
int pb_with_rv(const void *obj, size_t len, uint64_t rv, char **out, size_t *out_len);

/* ------------------------------------------------------------------------ */
/* The envelope                                                              */

/* Spans point into the input. */
struct pb_envelope {
    const char *api_version, *kind; /* not NUL-terminated */
    size_t api_version_len, kind_len;
    size_t raw_off, raw_len; /* Unknown.raw: input[raw_off, raw_off + raw_len) */
};

/*
 * "k8s\0" + Unknown. contentEncoding and contentType must be absent or empty
 * (kube writes them empty; anything else is an encoding kwc cannot vouch
 * for). An absent apiVersion, kind or raw has length 0 (raw_off is then
 * len). No NUL in apiVersion or kind. Returns 0 or KWC_EPARSE (*out
 * zeroed).
 */
int pb_envelope_parse(const void *buf, size_t len, struct pb_envelope *out, char *err,
                      size_t errlen);

/* ------------------------------------------------------------------------ */
/* Lists                                                                     */

struct pb_list {
    uint64_t rv;     /* ListMeta.resourceVersion, > 0 */
    char *continue_; /* "" when empty or absent; owned */
    bool has_remaining;
    int64_t remaining;
    size_t n_items;
    /* items[i]: body[off[i], off[i] + len[i]) — spans into the caller's body */
    size_t *off, *len;
    char kind[128]; /* the envelope's kind ("PodList") */
    char api_version[128];
};

/*
 * A LIST response body (envelope + XxxList), borrowed: the spans point into
 * it. Items are not parsed here (pb_meta_parse each). Returns 0 or
 * KWC_EPARSE / KWC_ETOOBIG (a kind or apiVersion over 127 bytes, ListMeta
 * over OBJ_LIST_MAX_META); *l zeroed on failure; pb_list_fini is safe either
 * way.
 */
int pb_list_parse(const void *body, size_t len, struct pb_list *l, char *err, size_t errlen);
void pb_list_fini(struct pb_list *l);

/* ------------------------------------------------------------------------ */
/* Watch streams                                                             */

/*
 * Splits a protobuf watch stream into frames (4-byte big-endian length, then
 * that many bytes). Only a frame that spans chunks is copied, into a buffer
 * bounded by max_frame (0: PB_MAX_FRAME); a length over max_frame fails
 * before anything is allocated for it. Same contract as wframe_next in
 * object.h: returns 1 with *frame and *frame_len (valid until the next call),
 * 0 when the chunk is used up, KWC_ETOOBIG (sticky) when a frame is over the
 * bound. A zero-length frame is returned as one (pb_wevent_parse refuses
 * it). While a frame is incomplete its buffer grows with the bytes that
 * arrive (doubling, up to the announced size), not to the announced size.
 */
struct pb_splitter {
    char *buf;
    size_t len, cap, max_frame;
    bool handed_out;
    bool failed;
};
void pb_split_init(struct pb_splitter *s, size_t max_frame);
void pb_split_fini(struct pb_splitter *s);
int pb_split_next(struct pb_splitter *s, const char **data, size_t *len, const char **frame,
                  size_t *frame_len);
/* Bytes of a partial frame held back (length prefix included). */
size_t pb_split_pending(const struct pb_splitter *s);

/*
 * One frame: WatchEvent{type, object{raw: envelope}}. Reuses struct wevent
 * (object.h): for ADDED/MODIFIED/DELETED, frame[obj_off, obj_off + obj_len)
 * is the object message (Unknown.raw of the envelope: list-item form, run
 * pb_meta_parse on it); for BOOKMARK rv and initial_events_end (annotation
 * k8s.io/initial-events-end = "true") are read from its ObjectMeta; for ERROR
 * code, reason and message from the Status. An unknown type is KWC_EPARSE.
 * kind/api_version of the envelope go to *env when env is not NULL.
 * Returns 0, KWC_EPARSE or KWC_ETOOBIG (a bookmark with over
 * OBJ_MAX_LABELS annotations); *out zeroed on failure, wevent_fini is safe
 * either way.
 */
int pb_wevent_parse(const void *frame, size_t len, struct wevent *out, struct pb_envelope *env,
                    char *err, size_t errlen);

/* ------------------------------------------------------------------------ */
/* Writing                                                                   */

/* Bytes of a varint for v (1..10). */
size_t pb_varint_len(uint64_t v);

struct gostr_buf;

/* Append to b the message {1: the object message's field 1} (every kube
 * object's ObjectMeta: a PartialObjectMetadata, pom.h): 0, or -1 when obj is
 * no message or has no field 1, or it twice, or not as a message. */
int pb_object_meta(struct gostr_buf *b, const void *obj, size_t len);

/*
 * The bytes of an envelope before its raw object: "k8s\0", typeMeta, the
 * tag and length of raw (raw_len). Writes into buf (at most PB_HEAD_MAX +
 * api_version and kind lengths) and returns the count. The envelope's tail
 * after raw is the constant PB_ENVELOPE_TAIL (empty contentEncoding and
 * contentType).
 */
#define PB_HEAD_MAX 32
#define PB_ENVELOPE_TAIL "\x1a\x00\x22\x00"
#define PB_ENVELOPE_TAIL_LEN 4
size_t pb_envelope_head(char *buf, const char *api_version, const char *kind, uint64_t raw_len);

/* A whole envelope around obj (a GET answer). New buffer; caller frees. */
char *pb_envelope(const char *api_version, const char *kind, const void *obj, size_t len,
                  size_t *out_len);

/*
 * A list: head = envelope head (raw_len covering ListMeta and items) +
 * the ListMeta field; each item is PB item prefix (tag 0x12 + varint length)
 * + the item; tail = PB_ENVELOPE_TAIL. items_bytes: the sum over the items
 * of pb_item_size(len). cont NULL or "": empty continue; remaining < 0:
 * absent. New buffer; caller frees.
 */
char *pb_list_head(const char *api_version, const char *list_kind, uint64_t rv, const char *cont,
                   int64_t remaining, uint64_t items_bytes, size_t *out_len);
/* Bytes one item takes in a list: tag + varint length + len. */
uint64_t pb_item_size(size_t len);
/* Write an item's tag and length into buf (at most 11 bytes); returns the count. */
size_t pb_item_prefix(char *buf, size_t len);

/*
 * One watch frame: 4-byte big-endian length + WatchEvent{type,
 * RawExtension{envelope(api_version, kind, obj)}}. Appended to b (a
 * gostr_buf, see gostr.h). type: "ADDED", "MODIFIED", "DELETED",
 * "BOOKMARK", "ERROR".
 */
void pb_frame_event(struct gostr_buf *b, const char *type, const char *api_version,
                    const char *kind, const void *obj, size_t len);

/*
 * The object of a bookmark in list-item form: an object message holding only
 * metadata{resourceVersion, and with initial_end annotations
 * {"k8s.io/initial-events-end": "true"}}. (kube's spells out the zero-valued
 * spec and status its Go type has; decoded, both are the same object.)
 * Appended to b.
 */
void pb_bookmark_obj(struct gostr_buf *b, uint64_t rv, bool initial_end);

/*
 * A Status (kube's failure Status: status "Failure", message, reason, code;
 * details with name/group/kind and causes when given) as an envelope
 * {apiVersion "v1", kind "Status"}, appended to b. Encoded as kube's gogo
 * marshaller writes it.
 */
struct status_details;
void pb_status(struct gostr_buf *b, int code, const char *reason, const char *message,
               const struct status_details *details);

#endif
