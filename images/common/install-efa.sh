#!/bin/sh
# EFA for NCCL, user space only (the node's AMI carries the kernel driver):
#   install-efa.sh runtime EFA_INSTALLER_VERSION
#       libfabric with its EFA provider, from the AWS EFA installer (--skip-kmod: no kernel module in a
#       container), as the AWS EFA container examples do (aws-samples/awsome-distributed-training).
#   install-efa.sh plugin EFA_INSTALLER_VERSION AWS_OFI_NCCL_VERSION
#       the above plus aws-ofi-nccl, NCCL's libfabric network plugin, built from its release tarball
#       (aws/aws-ofi-nccl INSTALL.md) into /opt/aws-ofi-nccl; needs the CUDA headers of a -devel base.
# Without both, NCCL silently trains over TCP sockets; the job templates set NCCL_NET so it fails instead.
set -eu
mode=$1
efa_version=$2
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends curl ca-certificates
curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${efa_version}.tar.gz" | tar -xz -C /tmp
(cd /tmp/aws-efa-installer && ./efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify)
rm -rf /tmp/aws-efa-installer
/opt/amazon/efa/bin/fi_info --version
if [ "$mode" = plugin ]; then
    ofi_version=$3
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends build-essential libhwloc-dev
    curl -fsSL "https://github.com/aws/aws-ofi-nccl/releases/download/v${ofi_version}/aws-ofi-nccl-${ofi_version}.tar.gz" \
        | tar -xz -C /tmp
    (cd "/tmp/aws-ofi-nccl-${ofi_version}" \
        && ./configure --prefix=/opt/aws-ofi-nccl --with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda \
            --enable-platform-aws \
        && make -j"$(nproc)" && make install)
    rm -rf "/tmp/aws-ofi-nccl-${ofi_version}"
    ls /opt/aws-ofi-nccl/lib/libnccl-net*.so
fi
rm -rf /var/lib/apt/lists/*
