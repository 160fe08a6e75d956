{{/* The app.kubernetes.io/name label: nameOverride, or the chart's name. */}}
{{- define "ephemera-scratch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/*
Base name of every object: fullnameOverride, or the name. Not derived from the
release name: there is one driver per driverName in a cluster, and its objects keep
their names whatever the release is called.
*/}}
{{- define "ephemera-scratch.fullname" -}}
{{- default (include "ephemera-scratch.name" .) .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "ephemera-scratch.nodeName" -}}
{{- printf "%s-node" (include "ephemera-scratch.fullname" .) -}}
{{- end -}}

{{- define "ephemera-scratch.serviceAccountName" -}}
{{- default (include "ephemera-scratch.nodeName" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "ephemera-scratch.labels" -}}
app.kubernetes.io/name: {{ include "ephemera-scratch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The DaemonSet's selector. Immutable once installed: never add a label here (the
pod template carries the others, see podLabels).
*/}}
{{- define "ephemera-scratch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ephemera-scratch.name" . }}
app.kubernetes.io/component: node
{{- end -}}

{{/* The node plugin's pod labels: the selector and the other standard labels. */}}
{{- define "ephemera-scratch.podLabels" -}}
{{ include "ephemera-scratch.selectorLabels" . }}
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
{{- define "ephemera-scratch.image" -}}
{{- $img := index . 0 -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository ($img.tag | default (index . 1)) -}}
{{- end -}}
{{- end -}}

{{/* Host path of the plugin directory and the CSI socket. */}}
{{- define "ephemera-scratch.pluginDir" -}}
{{- printf "%s/plugins/%s" .Values.kubeletRoot .Values.driverName -}}
{{- end -}}

{{- define "ephemera-scratch.stateDir" -}}
{{- printf "%s/%s" .Values.stateRoot .Values.driverName -}}
{{- end -}}

{{- define "ephemera-scratch.capacity" -}}
{{- $parts := list -}}
{{- range $k, $v := .Values.capacity -}}
{{- $parts = append $parts (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $parts -}}
{{- end -}}
