// The npm @kubernetes/client-node listing pods with the API client a kubeconfig
// makes (kwc over https with the kubeconfig's certificate-authority, or apisim
// over http). Prints one JSON line: the list's resourceVersion and its items as
// [key, resourceVersion] sorted by key. Usage: node list.mjs KUBECONFIG
import * as k8s from '@kubernetes/client-node';

const kc = new k8s.KubeConfig();
kc.loadFromFile(process.argv[2]);
const api = kc.makeApiClient(k8s.CoreV1Api);
const list = await api.listPodForAllNamespaces();
const items = list.items.map((o) => [`${o.metadata.namespace}/${o.metadata.name}`, o.metadata.resourceVersion]);
items.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
console.log(JSON.stringify({ rv: list.metadata.resourceVersion, items }));
