# The slurm.conf settings local_cluster.sh and sim_cluster.sh share (sourced by both): root
# daemons, a private munge, state under $STATE_DIR, no cgroups, quick turnaround for tests.
# Usage: slurm_conf_shared SLURMD_SPOOL_DIR SLURMD_PID_FILE SLURMD_LOG_FILE (needs STATE_DIR and
# MUNGE_SOCKET); the caller writes the cluster's name, hosts, ports, nodes and partition.
slurm_conf_shared() {
    cat <<EOF
SlurmUser=root
SlurmdUser=root

# Private munge daemon (socket in the state dir); used for auth + job creds.
# cred_expire also sets how long a requeued job waits before it may restart.
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10

StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$1
SlurmctldPidFile=$STATE_DIR/slurmctld.daemon.pid
SlurmdPidFile=$2
SlurmctldLogFile=$STATE_DIR/slurmctld.log
SlurmdLogFile=$3
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true

# No systemd/cgroups here: track processes via /proc, no CPU binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=pmi2

# Schedule individual CPUs; memory is not a consumable resource. The backfill pass, which starts a
# requeued job once it may restart, every second (SLURM's default: 30 s).
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU

# Quick turnaround for tests: 5 s between SIGTERM and SIGKILL at job end /
# time limit, finished jobs disappear from squeue after 10 s (and sbatch --wait,
# which polls less often the longer MinJobAge is, sees a job end within 8 s), a
# restarted slurmd puts the node straight back into service, batch jobs may be requeued.
KillWait=5
MinJobAge=10
ReturnToService=2
JobRequeue=1
SlurmdTimeout=60
InactiveLimit=0

# Advertise $CPUS CPUs whatever the real core count is (config_overrides makes
# slurmd trust this file instead of the hardware it detects).
SlurmdParameters=config_overrides
EOF
}
