#!/bin/bash
# Replay a pass captured by scripts/pass_capture.py under callgrind and print its instructions.
#   scripts/pass_callgrind.sh OUTDIR DATADIR PORT
# OUTDIR: the capture (replay.sql, replay.json, optional pre.sql run on the copy first);
# DATADIR/PORT: the private cluster it was captured on (stopped during the replay, then
# started again; run as root, the cluster's files owned by postgres).
set -e
dir=$1; data=$2; port=$3
bin=/usr/lib/postgresql/15/bin
db=$(python -c "import json; print(json.load(open('$dir/replay.json'))['db'])")
psql -h 127.0.0.1 -p "$port" -U postgres -qc "DROP DATABASE IF EXISTS run_copy" \
    -c "CREATE DATABASE run_copy TEMPLATE \"$db\"" >/dev/null
if [ -f "$dir/pre.sql" ]; then psql -h 127.0.0.1 -p "$port" -U postgres -d run_copy -qf "$dir/pre.sql"; fi
su postgres -c "$bin/pg_ctl -D $data -m fast stop" >/dev/null
chmod a+rw "$dir"
su postgres -c "valgrind --tool=callgrind --callgrind-out-file=$dir/cg.out $bin/postgres \
    --single -D $data -c fsync=off run_copy < $dir/replay.sql > $dir/single.out 2> $dir/cg.err"
su postgres -c "$bin/pg_ctl -D $data -l $data/../log start" >/dev/null
callgrind_annotate "$dir/cg.out" 2>/dev/null | grep -m1 "PROGRAM TOTALS"
