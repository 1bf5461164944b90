{{/* The pod template the StatefulSet and the node-local DaemonSet share. */}}
{{- define "kvpool.podTemplate" -}}
metadata:
  labels:
    {{- include "kvpool.labels" . | nindent 4 }}
    app.kubernetes.io/component: pool
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include "kvpool.config" . | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "kvpool.fullname" . }}
  automountServiceAccountToken: false
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    runAsGroup: 10001
    fsGroup: 10001
    seccompProfile:
      type: RuntimeDefault
  {{- if .Values.nodeLocal.enabled }}
  # The host directories are root's: hand them to kvpoold's user first.
  initContainers:
    - name: host-dirs
      image: "{{ .Values.image.repository }}:{{ ternary .Values.gpu.image.tag .Values.image.tag .Values.gpu.enabled }}"
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      {{- $dirs := ternary "/host/*" "/host/socket /host/region" (ne (include "kvpool.hasDisk" .) "") }}
      command: ["sh", "-c", "for d in {{ $dirs }}; do chown 10001:10001 $d && chmod 0770 $d; done"]
      securityContext:
        runAsNonRoot: false
        runAsUser: 0
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: ["ALL"]
          add: ["CHOWN", "FOWNER"]
      volumeMounts:
        - name: host-socket
          mountPath: /host/socket
        - name: host-region
          mountPath: /host/region
        {{- if include "kvpool.hasDisk" . }}
        - name: host-disk
          mountPath: /host/disk
        {{- end }}
  {{- end }}
  containers:
    - name: kvpoold
      image: "{{ .Values.image.repository }}:{{ ternary .Values.gpu.image.tag .Values.image.tag .Values.gpu.enabled }}"
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - --config
        - /etc/kvpool/kvpoold.conf
        {{- range .Values.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      {{- if .Values.preStopSleepSeconds }}
      # Services stop routing to a terminating pod a moment after it is marked: wait that out.
      lifecycle:
        preStop:
          exec:
            command: ["sleep", "{{ int64 .Values.preStopSleepSeconds }}"]
      {{- end }}
      {{- if or .Values.auth.enabled .Values.vllmEvents.enabled .Values.extraEnv }}
      env:
        {{- if .Values.auth.enabled }}
        - name: KVPOOL_TOKEN_FILE
          value: /etc/kvpool/secret/{{ .Values.auth.tokenKey }}
        {{- end }}
        {{- if .Values.vllmEvents.enabled }}
        - name: KVPOOL_VLLM_POD
          valueFrom:
            fieldRef:
              fieldPath: status.podIP
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      ports:
        - name: rpc
          containerPort: {{ .Values.ports.rpc }}
          protocol: TCP
        - name: events
          containerPort: {{ .Values.ports.events }}
          protocol: TCP
        - name: admin
          containerPort: {{ .Values.ports.admin }}
          protocol: TCP
        {{- range $line := splitList "\n" (include "kvpool.vllmPorts" .) }}
        {{- if $line }}
        - name: {{ index (splitList " " $line) 0 }}
          containerPort: {{ index (splitList " " $line) 1 }}
          protocol: TCP
        {{- end }}
        {{- end }}
      startupProbe:
        httpGet:
          path: /healthz
          port: admin
        periodSeconds: 2
        failureThreshold: 30
      livenessProbe:
        httpGet:
          path: /healthz
          port: admin
        periodSeconds: 10
        timeoutSeconds: 2
        failureThreshold: 3
      readinessProbe:
        httpGet:
          path: /readyz
          port: admin
        periodSeconds: 5
        timeoutSeconds: 2
        failureThreshold: 2
      resources:
        {{- $res := deepCopy .Values.resources }}
        {{- if .Values.gpu.enabled }}
        {{- $limits := default dict $res.limits }}
        {{- $_ := set $limits "nvidia.com/gpu" .Values.gpu.count }}
        {{- $_ := set $res "limits" $limits }}
        {{- end }}
        {{- toYaml $res | nindent 8 }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: ["ALL"]
      volumeMounts:
        - name: config
          mountPath: /etc/kvpool
          readOnly: true
        {{- if .Values.auth.enabled }}
        - name: auth
          mountPath: /etc/kvpool/secret
          readOnly: true
        {{- end }}
        {{- if .Values.tls.enabled }}
        - name: tls
          mountPath: /etc/kvpool/tls
          readOnly: true
        {{- end }}
        - name: tmp
          mountPath: /tmp
        {{- if .Values.nodeLocal.enabled }}
        - name: host-socket
          mountPath: {{ .Values.nodeLocal.socketDir }}
        - name: host-region
          mountPath: {{ .Values.nodeLocal.regionDir }}
        {{- if include "kvpool.hasDisk" . }}
        - name: host-disk
          mountPath: {{ .Values.nodeLocal.diskDir }}
        {{- end }}
        {{- end }}
    {{- if .Values.cluster.enabled }}
    # The cluster tier's agent (docs/cluster.md): kvpoold's pool over ipc, its
    # region mapped from the same host directory, Mooncake Store on the pod network.
    - name: cluster-agent
      image: "{{ .Values.cluster.image.repository }}:{{ .Values.cluster.image.tag }}"
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - --url
        - ipc://{{ .Values.nodeLocal.socketDir }}/kvpool.ipc
        - --events
        - tcp://127.0.0.1:{{ int64 .Values.ports.events }}
        - --pool
        - {{ include "kvpool.clusterPool" . | quote }}
        {{- if .Values.auth.enabled }}
        - --token-file
        - /etc/kvpool/secret/{{ .Values.auth.tokenKey }}
        {{- end }}
        - --master
        - {{ include "kvpool.clusterMaster" . | quote }}
        - --metadata
        - {{ include "kvpool.clusterMetadata" . | quote }}
        - --host
        - $(POD_IP)
        - --segment-mib
        - {{ int64 .Values.cluster.segmentMib | quote }}
        - --tenant
        - {{ .Values.cluster.tenant | quote }}
        - --model
        - {{ .Values.cluster.model | quote }}
        - --layout
        - {{ .Values.cluster.layout | quote }}
        - --timeout-ms
        - {{ int64 .Values.cluster.timeoutMs | quote }}
        - --write-behind
        - {{ .Values.cluster.writeBehind | quote }}
        {{- if .Values.cluster.pins }}
        - --pin-file
        - /etc/kvpool/cluster-pins.jsonl
        {{- end }}
        {{- if .Values.cluster.pinHashSeed }}
        - --pin-hash-seed
        - {{ .Values.cluster.pinHashSeed | quote }}
        {{- end }}
      env:
        - name: POD_IP
          valueFrom:
            fieldRef:
              fieldPath: status.podIP
      resources:
        {{- toYaml .Values.cluster.resources | nindent 8 }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: ["ALL"]
      volumeMounts:
        {{- if .Values.cluster.pins }}
        - name: config
          mountPath: /etc/kvpool
          readOnly: true
        {{- end }}
        {{- if .Values.auth.enabled }}
        - name: auth
          mountPath: /etc/kvpool/secret
          readOnly: true
        {{- end }}
        - name: tmp
          mountPath: /tmp
        - name: host-socket
          mountPath: {{ .Values.nodeLocal.socketDir }}
        - name: host-region
          mountPath: {{ .Values.nodeLocal.regionDir }}
    {{- end }}
  {{- $nodeSelector := .Values.nodeSelector }}
  {{- if .Values.gpu.enabled }}
  {{- $nodeSelector = merge (deepCopy .Values.nodeSelector) .Values.gpu.nodeSelector }}
  {{- end }}
  {{- with $nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $tolerations := .Values.tolerations }}
  {{- if .Values.gpu.enabled }}
  {{- $tolerations = concat .Values.tolerations .Values.gpu.tolerations }}
  {{- end }}
  {{- with $tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "kvpool.fullname" . }}-config
    {{- if .Values.auth.enabled }}
    - name: auth
      secret:
        secretName: {{ include "kvpool.authSecret" . }}
        defaultMode: 0440
    {{- end }}
    {{- if .Values.tls.enabled }}
    - name: tls
      secret:
        secretName: {{ include "kvpool.tlsSecret" . }}
        defaultMode: 0440
    {{- end }}
    - name: tmp
      emptyDir:
        sizeLimit: 64Mi
    {{- if .Values.nodeLocal.enabled }}
    - name: host-socket
      hostPath:
        path: {{ .Values.nodeLocal.socketDir }}
        type: DirectoryOrCreate
    - name: host-region
      hostPath:
        path: {{ .Values.nodeLocal.regionDir }}
        type: DirectoryOrCreate
    {{- if include "kvpool.hasDisk" . }}
    # Pools' disk tiers: a host directory, so they outlive the pod.
    - name: host-disk
      hostPath:
        path: {{ .Values.nodeLocal.diskDir }}
        type: DirectoryOrCreate
    {{- end }}
    {{- end }}
{{- end -}}
