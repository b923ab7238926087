/*
 * object_test.c — cache/object.c: object metadata, watch stream framing,
 * watch event lines and LIST bodies read from upstream JSON.
 *
 * Inputs are hand-written in the shape kube-apiserver sends (compact Go
 * encoding/json output: pods with managedFields and ownerReferences, nodes,
 * secrets in unstructured key order, watch events, PodLists), with the JSON
 * quotes written as backquotes to keep the C literals readable (J() turns them
 * back). Expected values are read off those inputs by hand: the pod field set
 * follows ToSelectableFields in kubernetes pkg/registry/core/pod/strategy.go
 * (hostNetwork "false" when unset, status.podIP from status.podIPs[0], every
 * other missing field ""). Every span is checked byte for byte against the
 * literal it was built from. Inputs are copied into exact-size buffers without
 * a NUL so ASan sees any read past the end.
 */
#include "kwc/object.h"

#include "kwc/base.h"
#include "tap.h"

#include <stdlib.h>
#include <string.h>

/* Table rows leave the fields that do not apply to them out (zero). */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

/* ---- helpers ---- */

static char *pool[4096];
static size_t npool;

static void *
keep(void *p)
{
    if (npool < KWC_ARRAY_LEN(pool))
        pool[npool++] = p;
    return p;
}

/* s with every backquote turned into a double quote (kept until exit). */
static const char *
J(const char *s)
{
    char *o = keep(xstrdup(s));
    for (char *c = o; *c; c++)
        if (*c == '`')
            *c = '"';
    return o;
}

/* An exact-size copy without a terminating NUL. */
static char *
exact(const char *s, size_t n)
{
    char *p = xmalloc(n ? n : 1);
    memcpy(p, s, n);
    return p;
}

static int
meta(const char *json, const struct obj_fields_spec *spec, struct obj_meta *m, char *err,
     size_t errlen)
{
    size_t n = strlen(json);
    char *p = exact(json, n);
    int rc = obj_meta_parse(p, n, spec, m, err, errlen);
    free(p);
    return rc;
}

/* labels as "k=v,k=v" in the order given */
static const char *
labels_str(const struct obj_meta *m, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < m->n_labels && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s=%s", i ? "," : "", m->labels[i].key,
                               m->labels[i].value);
    return buf;
}

static const char *
fields_str(const struct obj_meta *m, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < m->n_fields && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? "|" : "", m->fields[i]);
    return buf;
}

/* ---- inputs ---- */

/* A pod as kube-apiserver writes it in a watch event. The annotations hold a
 * quote-brace inside a string, backslashes, a surrogate pair and a \u escape;
 * one label key is written with an escaped slash. */
#define POD                                                                                        \
    "{`kind`:`Pod`,`apiVersion`:`v1`,`metadata`:{`name`:`web-7d4b9c-x2x9k`,"                       \
    "`generateName`:`web-7d4b9c-`,`namespace`:`prod`,"                                             \
    "`uid`:`3f1c2a9e-5b7d-4c1e-9a2f-0d8e6b4c7a11`,`resourceVersion`:`184467`,"                     \
    "`creationTimestamp`:`2024-05-01T10:00:00Z`,"                                                  \
    "`labels`:{`pod-template-hash`:`7d4b9c`,`app`:`web`,`app.kubernetes.io\\/name`:`web`},"        \
    "`annotations`:{`note`:`a \\`}\\` b`,`path`:`C:\\\\dir\\\\`,"                                  \
    "`emoji`:`\\ud83d\\ude00 caf\\u00e9`},"                                                        \
    "`ownerReferences`:[{`apiVersion`:`apps/v1`,`kind`:`ReplicaSet`,`name`:`web-7d4b9c`,"          \
    "`uid`:`0b5c`,`controller`:true,`blockOwnerDeletion`:true}],"                                  \
    "`managedFields`:[{`manager`:`kube-controller-manager`,`operation`:`Update`,"                  \
    "`apiVersion`:`v1`,`time`:`2024-05-01T10:00:00Z`,`fieldsType`:`FieldsV1`,"                     \
    "`fieldsV1`:{`f:metadata`:{`f:labels`:{`.`:{},`f:app`:{}}}}}]},"                               \
    "`spec`:{`volumes`:[{`name`:`kube-api-access`,`projected`:{`sources`:[{"                       \
    "`serviceAccountToken`:{`expirationSeconds`:3607,`path`:`token`}}],`defaultMode`:420}}],"      \
    "`containers`:[{`name`:`web`,`image`:`nginx:1.25`,"                                            \
    "`ports`:[{`containerPort`:80,`protocol`:`TCP`}],`resources`:{},"                              \
    "`terminationMessagePath`:`/dev/termination-log`,`imagePullPolicy`:`IfNotPresent`}],"          \
    "`restartPolicy`:`Always`,`terminationGracePeriodSeconds`:30,`dnsPolicy`:`ClusterFirst`,"      \
    "`serviceAccountName`:`default`,`serviceAccount`:`default`,`nodeName`:`node-a`,"               \
    "`securityContext`:{},`schedulerName`:`default-scheduler`,`priority`:0},"                      \
    "`status`:{`phase`:`Running`,`conditions`:[{`type`:`Ready`,`status`:`True`,"                   \
    "`lastProbeTime`:null,`lastTransitionTime`:`2024-05-01T10:00:05Z`}],"                          \
    "`hostIP`:`10.0.0.5`,`podIP`:`10.244.1.7`,`podIPs`:[{`ip`:`10.244.1.7`},{`ip`:`fd00::7`}],"    \
    "`startTime`:`2024-05-01T10:00:00Z`,`qosClass`:`BestEffort`}}"

/* The same kind of pod as a list item (no TypeMeta), metadata last, pending. */
#define POD2                                                                                       \
    "{`spec`:{`containers`:[{`name`:`c`,`image`:`busybox`,`args`:[`sh`,`-c`,`echo ]}`]}],"         \
    "`restartPolicy`:`Never`,`schedulerName`:`custom`,`hostNetwork`:true,"                         \
    "`serviceAccountName`:`builder`},"                                                             \
    "`status`:{`phase`:`Pending`,`nominatedNodeName`:`node-b`},"                                   \
    "`metadata`:{`namespace`:`ci`,`name`:`job-1`,`uid`:`u-2`,`resourceVersion`:`184470`,"          \
    "`labels`:{`job-name`:`job-1`}}}"

/* A node (cluster-scoped). */
#define NODE                                                                                       \
    "{`kind`:`Node`,`apiVersion`:`v1`,`metadata`:{`name`:`node-a`,`uid`:`n-1`,"                    \
    "`resourceVersion`:`99`,`labels`:{`kubernetes.io/hostname`:`node-a`,"                          \
    "`kubernetes.io/os`:`linux`,`beta.kubernetes.io/arch`:`amd64`,"                                \
    "`node-role.kubernetes.io/control-plane`:``}},"                                                \
    "`spec`:{`podCIDR`:`10.244.0.0/24`,`unschedulable`:true},"                                     \
    "`status`:{`addresses`:[{`type`:`InternalIP`,`address`:`10.0.0.5`}]}}"

/* A secret in unstructured (sorted) key order, being deleted. */
#define SECRET                                                                                     \
    "{`apiVersion`:`v1`,`data`:{`token`:`ZXlKaGJHY2lPaUpTVXpJMU5pSjk=`},`kind`:`Secret`,"          \
    "`metadata`:{`deletionTimestamp`:`2024-05-01T10:00:00Z`,`name`:`sa-token`,"                    \
    "`namespace`:`kube-system`,`resourceVersion`:`5`,`uid`:`s-1`},"                                \
    "`type`:`kubernetes.io/service-account-token`}"

/* A Status as kube-apiserver sends in an ERROR event when the rv is gone. */
#define EXPIRED                                                                                    \
    "{`kind`:`Status`,`apiVersion`:`v1`,`metadata`:{},`status`:`Failure`,"                         \
    "`message`:`too old resource version: 100 (2000)`,`reason`:`Expired`,`code`:410}"

#define BOOKMARK_END                                                                               \
    "{`kind`:`Pod`,`apiVersion`:`v1`,`metadata`:{`resourceVersion`:`184500`,"                      \
    "`creationTimestamp`:null,`annotations`:{`k8s.io/initial-events-end`:`true`}},"                \
    "`spec`:{`containers`:null},`status`:{}}"

static const struct obj_field pod_fields[] = {
    {"spec.nodeName", NULL},       {"spec.restartPolicy", NULL},
    {"spec.schedulerName", NULL},  {"spec.serviceAccountName", NULL},
    {"spec.hostNetwork", "false"}, {"status.phase", NULL},
    {"status.podIPs.0.ip", NULL},  {"status.nominatedNodeName", NULL},
    {"metadata.name", NULL},       {"metadata.namespace", NULL},
};
static const struct obj_fields_spec pod_spec = {pod_fields, KWC_ARRAY_LEN(pod_fields), 0, 0};

static const struct obj_field node_fields[] = {{"spec.unschedulable", "false"}};
static const struct obj_fields_spec node_spec = {node_fields, 1, 0, 0};

static const struct obj_field secret_fields[] = {{"type", NULL}};
static const struct obj_fields_spec secret_spec = {secret_fields, 1, 0, 0};

/* integers, arrays and odd paths */
static const struct obj_field misc_fields[] = {
    {"spec.replicas", NULL}, {"spec.ratio", NULL},  {"spec.list", NULL},   {"spec.obj", NULL},
    {"spec.nil", "dflt"},    {"spec.list.1", NULL}, {"spec.list.9", NULL}, {"spec..x", NULL},
    {"spec.obj.a", NULL},    {"spec.neg", NULL},    {"spec.f", NULL},
};
static const struct obj_fields_spec misc_spec = {misc_fields, KWC_ARRAY_LEN(misc_fields), 0, 0};

static const struct obj_fields_spec tiny_spec = {NULL, 0, 134, 2};

/* ---- obj_meta_parse ---- */

struct mcase {
    const char *what, *json;
    const struct obj_fields_spec *spec;
    int rc;
    const char *err_has; /* a phrase of the error text when rc != 0 */
    const char *kind, *api_version, *ns, *name, *uid;
    uint64_t rv;
    bool deleting;
    const char *labels; /* "k=v,..." sorted by key */
    const char *fields; /* values joined by '|' */
};

#define M_MD(rest) "{`metadata`:{`name`:`n`,`resourceVersion`:`1`" rest "}}"

/* clang-format off */
static const struct mcase mcases[] = {
    {"pod", POD, &pod_spec, 0, NULL, "Pod", "v1", "prod", "web-7d4b9c-x2x9k",
     "3f1c2a9e-5b7d-4c1e-9a2f-0d8e6b4c7a11", 184467, false,
     "app=web,app.kubernetes.io/name=web,pod-template-hash=7d4b9c",
     "node-a|Always|default-scheduler|default|false|Running|10.244.1.7||web-7d4b9c-x2x9k|prod"},
    {"list-item pod, metadata last", POD2, &pod_spec, 0, NULL, NULL, NULL, "ci", "job-1", "u-2",
     184470, false, "job-name=job-1", "|Never|custom|builder|true|Pending||node-b|job-1|ci"},
    {"pod without a spec: every field missing", "{`metadata`:{`name`:`p`,`resourceVersion`:`3`}}",
     &pod_spec, 0, NULL, NULL, NULL, "", "p", "", 3, false, "", "||||false||||p|"},
    {"node", NODE, &node_spec, 0, NULL, "Node", "v1", "", "node-a", "n-1", 99, false,
     "beta.kubernetes.io/arch=amd64,kubernetes.io/hostname=node-a,kubernetes.io/os=linux,"
     "node-role.kubernetes.io/control-plane=", "true"},
    {"secret, unstructured key order, deleting", SECRET, &secret_spec, 0, NULL, "Secret", "v1",
     "kube-system", "sa-token", "s-1", 5, true, "", "kubernetes.io/service-account-token"},
    {"no spec", "{`metadata`:{`name`:`a`,`resourceVersion`:`7`}}", NULL, 0, NULL, NULL, NULL, "",
     "a", "", 7, false, "", ""},
    {"whitespace everywhere",
     " \r\n\t{ `metadata` : { `name` : `a` , `resourceVersion` : `7` , `labels` : { } } } \n",
     NULL, 0, NULL, NULL, NULL, "", "a", "", 7, false, "", ""},
    {"escaped names decode", "{`kind`:`P\\u006fd`,`metadata`:{`n\\u0061me`:`caf\\u00e9`,"
     "`resourceVersion`:`7`,`labels`:{`\\u0061pp`:`\\\\x\\/y`,`nul-ok`:null}}}",
     NULL, 0, NULL, "Pod", NULL, "", "caf\xc3\xa9", "", 7, false, "app=\\x/y,nul-ok=", ""},
    {"deletionTimestamp null", M_MD(",`deletionTimestamp`:null"), NULL, 0, NULL, NULL, NULL, "",
     "n", "", 1, false, "", ""},
    {"nulls are absent", "{`kind`:null,`metadata`:{`name`:`n`,`namespace`:null,`uid`:null,"
     "`resourceVersion`:`1`,`labels`:null}}",
     NULL, 0, NULL, NULL, NULL, "", "n", "", 1, false, "", ""},
    {"\\u0000 in an annotation", M_MD(",`annotations`:{`a`:`x\\u0000y`}"), NULL, 0, NULL, NULL,
     NULL, "", "n", "", 1, false, "", ""},
    {"rv leading zeros (strconv.ParseUint)", "{`metadata`:{`name`:`n`,`resourceVersion`:`007`}}",
     NULL, 0, NULL, NULL, NULL, "", "n", "", 7, false, "", ""},
    {"rv max uint64", "{`metadata`:{`name`:`n`,`resourceVersion`:`18446744073709551615`}}", NULL,
     0, NULL, NULL, NULL, "", "n", "", UINT64_MAX, false, "", ""},
    {"field types",
     "{`metadata`:{`name`:`n`,`resourceVersion`:`1`},`spec`:{`replicas`:3,`ratio`:0.5,"
     "`list`:[`a`,`b`],`obj`:{`a`:false},`nil`:null,`neg`:-9223372036854775808,`f`:2.0}}",
     &misc_spec, 0, NULL, NULL, NULL, "", "n", "", 1, false, "",
     "3||||dflt|b|||false|-9223372036854775808|2"},
    {"integer beyond 64 bits elsewhere: read as reals",
     "{`metadata`:{`name`:`n`,`resourceVersion`:`1`},`spec`:{`replicas`:3,"
     "`big`:123456789012345678901234,`f`:2.0}}",
     &misc_spec, 0, NULL, NULL, NULL, "", "n", "", 1, false, "", "3||||dflt||||||2"},
    {"exactly max_bytes", "{`metadata`:{`name`:`n`,`resourceVersion`:`1`,"
     "`labels`:{`a`:`1`,`b`:`2`}},`pad`:`xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx`}",
     &tiny_spec, 0, NULL, NULL, NULL, "", "n", "", 1, false, "a=1,b=2", ""},

    /* errors */
    {"over max_bytes", "{`metadata`:{`name`:`n`,`resourceVersion`:`1`,"
     "`labels`:{`a`:`1`,`b`:`2`}},`pad`:`xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx`}",
     &tiny_spec, KWC_ETOOBIG, "over the limit"},
    {"labels over max_labels", M_MD(",`labels`:{`a`:`1`,`b`:`2`,`c`:`3`}"), &tiny_spec,
     KWC_ETOOBIG, "3 labels"},
    {"no metadata", "{`kind`:`Pod`,`spec`:{}}", NULL, KWC_EPARSE, "metadata missing"},
    {"metadata null", "{`metadata`:null}", NULL, KWC_EPARSE, "metadata missing"},
    {"metadata not an object", "{`metadata`:[]}", NULL, KWC_EPARSE, "not an object"},
    {"no name", "{`metadata`:{`resourceVersion`:`1`}}", NULL, KWC_EPARSE, "metadata.name"},
    {"empty name", "{`metadata`:{`name`:``,`resourceVersion`:`1`}}", NULL, KWC_EPARSE,
     "metadata.name"},
    {"name not a string", "{`metadata`:{`name`:5,`resourceVersion`:`1`}}", NULL, KWC_EPARSE,
     "metadata.name is not a string"},
    {"name with NUL", "{`metadata`:{`name`:`a\\u0000b`,`resourceVersion`:`1`}}", NULL,
     KWC_EPARSE, "NUL"},
    {"namespace not a string", M_MD(",`namespace`:{}"), NULL, KWC_EPARSE, "metadata.namespace"},
    {"no rv", "{`metadata`:{`name`:`n`}}", NULL, KWC_EPARSE, "resourceVersion missing"},
    {"rv empty", "{`metadata`:{`name`:`n`,`resourceVersion`:``}}", NULL, KWC_EPARSE,
     "resourceVersion missing"},
    {"rv not numeric", "{`metadata`:{`name`:`n`,`resourceVersion`:`abc`}}", NULL, KWC_EPARSE,
     "\"abc\" is not a decimal uint64"},
    {"rv trailing junk", "{`metadata`:{`name`:`n`,`resourceVersion`:`12a`}}", NULL, KWC_EPARSE,
     "decimal uint64"},
    {"rv signed", "{`metadata`:{`name`:`n`,`resourceVersion`:`+12`}}", NULL, KWC_EPARSE,
     "decimal uint64"},
    {"rv negative", "{`metadata`:{`name`:`n`,`resourceVersion`:`-1`}}", NULL, KWC_EPARSE,
     "decimal uint64"},
    {"rv space", "{`metadata`:{`name`:`n`,`resourceVersion`:` 1`}}", NULL, KWC_EPARSE,
     "decimal uint64"},
    {"rv overflow", "{`metadata`:{`name`:`n`,`resourceVersion`:`18446744073709551616`}}", NULL,
     KWC_EPARSE, "decimal uint64"},
    {"rv zero", "{`metadata`:{`name`:`n`,`resourceVersion`:`0`}}", NULL, KWC_EPARSE, "is 0"},
    {"rv a number", "{`metadata`:{`name`:`n`,`resourceVersion`:12}}", NULL, KWC_EPARSE,
     "not a string"},
    {"labels not an object", M_MD(",`labels`:[`a`]"), NULL, KWC_EPARSE, "labels"},
    {"label value not a string", M_MD(",`labels`:{`a`:1}"), NULL, KWC_EPARSE,
     "labels[\"a\"] is not a string"},
    {"label value with NUL", M_MD(",`labels`:{`a`:`\\u0000`}"), NULL, KWC_EPARSE, "NUL"},
    {"field value with NUL", "{`metadata`:{`name`:`n`,`resourceVersion`:`1`},"
     "`type`:`a\\u0000`}", &secret_spec, KWC_EPARSE, "NUL"},
    {"duplicate top-level key", "{`metadata`:{`name`:`n`,`resourceVersion`:`1`},`metadata`:{}}",
     NULL, KWC_EPARSE, "duplicate"},
    {"duplicate nested key", M_MD(",`labels`:{`a`:`1`,`a`:`2`}"), NULL, KWC_EPARSE, "duplicate"},
    {"duplicate key spelled with an escape", M_MD(",`labels`:{`a`:`1`,`\\u0061`:`2`}"), NULL,
     KWC_EPARSE, "duplicate"},
    {"truncated", "{`metadata`:{`name`:`n`,`resourceVersion`:`1`}", NULL, KWC_EPARSE,
     "invalid JSON"},
    {"truncated in a string", "{`metadata`:{`name`:`n", NULL, KWC_EPARSE, "invalid JSON"},
    {"trailing data", M_MD("") " {}", NULL, KWC_EPARSE, "invalid JSON"},
    {"two objects", M_MD("") M_MD(""), NULL, KWC_EPARSE, "invalid JSON"},
    {"array root", "[" M_MD("") "]", NULL, KWC_EPARSE, "not a JSON object"},
    {"string root", "`x`", NULL, KWC_EPARSE, "invalid JSON"},
    {"empty", "", NULL, KWC_EPARSE, "invalid JSON"},
    {"invalid UTF-8", M_MD(",`x`:`\xc3\x28`"), NULL, KWC_EPARSE, "invalid JSON"},
    {"overlong UTF-8", M_MD(",`x`:`\xc0\xaf`"), NULL, KWC_EPARSE, "invalid JSON"},
    {"lone surrogate", M_MD(",`x`:`\\ud800`"), NULL, KWC_EPARSE, "invalid JSON"},
    {"bad escape", M_MD(",`x`:`\\q`"), NULL, KWC_EPARSE, "invalid JSON"},
    {"raw newline in string", M_MD(",`x`:`a\nb`"), NULL, KWC_EPARSE, "invalid JSON"},
    {"leading zero", M_MD(",`x`:01"), NULL, KWC_EPARSE, "invalid JSON"},
    {"single quotes", "{'metadata':{}}", NULL, KWC_EPARSE, "invalid JSON"},
    {"real overflow", M_MD(",`x`:1e400"), NULL, KWC_EPARSE, "invalid JSON"},
};
/* clang-format on */

static void
test_meta_table(void)
{
    char err[256], buf[512], what[160];
    for (size_t i = 0; i < KWC_ARRAY_LEN(mcases); i++) {
        const struct mcase *c = &mcases[i];
        struct obj_meta m;
        err[0] = '\0';
        int rc = meta(J(c->json), c->spec, &m, err, sizeof(err));
        snprintf(what, sizeof(what), "%s: rc", c->what);
        is_int(rc, c->rc, what);
        if (rc != 0) {
            snprintf(what, sizeof(what), "%s: error says \"%s\"", c->what,
                     c->err_has ? c->err_has : "(no error expected)");
            if (!ok(c->err_has && strstr(err, c->err_has) != NULL, what))
                printf("#   err: %s\n", err);
            ok(m.name == NULL && m.arena_ == NULL && m.n_labels == 0, "zeroed on failure");
            obj_meta_fini(&m);
            continue;
        }
        if (*err)
            printf("#   unexpected err text: %s\n", err);
        snprintf(what, sizeof(what), "%s: kind", c->what);
        is_str(m.kind, c->kind, what);
        snprintf(what, sizeof(what), "%s: apiVersion", c->what);
        is_str(m.api_version, c->api_version, what);
        snprintf(what, sizeof(what), "%s: namespace", c->what);
        is_str(m.namespace_, c->ns, what);
        snprintf(what, sizeof(what), "%s: name", c->what);
        is_str(m.name, c->name, what);
        snprintf(what, sizeof(what), "%s: uid", c->what);
        is_str(m.uid, c->uid, what);
        snprintf(what, sizeof(what), "%s: rv", c->what);
        ok(m.rv == c->rv, what);
        snprintf(what, sizeof(what), "%s: deleting", c->what);
        is_int(m.deleting, c->deleting, what);
        snprintf(what, sizeof(what), "%s: labels", c->what);
        is_str(labels_str(&m, buf, sizeof(buf)), c->labels, what);
        snprintf(what, sizeof(what), "%s: fields", c->what);
        is_str(fields_str(&m, buf, sizeof(buf)), c->fields, what);
        obj_meta_fini(&m);
        obj_meta_fini(&m);
    }
}

static void
test_meta_annotation_bytes_untouched(void)
{
    /* The pod's escapes are metadata obj_meta does not extract; what it does
     * extract is decoded, never the raw text. */
    struct obj_meta m;
    is_int(meta(J(POD), &pod_spec, &m, NULL, 0), 0, "pod parses with err NULL");
    char buf[256];
    is_str(labels_str(&m, buf, sizeof(buf)),
           "app=web,app.kubernetes.io/name=web,pod-template-hash=7d4b9c",
           "the labels, escaped slash decoded, sorted, no other");
    obj_meta_fini(&m);
    obj_meta_fini(NULL);
}

static void
test_meta_raw_nul(void)
{
    /* jansson alone skips a raw NUL byte after a number and would accept this */
    static const char obj[] = "{\"metadata\":{\"name\":\"n\",\"resourceVersion\":\"1\"},\"x\":5\0}";
    struct obj_meta m;
    char err[128] = "";
    char *p = exact(obj, sizeof(obj) - 1);
    is_int(obj_meta_parse(p, sizeof(obj) - 1, NULL, &m, err, sizeof(err)), KWC_EPARSE,
           "raw NUL byte refused");
    ok(strstr(err, "NUL byte") != NULL, "error says NUL byte");
    free(p);

    static const char line[] = "{\"type\":\"ADDED\",\"object\":{\"x\":5\0}}";
    struct wevent ev;
    p = exact(line, sizeof(line) - 1);
    is_int(wevent_parse(p, sizeof(line) - 1, &ev, NULL, 0), KWC_EPARSE, "in an event line too");
    free(p);
}

/* "{"metadata":{...},"x":" + depth-2 arrays + "1" + "]..." + "}": the innermost
 * value sits at jansson depth `depth` */
static char *
deep_object(size_t depth, size_t *len)
{
    const char *head = "{\"metadata\":{\"name\":\"n\",\"resourceVersion\":\"1\"},\"x\":";
    size_t h = strlen(head), arrays = depth - 2;
    char *p = xmalloc(h + 2 * arrays + 3);
    memcpy(p, head, h);
    memset(p + h, '[', arrays);
    p[h + arrays] = '1';
    memset(p + h + arrays + 1, ']', arrays);
    p[h + 2 * arrays + 1] = '}';
    p[h + 2 * arrays + 2] = '\0';
    *len = h + 2 * arrays + 2;
    return p;
}

static void
test_meta_depth(void)
{
    struct obj_meta m;
    size_t n;
    char *p = deep_object(OBJ_MAX_DEPTH, &n);
    is_int(obj_meta_parse(p, n, NULL, &m, NULL, 0), 0, "nesting at OBJ_MAX_DEPTH parses");
    obj_meta_fini(&m);
    free(p);
    p = deep_object(OBJ_MAX_DEPTH + 1, &n);
    is_int(obj_meta_parse(p, n, NULL, &m, NULL, 0), KWC_EPARSE, "one level deeper is refused");
    free(p);
}

static void
test_meta_limits_default(void)
{
    /* the default label cap applies without a spec */
    size_t nl = OBJ_MAX_LABELS + 1, at = 0;
    char *p = xmalloc(nl * 24 + 128);
    at +=
        (size_t)sprintf(p, "{\"metadata\":{\"name\":\"n\",\"resourceVersion\":\"1\",\"labels\":{");
    for (size_t i = 0; i < nl; i++)
        at += (size_t)sprintf(p + at, "%s\"k%zu\":\"v\"", i ? "," : "", i);
    at += (size_t)sprintf(p + at, "}}}");
    struct obj_meta m;
    is_int(obj_meta_parse(p, at, NULL, &m, NULL, 0), KWC_ETOOBIG, "OBJ_MAX_LABELS + 1 labels");
    struct obj_fields_spec big = {NULL, 0, 0, nl};
    is_int(obj_meta_parse(p, at, &big, &m, NULL, 0), 0, "accepted under a raised cap");
    is_int(m.n_labels, nl, "every label");
    is_str(m.labels[0].key, "k0", "sorted by bytes: k0 first");
    is_str(m.labels[1].key, "k1", "then k1");
    is_str(m.labels[2].key, "k10", "then k10");
    obj_meta_fini(&m);
    free(p);

    char err[8];
    is_int(meta(J("{`metadata`:{}}"), NULL, &m, err, sizeof(err)), KWC_EPARSE, "short err buf");
    is_int(strlen(err), sizeof(err) - 1, "error text truncated, terminated");
}

/* ---- wevent_parse ---- */

struct wcase {
    const char *what, *line;
    int rc;
    const char *err_has;
    enum wevent_type type;
    const char *object; /* the exact span expected */
    uint64_t rv;
    bool end;
    int code;
    const char *reason, *message;
};

/* clang-format off */
static const struct wcase wcases[] = {
    {"ADDED pod", "{`type`:`ADDED`,`object`:" POD "}", 0, NULL, WEVENT_ADDED, POD},
    {"object before type", "{`object`:" POD ",`type`:`MODIFIED`}", 0, NULL, WEVENT_MODIFIED, POD},
    {"DELETED secret", "{`type`:`DELETED`,`object`:" SECRET "}", 0, NULL, WEVENT_DELETED, SECRET},
    {"whitespace around everything", " {\t`type` :\r\n`ADDED` , `object` :  " NODE "  } \r",
     0, NULL, WEVENT_ADDED, NODE},
    {"escaped keys and type", "{`typ\\u0065`:`ADD\\u0045D`,`\\u006fbject`:" NODE "}", 0, NULL,
     WEVENT_ADDED, NODE},
    {"extra keys ignored", "{`kind`:`WatchEvent`,`type`:`ADDED`,`x`:{`object`:1},`object`:"
     POD2 ",`y`:[`}`]}", 0, NULL, WEVENT_ADDED, POD2},
    {"empty object", "{`type`:`ADDED`,`object`:{}}", 0, NULL, WEVENT_ADDED, "{}"},
    {"BOOKMARK ending initial events", "{`type`:`BOOKMARK`,`object`:" BOOKMARK_END "}", 0, NULL,
     WEVENT_BOOKMARK, BOOKMARK_END, 184500, true},
    {"plain BOOKMARK",
     "{`type`:`BOOKMARK`,`object`:{`kind`:`Pod`,`apiVersion`:`v1`,`metadata`:"
     "{`resourceVersion`:`42`,`annotations`:{`k8s.io/initial-events-end`:`false`}}}}",
     0, NULL, WEVENT_BOOKMARK,
     "{`kind`:`Pod`,`apiVersion`:`v1`,`metadata`:"
     "{`resourceVersion`:`42`,`annotations`:{`k8s.io/initial-events-end`:`false`}}}", 42},
    {"ERROR 410 Expired", "{`type`:`ERROR`,`object`:" EXPIRED "}", 0, NULL, WEVENT_ERROR, EXPIRED,
     0, false, 410, "Expired", "too old resource version: 100 (2000)"},
    {"ERROR without details", "{`object`:{`kind`:`Status`},`type`:`ERROR`}", 0, NULL,
     WEVENT_ERROR, "{`kind`:`Status`}", 0, false, 0, "", ""},
    {"ERROR message with escapes",
     "{`type`:`ERROR`,`object`:{`code`:500,`message`:`a \\`b\\`\\n\\u00e9`}}", 0, NULL,
     WEVENT_ERROR, "{`code`:500,`message`:`a \\`b\\`\\n\\u00e9`}", 0, false, 500, "",
     "a \"b\"\n\xc3\xa9"},

    /* errors */
    {"unknown type", "{`type`:`UPDATED`,`object`:{}}", KWC_EPARSE, "unknown watch event type"},
    {"type in lower case", "{`type`:`added`,`object`:{}}", KWC_EPARSE, "unknown"},
    {"type with NUL", "{`type`:`ADDED\\u0000`,`object`:{}}", KWC_EPARSE, "unknown"},
    {"type not a string", "{`type`:1,`object`:{}}", KWC_EPARSE, "unknown"},
    {"Type capitalised is another key", "{`Type`:`ADDED`,`object`:{}}", KWC_EPARSE, "no \"type\""},
    {"no object", "{`type`:`ADDED`}", KWC_EPARSE, "no \"object\""},
    {"object null", "{`type`:`ADDED`,`object`:null}", KWC_EPARSE, "not a JSON object"},
    {"object an array", "{`type`:`ADDED`,`object`:[" POD "]}", KWC_EPARSE, "not a JSON object"},
    {"duplicate type", "{`type`:`ADDED`,`object`:{},`type`:`DELETED`}", KWC_EPARSE, "duplicate"},
    {"duplicate object", "{`type`:`ADDED`,`object`:{},`object`:{}}", KWC_EPARSE, "duplicate"},
    {"duplicate object via escape", "{`type`:`ADDED`,`object`:{},`obj\\u0065ct`:{}}", KWC_EPARSE,
     "duplicate"},
    {"truncated", "{`type`:`ADDED`,`object`:{`metadata`:{`name`:`a`}", KWC_EPARSE, "invalid JSON"},
    {"truncated in a string", "{`type`:`ADDED`,`object`:{`a`:`b\\", KWC_EPARSE, "invalid JSON"},
    {"two events on a line", "{`type`:`ADDED`,`object`:{}}{`type`:`ADDED`,`object`:{}}",
     KWC_EPARSE, "data after"},
    {"trailing comma", "{`type`:`ADDED`,`object`:{},}", KWC_EPARSE, "expected a key"},
    {"missing colon", "{`type` `ADDED`,`object`:{}}", KWC_EPARSE, "expected ':'"},
    {"array line", "[{`type`:`ADDED`,`object`:{}}]", KWC_EPARSE, "not a JSON object"},
    {"blank", "   ", KWC_EPARSE, "not a JSON object"},
    {"empty", "", KWC_EPARSE, "not a JSON object"},
    {"bad number inside object", "{`type`:`ADDED`,`object`:{`a`:01}}", KWC_EPARSE,
     "expected ',' or '}'"},
    {"bad literal inside object", "{`type`:`ADDED`,`object`:{`a`:tru}}", KWC_EPARSE,
     "invalid literal"},
    {"invalid UTF-8 inside object", "{`type`:`ADDED`,`object`:{`a`:`\xff`}}", KWC_EPARSE,
     "invalid UTF-8"},
    {"surrogate half as UTF-8", "{`type`:`ADDED`,`object`:{`a`:`\xed\xa0\x80`}}", KWC_EPARSE,
     "invalid UTF-8"},
    {"lone high surrogate", "{`type`:`ADDED`,`object`:{`a`:`\\ud83d x`}}", KWC_EPARSE,
     "surrogate"},
    {"lone low surrogate", "{`type`:`ADDED`,`object`:{`a`:`\\ude00`}}", KWC_EPARSE, "surrogate"},
    {"short \\u escape", "{`type`:`ADDED`,`object`:{`a`:`\\u12`}}", KWC_EPARSE, "\\u escape"},
    {"control character", "{`type`:`ADDED`,`object`:{`a`:`\t`}}", KWC_EPARSE, "control"},
    {"BOOKMARK without rv", "{`type`:`BOOKMARK`,`object`:{`metadata`:{}}}", KWC_EPARSE,
     "resourceVersion missing"},
    {"BOOKMARK without metadata", "{`type`:`BOOKMARK`,`object`:{}}", KWC_EPARSE, "no metadata"},
    {"BOOKMARK rv not numeric", "{`type`:`BOOKMARK`,`object`:{`metadata`:"
     "{`resourceVersion`:`12x`}}}", KWC_EPARSE, "decimal uint64"},
    {"ERROR status with duplicate keys", "{`type`:`ERROR`,`object`:{`code`:1,`code`:2}}",
     KWC_EPARSE, "duplicate"},
    {"ERROR reason not a string", "{`type`:`ERROR`,`object`:{`reason`:1}}", KWC_EPARSE,
     "reason is not a string"},
};
/* clang-format on */

static void
test_wevent_table(void)
{
    char err[256], what[160];
    for (size_t i = 0; i < KWC_ARRAY_LEN(wcases); i++) {
        const struct wcase *c = &wcases[i];
        const char *line = J(c->line);
        size_t n = strlen(line);
        char *p = exact(line, n);
        struct wevent ev;
        err[0] = '\0';
        int rc = wevent_parse(p, n, &ev, err, sizeof(err));
        snprintf(what, sizeof(what), "%s: rc", c->what);
        is_int(rc, c->rc, what);
        if (rc != 0) {
            snprintf(what, sizeof(what), "%s: error says \"%s\"", c->what,
                     c->err_has ? c->err_has : "(no error expected)");
            if (!ok(c->err_has && strstr(err, c->err_has) != NULL, what))
                printf("#   err: %s\n", err);
            ok(ev.arena_ == NULL && ev.obj_len == 0, "zeroed on failure");
            wevent_fini(&ev);
            free(p);
            continue;
        }
        const char *want = J(c->object);
        snprintf(what, sizeof(what), "%s: type", c->what);
        is_int(ev.type, c->type, what);
        snprintf(what, sizeof(what), "%s: object span, byte for byte", c->what);
        ok(ev.obj_off + ev.obj_len <= n, "span inside the line");
        is_mem(p + ev.obj_off, ev.obj_len, want, strlen(want), what);
        snprintf(what, sizeof(what), "%s: rv", c->what);
        ok(ev.rv == c->rv, what);
        snprintf(what, sizeof(what), "%s: initial-events-end", c->what);
        is_int(ev.initial_events_end, c->end, what);
        if (c->type == WEVENT_ERROR) {
            snprintf(what, sizeof(what), "%s: Status", c->what);
            is_int(ev.code, c->code, what);
            is_str(ev.reason, c->reason, what);
            is_str(ev.message, c->message, what);
        } else {
            ok(ev.reason == NULL && ev.message == NULL, "no Status for this type");
        }
        wevent_fini(&ev);
        wevent_fini(&ev);
        free(p);
    }
    wevent_fini(NULL);
}

static void
test_wevent_then_meta(void)
{
    /* the reflector's path: line -> span -> metadata */
    const char *line = J("{`type`:`MODIFIED`,`object`:" POD2 "}");
    struct wevent ev;
    struct obj_meta m;
    is_int(wevent_parse(line, strlen(line), &ev, NULL, 0), 0, "event");
    is_int(obj_meta_parse(line + ev.obj_off, ev.obj_len, &pod_spec, &m, NULL, 0), 0, "meta");
    is_str(m.name, "job-1", "name from the span");
    is_int(m.rv, 184470, "rv from the span");
    obj_meta_fini(&m);
    wevent_fini(&ev);

    /* An ADDED object is only syntax-checked by wevent_parse: duplicates deep
     * inside are obj_meta_parse's to refuse. */
    line = J("{`type`:`ADDED`,`object`:{`metadata`:{`name`:`a`,`name`:`b`,"
             "`resourceVersion`:`1`}}}");
    is_int(wevent_parse(line, strlen(line), &ev, NULL, 0), 0, "envelope fine");
    is_int(obj_meta_parse(line + ev.obj_off, ev.obj_len, NULL, &m, NULL, 0), KWC_EPARSE,
           "duplicate name refused by obj_meta_parse");
    wevent_fini(&ev);
}

static void
test_wevent_depth(void)
{
    /* An object nested OBJ_MAX_DEPTH deep (as jansson counts from the object)
     * is accepted inside an event line; one more level is not. */
    for (size_t extra = 0; extra < 2; extra++) {
        size_t n, depth = OBJ_MAX_DEPTH + extra;
        char *obj = deep_object(depth, &n);
        char *line = xasprintf("{\"type\":\"ADDED\",\"object\":%s}", obj);
        struct wevent ev;
        char what[80];
        snprintf(what, sizeof(what), "object depth %zu", depth);
        is_int(wevent_parse(line, strlen(line), &ev, NULL, 0), extra ? KWC_EPARSE : 0, what);
        if (!extra)
            is_mem(line + ev.obj_off, ev.obj_len, obj, n, "deep object span");
        wevent_fini(&ev);
        free(line);
        free(obj);
    }
    /* a hostile line of a million '[' costs no C stack */
    size_t n = 1000000;
    char *p = xmalloc(n + 30);
    int h = sprintf(p, "{\"type\":\"ADDED\",\"object\":");
    memset(p + h, '[', n);
    struct wevent ev;
    is_int(wevent_parse(p, (size_t)h + n, &ev, NULL, 0), KWC_EPARSE, "a million '['");
    free(p);
}

static void
test_wevent_names(void)
{
    is_str(wevent_type_name(WEVENT_ADDED), "ADDED", "ADDED");
    is_str(wevent_type_name(WEVENT_MODIFIED), "MODIFIED", "MODIFIED");
    is_str(wevent_type_name(WEVENT_DELETED), "DELETED", "DELETED");
    is_str(wevent_type_name(WEVENT_BOOKMARK), "BOOKMARK", "BOOKMARK");
    is_str(wevent_type_name(WEVENT_ERROR), "ERROR", "ERROR");
}

/* ---- wframe splitter ---- */

static uint32_t rng_state;

static uint32_t
rng(void)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return rng_state >> 8;
}

/* The stream and the lines a reader must get from it. */
static const char *stream_lines[8];
static size_t n_stream_lines;

static char *
build_stream(size_t *len)
{
    const char *ev[] = {
        J("{`type`:`ADDED`,`object`:" POD "}"),
        J("{`type`:`ADDED`,`object`:" NODE "}"),
        J("{`type`:`MODIFIED`,`object`:" POD2 "}"),
        J("{`type`:`BOOKMARK`,`object`:" BOOKMARK_END "}"),
        J("{`type`:`DELETED`,`object`:" SECRET "}"),
        J("{`type`:`ERROR`,`object`:" EXPIRED "}"),
    };
    n_stream_lines = KWC_ARRAY_LEN(ev);
    /* blank lines between events are skipped */
    char *s =
        xasprintf("%s\n%s\n\n%s\n \r\n%s\n%s\n%s\n", ev[0], ev[1], ev[2], ev[3], ev[4], ev[5]);
    for (size_t i = 0; i < n_stream_lines; i++)
        stream_lines[i] = ev[i];
    *len = strlen(s);
    return s;
}

/* Feed the stream in pieces (sizes from next_size) and check every line. */
static void
split_check(const char *what, size_t (*next_size)(size_t left))
{
    size_t len, got = 0, bad_lines = 0, bad_events = 0;
    char *stream = build_stream(&len);
    struct wframe_splitter s;
    wframe_init(&s, 0);
    for (size_t at = 0; at < len;) {
        size_t n = next_size(len - at);
        char *chunk = exact(stream + at, n); /* freed before the next chunk */
        const char *data = chunk, *line;
        size_t left = n, line_len;
        int rc;
        while ((rc = wframe_next(&s, &data, &left, &line, &line_len)) == 1) {
            if (got >= n_stream_lines || line_len != strlen(stream_lines[got]) ||
                memcmp(line, stream_lines[got], line_len) != 0)
                bad_lines++;
            struct wevent ev;
            if (wevent_parse(line, line_len, &ev, NULL, 0) != 0)
                bad_events++;
            wevent_fini(&ev);
            got++;
        }
        if (rc != 0 || left != 0)
            bad_lines++;
        free(chunk);
        at += n;
    }
    char w[160];
    snprintf(w, sizeof(w), "%s: every line, in order", what);
    is_int(got, n_stream_lines, w);
    snprintf(w, sizeof(w), "%s: lines byte for byte", what);
    is_int(bad_lines, 0, w);
    snprintf(w, sizeof(w), "%s: each line is an event", what);
    is_int(bad_events, 0, w);
    snprintf(w, sizeof(w), "%s: nothing pending at the end", what);
    is_int(wframe_pending(&s), 0, w);
    wframe_fini(&s);
    free(stream);
}

static size_t
whole(size_t left)
{
    return left;
}

static size_t
one_byte(size_t left)
{
    (void)left;
    return 1;
}

static size_t
random_piece(size_t left)
{
    size_t n = 1 + rng() % 700;
    return n < left ? n : left;
}

static void
test_split(void)
{
    split_check("one chunk", whole);
    split_check("one byte at a time", one_byte);
    for (uint32_t seed = 1; seed <= 20; seed++) {
        char what[64];
        rng_state = seed;
        snprintf(what, sizeof(what), "random pieces, seed %u", seed);
        split_check(what, random_piece);
    }
}

static void
test_split_in_place(void)
{
    const char *data = "{\"a\":1}\n{\"b\":2}\n{\"c\"", *p = data, *line;
    size_t left = strlen(data), n;
    struct wframe_splitter s;
    wframe_init(&s, 64);
    is_int(wframe_next(&s, &p, &left, &line, &n), 1, "first line");
    ok(line == data && n == 7, "returned in place, without the newline");
    is_int(wframe_next(&s, &p, &left, &line, &n), 1, "second line");
    ok(line == data + 8 && n == 7, "in place too");
    is_int(wframe_next(&s, &p, &left, &line, &n), 0, "chunk used up");
    is_int(left, 0, "all consumed");
    is_int(wframe_pending(&s), 4, "partial line kept");
    const char *rest = ":3}\n", *q = rest;
    left = strlen(rest);
    is_int(wframe_next(&s, &q, &left, &line, &n), 1, "line across chunks");
    is_mem(line, n, "{\"c\":3}", 7, "joined");
    is_int(wframe_pending(&s), 0, "nothing pending after a line is handed out");
    is_int(wframe_next(&s, &q, &left, &line, &n), 0, "then nothing");
    is_int(wframe_next(&s, &q, &left, &line, &n), 0, "idempotent on an empty chunk");
    const char *cut = "{\"type\":\"ADD", *r = cut;
    left = strlen(cut);
    is_int(wframe_next(&s, &r, &left, &line, &n), 0, "stream ends mid-event");
    is_int(wframe_pending(&s), strlen(cut), "pending says so");
    wframe_fini(&s);
    wframe_fini(NULL);
}

static void
test_split_cap(void)
{
    enum { CAP = 100 };
    char fits[CAP + 2], over[CAP + 3];
    memset(fits, 'x', CAP);
    fits[CAP] = '\n';
    memset(over, 'y', CAP + 1);
    over[CAP + 1] = '\n';
    const char *p, *line;
    size_t left, n;
    struct wframe_splitter s;

    /* in one chunk */
    wframe_init(&s, CAP);
    p = fits;
    left = CAP + 1;
    is_int(wframe_next(&s, &p, &left, &line, &n), 1, "a line of exactly max_line");
    is_int(n, CAP, "its length");
    p = over;
    left = CAP + 2;
    is_int(wframe_next(&s, &p, &left, &line, &n), KWC_ETOOBIG, "max_line + 1 in one chunk");
    p = fits;
    left = CAP + 1;
    is_int(wframe_next(&s, &p, &left, &line, &n), KWC_ETOOBIG, "sticky");
    wframe_fini(&s);

    /* across chunks, one byte at a time */
    for (int which = 0; which < 2; which++) {
        const char *src = which ? over : fits;
        size_t total = which ? CAP + 2 : CAP + 1;
        int last = 0;
        wframe_init(&s, CAP);
        for (size_t i = 0; i < total && last >= 0; i++) {
            p = src + i;
            left = 1;
            last = wframe_next(&s, &p, &left, &line, &n);
            ok(s.cap <= CAP, "never buffers more than max_line");
        }
        if (which) {
            is_int(last, KWC_ETOOBIG, "max_line + 1 across chunks");
        } else {
            is_int(last, 1, "max_line across chunks");
            is_int(n, CAP, "its length");
        }
        wframe_fini(&s);
    }

    /* no newline at all: the partial line is bounded too */
    wframe_init(&s, CAP);
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        p = fits;
        left = CAP / 2;
        rc = wframe_next(&s, &p, &left, &line, &n);
    }
    is_int(rc, KWC_ETOOBIG, "a partial line past max_line");
    wframe_fini(&s);

    /* a 3 MiB line across two chunks: joined, then its buffer released */
    size_t big = 3u << 20;
    char *b = xmalloc(big + 1);
    memset(b, 'z', big);
    b[big] = '\n';
    wframe_init(&s, 0);
    p = b;
    left = big / 2;
    is_int(wframe_next(&s, &p, &left, &line, &n), 0, "first half kept");
    left = big + 1 - big / 2;
    is_int(wframe_next(&s, &p, &left, &line, &n), 1, "the big line");
    is_int(n, big, "whole");
    ok(line != b + big / 2 && s.cap >= big, "joined in the splitter's buffer");
    const char *tail = "{}\n";
    p = tail;
    left = 3;
    is_int(wframe_next(&s, &p, &left, &line, &n), 1, "next line");
    ok(s.cap == 0 && s.buf == NULL, "big buffer released once consumed");
    wframe_fini(&s);
    free(b);
}

/* ---- LIST bodies ---- */

#define LIST_HEAD "{`kind`:`PodList`,`apiVersion`:`v1`,"
#define LIST_META                                                                                  \
    "`metadata`:{`resourceVersion`:`184480`,`continue`:`eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ`,"          \
    "`remainingItemCount`:1234}"
#define ITEM3                                                                                      \
    "{`metadata`:{`name`:`z`,`namespace`:`prod`,`resourceVersion`:`9`,"                            \
    "`annotations`:{`a`:`]}],\\`{[`}},`spec`:{`x`:[[],[{}],{`y`:[1,-2.5e3,true,false,null]}]}}"

struct lcase {
    const char *what, *body;
    int rc;
    const char *err_has;
    const char *kind, *api_version;
    uint64_t rv;
    const char *cont;
    bool has_remaining;
    int64_t remaining;
    const char *items[4]; /* exact spans, NULL-terminated */
};

/* clang-format off */
static const struct lcase lcases[] = {
    {"PodList page", LIST_HEAD LIST_META ",`items`:[" POD2 "," ITEM3 "]}", 0, NULL, "PodList",
     "v1", 184480, "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ", true, 1234, {POD2, ITEM3}},
    {"items before metadata, kind last",
     "{`items`:[" ITEM3 "," POD "," POD2 "],`metadata`:{`resourceVersion`:`7`},`kind`:`PodList`}",
     0, NULL, "PodList", NULL, 7, "", false, 0, {ITEM3, POD, POD2}},
    {"pretty-printed", "{\n  `kind` : `NodeList`,\n  `apiVersion`: `v1`,\n  `metadata`: "
     "{ `resourceVersion`: `12` },\n  `items`: [\n    " NODE " ,\n\t" NODE "\n  ]\n}\n",
     0, NULL, "NodeList", "v1", 12, "", false, 0, {NODE, NODE}},
    {"empty items", LIST_HEAD "`metadata`:{`resourceVersion`:`5`},`items`:[ ]}", 0, NULL,
     "PodList", "v1", 5, "", false, 0, {NULL}},
    {"items null", "{`metadata`:{`resourceVersion`:`5`},`items`:null}", 0, NULL, NULL, NULL, 5,
     "", false, 0, {NULL}},
    {"no items", "{`metadata`:{`resourceVersion`:`5`,`remainingItemCount`:null}}", 0, NULL, NULL,
     NULL, 5, "", false, 0, {NULL}},
    {"escaped keys, continue with escapes, remaining 0",
     "{`k\\u0069nd`:`Pod\\u004cist`,`metadata`:{`resourceVersion`:`5`,`continue`:`a\\/b`,"
     "`remainingItemCount`:0},`\\u0069tems`:[{}],`other`:{`items`:[1]}}",
     0, NULL, "PodList", NULL, 5, "a/b", true, 0, {"{}"}},

    /* errors */
    {"no metadata", "{`items`:[]}", KWC_EPARSE, "no metadata"},
    {"metadata null", "{`metadata`:null,`items`:[]}", KWC_EPARSE, "no metadata"},
    {"metadata not an object", "{`metadata`:[],`items`:[]}", KWC_EPARSE, "not a JSON object"},
    {"no rv", "{`metadata`:{},`items`:[]}", KWC_EPARSE, "resourceVersion missing"},
    {"rv not numeric", "{`metadata`:{`resourceVersion`:`x1`},`items`:[]}", KWC_EPARSE,
     "decimal uint64"},
    {"remainingItemCount not an integer",
     "{`metadata`:{`resourceVersion`:`1`,`remainingItemCount`:`5`}}", KWC_EPARSE,
     "remainingItemCount"},
    {"continue not a string", "{`metadata`:{`resourceVersion`:`1`,`continue`:5}}", KWC_EPARSE,
     "continue is not a string"},
    {"kind not a string", "{`kind`:5,`metadata`:{`resourceVersion`:`1`}}", KWC_EPARSE,
     "kind is not a string"},
    {"items not an array", "{`metadata`:{`resourceVersion`:`1`},`items`:{}}", KWC_EPARSE,
     "items is not an array"},
    {"an item not an object", "{`metadata`:{`resourceVersion`:`1`},`items`:[{},1]}", KWC_EPARSE,
     "an item is not a JSON object"},
    {"an item invalid inside", "{`metadata`:{`resourceVersion`:`1`},`items`:[{`a`:[}]}",
     KWC_EPARSE, "invalid JSON"},
    {"trailing comma in items", "{`metadata`:{`resourceVersion`:`1`},`items`:[{},]}", KWC_EPARSE,
     "an item is not a JSON object"},
    {"duplicate items", "{`metadata`:{`resourceVersion`:`1`},`items`:[],`items`:[{}]}",
     KWC_EPARSE, "duplicate key \"items\""},
    {"duplicate metadata after null",
     "{`metadata`:null,`metadata`:{`resourceVersion`:`1`}}", KWC_EPARSE, "duplicate"},
    {"duplicate metadata keys inside", "{`metadata`:{`resourceVersion`:`1`,`continue`:`a`,"
     "`continue`:`b`}}", KWC_EPARSE, "duplicate"},
    {"truncated", LIST_HEAD LIST_META ",`items`:[" POD2 "," ITEM3, KWC_EPARSE, "invalid JSON"},
    {"truncated after items", LIST_HEAD LIST_META ",`items`:[" POD2 "]", KWC_EPARSE,
     "invalid JSON"},
    {"trailing data", "{`metadata`:{`resourceVersion`:`1`}}x", KWC_EPARSE, "data after"},
    {"array body", "[{`metadata`:{`resourceVersion`:`1`}}]", KWC_EPARSE, "not a JSON object"},
};
/* clang-format on */

static void
test_list_table(void)
{
    char err[256], what[160];
    for (size_t i = 0; i < KWC_ARRAY_LEN(lcases); i++) {
        const struct lcase *c = &lcases[i];
        const char *body = J(c->body);
        size_t n = strlen(body);
        char *p = exact(body, n);
        struct obj_list l;
        err[0] = '\0';
        int rc = obj_list_init(&l, p, n, err, sizeof(err));
        snprintf(what, sizeof(what), "%s: rc", c->what);
        is_int(rc, c->rc, what);
        if (rc != 0) {
            snprintf(what, sizeof(what), "%s: error says \"%s\"", c->what,
                     c->err_has ? c->err_has : "(no error expected)");
            if (!ok(c->err_has && strstr(err, c->err_has) != NULL, what))
                printf("#   err: %s\n", err);
            ok(l.arena_ == NULL && l.body_ == NULL, "zeroed on failure");
            obj_list_fini(&l);
            free(p);
            continue;
        }
        snprintf(what, sizeof(what), "%s: kind/apiVersion", c->what);
        is_str(l.kind, c->kind, what);
        is_str(l.api_version, c->api_version, what);
        snprintf(what, sizeof(what), "%s: metadata", c->what);
        ok(l.rv == c->rv, what);
        is_str(l.continue_, c->cont, what);
        is_int(l.has_remaining, c->has_remaining, what);
        is_int(l.remaining, c->remaining, what);
        size_t want_n = 0;
        while (want_n < 4 && c->items[want_n])
            want_n++;
        snprintf(what, sizeof(what), "%s: n_items", c->what);
        is_int(l.n_items, want_n, what);
        size_t off, len, k = 0;
        while (obj_list_next(&l, &off, &len) == 1) {
            snprintf(what, sizeof(what), "%s: item %zu byte for byte", c->what, k);
            if (k < want_n) {
                const char *want = J(c->items[k]);
                is_mem(p + off, len, want, strlen(want), what);
            } else {
                ok(0, what);
            }
            k++;
        }
        snprintf(what, sizeof(what), "%s: every item, then 0", c->what);
        is_int(k, want_n, what);
        is_int(obj_list_next(&l, &off, &len), 0, "stays at the end");
        obj_list_fini(&l);
        obj_list_fini(&l);
        free(p);
    }
    obj_list_fini(NULL);
}

static void
test_list_items_meta(void)
{
    const char *body = J(LIST_HEAD LIST_META ",`items`:[" POD2 "," ITEM3 "," POD "]}");
    struct obj_list l;
    is_int(obj_list_init(&l, body, strlen(body), NULL, 0), 0, "list");
    const char *names[] = {"job-1", "z", "web-7d4b9c-x2x9k"};
    uint64_t rvs[] = {184470, 9, 184467};
    size_t off, len, k = 0;
    while (obj_list_next(&l, &off, &len) == 1 && k < 3) {
        struct obj_meta m;
        is_int(obj_meta_parse(body + off, len, &pod_spec, &m, NULL, 0), 0, "item parses");
        is_str(m.name, names[k], "item name");
        ok(m.rv == rvs[k], "item rv");
        obj_meta_fini(&m);
        k++;
    }
    is_int(k, 3, "three items");
    obj_list_fini(&l);

    /* depth inside a list: items at jansson's limit pass, deeper fail */
    for (size_t extra = 0; extra < 2; extra++) {
        size_t n;
        char *obj = deep_object(OBJ_MAX_DEPTH + extra, &n);
        char *b = xasprintf("{\"metadata\":{\"resourceVersion\":\"1\"},\"items\":[%s]}", obj);
        is_int(obj_list_init(&l, b, strlen(b), NULL, 0), extra ? KWC_EPARSE : 0,
               extra ? "an item one level too deep" : "an item at OBJ_MAX_DEPTH");
        if (!extra && obj_list_next(&l, &off, &len) == 1)
            is_mem(b + off, len, obj, n, "deep item span");
        obj_list_fini(&l);
        free(b);
        free(obj);
    }

    /* list metadata over its bound */
    size_t pad = OBJ_LIST_MAX_META;
    char *big = xmalloc(pad + 100);
    int h = sprintf(big, "{\"metadata\":{\"resourceVersion\":\"1\",\"x\":\"");
    memset(big + h, 'a', pad);
    strcpy(big + h + pad, "\"},\"items\":[]}");
    is_int(obj_list_init(&l, big, strlen(big), NULL, 0), KWC_ETOOBIG, "metadata too big");
    free(big);
}

int
main(void)
{
    TAP_RUN(test_meta_table);
    TAP_RUN(test_meta_annotation_bytes_untouched);
    TAP_RUN(test_meta_raw_nul);
    TAP_RUN(test_meta_depth);
    TAP_RUN(test_meta_limits_default);
    TAP_RUN(test_wevent_table);
    TAP_RUN(test_wevent_then_meta);
    TAP_RUN(test_wevent_depth);
    TAP_RUN(test_wevent_names);
    TAP_RUN(test_split);
    TAP_RUN(test_split_in_place);
    TAP_RUN(test_split_cap);
    TAP_RUN(test_list_table);
    TAP_RUN(test_list_items_meta);
    for (size_t i = 0; i < npool; i++)
        free(pool[i]);
    return tap_done();
}
