# shellcheck shell=bash  # sourced, never run
# Scenario 11: Kubernetes' own storage e2e suites (the kit's e2e.test, "External Storage")
# against the loop class, as the reference CSI driver runs them for conformance: the
# driver is described by tests/e2e/driver-loop.yaml, the deployment is this run's overlay
# with the csi-snapshotter sidecar (tests/cluster/overlays/snapshots) and the
# snapshot-controller run.sh started. Every spec that runs must pass. In the VM guest's
# cluster (tests/vm/cluster.sh --classes lvm-thin 11) the same promises on the lvm-thin
# class, ext4 as the default fs, focus S11_GUEST_FOCUS.
#
# Which specs: LOCALVOL_E2E_FOCUS (a ginkgo regex, default S11_FOCUS below: the suites
# of a CSI driver's conformance run, without [Slow], sized for CI) or
# LOCALVOL_E2E_FOCUS=all (every External Storage spec, [Slow] ones too: about 30
# minutes with 3 processes on 2 cores).
# Processes: LOCALVOL_E2E_PROCS (default 2). Skipped always, each with its reason:
S11_SKIP=(
  # ssh to the node and kubelet restarts: this harness has neither (the kit's README).
  '\[Disruptive\]'
  '\[Serial\]'
  # SELinux mount options: Debian's kernel here runs without SELinux.
  '\[Feature:SELinux\]'
)
# A pod entering PID 1's mount namespace to inspect the node's directories: this
# sandbox's init forbids it on the host (the kit's README). Run in the VM guest's
# cluster, whose PID 1 is its own init (tests/vm/cluster.sh --classes lvm-thin 11).
S11_HOST_SKIP=('should not mount / map unused volumes in a pod')
# Skipped in the default run only, for CI's time: minutes per spec, over the calls the
# kept specs make (xfs and ext3 patterns, many pods on one volume, stress).
S11_CI_SKIP=('\[Slow\]')
S11_FOCUS='External.Storage.*\] (provisioning|volumes|volumeMode|volumeIO|volume-expand|snapshottable|ephemeral|read-write-once-pod|fsgroupchangepolicy|subPath|multiVolume|capacity|topology) '
# In the VM guest's cluster (CI: tests/all.sh's guest cluster), what this machine cannot
# run on the host: online growth of ext4 (S11_FSTYPE), filesystem and raw block, and the
# PID 1 specs. LOCALVOL_E2E_FOCUS='External.Storage.*\] (volume-expand |volumeMode )'
# runs those suites whole there (10 specs, 599 s).
S11_GUEST_FOCUS='External.Storage.*\] (volume-expand should resize volume when PVC is edited while pod is using it|volumeMode should not mount / map unused volumes in a pod)'

s11_e2e_storage() {
  local kit_bin=$KUBE_KIT_BIN work focus skip procs
  [ -x "$kit_bin/e2e.test" ] && [ -x "$kit_bin/ginkgo" ] || fail "no e2e.test or ginkgo in $kit_bin (the kit's install.sh)"
  work=$(mktemp -d /tmp/localvol-e2e.XXXXXX)
  # The images the suites run, under their upstream names, without a registry.
  "$KIT/recipe/e2e-images.sh" "$work/images" >/dev/null
  for tar in "$work"/images/*.tar; do
    ctr --address "$KUBE_KIT_CRI_SOCK" -n k8s.io images import "$tar" >/dev/null
  done
  local driver skips=("${S11_SKIP[@]}") default_focus=$S11_FOCUS
  if [ "$CLASS_KIND" = loop ]; then
    k apply -k "$HERE/overlays/snapshots" >/dev/null
    trap s11_restore EXIT
    wait_until 120 "DaemonSet with the csi-snapshotter sidecar rolled out" k -n "$SYSTEM_NS" rollout status ds/localvol-node --timeout=5s
    wait_until 30 "csi-snapshotter sidecar ready" s11_sidecar_ready
    driver=$REPO/tests/e2e/driver-loop.yaml
    skips+=("${S11_HOST_SKIP[@]}")
  else
    # The VM guest's cluster (tests/vm/cluster.sh): the class's shipped overlay, without
    # the snapshot component, so the focus there leaves out snapshottable; nothing to
    # restore afterwards.
    driver=$(s11_class_driver)
    default_focus=$S11_GUEST_FOCUS
  fi

  focus=${LOCALVOL_E2E_FOCUS:-$default_focus}
  if [ "$focus" = all ]; then focus='External.Storage'; else skips+=("${S11_CI_SKIP[@]}"); fi
  skip=$(IFS='|'; echo "${skips[*]}")
  procs=${LOCALVOL_E2E_PROCS:-2}
  local rc=0
  # e2e.test resolves the driver's FromFile against --repo-root.
  (cd "$REPO" && "$kit_bin/ginkgo" --procs="$procs" --timeout=2h --no-color --succinct \
      --focus="$focus" --skip="$skip" --output-dir="$work" --junit-report=junit.xml \
      "$kit_bin/e2e.test" -- \
      -storage.testdriver="$driver" -repo-root="$REPO" \
      -provider=local -node-os-distro=debian -allowed-not-ready-nodes=0 \
      -kubectl-path="$kit_bin/kubectl" -disable-log-dump -kubeconfig="$KUBECONFIG") \
      >"$work/ginkgo.log" 2>&1 || rc=$?
  cp "$work/ginkgo.log" "$LOGS/e2e-ginkgo.log" 2>/dev/null || true
  local line
  # ginkgo names the report after the suite's binary, inside --output-dir.
  s11_summary "$(find "$work" -maxdepth 1 -name '*junit.xml' | head -n 1)" | while IFS= read -r line; do note "NOTE s11: $line"; done
  # ginkgo's verdict and, on failure, which specs (succinct output: one line each).
  grep -E '\[FAIL\]|Summarizing|(Ran|FAIL!|SUCCESS!) ' "$work/ginkgo.log" | tail -n 40 || true
  rm -rf "$work"
  [ "$rc" = 0 ] || fail "the e2e suites failed (ginkgo exit $rc; the log is e2e-ginkgo.log in the run's logs)"
}

# How many specs ran, passed, failed and were skipped, and which failed (junit report).
s11_summary() { # JUNIT
  [ -f "$1" ] || { echo "no junit report"; return 0; }
  python3 - "$1" <<'PY'
import collections, re, sys, xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
ran = passed = failed = skipped = 0
failures = []
suites = collections.Counter()
for c in cases:
    name = c.get("name", "")
    if "External Storage" not in name:
        continue
    if c.find("skipped") is not None:
        skipped += 1
        continue
    ran += 1
    m = re.search(r"\[Testpattern: [^]]*\] (\S+)", name)
    suites[m.group(1) if m else "other"] += 1
    if c.find("failure") is not None or c.find("error") is not None:
        failed += 1
        failures.append(name)
    else:
        passed += 1
print(f"External Storage: {ran} specs ran, {passed} passed, {failed} failed, {skipped} skipped")
print("ran per suite: " + ", ".join(f"{k} {v}" for k, v in sorted(suites.items())))
for f in failures:
    print(f"FAILED {f}")
PY
}

s11_sidecar_ready() {
  local pod; pod=$(daemon_pod)
  [ "$(k -n "$SYSTEM_NS" get pod "$pod" -o jsonpath="{.status.containerStatuses[?(@.name=='csi-snapshotter')].ready}")" = true ]
}

s11_restore() {
  k delete volumesnapshot --all --all-namespaces --wait=false >/dev/null 2>&1 || true
  k apply -k "$OVERLAY" >/dev/null
  k delete --ignore-not-found -f "$REPO/deploy/components/csi-snapshotter/rbac.yaml" >/dev/null
}

# The loop driver's definition for lib.sh's DEVICE_CLASS, made under target/ (e2e.test
# reads a StorageClass FromFile relative to --repo-root): the same promises, which hold
# on lvm-thin (snapshots, clones, growth; tests/vm/cluster.sh runs this scenario on that
# class only), and its StorageClass with S11_FSTYPE (default ext4, which cannot grow
# online on the host) as the suites' default fs. Prints the driver file's path.
s11_class_driver() {
  local dir=target/e2e-$DEVICE_CLASS fs=${S11_FSTYPE:-ext4}
  mkdir -p "$REPO/$dir"
  sed -e "s|device-class: loop|device-class: $DEVICE_CLASS|" -e "s|fstype: xfs|fstype: $fs|" \
    "$REPO/tests/e2e/storageclass-loop.yaml" >"$REPO/$dir/storageclass.yaml"
  sed -e "s|FromFile: tests/e2e/storageclass-loop.yaml|FromFile: $dir/storageclass.yaml|" \
    -e "s|# the class default: xfs in storageclass-loop.yaml|# the class default: $fs (storageclass.yaml beside this file)|" \
    "$REPO/tests/e2e/driver-loop.yaml" >"$REPO/$dir/driver.yaml"
  grep -q "FromFile: $dir/storageclass.yaml" "$REPO/$dir/driver.yaml" || fail "s11_class_driver: the loop driver's FromFile line changed"
  echo "$REPO/$dir/driver.yaml"
}
