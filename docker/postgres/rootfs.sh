#!/bin/sh
# Builds the spark-eos/postgres root filesystem: Debian bookworm minbase + postgresql-15, trimmed.
# Usage: rootfs.sh <target-dir> <debian-mirror-url>   (root; needs debootstrap; no registry needed)
set -eu
target=$1
mirror=$2
here=$(cd "$(dirname "$0")" && pwd)

debootstrap --variant=minbase --include=postgresql-15 bookworm "$target" "$mirror"

# The package's postinst made a "main" cluster; the entrypoint makes its own in the data volume.
rm -rf "$target/var/lib/postgresql/15" "$target/etc/postgresql/15"

# Trim what a server that only runs initdb/postgres never reads (docs, man pages, locales other
# than C, apt's caches and lists, logs). Perl stays: postgresql-common's wrappers need it, and a
# user may want them inside the container.
rm -rf "$target/usr/share/doc" "$target/usr/share/man" "$target/usr/share/info" \
       "$target/usr/share/lintian" "$target/usr/share/locale" \
       "$target/var/cache/apt" "$target/var/lib/apt/lists" "$target/var/cache/debconf"/*-old \
       "$target/var/log"/* "$target/tmp"/*
mkdir -p "$target/var/cache/apt/archives/partial" "$target/var/lib/apt/lists/partial"
# LLVM (and z3, which only LLVM uses) serves postgres' optional JIT, loaded as llvmjit.so on
# demand; the entrypoint runs with jit=off. 130 MB less to copy into every vfs layer.
rm -f "$target"/usr/lib/x86_64-linux-gnu/libLLVM-*.so* "$target"/usr/lib/x86_64-linux-gnu/libz3.so* \
      "$target"/usr/lib/postgresql/15/lib/llvmjit*
rm -rf "$target/usr/lib/postgresql/15/lib/bitcode"

install -m 0755 "$here/entrypoint.sh" "$target/usr/local/bin/eos-postgres"
mkdir -p "$target/var/lib/eos-postgres"
