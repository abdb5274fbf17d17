{{- define "berth.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "berth.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "berth.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "berth.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Environment shared by every Berth container: the database URL (from its Secret only)
     and the extra settings. */}}
{{- define "berth.env" -}}
- name: BERTH_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.secretName }}
      key: {{ .Values.database.secretKey }}
{{- range $name, $value := .Values.config }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/* Pod metadata of one component: call with (dict "root" $ "component" "api"). */}}
{{- define "berth.podMetadata" -}}
labels:
  {{- include "berth.selector" .root | nindent 2 }}
  app.kubernetes.io/component: {{ .component }}
  {{- with .root.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .root.Values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod-level settings every Berth pod shares: no Kubernetes API token, non-root. */}}
{{- define "berth.podCommon" -}}
automountServiceAccountToken: false
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* Volumes every Berth pod has: /tmp (the root filesystem is read-only: /tmp is the one
writable place), and the database's TLS files when given. */}}
{{- define "berth.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- with .Values.database.tlsSecretName }}
- name: database-tls
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/* Mounts every Berth container has: /tmp, and the database's TLS files when given. */}}
{{- define "berth.volumeMounts" -}}
- {name: tmp, mountPath: /tmp}
{{- if .Values.database.tlsSecretName }}
- {name: database-tls, mountPath: /etc/berth/postgresql, readOnly: true}
{{- end }}
{{- end -}}

{{- define "berth.podPlacement" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
