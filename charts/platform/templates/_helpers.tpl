{{/*
platform.labels: the labels of every object, for component .component.
*/}}
{{- define "platform.labels" -}}
app.kubernetes.io/part-of: cozy
app.kubernetes.io/managed-by: cozyctl
cozy.dev/component: {{ .component }}
{{- end }}

{{/*
platform.namespace: a Namespace for component .component named .name.
*/}}
{{- define "platform.namespace" -}}
apiVersion: v1
kind: Namespace
metadata:
  name: {{ .name }}
  labels:
    {{- include "platform.labels" . | nindent 4 }}
    pod-security.kubernetes.io/enforce: privileged
{{- end }}

{{/*
platform.path: the folder of component .component in the Git repository.
*/}}
{{- define "platform.path" -}}
./{{ trimSuffix "/" (trimPrefix "./" .root.Values.git.path) }}/components/{{ .component }}
{{- end }}

{{/*
platform.kustomization: the Flux Kustomization that applies one component's
folder and is Ready only when everything it applied is healthy. Arguments:
root, component, dependsOn (list), timeout (unless flux.timeout says),
healthCheckExprs (list).
Nothing when the component is switched off. A dependency on networking is
dropped when networking is off on a flannel cluster (cluster.cni).
*/}}
{{- define "platform.kustomization" -}}
{{- if (index .root.Values.components .component).enabled }}
---
apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata:
  name: {{ .component }}
  namespace: {{ .root.Values.flux.namespace }}
  labels:
    {{- include "platform.labels" . | nindent 4 }}
spec:
  {{- $deps := list }}
  {{- range (get . "dependsOn" | default list) }}
  {{- /* With networking off, a flannel cluster keeps Talos's flannel as its network. */}}
  {{- if not (and (eq . "networking") (not $.root.Values.components.networking.enabled) (eq $.root.Values.cluster.cni "flannel")) }}
  {{- $deps = append $deps . }}
  {{- end }}
  {{- end }}
  {{- with $deps }}
  dependsOn:
    {{- range . }}
    - name: {{ . }}
    {{- end }}
  {{- end }}
  interval: {{ .root.Values.flux.interval }}
  retryInterval: {{ .root.Values.flux.retryInterval }}
  timeout: {{ .root.Values.flux.timeout | default .timeout }}
  path: {{ include "platform.path" . }}
  prune: true
  wait: true
  sourceRef:
    kind: GitRepository
    name: {{ .root.Values.git.sourceRef.name }}
    namespace: {{ .root.Values.git.sourceRef.namespace }}
  commonMetadata:
    labels:
      {{- include "platform.labels" . | nindent 6 }}
  {{- with (get . "healthCheckExprs") }}
  healthCheckExprs:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}

{{/*
platform.releaseSpec: what every HelmRelease shares: reconcile interval,
timeout (.timeout, unless flux.timeout says), CRDs created and upgraded
with the chart, remediation that retries a failed install (uninstalling
first) and rolls back a failed upgrade, and Deployments' progress
deadline when flux.progressDeadlineSeconds sets one. Arguments: root,
timeout.
*/}}
{{- define "platform.releaseSpec" -}}
interval: {{ .root.Values.flux.interval }}
timeout: {{ .root.Values.flux.timeout | default .timeout }}
maxHistory: 5
install:
  crds: CreateReplace
  remediation:
    retries: 3
upgrade:
  crds: CreateReplace
  cleanupOnFail: true
  remediation:
    retries: 3
    remediateLastFailure: true
    strategy: rollback
rollback:
  cleanupOnFail: true
uninstall:
  keepHistory: false
driftDetection:
  mode: warn
{{- with .root.Values.flux.progressDeadlineSeconds }}
{{- /* Past its deadline a Deployment is Failed to kstatus, and Helm's wait gives up at once. */}}
postRenderers:
  - kustomize:
      patches:
        - target: {kind: Deployment}
          patch: |
            - op: add
              path: /spec/progressDeadlineSeconds
              value: {{ int . }}
{{- end }}
{{- end }}

{{/*
platform.helmRepository: a HelmRepository .name in .namespace at .url; for
charts Cozy makes from their modules (.mirrored, see platform/upstream),
the chart mirror instead when .root's values name one.
*/}}
{{- define "platform.helmRepository" -}}
{{- $m := .root.Values.charts.mirror -}}
apiVersion: source.toolkit.fluxcd.io/v1
kind: HelmRepository
metadata:
  name: {{ .name }}
  namespace: {{ .namespace }}
  labels:
    {{- include "platform.labels" . | nindent 4 }}
spec:
  interval: 1h
  timeout: 3m
  {{- if and .mirrored $m.url }}
  # Mirrored: {{ .url }}
  type: oci
  url: {{ $m.url }}
  {{- if $m.insecure }}
  insecure: true
  {{- end }}
  {{- else }}
  url: {{ .url }}
  {{- end }}
{{- end }}

{{/*
platform.ociRepository: an OCIRepository holding one chart at a pinned tag.
*/}}
{{- define "platform.ociRepository" -}}
apiVersion: source.toolkit.fluxcd.io/v1
kind: OCIRepository
metadata:
  name: {{ .name }}
  namespace: {{ .namespace }}
  labels:
    {{- include "platform.labels" . | nindent 4 }}
spec:
  interval: 1h
  timeout: 3m
  url: {{ .url }}
  ref:
    tag: {{ .tag | quote }}
  layerSelector:
    mediaType: application/vnd.cncf.helm.chart.content.v1.tar+gzip
    operation: copy
{{- end }}

{{/*
platform.keepCRDs: a kustomize patch that stops Flux from pruning the
CRDs of a release manifest: removing the component from Git must not
delete the KubeVirt or CDI resource through its CRD, and with it every
VM and disk the operator manages.
*/}}
{{- define "platform.keepCRDs" -}}
patches:
  {{- include "platform.keepCRDsPatch" . | nindent 2 }}
{{- end }}

{{/*
platform.keepCRDsPatch: platform.keepCRDs' patch alone, an item of a
patches list that has others.
*/}}
{{- define "platform.keepCRDsPatch" -}}
- target:
    kind: CustomResourceDefinition
  patch: |
    apiVersion: apiextensions.k8s.io/v1
    kind: CustomResourceDefinition
    metadata:
      name: any
      annotations:
        kustomize.toolkit.fluxcd.io/prune: disabled
{{- end }}
