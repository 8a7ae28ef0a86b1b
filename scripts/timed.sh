#!/usr/bin/env bash
# `timed.sh NAME COMMAND...`: runs COMMAND, then says in one line how long it took and how it
# ended, so that a slow or red CI run explains itself; the line is also appended to $TIMES_FILE
# when set (.ci/run prints them all at the end). Exits with COMMAND's status.
name=$1
shift
start=$SECONDS
"$@"
rc=$?
line="timed: $name $((SECONDS - start)) s, exit $rc"
echo "$line"
[ -n "${TIMES_FILE:-}" ] && echo "$line" >>"$TIMES_FILE"
exit $rc
