// The npm @kubernetes/client-node informer on pods (list, then watch from the
// list's rv; relist on 410), as Node controllers run it. Prints "synced N" once
// the initial list is in its cache, then, when the pod named by argv[3] has
// arrived, one JSON line: counts of add/update/delete callbacks and the cache
// contents (key -> resourceVersion). Usage: node informer.mjs KUBECONFIG NS/NAME
import * as k8s from '@kubernetes/client-node';

const [kubeconfig, until] = process.argv.slice(2);
const kc = new k8s.KubeConfig();
kc.loadFromFile(kubeconfig);
const api = kc.makeApiClient(k8s.CoreV1Api);
const inf = k8s.makeInformer(kc, '/api/v1/pods', () => api.listPodForAllNamespaces());
const counts = { add: 0, update: 0, delete: 0 };
const key = (o) => `${o.metadata.namespace}/${o.metadata.name}`;
let done = false;
const finish = () => {
  if (done) return;
  done = true;
  const cache = {};
  for (const o of inf.list()) cache[key(o)] = o.metadata.resourceVersion;
  console.log(JSON.stringify({ counts, cache }));
  inf.stop();
  process.exit(0);
};
inf.on('add', (o) => { counts.add++; if (key(o) === until) finish(); });
inf.on('update', () => { counts.update++; });
inf.on('delete', () => { counts.delete++; });
inf.on('error', (e) => { console.error('informer error', e && e.message); setTimeout(() => inf.start(), 200); });
await inf.start();
console.log(`synced ${inf.list().length}`);
