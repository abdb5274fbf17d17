#!/bin/sh
# Instructions per lean decision (callgrind): scripts/lean_cost.py with REPEAT=1 minus REPEAT=0,
# divided by the lean tasks. Usage: scripts/lean_ir.sh POOLS TASKS [CAPACITY_SCALE]
PY=${PY:-/root/.pyenv/versions/3.11.7/bin/python3.11}
ir() { PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 | grep -o "Collected : [0-9]*\|lean tasks [0-9]*" ; }
a=$(PYTHONPATH=$PWD:$PWD/scripts REPEAT=0 ir $PY scripts/lean_cost.py "$@")
b=$(PYTHONPATH=$PWD:$PWD/scripts REPEAT=1 ir $PY scripts/lean_cost.py "$@")
ia=$(echo "$a" | grep -o "Collected : [0-9]*" | grep -o "[0-9]*")
ib=$(echo "$b" | grep -o "Collected : [0-9]*" | grep -o "[0-9]*")
n=$(echo "$a" | grep -o "lean tasks [0-9]*" | grep -o "[0-9]*")
echo "pools=$1 tasks=$2 loop_ir=$ia with_extra=$ib lean_tasks=$n lean_ir_per_task=$(( (ib - ia) / n ))"
