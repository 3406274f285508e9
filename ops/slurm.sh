#!/usr/bin/env bash
# A one-host Slurm for trying the Slurm executor and for its tests: munge, slurmctld and two
# slurmd (node1, node2 on this host, `slurmd -N`), as plain processes (no systemd), with
# private ports and a private state directory. Debian's packages (slurmctld, slurmd,
# slurm-client, munge), installed by ops/setup.sh. As root.
#
#   ops/slurm.sh up      start it (or find it running); prints the line to use it:
#                          export SLURM_CONF=/var/tmp/trnflow-slurm/slurm.conf
#   ops/slurm.sh down    stop it (state and logs stay in the directory)
#   ops/slurm.sh status  is it up?
#
# TRNFLOW_SLURM_DIR moves the directory (default /var/tmp/trnflow-slurm); TRNFLOW_SLURM_PORT
# the first of its three ports (default 16817: slurmctld, then one per slurmd). Partitions:
#   batch   (default) node1,node2, never preempted
#   spot    node1,node2, preemptible: a job in `urgent` cancels spot jobs in its way
#   urgent  node1,node2, higher priority tier (for preemption tests)
# Each node has two fake Neuron devices as a generic resource (GresTypes=neuron, gres.conf
# with File= pointing at plain files under $dir/dev/NODE/), so `--gres=neuron:N` is scheduled
# and shows in `scontrol show job` as on a trn1 node (which has 16).
# Accounting: Debian packages slurmdbd, but it needs a MariaDB server, which this test
# cluster does not run; it keeps to job completion logging instead
# (AccountingStorageType=accounting_storage/none, JobCompType=jobcomp/filetxt), which `sacct -c`
# reads: the job's state, elapsed time and node count, what trnflow bills from. The worker
# reads these two keys from `scontrol show config`: on a cluster with slurmdbd it bills from
# plain `sacct` first (docs/executors.md).
set -euo pipefail

dir="${TRNFLOW_SLURM_DIR:-/var/tmp/trnflow-slurm}"
port="${TRNFLOW_SLURM_PORT:-16817}"
conf="$dir/slurm.conf"
munge_socket="$dir/munge/munge.socket"
nodes=(node1 node2)

die() { echo "ops/slurm.sh: $*" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || die "run it as root (slurmd starts jobs as their users)"
for b in munged slurmctld slurmd sbatch squeue scontrol; do
  command -v "$b" >/dev/null || die "$b is missing: run ops/setup.sh (it installs slurm and munge)"
done

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_conf() {
  local cpus mem
  # Eight job slots a node whatever the host has (config_overrides: slurmd believes the
  # configuration): the jobs of tests mostly wait, and a 200-task array should not queue four
  # at a time.
  cpus=$(( $(nproc) > 8 ? $(nproc) : 8 ))
  mem=$(( $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) / 4 ))
  mkdir -p "$dir"/{state,log,munge,spool/node1,spool/node2,dev/node1,dev/node2}
  touch "$dir"/dev/node{1,2}/neuron{0,1}
  cat > "$dir/gres.conf" <<EOF
# Written by ops/slurm.sh: two fake Neuron devices per node (plain files).
NodeName=node1 Name=neuron File=$dir/dev/node1/neuron[0-1]
NodeName=node2 Name=neuron File=$dir/dev/node2/neuron[0-1]
EOF
  cat > "$conf" <<EOF
# Written by ops/slurm.sh: a one-host test cluster. Not for production.
ClusterName=trnflow
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge_socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
LaunchParameters=use_interactive_step
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
SlurmdParameters=config_overrides
GresTypes=neuron
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
MinJobAge=3600
KillWait=10
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
Waittime=0
NodeName=node1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((port + 1)) CPUs=$cpus RealMemory=$mem Gres=neuron:2 State=UNKNOWN
NodeName=node2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((port + 2)) CPUs=$cpus RealMemory=$mem Gres=neuron:2 State=UNKNOWN
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
PartitionName=batch Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=OFF
PartitionName=spot Nodes=node1,node2 MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL
PartitionName=urgent Nodes=node1,node2 MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
}

up() {
  write_conf
  if ! alive "$dir/munge/munged.pid"; then
    [[ -f "$dir/munge/munge.key" ]] || { dd if=/dev/urandom bs=1 count=1024 of="$dir/munge/munge.key" 2>/dev/null; }
    chmod 0700 "$dir/munge"; chmod 0400 "$dir/munge/munge.key"
    munged --force --socket="$munge_socket" --key-file="$dir/munge/munge.key" \
      --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
      --seed-file="$dir/munge/munged.seed"
  fi
  export SLURM_CONF="$conf"
  if ! alive "$dir/slurmctld.pid"; then
    slurmctld -f "$conf"
  fi
  for n in "${nodes[@]}"; do
    if ! alive "$dir/slurmd-$n.pid"; then
      slurmd -f "$conf" -N "$n"
    fi
  done
  for _ in $(seq 1 100); do
    # One line per node of the default partition (sinfo -N repeats a node per partition).
    if [[ $(sinfo -h -N -p batch -o '%t' 2>/dev/null | grep -c -E '^(idle|mix|alloc)$') -eq ${#nodes[@]} ]]; then
      echo "export SLURM_CONF=$conf"
      return 0
    fi
    # A node left down by an earlier run (killed slurmd) comes back when it answers again.
    for n in $(sinfo -h -N -p batch -t down,drain -o '%N' 2>/dev/null); do
      scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true
    done
    sleep 0.2
  done
  sinfo -N >&2 || true
  tail -n 20 "$dir/log/slurmctld.log" >&2 || true
  die "the nodes did not come up in 20 s (logs in $dir/log)"
}

down() {
  export SLURM_CONF="$conf"
  local f p pids=()
  # Jobs first, while the controller can still end them (it has 3 s).
  if alive "$dir/slurmctld.pid"; then
    timeout 5 scancel --full --quiet $(timeout 5 squeue -h -o %i 2>/dev/null) 2>/dev/null || true
    for _ in $(seq 1 30); do
      [[ -z $(timeout 5 squeue -h -t running,completing -o %i 2>/dev/null) ]] && break
      sleep 0.1
    done
  fi
  for f in "$dir"/slurmd-*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    if alive "$f"; then pids+=("$(cat "$f")"); fi
  done
  ((${#pids[@]})) && kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 30); do  # 3 s to save their state, then they are killed
    kill -0 "${pids[@]}" 2>/dev/null || break
    sleep 0.1
  done
  ((${#pids[@]})) && kill -9 "${pids[@]}" 2>/dev/null || true
  # Job steps outlive their slurmd by design (a slurmd restart keeps jobs running); this
  # cluster's, found by the files they hold in $dir, go with it.
  for p in $(pgrep -x slurmstepd || true); do
    if ls -l "/proc/$p/fd" 2>/dev/null | grep -qF "$dir/"; then kill -9 "$p" 2>/dev/null || true; fi
  done
  echo "slurm stopped (state in $dir)"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status)
    export SLURM_CONF="$conf"
    if alive "$dir/slurmctld.pid"; then sinfo -N; else echo "slurm is down"; exit 1; fi ;;
  *) die "usage: ops/slurm.sh up|down|status" ;;
esac
