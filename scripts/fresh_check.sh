#!/usr/bin/env bash
# Proves the README's two commands on a machine that has nothing: makes a clean Debian 12 root
# with mmdebstrap (from Debian's packages, with this machine's apt sources), copies a clean clone
# of the repository's HEAD into it, and runs there, as a newcomer would:
#   1. scripts/run_main.sh     the main job, fully
#   2. scripts/test.sh ARGS    the test command: the whole build, then a CTest subset
# printing how long each step took and which packages the two commands installed. The root has
# no CUDA toolkit (it is not a Debian package), so this is also the CPU-only build
# (KILN_ENABLE_CUDA=AUTO finds no nvcc and builds every non-CUDA target).
#
# Usage: scripts/fresh_check.sh [--root DIR] [--keep] [--ctest "ARGS"] [--repo DIR]
#   --root DIR     where to make the root (default: a new folder under /var/tmp; must not exist)
#   --keep         leave the root in place afterwards (default: removed)
#   --ctest ARGS   CTest arguments for the test command (default: a subset through every layer)
#   --repo DIR     the repository whose HEAD is cloned (default: this script's)
# Needs root (mmdebstrap, mounts, chroot) and the network to Debian's archive and PyPI. Takes
# 30-60 minutes on a 2-core machine, most of it compiling.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root=""
keep=0
# A subset that goes through every layer: units of the lower layers, the CLI's own checks, the
# zoo end to end, and the hostile-input suite.
ctest_args=(-R "^(Builder\\.|Preflight\\.|OnnxImport\\.|EngineFile\\.|cli\\.|hostile\\.|conformance\\.zoo$)")
while (($#)); do
  case "$1" in
    --root) root="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --repo) repo="$(cd "$2" && pwd)"; shift 2 ;;
    --ctest) read -r -a ctest_args <<<"$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fresh_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$(id -u)" == 0 ]] || { echo "fresh_check: needs root (mmdebstrap, mount, chroot)" >&2; exit 2; }
if [[ -z "$root" ]]; then
  root="$(mktemp -d /var/tmp/kiln-fresh.XXXXXX)"
  rmdir "$root"
fi
[[ ! -e "$root" ]] || { echo "fresh_check: $root exists; give a new --root" >&2; exit 2; }

t0=$(date +%s)
step_start=$t0
declare -a timings=()
step() {  # step NAME: closes the previous step's timing and announces the next
  local now; now=$(date +%s)
  if [[ -n "${current_step:-}" ]]; then timings+=("$(printf '%-34s %5d s' "$current_step" $((now - step_start)))"); fi
  current_step="$1"; step_start=$now
  [[ -z "$1" ]] || echo "=== fresh_check: $1 ($(date -u +%H:%M:%S))"
}

mounted=()
cleanup() {
  local rc=$?
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  if ((keep == 0)) && [[ -d "$root" ]]; then rm -rf --one-file-system "$root"; fi
  exit $rc
}
trap cleanup EXIT

step "install mmdebstrap on this machine"
if ! command -v mmdebstrap >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi

step "make a clean Debian 12 root"
# This machine's own apt sources (deb822 or one-line), so the root uses the same archive.
sources=/etc/apt/sources.list.d/debian.sources
[[ -f "$sources" ]] || sources=/etc/apt/sources.list
mmdebstrap --variant=apt --include=ca-certificates --quiet bookworm "$root" "$sources"
dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Package}\n' | sort >"$root/.packages-before"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The network's own certificate authorities (a proxy's, say), as a machine on this network has
# them: local CAs are not packages, so a fresh machine here gets them from its image.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null
fi
[[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$root/etc/pip.conf"

step "copy a clean clone of HEAD"
git clone -q --no-hardlinks "$repo" "$root/kiln"
git -C "$root/kiln" log --oneline -1

for m in proc sys dev; do
  mkdir -p "$root/$m"
  case $m in
    proc) mount -t proc proc "$root/proc" ;;
    sys) mount --rbind /sys "$root/sys" ;;
    dev) mount --rbind /dev "$root/dev" ;;
  esac
  mounted+=("$root/$m")
done
mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"

in_root() {  # runs a command in the root with a newcomer's clean environment
  chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "cd /kiln && $1"
}

step "README command 1: scripts/run_main.sh"
in_root "scripts/run_main.sh"

step "README command 2: scripts/test.sh (build + subset)"
printf -v quoted '%q ' "${ctest_args[@]}"
in_root "scripts/test.sh $quoted"

step ""
dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${Package}\n' | sort >"$root/.packages-after"
installed=$(comm -13 "$root/.packages-before" "$root/.packages-after")
echo "=== fresh_check: the two commands installed $(wc -l <<<"$installed") Debian packages:"
fmt -w 100 <<<"$(tr '\n' ' ' <<<"$installed")"
echo "=== fresh_check: Python packages in the venv (pip):"
in_root ".venv/bin/python -m pip list --local --format=freeze 2>/dev/null | tr '\n' ' '; echo"
echo "=== fresh_check: CUDA backend in the root's build: $(grep -o 'KILN_ENABLE_CUDA:STRING=.*' "$root/kiln/builder/CMakeCache.txt")"
echo "=== fresh_check: timings"
printf '  %s\n' "${timings[@]}"
echo "  total                              $(( $(date +%s) - t0 )) s"
echo "=== fresh_check: passed (root: $root$( ((keep)) || echo ', removed'))"
