{{/* Chart name, truncated to a DNS label. */}}
{{- define "flashserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name when it already contains the chart name, else <release>-<chart>. */}}
{{- define "flashserve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the operator's objects (Deployment, Service, RBAC). */}}
{{- define "flashserve.operatorName" -}}
{{- /* 46: the longest name built on it, <name>-operator-metrics (a Service), is a DNS label (63) */}}
{{- printf "%s-operator" (include "flashserve.fullname" . | trunc 46 | trimSuffix "-") }}
{{- end }}

{{- define "flashserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "flashserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flashserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "flashserve.labels" -}}
helm.sh/chart: {{ include "flashserve.chart" . }}
{{ include "flashserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: flashserve
{{- end }}

{{- define "flashserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "flashserve.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "flashserve.leaseName" -}}
{{- default (include "flashserve.operatorName" .) .Values.operator.leaderElection.leaseName }}
{{- end }}

{{- define "flashserve.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* Is an item under `monitoring` on: the master switch and its own switch. */}}
{{- define "flashserve.monitoring" -}}
{{- $item := index .root.Values.monitoring .item }}
{{- if and .root.Values.monitoring.enabled $item.enabled }}true{{ end }}
{{- end }}

{{/*
The API access of one reconcile loop, in the namespaces it manages: exactly what controller/kube.py,
controller/handlers.py, controller/autoscale.py and kopf do there (tests/chart checks it against the code). Server-side apply is a PATCH that creates a missing object, so
the API server checks `create` as well. `get` adds nothing that `list` does not already give.
*/}}
{{- define "flashserve.namespacedRules" -}}
- apiGroups: ["flashserve.io"]
  resources: ["deepseekservings"]
  # watched by kopf; the autoscaler patches spec.replicas and its state annotation
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["flashserve.io"]
  resources: ["deepseekservings/status"]
  verbs: ["patch"]
- apiGroups: ["flashserve.io"]
  resources: ["deepseekservings/finalizers"]
  # the children's owner references set blockOwnerDeletion, which OwnerReferencesPermissionEnforcement
  # (on by default in OpenShift) allows only to whoever may update the owner's finalizers
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  # one per replica group: applied, scaled, deleted with its group
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  # applied; one under a name of an earlier operator version is deleted (owner references remove the
  # current one with the serving)
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  # the engines' optional NetworkPolicy (spec.networkPolicy): applied, and deleted when turned off
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  # observed for readiness; all pods of a group are deleted together in a rollout; a group is taken out of
  # routing by patching its pods' flashserve.io/routing label to `drain`. Holding get/list/watch is also what
  # lets the operator grant them to a router's Role (RBAC refuses to grant what the granter lacks).
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  # one vllm-router Deployment per serving (spec.routing), deleted when routing is turned off
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["daemonsets"]
  # spec.startup: the node-local weights prefetch and the image pre-pull, deleted when turned off
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  # spec.startup: the shared weights cache's fill Job; a changed one is a new Job, the old one is deleted
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  # the router's identity, one per serving
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  # the router's Role (pods: get, list, watch; nothing else) and its binding to the router's ServiceAccount.
  # No `bind` or `escalate`: the API server lets the operator grant only verbs it holds itself.
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  # kopf posts core/v1 Events about servings; a StatefulSet's FailedCreate Events are listed (only while it
  # lacks pods) to say why the API server refuses its pods
  verbs: ["create", "list"]
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  # Gateway API Inference Extension pools (spec.routing.inferencePool), watched once the CRD is installed.
  # Not optional: kopf would wait forever for a watch of an installed CRD that it may not list.
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- if .Values.rbac.computeDomains }}
- apiGroups: ["resource.nvidia.com"]
  resources: ["computedomains"]
  # applied per multi-node group and deleted with it; not watched, so read before a write to check that
  # this serving owns it
  verbs: ["get", "create", "patch", "delete"]
{{- end }}
{{- end }}

{{/*
Range checks for the numbers the schema must also take as strings (`--set` leaves a decimal as a string, which
the schema can only match by pattern): each fails naming the value and what it takes.
*/}}
{{- define "flashserve.inRange" -}}
{{- $x := float64 .value }}
{{- if or (lt $x .min) (and .above (eq $x .min)) (gt $x .max) }}
{{- fail (printf "%s: %v is out of range: %s" .name .value .want) }}
{{- end }}
{{- end }}

{{- define "flashserve.checkValues" -}}
{{- $o := .Values.operator }}
{{- $r := .Values.monitoring.prometheusRule }}
{{- include "flashserve.inRange" (dict "name" "operator.resyncSeconds" "value" $o.resyncSeconds "min" 0.0 "above" true "max" 86400.0 "want" "seconds above 0, at most 86400") }}
{{- include "flashserve.inRange" (dict "name" "monitoring.prometheusRule.sla.perUserTokensPerSecond" "value" $r.sla.perUserTokensPerSecond "min" 0.0 "above" true "max" 100000.0 "want" "tokens per second above 0, at most 100000") }}
{{- /* below 0.001 Go prints the percentile with an exponent, which no recording rule name may hold */}}
{{- include "flashserve.inRange" (dict "name" "monitoring.prometheusRule.sla.percentile" "value" $r.sla.percentile "min" 0.001 "above" false "max" 99.999 "want" "a percentile from 0.001 to 99.999") }}
{{- include "flashserve.inRange" (dict "name" "monitoring.prometheusRule.sla.ttftSeconds" "value" $r.sla.ttftSeconds "min" 0.0 "above" true "max" 3600.0 "want" "seconds above 0, at most 3600") }}
{{- include "flashserve.inRange" (dict "name" "monitoring.prometheusRule.kvCacheUsageWarning" "value" $r.kvCacheUsageWarning "min" 0.0 "above" true "max" 1.0 "want" "a share of the KV cache above 0, at most 1") }}
{{- include "flashserve.inRange" (dict "name" "monitoring.prometheusRule.childWritesPerSecondWarning" "value" $r.childWritesPerSecondWarning "min" 0.0 "above" true "max" 1000000.0 "want" "writes per second above 0") }}
{{- include "flashserve.inRange" (dict "name" "monitoring.dashboard.gpuHourlyCost" "value" .Values.monitoring.dashboard.gpuHourlyCost "min" 0.0 "above" false "max" 1000000.0 "want" "dollars per GPU-hour, 0 or more") }}
{{- include "flashserve.checkLabels" . }}
{{- $m := .Values.monitoring }}
{{- range $name, $value := dict "monitoring.serviceMonitor.interval" $m.serviceMonitor.interval "monitoring.serviceMonitor.scrapeTimeout" $m.serviceMonitor.scrapeTimeout "monitoring.podMonitor.interval" $m.podMonitor.interval "monitoring.prometheusRule.window" $m.prometheusRule.window }}
{{- $ms := include "flashserve.durationMs" $value }}
{{- if eq $ms "out of range" }}
{{- fail (printf "%s: %s is beyond what Prometheus takes (about 292 years)" $name $value) }}
{{- else if eq $ms "0" }}
{{- fail (printf "%s: %s is no time: give a duration above zero (e.g. 30s)" $name $value) }}
{{- end }}
{{- end }}
{{- $sm := $m.serviceMonitor }}
{{- if and $m.enabled $sm.enabled (gt (include "flashserve.durationMs" $sm.scrapeTimeout | int64) (include "flashserve.durationMs" $sm.interval | int64)) }}
{{- fail (printf "monitoring.serviceMonitor.scrapeTimeout: %s is longer than monitoring.serviceMonitor.interval (%s), which Prometheus refuses: shorten the timeout or lengthen the interval" $sm.scrapeTimeout $sm.interval) }}
{{- end }}
{{- if eq (int $o.healthPort) (int $o.metricsPort) }}
{{- fail (printf "operator.healthPort and operator.metricsPort are both %v: the two listeners need ports of their own" $o.healthPort) }}
{{- end }}
{{- end }}

{{/* A Prometheus duration (`1m30s`, the schema's pattern) in milliseconds, or "out of range". */}}
{{- define "flashserve.durationMs" -}}
{{- $unit := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 "y" 31536000000 }}
{{- $total := 0 }}
{{- $big := false }}
{{- range regexFindAll "[0-9]+(ms|s|m|h|d|w|y)" . -1 }}
{{- /* leading zeros trimmed: sprig's int64 would read 010 as octal */}}
{{- $count := regexReplaceAll "^0+" (regexFind "^[0-9]+" .) "" | default "0" }}
{{- $each := get $unit (regexReplaceAll "^[0-9]+" . "") }}
{{- if or (gt (len $count) 13) (gt ($count | int64) (div 9223372036854 $each)) }}{{ $big = true }}{{ else }}
{{- $total = add $total (mul ($count | int64) $each) }}
{{- end }}
{{- end }}
{{- /* Prometheus keeps a duration in int64 nanoseconds */}}
{{- if or $big (gt (int64 $total) 9223372036854) }}out of range{{ else }}{{ $total }}{{ end }}
{{- end }}

{{/* Labels a user adds may not be the chart's own: a second selector label breaks the Deployment's selector. */}}
{{- define "flashserve.checkLabels" -}}
{{- $own := list "helm.sh/chart" "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/component" "app.kubernetes.io/version" "app.kubernetes.io/managed-by" "app.kubernetes.io/part-of" }}
{{- $m := .Values.monitoring }}
{{- range $name, $labels := dict "podLabels" .Values.podLabels "monitoring.serviceMonitor.labels" $m.serviceMonitor.labels "monitoring.podMonitor.labels" $m.podMonitor.labels "monitoring.prometheusRule.labels" $m.prometheusRule.labels "monitoring.dashboard.labels" $m.dashboard.labels }}
{{- range $key, $_ := $labels }}
{{- if has $key $own }}
{{- fail (printf "%s: %s is a label the chart sets itself: remove it" $name $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
