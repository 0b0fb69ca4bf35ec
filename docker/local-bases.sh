#!/usr/bin/env bash
# Base images for docker-compose.yml built without any image registry, from Debian's archive and the
# Python package index only: for machines that reach those but not Docker Hub (docs/deploy.md,
# "Without a registry"). Idempotent: an image that exists is kept, so a second run takes a second.
#
#   docker/local-bases.sh            # builds what is missing, then prints the variables to use
#   docker/local-bases.sh --env F    # also writes them to F (docker/compose.local.env by default)
#   LOCAL_BASES_REBUILD=1 docker/local-bases.sh   # builds every one again
#
# Images (tag prefix LOCAL_BASES_PREFIX, default kernelswarm-local):
#   debian:bookworm      debootstrap's minbase, the host's extra CA certificates installed
#   python:3.11-bookworm + Debian's Python 3.11
#   python-torch:3.11-V  + /opt/venv with the CPU build of torch V (PYTHON_IMAGE of docker/cpu.Dockerfile)
#   redis:7-bookworm     + Debian's redis-server                                 (REDIS_IMAGE)
#   postgres:15-bookworm + Debian's PostgreSQL 15, POSTGRES_* handled at start   (POSTGRES_IMAGE)
#   s3:s3rver-V          + Node.js and s3rver, an S3 server standing in for MinIO (S3_IMAGE)
#
# Needs root (debootstrap, chroot) and a running Docker engine; uses the legacy builder, which does not
# fetch a BuildKit frontend from a registry. Run by `make compose-test` and `make local-bases`.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
PREFIX="${LOCAL_BASES_PREFIX:-kernelswarm-local}"
SUITE=bookworm
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
S3RVER_VERSION="${S3RVER_VERSION:-3.7.1}"
ENV_FILE=""
if [ "${1:-}" = "--env" ]; then ENV_FILE="${2:-$HERE/compose.local.env}"; fi
export DOCKER_BUILDKIT=0

log() { printf 'local-bases: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v docker >/dev/null || die "docker is not installed (apt-get install docker.io)"
docker info >/dev/null 2>&1 || die "the Docker engine is not running (start dockerd)"

# Folders of this run, removed at its end however it ends.
SCRATCH=()
cleanup() { [ ${#SCRATCH[@]} -eq 0 ] || rm -rf "${SCRATCH[@]}"; }
trap cleanup EXIT
scratch() { local dir; dir="$(mktemp -d "/var/tmp/local-bases-$2.XXXXXX")"; SCRATCH+=("$dir"); printf -v "$1" %s "$dir"; }

exists() { [ -z "${LOCAL_BASES_REBUILD:-}" ] && docker image inspect "$1" >/dev/null 2>&1; }

# The Debian mirror apt already uses on this host (deb822 or one-line sources), else Debian's own.
debian_mirror() {
    local uri
    uri="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
    [ -n "$uri" ] || uri="$(awk '$1 == "deb" && $0 ~ / bookworm / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
    echo "${DEBIAN_MIRROR:-${uri:-http://deb.debian.org/debian}}"
}

build_debian() {
    local tag="$PREFIX/debian:$SUITE" rootfs
    if exists "$tag"; then log "$tag exists"; return; fi
    command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
    scratch rootfs rootfs
    local mirror; mirror="$(debian_mirror)"
    log "debootstrap $SUITE from $mirror (about 30-70 s)"
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$rootfs" "$mirror" >/dev/null
    # Certificates this host trusts beyond Mozilla's (a TLS-inspecting proxy's): without them pip
    # inside a build cannot reach the package index through that proxy.
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    fi
    chroot "$rootfs" update-ca-certificates >/dev/null
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
        --change 'ENV LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive' \
        --change 'CMD ["bash"]' - "$tag" >/dev/null
    log "$tag built"
}

# docker build from a Dockerfile on stdin and a context folder.
build() {
    local tag="$1" context="$2"
    if exists "$tag"; then log "$tag exists"; cat >/dev/null; return; fi
    log "building $tag"
    docker build -q -t "$tag" --build-arg "BASE=$PREFIX/debian:$SUITE" -f - "$context" 2>&1 >/dev/null \
        | grep -v -e '^DEPRECATED: The legacy builder' -e 'BuildKit is currently disabled' -e 'environment-variable\.$' -e '^$' >&2 || true
    log "$tag built"
}

build_python() {
    build "$PREFIX/python:3.11-$SUITE" "$HERE/local" <<'EOF'
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python-is-python3 \
 && rm -rf /var/lib/apt/lists/*
EOF
}

build_python_torch() {
    local tag="$PREFIX/python-torch:3.11-$TORCH_VERSION" context
    if exists "$tag"; then log "$tag exists"; return; fi
    # The torch wheel is fetched on the host, where pip's own configuration applies (a local wheel
    # folder, a proxy): the CPU build, from PyTorch's index, which the package index does not carry.
    scratch context torch
    log "fetching torch==$TORCH_VERSION (CPU build, cp311)"
    python3 -m pip download -q --retries 1 --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux_2_28_x86_64 --index-url "${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" \
        -d "$context" "torch==$TORCH_VERSION"
    case "$(ls "$context")" in
        torch-*+cpu-*.whl) ;;
        *) die "the torch wheel fetched is not the CPU build: $(ls "$context")";;
    esac
    build "$tag" "$context" <<EOF
FROM $PREFIX/python:3.11-$SUITE
COPY torch-*.whl /tmp/
# torch's own dependencies come from the package index; the wheel from this folder.
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install -q --no-cache-dir --disable-pip-version-check /tmp/torch-*.whl \
 && rm /tmp/torch-*.whl \
 && /opt/venv/bin/python -c "import torch; print('torch', torch.__version__)"
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOF
}

build_redis() {
    build "$PREFIX/redis:7-$SUITE" "$HERE/local" <<'EOF'
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
CMD ["redis-server"]
EOF
}

build_postgres() {
    build "$PREFIX/postgres:15-$SUITE" "$HERE/local" <<'EOF'
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/
ENV PGDATA=/var/lib/postgresql/data PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EXPOSE 5432
ENTRYPOINT ["postgres-entrypoint.sh"]
CMD ["postgres"]
EOF
}

build_s3() {
    local tag="$PREFIX/s3:s3rver-$S3RVER_VERSION" context
    if exists "$tag"; then log "$tag exists"; return; fi
    # s3rver keeps buckets as files under its data folder, so they outlive a restart of the container
    # (moto's server keeps them in memory). Fetched on the host with npm, run with Debian's Node.js.
    if ! command -v npm >/dev/null; then
        log "installing Debian's npm (for the S3 stand-in)"
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends npm >/dev/null; } \
            || die "npm is not installed and could not be (apt-get install npm)"
    fi
    scratch context s3
    log "fetching s3rver@$S3RVER_VERSION"
    npm install --silent --no-audit --no-fund --prefix "$context" "s3rver@$S3RVER_VERSION" >/dev/null
    build "$tag" "$context" <<EOF
FROM $PREFIX/debian:$SUITE
RUN apt-get update \\
 && apt-get install -y --no-install-recommends nodejs \\
 && rm -rf /var/lib/apt/lists/* \\
 && useradd --system --home-dir /data --create-home s3
COPY node_modules /opt/s3rver/node_modules
WORKDIR /data
USER s3
EXPOSE 9000
# s3rver checks signatures against its one account: access key and secret both S3RVER.
CMD ["node", "/opt/s3rver/node_modules/s3rver/bin/s3rver.js", "-d", "/data", "-a", "0.0.0.0", "-p", "9000", "--no-vhost-buckets"]
EOF
}

build_debian
build_python
build_python_torch
build_redis
build_postgres
build_s3

VARS="PYTHON_IMAGE=$PREFIX/python-torch:3.11-$TORCH_VERSION
REDIS_IMAGE=$PREFIX/redis:7-$SUITE
POSTGRES_IMAGE=$PREFIX/postgres:15-$SUITE
S3_IMAGE=$PREFIX/s3:s3rver-$S3RVER_VERSION"
if [ -n "$ENV_FILE" ]; then printf '%s\n' "$VARS" > "$ENV_FILE"; log "wrote $ENV_FILE"; fi
printf '%s\n' "$VARS"
