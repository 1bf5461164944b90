// SPDX-License-Identifier: Apache-2.0
// Validates every object of the given multi-document YAML files offline
// against the Kubernetes API schemas (kubernetes-models 5.1.0, generated
// from Kubernetes 1.34's OpenAPI; ServiceMonitor from the Prometheus
// Operator's CRD, Certificate from cert-manager's). An object of a kind we
// have no schema for is an error.
//   node validate.mjs FILE...
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const models = {
  "v1/ConfigMap": "kubernetes-models/v1/ConfigMap",
  "v1/Secret": "kubernetes-models/v1/Secret",
  "v1/Service": "kubernetes-models/v1/Service",
  "v1/ServiceAccount": "kubernetes-models/v1/ServiceAccount",
  "v1/Pod": "kubernetes-models/v1/Pod",
  "apps/v1/StatefulSet": "kubernetes-models/apps/v1/StatefulSet",
  "apps/v1/DaemonSet": "kubernetes-models/apps/v1/DaemonSet",
  "apps/v1/Deployment": "kubernetes-models/apps/v1/Deployment",
  "policy/v1/PodDisruptionBudget": "kubernetes-models/policy/v1/PodDisruptionBudget",
  "networking.k8s.io/v1/NetworkPolicy": "kubernetes-models/networking.k8s.io/v1/NetworkPolicy",
  "monitoring.coreos.com/v1/PrometheusRule":
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule",
  "monitoring.coreos.com/v1/ServiceMonitor":
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor",
  "cert-manager.io/v1/Certificate": "@kubernetes-models/cert-manager/cert-manager.io/v1/Certificate",
};

let failed = 0, checked = 0;
for (const file of process.argv.slice(2)) {
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (doc.errors.length) {
      console.error(`${file}: YAML: ${doc.errors[0].message}`);
      failed++;
      continue;
    }
    const obj = doc.toJS();
    if (obj == null) continue;
    const key = `${obj.apiVersion}/${obj.kind}`, name = `${file}: ${key} ${obj.metadata?.name}`;
    if (!models[key]) {
      console.error(`${name}: no schema for this kind`);
      failed++;
      continue;
    }
    const mod = await import(models[key]);
    try {
      new mod[obj.kind](obj).validate();
      checked++;
    } catch (e) {
      console.error(`${name}: ${e.message}`);
      failed++;
    }
  }
}
console.log(`validate: ${checked} objects valid, ${failed} failed`);
process.exit(failed ? 1 : 0);
