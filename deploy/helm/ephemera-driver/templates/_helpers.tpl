{{/*
The app.kubernetes.io/name label: nameOverride, or "ephemera-" and the first label
of driver.name (scratch.csi.ephemera.dev: ephemera-scratch). One chart deploys many
drivers: each gets its own name, so their DaemonSets' selectors never overlap.
*/}}
{{- define "ephemera-driver.name" -}}
{{- $first := regexReplaceAll "\\..*$" .Values.driver.name "" -}}
{{- default (printf "ephemera-%s" $first) .Values.nameOverride | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/*
Base name of every object: fullnameOverride, or the name. Not derived from the
release name: there is one driver per driver.name in a cluster, and its objects keep
their names whatever the release is called.
*/}}
{{- define "ephemera-driver.fullname" -}}
{{- default (include "ephemera-driver.name" .) .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "ephemera-driver.nodeName" -}}
{{- printf "%s-node" (include "ephemera-driver.fullname" .) -}}
{{- end -}}

{{- define "ephemera-driver.serviceAccountName" -}}
{{- default (include "ephemera-driver.nodeName" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "ephemera-driver.labels" -}}
app.kubernetes.io/name: {{ include "ephemera-driver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The DaemonSet's selector. Immutable once installed: never add a label here (the
pod template carries the others, see podLabels).
*/}}
{{- define "ephemera-driver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ephemera-driver.name" . }}
app.kubernetes.io/component: node
{{- end -}}

{{/* The node plugin's pod labels: the selector and the other standard labels. */}}
{{- define "ephemera-driver.podLabels" -}}
{{ include "ephemera-driver.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ephemera
{{- end -}}

{{/*
An image reference from {repository, tag, digest} and the tag to use when tag is
empty: repository@digest when a digest is set (the tag is ignored), else
repository:tag.
*/}}
{{- define "ephemera-driver.image" -}}
{{- $img := index . 0 -}}
{{- if and $img.digest $img.tag -}}
{{- printf "%s:%s@%s" $img.repository $img.tag $img.digest -}}
{{- else if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository ($img.tag | default (index . 1)) -}}
{{- end -}}
{{- end -}}

{{/* Directory of an out-of-process plugin's socket (a plugins item), the same in
the driver's and the plugin's container. */}}
{{- define "ephemera-driver.pluginSocketDir" -}}
{{- .socketDir | default (printf "/run/ephemera/plugins/%s" .name) -}}
{{- end -}}

{{/* Host path of the plugin directory and the CSI socket. */}}
{{- define "ephemera-driver.pluginDir" -}}
{{- printf "%s/plugins/%s" .Values.kubeletRoot .Values.driver.name -}}
{{- end -}}

{{- define "ephemera-driver.stateDir" -}}
{{- printf "%s/%s" .Values.stateRoot .Values.driver.name -}}
{{- end -}}

{{- define "ephemera-driver.capacity" -}}
{{- $parts := list -}}
{{- range $k, $v := .Values.scratch.capacity -}}
{{- $parts = append $parts (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $parts -}}
{{- end -}}

{{/* The "backend" values the admission policy allows: admission.allowedBackends
and every plugin's name (an operator who deploys a plugin means pods to use it). */}}
{{- define "ephemera-driver.allowedBackends" -}}
{{- $out := .Values.admission.allowedBackends -}}
{{- range .Values.plugins -}}
{{- if not (has .name $out) -}}
{{- $out = append $out .name -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
The driver container's memory limit in MiB: at least the memory plan of
memoryPlan (docs/operations.md, "The memory plan"; framework.MemoryNeeded):
contentCapacityMi + 4/3 x (3 x contentBytesInFlightMi + 8 x statsWalks), and at
least 32Mi above what Go needs, rounded up to 32Mi. A limit set in
resources.limits.memory (320Mi, 1Gi) is kept when it holds the plan, refused
otherwise.
*/}}
{{- define "ephemera-driver.memoryLimit" -}}
{{- $p := .Values.memoryPlan -}}
{{- $go := add (mul 3 ($p.contentBytesInFlightMi | int64)) (mul 8 ($p.statsWalks | int64)) -}}
{{- $need := add ($p.contentCapacityMi | int64) (max (div (add (mul $go 4) 2) 3) (add $go 32)) -}}
{{- $set := (.Values.resources.limits | default dict).memory -}}
{{- if $set -}}
{{- $s := toString $set -}}
{{- if not (regexMatch "^[0-9]+(Mi|Gi)$" $s) -}}
{{- fail (printf "resources.limits.memory %q: give it in Mi or Gi (e.g. 320Mi), so that the chart can check it against the memory plan" $s) -}}
{{- end -}}
{{- $mi := regexFind "^[0-9]+" $s | int64 -}}
{{- if hasSuffix "Gi" $s }}{{ $mi = mul $mi 1024 }}{{ end -}}
{{- if lt $mi $need -}}
{{- fail (printf "resources.limits.memory %s does not hold the driver's memory plan, %dMi: memoryPlan.contentCapacityMi %d + 4/3 x (3 x memoryPlan.contentBytesInFlightMi %d + 8 x memoryPlan.statsWalks %d) (docs/operations.md, \"The memory plan\"); raise the limit, leave it unset to have it computed, or lower the plan" $s $need ($p.contentCapacityMi | int64) ($p.contentBytesInFlightMi | int64) ($p.statsWalks | int64)) -}}
{{- end -}}
{{- $s -}}
{{- else -}}
{{- printf "%dMi" (mul (div (add $need 31) 32) 32) -}}
{{- end -}}
{{- end -}}

{{/* The startup taint's key: startupTaint.key, or ephemera.dev/<first label of driver.name>-not-ready. */}}
{{- define "ephemera-driver.startupTaintKey" -}}
{{- $first := regexReplaceAll "\\..*$" .Values.driver.name "" -}}
{{- .Values.startupTaint.key | default (printf "ephemera.dev/%s-not-ready" $first) -}}
{{- end -}}
