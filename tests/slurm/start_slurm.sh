#!/bin/bash
# Starts a single-node Slurm (munged, slurmctld, slurmd) on localhost, as root and without systemd,
# with its configuration, state, logs and PID files in DIR (default /tmp/hymoe-slurm); see
# spec/toolchain.md §5. Clients then need `export SLURM_CONF=DIR/slurm.conf`.
#   tests/slurm/start_slurm.sh [DIR]
# Environment: SLURM_FAKE_CPUS (default nproc), SLURM_FAKE_GPUS (default 0: no gres; N > 0 fakes N
# GPUs backed by /dev/null links), SLURM_CTLD_PORT / SLURMD_PORT (default 6817 / 6818).
# munged is started only if none answers; DIR/munged.ours then tells stop_slurm.sh to stop it.
# Exit 0 when the node is idle; otherwise 1 with the reason and the daemons' last log lines on
# stderr (the daemons already started are left for stop_slurm.sh).
set -euo pipefail
DIR=${1:-/tmp/hymoe-slurm}
HERE=$(cd "$(dirname "$0")" && pwd)
HOST=$(hostname -s)
CPUS=${SLURM_FAKE_CPUS:-$(nproc)}
GPUS=${SLURM_FAKE_GPUS:-0}
CTLD_PORT=${SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
fail() {
    echo "start_slurm: $*" >&2
    exit 1
}

[ "$(id -u)" = 0 ] || fail "needs root (SlurmUser=root, munged as user munge)"
for b in /usr/sbin/munged /usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/sbatch /usr/bin/munge; do
    [ -x "$b" ] || fail "$b is missing: install slurm-wlm, munge and libpmix-dev (make deps)"
done
ls /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so >/dev/null 2>&1 ||
    fail "libpmix.so is missing (srun --mpi=pmix needs libpmix-dev; make deps)"
for p in "$CTLD_PORT" "$SLURMD_PORT"; do  # another slurmctld/slurmd (or anything) on our ports?
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
        fail "port $p on 127.0.0.1 is in use (another Slurm?); set SLURM_CTLD_PORT/SLURMD_PORT"
    fi
done
getent hosts "$HOST" >/dev/null || fail "hostname '$HOST' does not resolve (add it to /etc/hosts)"

mkdir -p "$DIR/state" "$DIR/spool"
sed -e "s|@HOST@|$HOST|g" -e "s|@DIR@|$DIR|g" -e "s|@CPUS@|$CPUS|g" -e "s|@GPUS@|$GPUS|g" \
    -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
    "$HERE/slurm.conf.in" >"$DIR/slurm.conf"
if [ "$GPUS" -gt 0 ]; then  # Slurm 22.05 drops file-less GPUs: point File= at /dev/null links
    mkdir -p "$DIR/fakedev"
    for i in $(seq 0 $((GPUS - 1))); do ln -sf /dev/null "$DIR/fakedev/nvidia$i"; done
    echo "NodeName=$HOST Name=gpu File=$DIR/fakedev/nvidia[0-$((GPUS - 1))]" >"$DIR/gres.conf"
else
    sed -i -e 's/ Gres=gpu:0//' -e '/^GresTypes=/d' "$DIR/slurm.conf"
    rm -f "$DIR/gres.conf"
fi
export SLURM_CONF="$DIR/slurm.conf"

# munge: the Debian postinst creates the key; make one if it is missing
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
chmod 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --force
    chown munge:munge /etc/munge/munge.key
    chmod 0600 /etc/munge/munge.key
fi
munge_ok() { munge -n 2>/dev/null | unmunge 2>/dev/null | grep -q 'STATUS: *Success'; }
if ! munge_ok; then
    runuser -u munge -- /usr/sbin/munged || fail "munged did not start (see /var/log/munge/munged.log)"
    touch "$DIR/munged.ours"
    for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
fi
munge_ok || fail "munge -n | unmunge fails: $(munge -n 2>&1 | unmunge 2>&1 | tail -1)"

logs() { tail -n 20 "$DIR/slurmctld.log" "$DIR/slurmd.log" >&2 2>/dev/null || true; }
/usr/sbin/slurmctld -i || { logs; fail "slurmctld did not start"; }  # -i: no saved state
/usr/sbin/slurmd || { logs; fail "slurmd did not start"; }
st=""
for _ in $(seq 100); do
    st=$(sinfo -h -N -o '%T' 2>/dev/null | head -1 || true)
    [[ "$st" == idle* ]] && break
    sleep 0.2
done
[[ "$st" == idle* ]] || { logs; fail "node $HOST is not idle after 20 s: '$st'"; }
echo "slurm: node $HOST idle, $CPUS CPUs, $GPUS GPUs, SLURM_CONF=$SLURM_CONF"
