#!/bin/sh
# Reads its data file through its runfiles, as real tools do.
set -eu
runfiles=${RUNFILES_DIR:-$0.runfiles}
tr a-z A-Z < "$runfiles/realrules/data/tool_data.txt"
cat "$1"
