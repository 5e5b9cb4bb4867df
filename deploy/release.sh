#!/usr/bin/env bash
# The release build, from this tree: kvmesh for linux/amd64 and linux/arm64
# with the version and revision stamped (static, -trimpath, no VCS or path
# in the binary: the same commit and Go toolchain give the same bytes), their
# SHA-256 sums, the Helm chart packaged with that version as its default
# image tag, and the container image from the Dockerfile for both platforms.
#
#   deploy/release.sh [--version V] [--image REPO] [--out DIR] [--push | --no-image] [--dry-run]
#
#   --version V    the release (default: the VERSION file)
#   --image REPO   the image's repository (default: kvmesh); the packaged
#                  chart's default image is REPO:V, the image this builds
#   --out DIR      where the files go (default: dist)
#   --push         push the image to REPO (after docker login); without it,
#                  the image is written as an OCI archive into DIR
#   --no-image     binaries and chart only (no docker needed)
#   --dry-run      print each command instead of running it
#
# Needs Go (go.mod's version) and, for the image, docker with buildx. See
# docs/OPERATIONS.md, "A release build".
set -euo pipefail
self="$(realpath "$0")"
cd "$(dirname "$self")/.."

usage() { sed -n '/^#   deploy/,/^#   --dry-run/s/^# \{0,1\}//p' "$self"; }

version="$(cat VERSION)" image=kvmesh out=dist push=0 build_image=1 dry=0
while (($#)); do
	case $1 in
	--version) version=${2:?--version needs a value}; shift 2 ;;
	--image) image=${2:?--image needs a value}; shift 2 ;;
	--out) out=${2:?--out needs a value}; shift 2 ;;
	--push) push=1; shift ;;
	--no-image) build_image=0; shift ;;
	--dry-run) dry=1; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "release.sh: unknown argument $1; see --help" >&2; exit 2 ;;
	esac
done
if ((push && !build_image)); then
	echo "release.sh: --push and --no-image contradict each other" >&2
	exit 2
fi
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$ ]] || {
	echo "release.sh: version $version is not semantic (1.2.3): Helm needs one" >&2
	exit 2
}

revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [[ $revision != unknown && -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
	echo "release.sh: the tree has uncommitted changes; the revision is stamped $revision-dirty" >&2
	revision+=-dirty
fi
# Times inside the chart archive and the image: the commit's, not the clock's.
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
out_abs="$(realpath -m "$out")"
ldflags="-s -w -X main.releaseVersion=$version -X github.com/kvmesh/kvmesh/node.revision=$revision"

# run prints or runs a command.
run() {
	if ((dry)); then
		printf '+'
		printf ' %q' "$@"
		printf '\n'
	else
		"$@"
	fi
}

echo "--- kvmesh $version ($revision) into $out" >&2
run mkdir -p "$out"
for arch in amd64 arm64; do
	run env CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -buildvcs=false -ldflags "$ldflags" \
		-o "$out/kvmesh-$version-linux-$arch" ./cmd/kvmesh
done
if ((dry)); then
	echo "+ (cd $out && sha256sum kvmesh-$version-linux-* > SHA256SUMS)"
else
	(cd "$out" && sha256sum "kvmesh-$version-linux-"* >SHA256SUMS)
fi

echo "--- the chart, default image $image:$version" >&2
run go -C deploy/chartcheck run ./cmd/chartpack -chart "$PWD/deploy/helm/kvmesh" \
	-version "$version" -image "$image" -mtime "$epoch" -out "$out_abs"

if ((build_image)); then
	echo "--- the image $image:$version, linux/amd64 and linux/arm64" >&2
	if ((!dry)) && ! docker buildx version >/dev/null 2>&1; then
		echo "release.sh: docker with buildx is needed for the image (the binaries and the chart are in $out); install it, or pass --no-image" >&2
		exit 1
	fi
	dest=(--output "type=oci,dest=$out/kvmesh-$version-image.tar,rewrite-timestamp=true")
	((push)) && dest=(--push)
	run docker buildx build --platform linux/amd64,linux/arm64 \
		--build-arg VERSION="$version" --build-arg REVISION="$revision" --build-arg SOURCE_DATE_EPOCH="$epoch" \
		-t "$image:$version" "${dest[@]}" .
fi
((dry)) || ls -l "$out" >&2
