#!/bin/sh
# A base image for deploy/container/Containerfile.* where no container registry can be reached
# but Debian's packages can: Debian 12 (minbase) with python3, python3-venv (Python 3.11) and
# ca-certificates, made by mmdebstrap and imported into podman. Then build with
#   --build-arg BASE=localhost/debian-py:bookworm
# Usage: sh deploy/container/debian-base.sh [IMAGE]     (default localhost/debian-py:bookworm)
# Does nothing if IMAGE exists (remove it with `podman rmi IMAGE` to make a new one).
# Needs root (or podman unshare), mmdebstrap and podman: apt-get install mmdebstrap podman runc
set -eu
image=${1:-localhost/debian-py:bookworm}
if podman image exists "$image"; then
    echo "$image exists"
    exit 0
fi
# The tarball goes straight into podman; stdin closed: mmdebstrap reads no sources from it.
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm - </dev/null | podman import --quiet - "$image" >/dev/null
echo "$image made: $(podman run --rm "$image" python3 --version)"
