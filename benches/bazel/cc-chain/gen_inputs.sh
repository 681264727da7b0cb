#!/bin/sh
# A C workspace of chained cc_library targets with hundreds of headers, for
# timing sandboxes with Bazel (scripts/bench-bazel --workspace, or
# ../shared/bazel-e2e/run --workspace).
#
# LIBS libraries, each with HEADERS headers and SOURCES sources; library i
# depends on library i-1, and every source includes its library's umbrella
# header, which includes its own headers and the previous library's
# umbrella. So compiling a source of library i opens (i+1)*HEADERS headers,
# and its action maps every one of them: the last library's compile actions
# have LIBS*HEADERS header inputs. Idempotent; run in the workspace copy.
set -eu
cd "$(dirname "$0")"
LIBS=${LIBS:-24}
HEADERS=${HEADERS:-25}
SOURCES=${SOURCES:-4}
[ -f .generated ] && [ "$(cat .generated)" = "$LIBS $HEADERS $SOURCES" ] && exit 0

# Bazel 4.2.3 offline: @rules_cc and @rules_java stand in as local stubs
# that forward to the native rules.
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
# Debian's /etc/bazel/bazelrc sets --sandbox_debug, with which Bazel never
# destroys a sandbox (and leaves the mount up).
cat > .bazelrc <<'RC'
build --nosandbox_debug
build --verbose_failures
RC
cat > WORKSPACE <<'WS'
workspace(name = "ccchain")
local_repository(name = "rules_cc", path = "stubs/rules_cc")
local_repository(name = "rules_java", path = "stubs/rules_java")
WS

rm -rf libs
i=0
while [ $i -lt "$LIBS" ]; do
  d=libs/l$i
  mkdir -p "$d"
  umbrella=$d/l$i.h
  {
    echo "#ifndef L${i}_H"
    echo "#define L${i}_H"
    [ $i -gt 0 ] && echo "#include \"libs/l$((i - 1))/l$((i - 1)).h\""
  } > "$umbrella"
  h=0
  while [ $h -lt "$HEADERS" ]; do
    {
      echo "#ifndef L${i}_H${h}_H"
      echo "#define L${i}_H${h}_H"
      echo "struct l${i}_s${h} { int id; long value[$((h % 7 + 1))]; const char *name; };"
      f=0
      while [ $f -lt 8 ]; do
        echo "int l${i}_h${h}_f${f}(struct l${i}_s${h} *s, int x);"
        f=$((f + 1))
      done
      echo "#define L${i}_H${h}_SIZE $((h * 8 + i))"
      echo "#endif"
    } > "$d/h$h.h"
    echo "#include \"libs/l$i/h$h.h\"" >> "$umbrella"
    h=$((h + 1))
  done
  echo "int l${i}_entry(int x);" >> "$umbrella"
  echo "#endif" >> "$umbrella"
  s=0
  while [ $s -lt "$SOURCES" ]; do
    {
      echo "#include \"libs/l$i/l$i.h\""
      echo "int l${i}_part$s(int x) { return x * $((s + 2)) + L${i}_H$((s % HEADERS))_SIZE; }"
      if [ $s -eq 0 ]; then
        echo "int l${i}_part$((SOURCES - 1))(int x);"
        if [ $i -gt 0 ]; then
          echo "int l${i}_entry(int x) { return l$((i - 1))_entry(x) + l${i}_part$((SOURCES - 1))(x); }"
        else
          echo "int l${i}_entry(int x) { return l${i}_part$((SOURCES - 1))(x); }"
        fi
      fi
    } > "$d/s$s.c"
    s=$((s + 1))
  done
  {
    printf 'cc_library(\n    name = "l%d",\n' "$i"
    printf '    srcs = glob(["*.c"]),\n    hdrs = glob(["*.h"]),\n'
    [ $i -gt 0 ] && printf '    deps = ["//libs/l%d"],\n' $((i - 1))
    printf '    visibility = ["//visibility:public"],\n)\n'
  } > "$d/BUILD"
  i=$((i + 1))
done
cat > app.c <<C
#include <stdio.h>
#include "libs/l$((LIBS - 1))/l$((LIBS - 1)).h"
int main(void) { printf("%d\\n", l$((LIBS - 1))_entry(1)); return 0; }
C
cat > BUILD <<B
cc_binary(name = "app", srcs = ["app.c"], deps = ["//libs/l$((LIBS - 1))"])
B
echo "$LIBS $HEADERS $SOURCES" > .generated
