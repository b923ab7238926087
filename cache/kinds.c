/*
 * kinds.c — the field-selector table (see kinds.h). One X-macro row per
 * resource; "missing" is what kube's field set holds when the object lacks the
 * field (a bool field reads "false", everything else "").
 */
#include "kwc/kinds.h"

#include <string.h>

#include "kwc/base.h"

#define META                                                                                       \
    {"metadata.name", NULL},                                                                       \
    {                                                                                              \
        "metadata.namespace", NULL                                                                 \
    }

static const struct obj_field f_meta[] = {META};
static const struct obj_field f_pods[] = {
    META,
    {"spec.nodeName", NULL},
    {"spec.restartPolicy", NULL},
    {"spec.schedulerName", NULL},
    {"spec.serviceAccountName", NULL},
    {"spec.hostNetwork", "false"},
    {"status.phase", NULL},
    {"status.podIP", NULL},
    {"status.nominatedNodeName", NULL},
};
static const struct obj_field f_secrets[] = {META, {"type", NULL}};
static const struct obj_field f_nodes[] = {META, {"spec.unschedulable", "false"}};
static const struct obj_field f_namespaces[] = {META, {"status.phase", NULL}};
static const struct obj_field f_replicationcontrollers[] = {META, {"status.replicas", NULL}};
static const struct obj_field f_jobs[] = {META, {"status.successful", NULL}};
static const struct obj_field f_events[] = {
    META,
    {"involvedObject.kind", NULL},
    {"involvedObject.namespace", NULL},
    {"involvedObject.name", NULL},
    {"involvedObject.uid", NULL},
    {"involvedObject.apiVersion", NULL},
    {"involvedObject.resourceVersion", NULL},
    {"involvedObject.fieldPath", NULL},
    {"reason", NULL},
    {"reportingComponent", NULL},
    {"source", NULL},
    {"type", NULL},
};

#define KINDS_TABLE(X)                                                                             \
    X("", "pods", f_pods)                                                                          \
    X("", "secrets", f_secrets)                                                                    \
    X("", "nodes", f_nodes)                                                                        \
    X("", "namespaces", f_namespaces)                                                              \
    X("", "replicationcontrollers", f_replicationcontrollers)                                      \
    X("", "events", f_events)                                                                      \
    X("batch", "jobs", f_jobs)

const struct obj_field *
kinds_fields(const char *group, const char *resource, size_t *n)
{
#define KINDS_ROW(g, r, arr)                                                                       \
    if (strcmp(group, g) == 0 && strcmp(resource, r) == 0) {                                       \
        *n = KWC_ARRAY_LEN(arr);                                                                   \
        return arr;                                                                                \
    }
    KINDS_TABLE(KINDS_ROW)
#undef KINDS_ROW
    *n = KWC_ARRAY_LEN(f_meta);
    return f_meta;
}

bool
kinds_builtin_group(const char *group)
{
    size_t l = strlen(group);
    if (l == 0 || !strchr(group, '.'))
        return true; /* core, apps, batch, policy, autoscaling, ... */
    return l > 7 && strcmp(group + l - 7, ".k8s.io") == 0;
}

int
kinds_index_field(const char *group, const char *resource)
{
    /* the kubelet's list and watch: pods by spec.nodeName (field 2 of f_pods) */
    if (strcmp(group, "") == 0 && strcmp(resource, "pods") == 0)
        return 2;
    return -1;
}
