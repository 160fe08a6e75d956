#!/usr/bin/env bash
# Checks Ephemera's inline volumes on a node with SELinux enforcing (RHEL, OpenShift):
# the container runtime's relabel of tmpfs, loop (ext4, xfs) and dir volumes, writes
# from the container, and the readOnly cases. See test/selinux/README.md and
# docs/operations.md, "SELinux nodes".
#
# Run as root ON the node under test (it reads the kubelet's pod directories with
# ls -Z), with kubectl configured for the cluster and the driver installed (the
# chart). It creates one namespace and one pod, prints a PASS/FAIL table, deletes
# the namespace (KEEP=1 keeps it), and exits 1 if a check failed, 2 if it could not run.
#
#   IMAGE         an image with /bin/sh, cat, ls, sleep (default: registry.access.redhat.com/ubi9/ubi-minimal)
#   DRIVER        the CSI driver name (default: scratch.csi.ephemera.dev)
#   NODE          the node's name in the cluster (default: hostname)
#   KUBELET_ROOT  the kubelet's root dir (default: /var/lib/kubelet)
#   NS            the namespace to create (default: ephemera-selinux-check)
#   DRIVER_POD    namespace/name of the driver pod on NODE (default: the chart's, by its labels)
#   KEEP=1        keep the namespace and pod
set -euo pipefail

IMAGE="${IMAGE:-registry.access.redhat.com/ubi9/ubi-minimal}"
DRIVER="${DRIVER:-scratch.csi.ephemera.dev}"
NODE="${NODE:-$(hostname)}"
KUBELET_ROOT="${KUBELET_ROOT:-/var/lib/kubelet}"
NS="${NS:-ephemera-selinux-check}"

results=()
failed=0
result() { # PASS|FAIL|INFO check detail
	results+=("$(printf '%-4s  %-44s  %s' "$1" "$2" "$3")")
	[[ "$1" != FAIL ]] || failed=1
}

[[ $(id -u) == 0 ]] || { echo "verify: run as root on the node (ls -Z of the kubelet's pod dirs)" >&2; exit 2; }
command -v kubectl >/dev/null || { echo "verify: kubectl not found" >&2; exit 2; }
if [[ ! -r /sys/fs/selinux/enforce ]]; then
	echo "verify: no SELinux on this node (/sys/fs/selinux/enforce missing): nothing to verify" >&2
	exit 2
fi
enforce="$(cat /sys/fs/selinux/enforce)"
[[ "$enforce" == 1 ]] || echo "verify: SELinux is permissive (enforce=$enforce): labels are checked, denials only logged" >&2
kubectl get csidriver "$DRIVER" >/dev/null || { echo "verify: CSIDriver $DRIVER not found (install the chart first)" >&2; exit 2; }
result INFO "node" "$NODE, SELinux enforce=$enforce, $(uname -r)"
result INFO "runtime" "$(kubectl get node "$NODE" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}'), kubelet $(kubectl get node "$NODE" -o jsonpath='{.status.nodeInfo.kubeletVersion}')"
result INFO "CSIDriver seLinuxMount" "$(kubectl get csidriver "$DRIVER" -o jsonpath='{.spec.seLinuxMount}') (no effect on inline volumes)"

cleanup() {
	if [[ "${KEEP:-0}" == 1 ]]; then
		echo "verify: KEEP=1: namespace $NS kept" >&2
	else
		kubectl delete namespace "$NS" --wait=true --timeout=120s >/dev/null 2>&1 || true
	fi
}
trap cleanup EXIT

kubectl create namespace "$NS" >/dev/null
# The container writes to each writable volume, reads and writes the readOnly
# ones, prints its own SELinux context, then waits. Volumes:
#   tmpfs, ext4, xfs, dir  writable: the runtime relabels them
#   ro                     readOnly: true (the driver mounts it read-only; the kubelet asks no relabel)
#   robind                 writable volume, the container's volumeMount readOnly (the relabel runs)
kubectl apply -n "$NS" -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: selinux-check
spec:
  nodeName: $NODE
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: $IMAGE
    command: ["/bin/sh", "-c"]
    args:
    - |
      echo "CONTEXT \$(cat /proc/self/attr/current | tr -d '\0')"
      for v in tmpfs ext4 xfs dir; do
        if echo x > /v/\$v/f 2>/tmp/err; then echo "WRITE \$v ok"; else echo "WRITE \$v fail \$(cat /tmp/err)"; fi
      done
      for v in ro robind; do
        if ls /v/\$v >/dev/null 2>/tmp/err; then echo "LIST \$v ok"; else echo "LIST \$v fail \$(cat /tmp/err)"; fi
        if echo x > /v/\$v/f 2>/tmp/err; then echo "WRITE \$v ok"; else echo "WRITE \$v fail \$(cat /tmp/err)"; fi
      done
      echo DONE
      sleep 3600
    volumeMounts:
    - {name: tmpfs, mountPath: /v/tmpfs}
    - {name: ext4, mountPath: /v/ext4}
    - {name: xfs, mountPath: /v/xfs}
    - {name: dir, mountPath: /v/dir}
    - {name: ro, mountPath: /v/ro}
    - {name: robind, mountPath: /v/robind, readOnly: true}
  volumes:
  - {name: tmpfs, csi: {driver: $DRIVER, volumeAttributes: {size: 8Mi}}}
  - {name: ext4, csi: {driver: $DRIVER, volumeAttributes: {backend: loop, fsType: ext4, size: 64Mi}}}
  - {name: xfs, csi: {driver: $DRIVER, volumeAttributes: {backend: loop, fsType: xfs, size: 300Mi}}}
  - {name: dir, csi: {driver: $DRIVER, volumeAttributes: {backend: dir}}}
  - {name: ro, csi: {driver: $DRIVER, readOnly: true, volumeAttributes: {size: 4Mi}}}
  - {name: robind, csi: {driver: $DRIVER, volumeAttributes: {size: 4Mi}}}
EOF

if ! kubectl wait -n "$NS" pod/selinux-check --for=condition=Ready --timeout=180s >/dev/null; then
	result FAIL "pod Running" "$(kubectl get events -n "$NS" --field-selector involvedObject.name=selinux-check -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}' | tail -5)"
	printf '%s\n' "${results[@]}"
	exit 1
fi
result PASS "pod Running" "6 inline volumes published"
for _ in $(seq 30); do
	out="$(kubectl logs -n "$NS" selinux-check)"
	grep -q '^DONE' <<<"$out" && break
	sleep 1
done
uid="$(kubectl get pod -n "$NS" selinux-check -o jsonpath='{.metadata.uid}')"
ctx="$(sed -n 's/^CONTEXT //p' <<<"$out")"
level="${ctx#*:*:*:}" # user:role:type:LEVEL
result INFO "container context" "$ctx"

label_of() { ls -dZ "$1" 2>/dev/null | awk '{print $1}'; }
for v in tmpfs ext4 xfs dir; do
	target="$KUBELET_ROOT/pods/$uid/volumes/kubernetes.io~csi/$v/mount"
	lbl="$(label_of "$target")"
	if [[ "$lbl" == *:container_file_t:"$level" ]]; then
		result PASS "$v: relabelled (ls -dZ)" "$lbl"
	else
		result FAIL "$v: relabelled (ls -dZ)" "${lbl:-no label} at $target, want container_file_t:$level"
	fi
	if grep -q "^WRITE $v ok" <<<"$out"; then
		result PASS "$v: write from the container" "$(label_of "$target/f")"
	else
		result FAIL "$v: write from the container" "$(grep "^WRITE $v" <<<"$out")"
	fi
done
# dir: the bind mount's source is the driver's own directory on the host.
src="$(findmnt -n -o SOURCE --target "$KUBELET_ROOT/pods/$uid/volumes/kubernetes.io~csi/dir/mount" 2>/dev/null || true)"
result INFO "dir: host source (findmnt)" "${src:-?} (the relabel labelled this directory tree on the host)"

# readOnly: true: no relabel is asked; report the label and what the container could do.
target="$KUBELET_ROOT/pods/$uid/volumes/kubernetes.io~csi/ro/mount"
result INFO "ro: label (not relabelled)" "$(label_of "$target")"
if grep -q '^LIST ro ok' <<<"$out"; then
	result PASS "ro: container lists it" "the label the driver's mount gave is readable by $ctx"
else
	result FAIL "ro: container lists it" "$(grep '^LIST ro' <<<"$out") (policy denies the unrelabelled label: use the robind form)"
fi
if grep -q '^WRITE ro fail' <<<"$out"; then
	result PASS "ro: write refused" "$(grep '^WRITE ro' <<<"$out")"
else
	result FAIL "ro: write refused" "the container wrote to a readOnly volume"
fi
# robind: the workaround, a writable volume with a read-only container mount.
lbl="$(label_of "$KUBELET_ROOT/pods/$uid/volumes/kubernetes.io~csi/robind/mount")"
if [[ "$lbl" == *:container_file_t:"$level" ]] && grep -q '^LIST robind ok' <<<"$out" && grep -q '^WRITE robind fail' <<<"$out"; then
	result PASS "robind: relabelled, readable, write refused" "$lbl"
else
	result FAIL "robind: relabelled, readable, write refused" "$lbl; $(grep 'robind' <<<"$out" | tr '\n' ' ')"
fi

# What NodePublishVolume received: the driver logs each request at --v=4 or more.
dpod="${DRIVER_POD:-$(kubectl get pods -A -l app.kubernetes.io/component=node --field-selector spec.nodeName="$NODE" \
	-o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {.metadata.labels.app\.kubernetes\.io/name}{"\n"}{end}' |
	awk '$2 ~ /^ephemera-/ {print $1; exit}')}"
if [[ -n "$dpod" ]]; then
	reqs="$(kubectl logs -n "${dpod%%/*}" "${dpod#*/}" -c driver 2>/dev/null | grep '"Request" method="/csi.v1.Node/NodePublishVolume"' | grep "$uid" || true)"
	if [[ -z "$reqs" ]]; then
		result INFO "NodePublishVolume mount_flags" "not checked: no request lines in $dpod's log (the driver logs requests at --v=4)"
	elif grep -q -e 'mount_flags' -e 'context=' <<<"$reqs"; then
		result FAIL "NodePublishVolume mount_flags" "$(grep -m1 -e mount_flags -e context= <<<"$reqs")"
	else
		result PASS "NodePublishVolume mount_flags" "none in $(wc -l <<<"$reqs") requests (no context=)"
	fi
else
	result INFO "NodePublishVolume mount_flags" "not checked: no driver pod found on $NODE"
fi

printf '%s\n' "${results[@]}"
exit "$failed"
