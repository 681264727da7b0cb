#!/bin/sh
# A test using TEST_TMPDIR and its runfiles.
set -eu
test -n "$TEST_TMPDIR"
echo scratch > "$TEST_TMPDIR/scratch.txt"
grep -q scratch "$TEST_TMPDIR/scratch.txt"
grep -q "tool data" "$TEST_SRCDIR/realrules/data/tool_data.txt"
grep -q "TOOL DATA" "$TEST_SRCDIR/realrules/use_tool.txt"
echo "check_test passed"
