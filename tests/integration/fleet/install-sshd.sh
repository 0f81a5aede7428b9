#!/bin/sh
# The fleet tests (tests/integration/fleet/) start their own OpenSSH servers on 127.0.0.1:
# make sure Debian's openssh-server and -client are installed. Idempotent and quick when they
# are; never fails `make test`: without root or apt-get it says so, and those tests skip,
# naming the missing sshd. The package's own service is not started (a policy-rc.d refuses
# it while installing): the tests run their own sshd processes, nothing listens on port 22.
set -u
SSHD=/usr/sbin/sshd
if [ -x "$SSHD" ] && command -v ssh >/dev/null 2>&1 && command -v ssh-keygen >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: no $SSHD and no root apt-get to install it: the fleet's SSH tests will skip" >&2
    exit 0
fi
echo "installing openssh-server and openssh-client for the fleet's SSH tests" >&2
policy=/usr/sbin/policy-rc.d
made_policy=
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && made_policy=1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q openssh-server openssh-client >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q openssh-server openssh-client >/dev/null 2>&1; } \
    || echo "note: apt-get could not install openssh-server: the fleet's SSH tests will skip" >&2
[ -n "$made_policy" ] && rm -f "$policy"
exit 0
