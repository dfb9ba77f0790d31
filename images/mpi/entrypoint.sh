#!/usr/bin/env bash
# The worker role of the MPI image, for MPIJob (MPI Operator v2beta1) and Volcano Job pods:
#   entrypoint.sh worker [SSHD_OPTION...]   sshd in the foreground, as the image's non-root user
# The job's SSH secret is mounted at ~/.ssh (MPI Operator:
# spec.sshAuthMountPath, Volcano: ssh plugin --ssh-key-file-path). Its id_rsa is the
# host key as well as the launcher's client key; authorized_keys lets the launcher in.
# The launcher's mpirun (in the job template) starts the trainer ranks through it.
#
# Stopping: the kubelet sends SIGTERM to the container's PID 1 only. The upstream examples run sshd as PID 1
# (kubeflow/mpi-operator v0.8.0 examples/v2beta1/pi/pi.yaml: `sshd -De`; volcano-sh/volcano v1.15.1
# example/integrations/mpi/mpi-example.yaml: `sh -c "...; /usr/sbin/sshd -D"`): sshd exits on SIGTERM without
# signalling its sessions, and when PID 1 exits the kernel SIGKILLs the rest of the container, so the ranks never
# save. Here tini is PID 1 (it reaps the ranks that sshd's sessions orphan and passes SIGTERM to this script), and
# this script, on SIGTERM, sends SIGTERM to the ranks and waits until they and Open MPI's daemon have exited (the
# kubelet's SIGKILL bounds that by the pod's grace period), then stops sshd.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
role=${1:-}
if [[ $role != worker ]]; then
    echo "usage: entrypoint.sh worker [SSHD_OPTION...] (got '${role}')" >&2
    exit 2
fi
shift
if (( $$ == 1 )); then
    exec /usr/bin/tini -- "$0" worker "$@"
fi
# The ranks: children of Open MPI's orted, the daemon mpirun starts through sshd on each worker.
ranks() {
    local stat pid comm state ppid rest daemons=" "
    for stat in /proc/[0-9]*/stat; do
        read -r pid comm state ppid rest 2>/dev/null < "$stat" || continue
        [[ $comm == "(orted)" ]] && daemons+="$pid "
    done
    for stat in /proc/[0-9]*/stat; do
        read -r pid comm state ppid rest 2>/dev/null < "$stat" || continue
        [[ $daemons == *" $ppid "* ]] && echo "$pid"
    done
    return 0
}

# What sshd's sessions still run (ranks, orted, the sessions): all but tini, this script and its children, and
# sshd's listener.
sessions() {
    local stat pid comm state ppid rest
    for stat in /proc/[0-9]*/stat; do
        read -r pid comm state ppid rest 2>/dev/null < "$stat" || continue
        (( pid == 1 || pid == $$ || ppid == $$ || pid == sshd )) || echo "$pid"
    done
    return 0
}

# SIGTERM to the ranks; then wait for them and for orted, which exits when mpirun tells it (after the job ends
# or aborts; Open MPI sends the other ranks SIGTERM, then SIGKILL odls_base_sigkill_timeout s later), so mpirun
# never loses a daemon; then sshd.
stop() {
    local pids
    pids=$(ranks)
    if [[ -n $pids ]]; then
        echo "entrypoint.sh: SIGTERM to ranks $(echo $pids)" >&2
        kill -TERM $pids 2>/dev/null || true
    fi
    while [[ -n $(sessions) ]]; do sleep 0.2; done
    kill -TERM "$sshd" 2>/dev/null || true
    wait "$sshd" || true
    exit 143
}

ssh_dir=$HOME/.ssh
/usr/sbin/sshd -D -e -f "$here/sshd_config" \
    -h "$ssh_dir/id_rsa" \
    -o "AuthorizedKeysFile=$ssh_dir/authorized_keys" \
    -o "PidFile=${TMPDIR:-/tmp}/gpuyard-sshd.pid" \
    "$@" &
sshd=$!
trap stop TERM
wait "$sshd"
