#!/bin/sh
# Builds the spark-eos/jre root filesystem: Debian bookworm minbase + openjdk-17-jre-headless, trimmed.
# It is the base of spark-eos/kafka (docker/kafka/), which adds the Apache Kafka jars on top.
# Usage: rootfs.sh <target-dir> <debian-mirror-url>   (root; needs debootstrap; no registry needed)
set -eu
target=$1
mirror=$2

debootstrap --variant=minbase --include=openjdk-17-jre-headless bookworm "$target" "$mirror"

# Trim what a broker JVM never reads: docs, man pages, locales, apt's caches and package lists
# (~190 MB of the ~480 MB debootstrap leaves), and of the JRE the class-data archive for heaps
# over 32 GB (classes_nocoops.jsa) and javac's symbol file (ct.sym). classes.jsa, the JDK's
# default class-data archive, stays: -Xshare:auto maps it and starts the JVM faster.
rm -rf "$target/usr/share/doc" "$target/usr/share/man" "$target/usr/share/info" \
       "$target/usr/share/lintian" "$target/usr/share/locale" \
       "$target/var/cache/apt" "$target/var/lib/apt/lists" "$target/var/cache/debconf"/*-old \
       "$target/var/log"/* "$target/tmp"/*
mkdir -p "$target/var/cache/apt/archives/partial" "$target/var/lib/apt/lists/partial"
jre="$target/usr/lib/jvm/java-17-openjdk-amd64"
rm -f "$jre/lib/server/classes_nocoops.jsa" "$jre/lib/ct.sym"
test -x "$jre/bin/java"
