#!/usr/bin/env bash
# The worker role of the MPI image, for MPIJob (MPI Operator v2beta1) and Volcano Job pods:
#   entrypoint.sh worker [SSHD_OPTION...]   sshd in the foreground, as the image's non-root user
# The job's SSH secret is mounted at ~/.ssh (MPI Operator:
# spec.sshAuthMountPath, Volcano: ssh plugin --ssh-key-file-path). Its id_rsa is the
# host key as well as the launcher's client key; authorized_keys lets the launcher in.
# The launcher's mpirun (in the job template) starts the trainer ranks through it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
role=${1:-}
if [[ $role != worker ]]; then
    echo "usage: entrypoint.sh worker [SSHD_OPTION...] (got '${role}')" >&2
    exit 2
fi
shift
ssh_dir=$HOME/.ssh
exec /usr/sbin/sshd -D -e -f "$here/sshd_config" \
    -h "$ssh_dir/id_rsa" \
    -o "AuthorizedKeysFile=$ssh_dir/authorized_keys" \
    -o "PidFile=${TMPDIR:-/tmp}/gpuyard-sshd.pid" \
    "$@"
