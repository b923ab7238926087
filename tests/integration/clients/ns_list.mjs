// The npm @kubernetes/client-node lists the pods of one namespace with the API
// client a kubeconfig makes (a plain list: no resourceVersion). Prints one JSON
// line: {"status":200,"items":[[key, resourceVersion], ...]} sorted by key, or
// for an API error {"status":N,"body":the answer's body}.
// Usage: node ns_list.mjs KUBECONFIG NAMESPACE
import * as k8s from '@kubernetes/client-node';

const [kubeconfig, namespace] = process.argv.slice(2);
const kc = new k8s.KubeConfig();
kc.loadFromFile(kubeconfig);
const api = kc.makeApiClient(k8s.CoreV1Api);
try {
  const list = await api.listNamespacedPod({ namespace });
  const items = list.items.map((o) => [`${o.metadata.namespace}/${o.metadata.name}`, o.metadata.resourceVersion]);
  items.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  console.log(JSON.stringify({ status: 200, items }));
} catch (e) {
  if (e instanceof k8s.ApiException) {
    console.log(JSON.stringify({ status: e.code, body: e.body }));
  } else {
    throw e;
  }
}
