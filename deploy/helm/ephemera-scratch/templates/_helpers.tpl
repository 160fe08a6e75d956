{{/* Base name of every object. */}}
{{- define "ephemera-scratch.name" -}}
{{- default "ephemera-scratch" .Values.nameOverride | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "ephemera-scratch.nodeName" -}}
{{- printf "%s-node" (include "ephemera-scratch.name" .) -}}
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

{{- define "ephemera-scratch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ephemera-scratch.name" . }}
app.kubernetes.io/component: node
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
