#!/usr/bin/env bash
# A one-host Slurm for trying the Slurm executor and for its tests: munge, a private MariaDB,
# slurmdbd, slurmctld and two slurmd (node1, node2 on this host, `slurmd -N`), as plain
# processes (no systemd), with private ports and a private state directory. Debian's packages
# (slurmctld, slurmd, slurm-client, slurmdbd, slurm-wlm-mysql-plugin, mariadb-server, munge),
# installed by ops/setup.sh. As root.
#
#   ops/slurm.sh up      start it (or find it running); prints the line to use it:
#                          export SLURM_CONF=/var/tmp/trnflow-slurm/slurm.conf
#   ops/slurm.sh down    stop it (state, accounting database and logs stay in the directory)
#   ops/slurm.sh kill    end it at once, for a cluster whose directory is thrown away next
#                        (tests): SIGKILL to its daemons, job steps and jobs, no cancel, no
#                        state saved
#   ops/slurm.sh status  is it up?
#
# TRNFLOW_SLURM_DIR moves the directory (default /var/tmp/trnflow-slurm); TRNFLOW_SLURM_PORT
# the first of its four ports (default 16817: slurmctld, one per slurmd, then slurmdbd).
# Partitions:
#   batch   (default) node1,node2, never preempted
#   spot    node1,node2, preemptible: a job in `urgent` cancels spot jobs in its way
#   urgent  node1,node2, higher priority tier (for preemption tests)
# Each node has two fake Neuron devices as a generic resource (GresTypes=neuron, gres.conf
# with File= pointing at plain files under $dir/dev/NODE/), so `--gres=neuron:N` is scheduled
# and shows in `scontrol show job` as on a trn1 node (which has 16).
# Accounting, as on a ParallelCluster head node with its Database setting: slurmdbd
# (AccountingStorageType=accounting_storage/slurmdbd) storing into the database
# slurm_acct_db of a MariaDB server of its own ($dir/mariadb: its data directory and a unix
# socket only, no TCP port; not the system's MariaDB service, which stays off), so plain
# `sacct` reads jobs. It also keeps a job completion log (JobCompType=jobcomp/filetxt, what
# `sacct -c` reads). The worker reads these two keys from `scontrol show config` and bills
# from plain `sacct` first (docs/executors.md).
# Accounts, as a site has one per group: `lab`, `vision` and `nlp` below `root`, and a QOS
# `high` beside Slurm's `normal`; root (who submits every job here) is associated with each
# (its default account stays `root`). AccountingStorageEnforce=associations,qos: a job under
# an account or QOS its user has no association for is refused at sbatch, as on a site.
set -euo pipefail

dir="${TRNFLOW_SLURM_DIR:-/var/tmp/trnflow-slurm}"
port="${TRNFLOW_SLURM_PORT:-16817}"
conf="$dir/slurm.conf"
munge_socket="$dir/munge/munge.socket"
dbd_port=$((port + 3))
db="$dir/mariadb"  # MariaDB's data directory ($db/data), pid file and socket
db_socket="$db/mysqld.sock"
nodes=(node1 node2)

die() { echo "ops/slurm.sh: $*" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || die "run it as root (slurmd starts jobs as their users)"
for b in munged slurmctld slurmd slurmdbd sbatch squeue scontrol sacctmgr mariadbd \
         mariadb-install-db mariadb mariadb-admin; do
  command -v "$b" >/dev/null ||
    die "$b is missing: run ops/setup.sh (it installs slurm, slurmdbd, mariadb-server and munge)"
done
dpkg-query -W -f='${Status}' slurm-wlm-mysql-plugin 2>/dev/null | grep -q "install ok installed" ||
  die "slurmdbd's MySQL plugin is missing: run ops/setup.sh (it installs slurm-wlm-mysql-plugin)"

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
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$dbd_port
AccountingStoragePass=$munge_socket
AccountingStorageEnforce=associations,qos
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
  # slurmdbd reads slurmdbd.conf beside slurm.conf; it holds the database password, so it is
  # the SlurmUser's and 0600 (slurmdbd refuses it otherwise).
  [[ -s "$dir/mariadb.pass" ]] ||
    (umask 077; head -c 32 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' > "$dir/mariadb.pass")
  (umask 077; cat > "$dir/slurmdbd.conf" <<EOF
# Written by ops/slurm.sh: the test cluster's slurmdbd. Not for production.
AuthType=auth/munge
AuthInfo=socket=$munge_socket
DbdHost=localhost
DbdPort=$dbd_port
SlurmUser=root
PidFile=$dir/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=$(cat "$dir/mariadb.pass")
EOF
  )
  chown root:root "$dir/slurmdbd.conf"
  chmod 0600 "$dir/slurmdbd.conf"
}

# SIGTERM to the daemons of these pid files, 5 s to save their state, then SIGKILL.
stop() {
  local f pids=()
  for f in "$@"; do
    if alive "$f"; then pids+=("$(cat "$f")"); fi
  done
  ((${#pids[@]})) || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "${pids[@]}" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
}

# `mariadb` as root through the private socket (unix_socket authentication: root here); the
# statements on stdin, not in the process list (one sets a password).
sql() { mariadb --no-defaults --socket="$db_socket" -uroot -N -B <<< "$1"; }

# Small buffers and logs (a few jobs' records), no flush per commit: a test cluster.
db_opts=(--innodb-buffer-pool-size=16M --innodb-log-file-size=8M
         --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0)

# The private MariaDB on $db/data: a unix socket in $db (0700) only, no TCP port.
db_start() {
  if ! alive "$db/mariadbd.pid"; then
    setsid mariadbd --no-defaults --user=root --datadir="$db/data" --socket="$db_socket" \
      --skip-networking --pid-file="$db/mariadbd.pid" --log-error="$dir/log/mariadb.log" \
      "${db_opts[@]}" < /dev/null > /dev/null 2>&1 &
  fi
  local until=$((SECONDS + 15))
  until sql "SELECT 1" > /dev/null 2>&1; do
    if ((SECONDS >= until)); then
      tail -n 20 "$dir/log/mariadb.log" >&2
      die "MariaDB did not start in 15 s (log in $dir/log)"
    fi
    sleep 0.1
  done
}

# slurmdbd, answering sacctmgr; prints the clusters it knows.
dbd_start() {
  if ! alive "$dir/slurmdbd.pid"; then
    # StorageHost=localhost is the client library's default socket unless MYSQL_UNIX_PORT names
    # another.
    MYSQL_UNIX_PORT="$db_socket" slurmdbd
  fi
  local out="" until=$((SECONDS + 15))
  until out=$(sacctmgr -n -P list cluster format=cluster 2>&1); do
    if ((SECONDS >= until)); then
      echo "$out" >&2
      tail -n 20 "$dir/log/slurmdbd.log" >&2
      die "slurmdbd did not answer in 15 s (log in $dir/log)"
    fi
    sleep 0.1
  done
  echo "$out"
}

# The accounting: MariaDB (its data directory made on the first `up`), slurmdbd's database and
# user, slurmdbd, and this cluster registered with it. Making the data directory
# (mariadb-install-db, then slurmdbd's tables and the cluster's) takes ten seconds; its
# result, before any job, is kept as a template for the next fresh directory (tests start one
# each): TRNFLOW_SLURM_DB_TEMPLATE, default /var/tmp/trnflow-slurm-db-template, a copy per
# MariaDB and Slurm version.
accounting_up() {
  local key templates template fresh=""
  key=$(dpkg-query -W -f='mariadb-${Version}-' mariadb-server-core 2>/dev/null
        dpkg-query -W -f='slurmdbd-${Version}' slurmdbd 2>/dev/null)
  key=${key//[^A-Za-z0-9.+_-]/_}-accounts  # made with the accounts of accounts_up
  templates="${TRNFLOW_SLURM_DB_TEMPLATE:-/var/tmp/trnflow-slurm-db-template}"
  template="$templates/$key"
  mkdir -p "$db"
  chmod 0700 "$db"
  if [[ ! -d "$db/data/mysql" ]]; then
    rm -rf "$db/data"
    if [[ -d "$template/mysql" ]]; then
      cp -a "$template" "$db/data"
    else
      fresh=1
      mariadb-install-db --no-defaults --user=root --datadir="$db/data" --skip-test-db \
        --auth-root-authentication-method=socket "${db_opts[@]}" \
        > "$dir/log/mariadb-install.log" 2>&1 ||
        { tail -n 20 "$dir/log/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
    fi
  fi
  db_start
  # slurmdbd's database and user (the password in $dir/mariadb.pass, set again on each up).
  sql "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
       CREATE USER IF NOT EXISTS 'slurm'@'localhost';
       ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$(cat "$dir/mariadb.pass")';
       GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  if ! dbd_start | grep -qx trnflow; then
    sacctmgr -i add cluster trnflow > /dev/null
  fi
  accounts_up
  if [[ -n "$fresh" && ! -d "$template/mysql" ]]; then
    # A clean copy: both stopped (MariaDB flushes on SIGTERM), copied, renamed into place
    # whole (another cluster may be making the same one), started again.
    stop "$dir/slurmdbd.pid"
    stop "$db/mariadbd.pid"
    mkdir -p "$templates"
    chmod 0700 "$templates"
    cp -a "$db/data" "$templates/.new.$$"
    mv -T "$templates/.new.$$" "$template" 2>/dev/null || rm -rf "$templates/.new.$$"
    db_start
    dbd_start > /dev/null
  fi
}

# The groups' accounts and the QOS `high`, and root's associations with them (see the top);
# one sacctmgr call when they are there already (a data directory copied from the template).
accounts_up() {
  local have
  have=$(sacctmgr -n -P show assoc where cluster=trnflow user=root format=account,qos 2>/dev/null |
         sort | tr '\n' ' ')
  [[ $have == "lab|high,normal nlp|high,normal root|normal vision|high,normal " ]] && return 0
  sacctmgr -i add qos high > /dev/null 2>&1 || true
  sacctmgr -i add account lab,vision,nlp cluster=trnflow > /dev/null 2>&1 || true
  sacctmgr -i add user root account=lab,vision,nlp cluster=trnflow > /dev/null 2>&1 || true
  sacctmgr -i modify user root where account=lab,vision,nlp cluster=trnflow set qos=normal,high \
    > /dev/null 2>&1 || true
  have=$(sacctmgr -n -P show assoc where cluster=trnflow user=root format=account,qos 2>&1 |
         sort | tr '\n' ' ')
  [[ $have == "lab|high,normal nlp|high,normal root|normal vision|high,normal " ]] ||
    die "root's accounts are not as expected: $have"
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
  accounting_up
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
  local p
  # Jobs first, while the controller can still end them (it has 3 s).
  if alive "$dir/slurmctld.pid"; then
    timeout 5 scancel --full --quiet $(timeout 5 squeue -h -o %i 2>/dev/null) 2>/dev/null || true
    for _ in $(seq 1 30); do
      [[ -z $(timeout 5 squeue -h -t running,completing -o %i 2>/dev/null) ]] && break
      sleep 0.1
    done
  fi
  # Then the daemons, together: a record slurmctld cannot hand slurmdbd any more stays in its
  # saved state for the next start, and MariaDB flushes on SIGTERM.
  stop "$dir"/slurmd-*.pid "$dir/slurmctld.pid" "$dir/slurmdbd.pid" "$db/mariadbd.pid" \
    "$dir/munge/munged.pid"
  # Job steps outlive their slurmd by design (a slurmd restart keeps jobs running); this
  # cluster's, found by the files they hold in $dir, go with it.
  for p in $(pgrep -x slurmstepd || true); do
    if ls -l "/proc/$p/fd" 2>/dev/null | grep -qF "$dir/"; then kill -9 "$p" 2>/dev/null || true; fi
  done
  # And the batch scripts those steps ran (their parent gone, they would run on): the scripts
  # live in this cluster's spool directory.
  for p in $(pgrep -f -- "^/bin/bash $dir/spool/" || true); do kill -9 "$p" 2>/dev/null || true; done
  echo "slurm stopped (state in $dir)"
}

# A cluster's job steps (slurmstepd, found by the files they hold in $dir) and the jobs they
# run (each task its own process group, proctrack/pgid), and the batch scripts of this
# cluster's spool directory with their process groups.
kill_jobs() {
  local p c
  for p in $(pgrep -x slurmstepd || true); do
    if ls -l "/proc/$p/fd" 2>/dev/null | grep -qF "$dir/"; then
      for c in $(pgrep -P "$p" || true); do kill -9 -- "-$c" "$c" 2>/dev/null || true; done
      kill -9 "$p" 2>/dev/null || true
    fi
  done
  for p in $(pgrep -f -- "^/bin/bash $dir/spool/" || true); do
    kill -9 -- "-$p" "$p" 2>/dev/null || true
  done
}

# SIGKILL to everything of this cluster, daemons first (nothing restarts a step), then its
# jobs: nothing is saved, so only for a directory removed next.
kill_all() {
  local f pids=()
  for f in "$dir"/slurmd-*.pid "$dir/slurmctld.pid" "$dir/slurmdbd.pid" "$db/mariadbd.pid" \
           "$dir/munge/munged.pid"; do
    if alive "$f"; then pids+=("$(cat "$f")"); fi
  done
  ((${#pids[@]} == 0)) || kill -9 "${pids[@]}" 2>/dev/null || true
  kill_jobs
  # Gone (or a zombie nobody reaped yet) within 5 s.
  local p left
  for _ in $(seq 1 50); do
    left=0
    for p in "${pids[@]}"; do
      [[ -e /proc/$p && $(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) != Z ]] && left=1
    done
    ((left)) || break
    sleep 0.1
  done
  echo "slurm killed (directory $dir)"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  kill) kill_all ;;
  status)
    export SLURM_CONF="$conf"
    if alive "$dir/slurmctld.pid"; then sinfo -N; else echo "slurm is down"; exit 1; fi ;;
  *) die "usage: ops/slurm.sh up|down|kill|status" ;;
esac
