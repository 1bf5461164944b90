{{/* The release's object name: the release name, or release-chart. */}}
{{- define "kvpool.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvpool.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The master's pods: not the pools' selector (a DaemonSet or StatefulSet would claim them). */}}
{{- define "kvpool.masterSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-mooncake
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvpool.labels" -}}
{{ include "kvpool.selectorLabels" . }}
app.kubernetes.io/part-of: kvpool
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The token's Secret: the chart's own with auth.createSecret, else auth.existingSecret. */}}
{{- define "kvpool.authSecret" -}}
{{- if .Values.auth.createSecret -}}
{{- include "kvpool.fullname" . }}-auth
{{- else -}}
{{- required "auth.existingSecret (or auth.createSecret) is required with auth.enabled" .Values.auth.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* The TLS Secret: tls.existingSecret, or with cert-manager <fullname>-tls by default. */}}
{{- define "kvpool.tlsSecret" -}}
{{- if .Values.tls.existingSecret -}}
{{- .Values.tls.existingSecret -}}
{{- else if .Values.tls.certManager.enabled -}}
{{- include "kvpool.fullname" . }}-tls
{{- else -}}
{{- fail "tls.existingSecret (or tls.certManager.enabled) is required with tls.enabled" -}}
{{- end -}}
{{- end -}}

{{/* tcp, or tls+tcp with TLS on. */}}
{{- define "kvpool.scheme" -}}
{{- ternary "tls+tcp" "tcp" .Values.tls.enabled -}}
{{- end -}}

{{/* The memory budget: executor.memory, or with a GPU gpu.memory. */}}
{{- define "kvpool.memory" -}}
{{- if .Values.executor.memory -}}
{{- .Values.executor.memory -}}
{{- else if .Values.gpu.enabled -}}
{{- .Values.gpu.memory -}}
{{- end -}}
{{- end -}}

{{/* kvpoold.conf: every setting kvpoold --help documents that the chart sets. */}}
{{- define "kvpool.config" -}}
# kvpoold's settings (kvpoold --help). Rendered by the kvpool chart.
rpc = {{ include "kvpool.scheme" . }}://0.0.0.0:{{ int64 .Values.ports.rpc }}
{{- if .Values.nodeLocal.enabled }}
rpc = ipc://{{ .Values.nodeLocal.socketDir }}/kvpool.ipc
ipc-mode = 0660
region-dir = {{ .Values.nodeLocal.regionDir }}
{{- end }}
events = {{ include "kvpool.scheme" . }}://0.0.0.0:{{ int64 .Values.ports.events }}
admin = http://0.0.0.0:{{ int64 .Values.ports.admin }}
{{- $memory := include "kvpool.memory" . }}
{{- $clusterPool := "" }}
{{- if .Values.cluster.enabled }}
{{- $clusterPool = include "kvpool.clusterPool" . }}
{{- end }}
{{- $cluster := .Values.cluster }}
{{- range .Values.pools }}
{{- if and (not .blocks) (not $memory) }}
{{- fail (printf "pool %s: give blocks, or executor.memory (gpu.memory with gpu.enabled)" .name) }}
{{- end }}
{{- if and .diskRows (not $.Values.nodeLocal.enabled) }}
{{- fail (printf "pool %s: diskRows needs nodeLocal.enabled (the disk tier lives in nodeLocal.diskDir on the host)" .name) }}
{{- end }}
{{- if and .groups (not (regexMatch "^[a-z_]+:[0-9]+(:[0-9a-z]+)?(\\+[a-z_]+:[0-9]+(:[0-9a-z]+)?)*$" .groups)) }}
{{- fail (printf "pool %s: groups %q is not KIND:BLOCK_SIZE[:PARAM] joined by '+' (kvpoold --help)" .name .groups) }}
{{- end }}
pool = name={{ .name }}{{ if .blocks }},blocks={{ int64 .blocks }}{{ end }}{{ if .groups }},groups={{ .groups }}{{ if .blockSize }},block_size={{ int64 .blockSize }}{{ end }}{{ else }},block_size={{ int64 (.blockSize | default 16) }}{{ end }}{{ if .hashBlockSize }},hash_block_size={{ int64 .hashBlockSize }}{{ end }}{{ if hasKey . "caching" }},caching={{ ternary "on" "off" .caching }}{{ end }}{{ if .hashAlgo }},hash_algo={{ .hashAlgo }}{{ end }}{{ if hasKey . "seed" }},seed={{ if kindIs "string" .seed }}{{ .seed }}{{ else }}{{ int64 .seed }}{{ end }}{{ end }}{{ if hasKey . "dpRank" }},dp_rank={{ int64 .dpRank }}{{ end }}{{ if .model }},model={{ .model }}{{ end }}{{ if .shards }},shards={{ int64 .shards }}{{ end }}{{ if .restart }},restart={{ .restart }}{{ end }}{{ if .diskRows }},disk={{ $.Values.nodeLocal.diskDir }}/{{ .name }}.disk,disk_rows={{ int64 .diskRows }}{{ end }}{{ if eq .name $clusterPool }},cluster_wait_ms={{ int64 $cluster.waitMs }},cluster_miss_ms={{ int64 $cluster.missMs }}{{ end }}
{{- end }}
{{- with .Values.vllmEvents }}
{{- if .enabled }}
vllm-events = tcp://*:{{ int64 .port }}
{{- if .replayPort }}
vllm-replay = tcp://*:{{ int64 .replayPort }}
{{- end }}
vllm-topic = {{ .topic }}
vllm-format = {{ .format }}
vllm-hashes = {{ .hashes }}
vllm-replay-topic = {{ ternary 1 0 .replayTopic }}
vllm-buffer-steps = {{ int64 .bufferSteps }}
vllm-buffer-mib = {{ int64 .bufferMib }}
vllm-hwm = {{ int64 .hwm }}
vllm-token-pools = {{ ternary 1 0 .includeTokenPools }}
{{- end }}
{{- end }}
executor = {{ ternary "cuda" .Values.executor.backend .Values.gpu.enabled }}
device = {{ int64 .Values.executor.device }}
kv-layers = {{ int64 .Values.executor.layers }}
kv-heads = {{ int64 .Values.executor.heads }}
kv-head-size = {{ int64 .Values.executor.headSize }}
kv-dtype = {{ .Values.executor.dtype }}
kv-layout = {{ .Values.executor.layout }}
{{- if $memory }}
kv-memory = {{ $memory }}
{{- end }}
lease-ms = {{ int64 .Values.daemon.leaseMs }}
drain-ms = {{ int64 .Values.daemon.drainMs }}
contexts = {{ int64 .Values.daemon.contexts }}
max-msg-bytes = {{ int64 .Values.daemon.maxMsgBytes }}
max-sessions = {{ int64 .Values.daemon.maxSessions }}
max-refs = {{ int64 .Values.daemon.maxRefs }}
max-session-requests = {{ int64 .Values.daemon.maxSessionRequests }}
reply-cache-mib = {{ int64 .Values.daemon.replyCacheMib }}
replay-batches = {{ int64 .Values.daemon.replayBatches }}
replay-mib = {{ int64 .Values.daemon.replayMib }}
log-level = {{ .Values.daemon.logLevel }}
log-format = {{ .Values.daemon.logFormat }}
{{- if .Values.tls.enabled }}
tls-cert = /etc/kvpool/tls/tls.crt
tls-key = /etc/kvpool/tls/tls.key
{{- if .Values.tls.requireClientCert }}
tls-ca = /etc/kvpool/tls/ca.crt
{{- end }}
{{- end }}
{{- end -}}


{{/* vLLM-wire ports, one pair per pool: "NAME PORT" lines (pool i at port + its dp rank). */}}
{{- define "kvpool.vllmPorts" -}}
{{- if .Values.vllmEvents.enabled }}
{{- $v := .Values.vllmEvents }}
{{- range $i, $p := .Values.pools }}
{{- $rank := ternary (int64 $p.dpRank) (int64 $i) (hasKey $p "dpRank") }}
vllm-pub-{{ $i }} {{ add $v.port $rank }}
{{- if $v.replayPort }}
vllm-rep-{{ $i }} {{ add $v.replayPort $rank }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Cluster mode: the pool under the tier (cluster.pool, or the first), after its checks. */}}
{{/* "true" when a pool has a disk tier (diskRows): the pod mounts nodeLocal.diskDir. */}}
{{- define "kvpool.hasDisk" -}}
{{- range .Values.pools }}{{ if .diskRows }}true{{ end }}{{ end }}
{{- end }}

{{- define "kvpool.clusterPool" -}}
{{- $c := .Values.cluster }}
{{- if not .Values.nodeLocal.enabled }}
{{- fail "cluster.enabled needs nodeLocal.enabled: the tier sits under a node's shared region (docs/cluster.md)" }}
{{- end }}
{{- if .Values.tls.enabled }}
{{- fail "cluster.enabled with tls.enabled: the agent does not speak TLS to the event stream yet (docs/cluster.md)" }}
{{- end }}
{{- if or (not $c.model) (not $c.layout) }}
{{- fail "cluster.enabled needs cluster.model and cluster.layout: they keep two models' or layouts' bytes apart" }}
{{- end }}
{{- if and (eq $c.writeBehind "pinned") (not $c.pins) }}
{{- fail "cluster.writeBehind pinned needs cluster.pins: the prompts whose blocks are put" }}
{{- end }}
{{- if and (eq $c.writeBehind "none") $c.pins }}
{{- fail "cluster.pins needs write-behind: not with cluster.writeBehind none" }}
{{- end }}
{{- if and (not $c.master.enabled) (or (not $c.master.address) (not $c.master.metadata)) }}
{{- fail "cluster.master.enabled false needs cluster.master.address and cluster.master.metadata" }}
{{- end }}
{{- $name := $c.pool | default (index .Values.pools 0).name }}
{{- $found := false }}
{{- range .Values.pools }}{{ if eq .name $name }}{{ $found = true }}{{ end }}{{ end }}
{{- if not $found }}
{{- fail (printf "cluster.pool %q is not one of pools" $name) }}
{{- end }}
{{- $name }}
{{- end -}}

{{/* Mooncake's master RPC address and metadata URL, for the agents. */}}
{{- define "kvpool.clusterMaster" -}}
{{- if .Values.cluster.master.enabled -}}
{{ include "kvpool.fullname" . }}-mooncake:{{ int64 .Values.cluster.master.rpcPort }}
{{- else -}}
{{ .Values.cluster.master.address }}
{{- end -}}
{{- end -}}
{{- define "kvpool.clusterMetadata" -}}
{{- if .Values.cluster.master.enabled -}}
http://{{ include "kvpool.fullname" . }}-mooncake:{{ int64 .Values.cluster.master.metadataPort }}/metadata
{{- else -}}
{{ .Values.cluster.master.metadata }}
{{- end -}}
{{- end -}}
