{{- define "kubevirt-csi-node.labels" -}}
app.kubernetes.io/name: kubevirt-csi-node
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: cozy
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "kubevirt-csi-node.selector" -}}
app.kubernetes.io/name: kubevirt-csi-node
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
