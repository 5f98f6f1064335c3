#!/usr/bin/env bash
# gpucloud node bootstrap (EC2 user data). gpucloud.infra.userdata prepends the node settings,
# written to /etc/gpucloud/node.env, then runs this script as root on first boot.
#
# 1. Local scratch: reuse the DLAMI's striped instance store (/opt/dlami/nvme) when the dlami-nvme
#    service made one; otherwise stripe the instance-store NVMe disks (RAID 0, XFS) ourselves.
# 2. FSx for Lustre: install the client if missing and mount it (systemd automount, _netdev).
# 3. EFA: log whether the expected number of EFA devices came up (p5en initialises late: retry).
# 4. Node agent: install gpucloud (the stack's agent.package: an s3:// wheel copied with the
#    instance role, or a pip requirement; nothing when the AMI has it) and start
#    gpucloud-agent.service, which runs `gpucloud agent` (claims gang slots from the cluster's
#    queue named in node.env, runs attempts under the spot supervisor, holds scale-in protection
#    while busy, scales the node in when idle).
# 5. Exporters, unless monitoring.mode is off: node_exporter (infiniband collector: EFA counters) and
#    dcgm-exporter (gpucloud's counters file, from the installed wheel); managed: Prometheus in
#    agent mode writing them to Amazon Managed Prometheus with SigV4. The gpucloud image has them;
#    on another AMI they are fetched at the image's pinned versions (node.env), checksums verified.
# A failed step ends the bootstrap and the node leaves its group (leave_group), its reason on the
# serial console, its gpucloud:bootstrap-failed tag and /var/lib/gpucloud/bootstrap-failed.
set -euo pipefail

ENV_FILE=/etc/gpucloud/node.env
LOG_TAG=gpucloud-bootstrap

LAST_LOG=""  # the last thing said: the likely reason when a step fails
STEP=settings  # the step running (main): named in the reason when it fails

log() { LAST_LOG="$*"; logger -t "$LOG_TAG" -- "$*"; echo "$LOG_TAG: $*" >&2; }

BOOTSTRAP_FAILED_TAG=gpucloud:bootstrap-failed
CONSOLE=/dev/console
STATE_DIR=/var/lib/gpucloud

on_exit() {
  local rc=$?
  if (( rc == 0 )); then return 0; fi
  leave_group "step $STEP failed (exit $rc): ${LAST_LOG:-see journalctl -t $LOG_TAG}"
}

imds_instance_id() {
  local token
  token="$(curl -fsS -m 5 -X PUT http://169.254.169.254/latest/api/token -H 'X-aws-ec2-metadata-token-ttl-seconds: 60')" &&
    curl -fsS -m 5 -H "X-aws-ec2-metadata-token: $token" http://169.254.169.254/latest/meta-data/instance-id
}

# After a failed bootstrap: terminate with a decrement (marked unhealthy at the group's minimum; powered
# off without the AWS CLI), drain hook completed. Why not unhealthy first: docs/cluster-as-code.md.
# https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_TerminateInstanceInAutoScalingGroup.html
leave_group() {
  local reason="${1:0:255}" id group
  log "FAILED, leaving the group: $reason"
  echo "$LOG_TAG: FAILED, leaving the group: $reason" > "$CONSOLE" 2>/dev/null || true
  { mkdir -p "$STATE_DIR" && echo "$reason" > "$STATE_DIR/bootstrap-failed"; } 2>/dev/null || true
  if ! command -v aws >/dev/null || ! id="$(imds_instance_id)"; then poweroff; return 0; fi
  : "${GPUCLOUD_RETRY_ATTEMPTS:=8}"
  local -a r=()
  [[ -z "${GPUCLOUD_REGION:-}" ]] || r=(--region "$GPUCLOUD_REGION")
  aws ec2 create-tags "${r[@]}" --resources "$id" --tags "Key=$BOOTSTRAP_FAILED_TAG,Value=$reason" || true
  if aws autoscaling terminate-instance-in-auto-scaling-group "${r[@]}" --instance-id "$id" --should-decrement-desired-capacity; then
    [[ -n "${GPUCLOUD_LIFECYCLE_HOOK:-}" ]] || return 0
    group="$(aws autoscaling describe-auto-scaling-instances "${r[@]}" --instance-ids "$id" --query 'AutoScalingInstances[0].AutoScalingGroupName' --output text)" || return 0
    retry aws autoscaling complete-lifecycle-action "${r[@]}" --lifecycle-hook-name "$GPUCLOUD_LIFECYCLE_HOOK" \
      --auto-scaling-group-name "$group" --instance-id "$id" --lifecycle-action-result CONTINUE || true
    return 0
  fi
  aws autoscaling set-instance-health "${r[@]}" --instance-id "$id" --health-status Unhealthy --no-should-respect-grace-period || poweroff
}

trap on_exit EXIT

# shellcheck source=/dev/null
source "$ENV_FILE"
: "${GPUCLOUD_CLUSTER:?missing in $ENV_FILE}"
: "${GPUCLOUD_SCRATCH_PATH:=/scratch}"
: "${GPUCLOUD_NVME_SCRATCH:=1}"
: "${GPUCLOUD_EFA_INTERFACES:=0}"
: "${GPUCLOUD_FSX_DNS:=}"
: "${GPUCLOUD_FSX_MOUNT_NAME:=}"
: "${GPUCLOUD_FSX_MOUNT_PATH:=/fsx}"
: "${GPUCLOUD_PACKAGE:=}"
: "${GPUCLOUD_REGION:?missing in $ENV_FILE}"
: "${GPUCLOUD_RETRY_ATTEMPTS:=8}"
: "${GPUCLOUD_MONITORING:=off}"
: "${GPUCLOUD_AMP_REMOTE_WRITE_URL:=}"
: "${GPUCLOUD_NODE_EXPORTER_VERSION:=}" "${GPUCLOUD_DCGM_EXPORTER_VERSION:=}" "${GPUCLOUD_PROMETHEUS_VERSION:=}"
AGENT_DIR=/opt/gpucloud
UNIT_DIR=/etc/systemd/system
CONF_DIR=/etc/gpucloud
BIN_DIR=/usr/local/bin

# Wait until a command succeeds or the deadline (seconds) passes.
wait_for() {
  local deadline=$(( SECONDS + $1 )); shift
  until "$@"; do
    if (( SECONDS >= deadline )); then return 1; fi
    sleep 2
  done
}

# Run a command until it succeeds: at most GPUCLOUD_RETRY_ATTEMPTS tries, waiting 2, 4, 8, ... s
# (60 s at most) between them. Right after launch the instance role's grants may not be visible
# yet (IAM is eventually consistent:
# https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_general.html#troubleshoot_general_eventual-consistency),
# and the NAT route, an endpoint or the package index may not answer yet.
retry() {
  local attempts="$GPUCLOUD_RETRY_ATTEMPTS" delay=2 attempt=1
  until "$@"; do
    if (( attempt >= attempts )); then
      log "gave up after $attempt attempts: $1 ${2:-}"
      return 1
    fi
    log "attempt $attempt of $attempts failed: $1 ${2:-}; retrying in ${delay}s"
    sleep "$delay"
    attempt=$(( attempt + 1 ))
    delay=$(( delay * 2 > 60 ? 60 : delay * 2 ))
  done
}

dlami_nvme_ready() {
  [[ "$(systemctl show -p ActiveState --value dlami-nvme 2>/dev/null)" == "active" ]] && mountpoint -q /opt/dlami/nvme
}

instance_store_disks() {
  # Nitro exposes instance-store NVMe disks with this model string; EBS volumes differ.
  local link
  for link in /dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_*; do
    [[ -e "$link" && "$link" != *-part* ]] && readlink -f "$link"
  done | sort -u
}

setup_scratch() {
  if [[ "$GPUCLOUD_NVME_SCRATCH" != "1" ]]; then log "scratch: disabled"; return 0; fi
  if mountpoint -q "$GPUCLOUD_SCRATCH_PATH"; then log "scratch: $GPUCLOUD_SCRATCH_PATH already mounted"; return 0; fi
  if systemctl list-unit-files dlami-nvme.service >/dev/null 2>&1 && wait_for 300 dlami_nvme_ready; then
    # The DLAMI already striped the disks: a second array over the same disks would destroy it.
    ln -sfn /opt/dlami/nvme "$GPUCLOUD_SCRATCH_PATH"
    log "scratch: $GPUCLOUD_SCRATCH_PATH -> /opt/dlami/nvme (DLAMI)"
    return 0
  fi
  local -a disks
  mapfile -t disks < <(instance_store_disks)
  if (( ${#disks[@]} == 0 )); then log "scratch: no instance-store NVMe disks"; return 0; fi
  local device
  if (( ${#disks[@]} == 1 )); then
    device="${disks[0]}"
  else
    device=/dev/md/gpucloud-scratch
    if [[ ! -e "$device" ]]; then
      mdadm --create "$device" --run --level=0 --raid-devices="${#disks[@]}" "${disks[@]}"
      mdadm --detail --scan > /etc/mdadm/mdadm.conf 2>/dev/null || mdadm --detail --scan > /etc/mdadm.conf
    fi
  fi
  if ! blkid -o value -s TYPE "$device" >/dev/null 2>&1; then
    mkfs.xfs -f -L gpucloud-scratch "$device"
  fi
  mkdir -p "$GPUCLOUD_SCRATCH_PATH"
  if ! grep -q "LABEL=gpucloud-scratch" /etc/fstab; then
    echo "LABEL=gpucloud-scratch $GPUCLOUD_SCRATCH_PATH xfs defaults,noatime,nofail 0 2" >> /etc/fstab
  fi
  mount "$GPUCLOUD_SCRATCH_PATH"
  chmod 1777 "$GPUCLOUD_SCRATCH_PATH"
  log "scratch: ${#disks[@]} disk(s) striped on $GPUCLOUD_SCRATCH_PATH"
}

install_lustre_client() {
  if command -v mount.lustre >/dev/null 2>&1; then return 0; fi
  if command -v apt-get >/dev/null 2>&1; then
    # Ubuntu: the client module must match the running kernel.
    install -d -m 0755 /usr/share/keyrings
    curl -fsSL https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/fsx-ubuntu-public-key.asc \
      | gpg --dearmor --yes -o /usr/share/keyrings/fsx-ubuntu-public-key.gpg
    # shellcheck source=/dev/null
    codename="$(. /etc/os-release && echo "$VERSION_CODENAME")"
    echo "deb [signed-by=/usr/share/keyrings/fsx-ubuntu-public-key.gpg] https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu $codename main" \
      > /etc/apt/sources.list.d/fsxlustreclientrepo.list
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "lustre-client-modules-$(uname -r)" lustre-client-modules-aws
  else
    dnf install -y -q lustre-client
  fi
}

mount_fsx() {
  if [[ -z "$GPUCLOUD_FSX_DNS" ]]; then log "fsx: none in this stack"; return 0; fi
  install_lustre_client
  mkdir -p "$GPUCLOUD_FSX_MOUNT_PATH"
  local source="${GPUCLOUD_FSX_DNS}@tcp:/${GPUCLOUD_FSX_MOUNT_NAME}"
  if ! grep -q "^${source} " /etc/fstab; then
    echo "${source} ${GPUCLOUD_FSX_MOUNT_PATH} lustre defaults,noatime,flock,_netdev,x-systemd.automount,x-systemd.requires=network-online.target 0 0" >> /etc/fstab
  fi
  systemctl daemon-reload
  wait_for 300 mount "$GPUCLOUD_FSX_MOUNT_PATH" || { log "fsx: mount of $source failed"; return 1; }
  chmod 1777 "$GPUCLOUD_FSX_MOUNT_PATH"
  log "fsx: $source on $GPUCLOUD_FSX_MOUNT_PATH"
}

efa_device_count() {
  local n=0 dev
  for dev in /sys/class/infiniband/*; do [[ -e "$dev" ]] && n=$(( n + 1 )); done
  echo "$n"
}

check_efa() {
  local expected="$GPUCLOUD_EFA_INTERFACES" found attempt
  if (( expected == 0 )); then return 0; fi
  for attempt in 1 2 3; do
    found="$(efa_device_count)"
    if (( found == expected )); then log "efa: $found of $expected devices"; return 0; fi
    log "efa: $found of $expected devices (attempt $attempt), waiting"
    sleep 5
  done
  log "efa: WARNING only $found of $expected EFA devices; NCCL will be slower or fail"
}

# The gpucloud package the agent runs, from the stack's agent.package (GPUCLOUD_PACKAGE): an
# s3://bucket/key.whl wheel, copied with the instance role (the stack grants s3:GetObject on exactly
# that object), or a pip requirement. Empty: the AMI must bring it (the gpucloud image installs it
# into the same venv).
install_agent_package() {
  local venv="$AGENT_DIR/venv" requirement="$GPUCLOUD_PACKAGE"
  if [[ -x "$venv/bin/gpucloud" ]]; then
    log "agent: gpucloud already installed in $venv"
    return 0
  fi
  if [[ -z "$requirement" ]]; then
    log "agent: ERROR this AMI has no $venv/bin/gpucloud and the stack sets no gpucloud:agent.package; set it to an s3://bucket/key.whl wheel or a pip requirement, or boot the gpucloud image"
    return 1
  fi
  if [[ "$requirement" == s3://*/ ]]; then
    # A wheelhouse: gpucloud and every dependency, installed with no package index (egress:
    # endpoints has none; the S3 gateway endpoint reaches the bucket).
    if ! command -v aws >/dev/null 2>&1; then
      log "agent: ERROR the AWS CLI, needed to copy $GPUCLOUD_PACKAGE, is not installed on this AMI"
      return 1
    fi
    install -d -m 0755 "$AGENT_DIR/wheelhouse"
    retry aws s3 cp --recursive --only-show-errors --region "$GPUCLOUD_REGION" "$GPUCLOUD_PACKAGE" "$AGENT_DIR/wheelhouse/"
    python3 -m venv "$venv"
    retry "$venv/bin/pip" install --quiet --no-index --find-links "$AGENT_DIR/wheelhouse" gpucloud
    log "agent: installed gpucloud from the wheelhouse $GPUCLOUD_PACKAGE into $venv"
    return 0
  fi
  if [[ "$requirement" == s3://* ]]; then
    if ! command -v aws >/dev/null 2>&1; then
      log "agent: ERROR the AWS CLI, needed to copy $GPUCLOUD_PACKAGE, is not installed on this AMI"
      return 1
    fi
    install -d -m 0755 "$AGENT_DIR/wheels"
    # pip reads the project and the version from the wheel's file name: keep it
    requirement="$AGENT_DIR/wheels/${GPUCLOUD_PACKAGE##*/}"
    retry aws s3 cp --only-show-errors --region "$GPUCLOUD_REGION" "$GPUCLOUD_PACKAGE" "$requirement"
    # with PyTorch (the train extra): a DLAMI's venv has none, and the jobs' python is this venv's
    requirement="${requirement}[train]"
  fi
  python3 -m venv "$venv"
  retry "$venv/bin/pip" install --quiet "$requirement"
  log "agent: installed $GPUCLOUD_PACKAGE into $venv"
}

install_agent() {
  install -d -m 0755 "$AGENT_DIR" /var/lib/gpucloud
  install_agent_package
  cat > /opt/gpucloud/agent-start <<'START'
#!/usr/bin/env bash
# Start the node agent. Its job queue, region and lifecycle hook come from node.env (the unit's
# EnvironmentFile), and so does GPUCLOUD_EVENTS_QUEUE_URL: every agent also consumes the cluster's
# events queue, so a noticed node whose agent died is still handled. Control directories live on
# the node's own disk.
set -euo pipefail
# A job's `python` and `torchrun` are the agent venv's (on the gpucloud image: Python with the image's
# CUDA torch, docs/code-shipping.md), not /usr/bin/python3, which systemd's bare PATH would find first.
export PATH="/opt/gpucloud/venv/bin:$PATH"
exec /opt/gpucloud/venv/bin/gpucloud agent --run-dir /var/lib/gpucloud/run
START
  chmod 0755 /opt/gpucloud/agent-start
  cat > /etc/systemd/system/gpucloud-agent.service <<UNIT
[Unit]
Description=gpucloud node agent (claims gang slots, runs jobs under the spot supervisor)
Wants=network-online.target
After=network-online.target remote-fs.target

[Service]
EnvironmentFile=$ENV_FILE
ExecStart=/opt/gpucloud/agent-start
# 75: an interruption notice stopped the agent; the node is going away, do not take more work
Restart=on-failure
RestartPreventExitStatus=75
RestartSec=5
# spot-train needs time to checkpoint after SIGTERM; the lifecycle hook holds the node meanwhile
TimeoutStopSec=300
KillMode=mixed

[Install]
WantedBy=multi-user.target
UNIT
  systemctl daemon-reload
  systemctl enable --now gpucloud-agent.service
  log "agent: gpucloud-agent.service started"
}

# A Prometheus-project release (node_exporter, prometheus) unless the AMI has it: the tarball,
# checked against the release's sha256sums.txt.
ensure_release() {
  local name="$1" version="$2" dir base tarball
  if command -v "$name" >/dev/null 2>&1; then return 0; fi
  dir="$(mktemp -d)"; tarball="$name-$version.linux-amd64.tar.gz"
  base="https://github.com/prometheus/$name/releases/download/v$version"
  retry curl -fsSL -o "$dir/$tarball" "$base/$tarball" && retry curl -fsSL -o "$dir/sums" "$base/sha256sums.txt"
  (cd "$dir" && grep " $tarball\$" sums | sha256sum -c --status) || { log "monitoring: $tarball checksum mismatch"; return 1; }
  tar -xzf "$dir/$tarball" -C "$dir" && install -m 0755 "$dir/$name-$version.linux-amd64/$name" "$BIN_DIR/"
}

exporter_unit() {  # name command...
  local name="$1"; shift
  printf '[Unit]\nDescription=gpucloud %s\nAfter=network-online.target\n\n[Service]\nExecStart=%s\nRestart=always\nRestartSec=5\n\n[Install]\nWantedBy=multi-user.target\n' \
    "$name" "$*" > "$UNIT_DIR/gpucloud-$name.service"
  systemctl daemon-reload && systemctl enable --now "gpucloud-$name.service"
}

start_exporters() {
  if [[ "$GPUCLOUD_MONITORING" == "off" ]]; then log "monitoring: off, no exporters"; return 0; fi
  ensure_release node_exporter "$GPUCLOUD_NODE_EXPORTER_VERSION"
  exporter_unit node-exporter "$(command -v node_exporter)" --collector.infiniband --web.listen-address=:9100
  if ! command -v dcgm-exporter >/dev/null 2>&1; then
    # NVIDIA's CUDA repository (the DLAMI has it); the package's version may carry an epoch
    local pkg=datacenter-gpu-manager-exporter rel="${GPUCLOUD_DCGM_EXPORTER_VERSION#*-}"
    retry apt-get install -y -q "$pkg=$rel*" || apt-get install -y -q "$pkg=1:$rel*" || log "monitoring: WARNING no dcgm-exporter"
  fi
  local counters
  local -a remote=()
  counters="$("$AGENT_DIR/venv/bin/python" -c 'import importlib.util as u, os; print(os.path.join(u.find_spec("gpucloud").submodule_search_locations[0], "monitoring", "dcgm-counters.csv"))')"
  # share the node's DCGM host engine (nvidia-dcgm) instead of embedding a second one
  if systemctl is-active --quiet nvidia-dcgm.service; then remote=(-r localhost:5555); fi
  if command -v dcgm-exporter >/dev/null 2>&1; then
    exporter_unit dcgm-exporter "$(command -v dcgm-exporter)" -f "$counters" -a :9400 "${remote[@]}"
  fi
  if [[ "$GPUCLOUD_MONITORING" == "managed" ]]; then start_prometheus_agent; fi
  log "monitoring: $GPUCLOUD_MONITORING exporters started"
}

# Managed: this node's exporters, labelled as the monitor's EC2 discovery would (instance_id,
# node_group), remote-written with the instance role (aps:RemoteWrite on the stack's workspace).
# The configuration comes from the one source of every monitoring file (gpucloud.monitoring):
# `gpucloud monitoring node-config` renders it (the agent venv's gpucloud: no deploy extra needed).
start_prometheus_agent() {
  local instance_id
  ensure_release prometheus "$GPUCLOUD_PROMETHEUS_VERSION"
  instance_id="$(imds_instance_id)"
  install -d -m 0755 "$CONF_DIR"
  "$AGENT_DIR/venv/bin/gpucloud" monitoring node-config --remote-write-url "$GPUCLOUD_AMP_REMOTE_WRITE_URL" \
    --region "$GPUCLOUD_REGION" --cluster "$GPUCLOUD_CLUSTER" --node-group "$GPUCLOUD_NODE_GROUP" \
    --instance-id "$instance_id" --agent-port "${GPUCLOUD_METRICS_PORT:-9401}" --out "$CONF_DIR/prometheus-agent.yml"
  exporter_unit prometheus-agent "$(command -v prometheus)" --agent "--config.file=$CONF_DIR/prometheus-agent.yml" \
    --storage.agent.path=/var/lib/gpucloud/prometheus-agent --web.listen-address=127.0.0.1:9090
}

main() {
  log "bootstrap of $GPUCLOUD_CLUSTER node started"
  STEP=scratch; setup_scratch
  STEP=fsx; mount_fsx
  STEP=efa; check_efa
  STEP=agent; install_agent
  STEP=exporters
  start_exporters || log "monitoring: WARNING exporters did not all start; the node works without them"
  date -u +%Y-%m-%dT%H:%M:%SZ > /var/lib/gpucloud/bootstrap-done
  log "bootstrap done"
}

main "$@"
