#!/usr/bin/env bash
# Roles of the MPI image, for MPIJob (MPI Operator v2beta1) and Volcano Job pods.
#   entrypoint.sh worker             sshd in the foreground, as the image's non-root user
#   entrypoint.sh launcher ARGS...   mpirun the trainer with ARGS on every slot of the hostfile
# The job's SSH secret is mounted at $GPUYARD_SSH_DIR (default ~/.ssh; MPI Operator:
# spec.sshAuthMountPath, Volcano: ssh plugin --ssh-key-file-path): id_rsa is both the
# client key and the host key, authorized_keys lets the launcher in.
# The launcher's hostfile is $GPUYARD_HOSTFILE (Volcano: /etc/volcano/<task>.host) or
# MPI Operator's OMPI_MCA_orte_default_hostfile; its first host is MASTER_ADDR unless
# that is set, and no hostfile means every rank runs here. sshd starts remote ranks
# with a clean environment, so the rendezvous, NCCL/EFA, AWS (IRSA) and thread
# settings are exported with -x. $GPUYARD_MPIRUN_ARGS adds mpirun options.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
role=${1:-}
shift || true
case $role in
worker)
    ssh_dir=${GPUYARD_SSH_DIR:-$HOME/.ssh}
    exec "${GPUYARD_SSHD:-/usr/sbin/sshd}" -D -e -f "$here/sshd_config" \
        -h "$ssh_dir/id_rsa" \
        -o "AuthorizedKeysFile=$ssh_dir/authorized_keys" \
        -o "PidFile=${TMPDIR:-/tmp}/gpuyard-sshd.pid" \
        ${GPUYARD_SSH_PORT:+-p "$GPUYARD_SSH_PORT"}
    ;;
launcher)
    options=()
    hostfile=${GPUYARD_HOSTFILE:-${OMPI_MCA_orte_default_hostfile:-}}
    if [[ -n $hostfile ]]; then
        options+=(--hostfile "$hostfile")
        first=$(awk 'NF && $1 !~ /^#/ { print $1; exit }' "$hostfile")
        export MASTER_ADDR=${MASTER_ADDR:-${first%%:*}}
    fi
    export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
    export MASTER_PORT=${MASTER_PORT:-29500}
    for name in $(compgen -e); do
        case $name in
        MASTER_ADDR | MASTER_PORT | PATH | LD_LIBRARY_PATH | PYTHONUNBUFFERED | OMP_NUM_THREADS | NCCL_* | FI_* | AWS_* | GPUYARD_*)
            options+=(-x "$name") ;;
        esac
    done
    read -r -a extra <<<"${GPUYARD_MPIRUN_ARGS:-}"
    exec mpirun "${options[@]}" "${extra[@]}" "${PYTHON:-python3}" -m jobs.workload.train "$@"
    ;;
*)
    echo "usage: entrypoint.sh worker | launcher TRAIN_ARGS... (got '${role}')" >&2
    exit 2
    ;;
esac
