#!/bin/sh
# Makes what a copy of this workspace may have lost (idempotent; run in the
# copy): the symlinked sources, and the offline stand-ins for @rules_cc and
# @rules_java that forward to the native rules, and of @remote_coverage_tools (Bazel 4.2.3 has no network).
set -eu
cd "$(dirname "$0")"
mkdir -p links
# A relative file link, and a directory link a source is reached through.
ln -sfn ../data/real.txt links/rel_alias.txt
ln -sfn data linkdir

mkdir -p stubs/rules_cc/cc stubs/rules_java/java
echo 'workspace(name = "rules_cc")' > stubs/rules_cc/WORKSPACE
: > stubs/rules_cc/BUILD
echo 'exports_files(["defs.bzl"])' > stubs/rules_cc/cc/BUILD
for rule in cc_binary cc_library cc_test cc_import cc_toolchain cc_toolchain_suite \
    cc_proto_library fdo_prefetch_hints fdo_profile objc_library objc_import; do
  printf 'def %s(**kwargs):\n    native.%s(**kwargs)\n\n' "$rule" "$rule"
done > stubs/rules_cc/cc/defs.bzl
echo 'workspace(name = "rules_java")' > stubs/rules_java/WORKSPACE
: > stubs/rules_java/BUILD
echo 'exports_files(["defs.bzl"])' > stubs/rules_java/java/BUILD
for rule in java_binary java_import java_library java_runtime java_toolchain java_test java_plugin; do
  printf 'def %s(**kwargs):\n    native.%s(**kwargs)\n\n' "$rule" "$rule"
done > stubs/rules_java/java/defs.bzl
# Test rules name these (used for coverage only, which is never run here).
mkdir -p stubs/remote_coverage_tools
echo 'workspace(name = "remote_coverage_tools")' > stubs/remote_coverage_tools/WORKSPACE
cat > stubs/remote_coverage_tools/BUILD <<'STUB'
filegroup(name = "coverage_report_generator", visibility = ["//visibility:public"])
filegroup(name = "lcov_merger", visibility = ["//visibility:public"])
STUB
# Debian's /etc/bazel/bazelrc sets --sandbox_debug; not wanted here.
cat > .bazelrc <<'RC'
build --nosandbox_debug
build --verbose_failures
RC
