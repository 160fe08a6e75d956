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
{{- if $img.digest -}}
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

{{/* The startup taint's key: startupTaint.key, or ephemera.dev/<first label of driver.name>-not-ready. */}}
{{- define "ephemera-driver.startupTaintKey" -}}
{{- $first := regexReplaceAll "\\..*$" .Values.driver.name "" -}}
{{- .Values.startupTaint.key | default (printf "ephemera.dev/%s-not-ready" $first) -}}
{{- end -}}
