{{- define "cozy-operator.labels" -}}
app.kubernetes.io/name: cozy-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: cozy
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "cozy-operator.selector" -}}
app.kubernetes.io/name: cozy-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
