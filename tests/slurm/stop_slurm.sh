#!/bin/bash
# Stops what start_slurm.sh DIR started: cancels the jobs left in that cluster, then sends TERM to
# slurmd, slurmctld and (if start_slurm.sh started it) munged by the PIDs in their PID files, and
# waits up to 10 s for them (KILL after that). Never kills by name.
#   tests/slurm/stop_slurm.sh [DIR]
DIR=${1:-/tmp/hymoe-slurm}
export SLURM_CONF="$DIR/slurm.conf"
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if alive "$DIR/slurmctld.pid"; then  # jobs still there (a failed test): cancel, give them 10 s
    jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ')
    if [ -n "${jobs// /}" ]; then
        # shellcheck disable=SC2086
        scancel $jobs 2>/dev/null
        for _ in $(seq 50); do [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break; sleep 0.2; done
    fi
fi
pidfiles=("$DIR/slurmd.pid" "$DIR/slurmctld.pid")
[ -e "$DIR/munged.ours" ] && pidfiles+=(/run/munge/munged.pid)
pids=()
for f in "${pidfiles[@]}"; do
    alive "$f" || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null && pids+=("$pid") && echo "slurm: sent TERM to $(basename "$f" .pid) $pid"
done
for _ in $(seq 100); do
    left=()
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
    [ ${#left[@]} -eq 0 ] && break
    sleep 0.1
done
for pid in "${left[@]}"; do kill -KILL "$pid" 2>/dev/null && echo "slurm: sent KILL to $pid"; done
rm -f "$DIR/munged.ours"
exit 0
