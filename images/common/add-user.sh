#!/bin/sh
# Create the image's non-root user with a fixed uid, so pods can set runAsNonRoot.
#   usage: add-user.sh NAME UID
# Ubuntu 24.04 bases ship an "ubuntu" user with uid 1000; it is removed first.
set -eu
name=$1
uid=$2
existing=$(getent passwd "$uid" | cut -d: -f1)
if [ -n "$existing" ] && [ "$existing" != "$name" ]; then
    userdel --remove "$existing" 2>/dev/null || userdel "$existing"
fi
if getent group "$uid" >/dev/null; then
    groupdel "$(getent group "$uid" | cut -d: -f1)"
fi
groupadd --gid "$uid" "$name"
useradd --create-home --uid "$uid" --gid "$uid" --shell /bin/bash "$name"
