#!/usr/bin/env bash
# gpucloud monitor bootstrap (EC2 user data of the self-hosted monitor, monitoring.mode: self-hosted).
# gpucloud.infra.monitoring prepends the settings, written to /etc/gpucloud/monitor.env, then runs
# this script as root on first boot (Ubuntu 24.04; the AMI's SSM agent is how people reach it).
#
# 1. The TSDB volume (encrypted gp3, sized from retentionDays): format once, mount on /var/lib/prometheus.
# 2. The monitoring files `gpucloud monitoring render` wrote for this stack (prometheus.yml, rules/,
#    alertmanager.yml, dashboards/), staged by the stack in its bucket: copied to /etc/gpucloud-monitor.
# 3. Prometheus and Alertmanager from their release tarballs (checked against the release's
#    sha256sums.txt), Grafana from its .deb (checked against its .sha256), at the versions pinned in
#    gpucloud.infra.monitoring_userdata; all three listen on 127.0.0.1 only (SSM port forwarding
#    reaches Grafana; nothing else can).
# 4. Grafana provisioned from files: the Prometheus datasource and the dashboards folder.
set -euo pipefail

ENV_FILE=/etc/gpucloud/monitor.env
LOG_TAG="gpucloud-monitor"

log() { logger -t "$LOG_TAG" -- "$*"; echo "$LOG_TAG: $*" >&2; }

# shellcheck source=/dev/null
source "$ENV_FILE"
: "${GPUCLOUD_REGION:?missing in $ENV_FILE}"
: "${GPUCLOUD_MONITOR_FILES:?missing in $ENV_FILE}"
: "${GPUCLOUD_MONITOR_VOLUME_ID:?missing in $ENV_FILE}"
: "${GPUCLOUD_RETENTION_DAYS:?missing in $ENV_FILE}"
: "${GPUCLOUD_RETENTION_SIZE_GIB:?missing in $ENV_FILE}"
: "${GPUCLOUD_PROMETHEUS_VERSION:?missing in $ENV_FILE}"
: "${GPUCLOUD_ALERTMANAGER_VERSION:?missing in $ENV_FILE}"
: "${GPUCLOUD_GRAFANA_VERSION:?missing in $ENV_FILE}"
CONF=/etc/gpucloud-monitor
DATA=/var/lib/prometheus

retry() {
  local attempt
  for attempt in 1 2 3 4 5 6; do
    if "$@"; then return 0; fi
    log "attempt $attempt failed: $1 ${2:-}; retrying"
    sleep $(( attempt * 5 ))
  done
  log "gave up: $*"
  return 1
}

# The attached EBS volume shows up as an NVMe device whose serial is the volume id without its dash
# (https://docs.aws.amazon.com/ebs/latest/userguide/identify-nvme-ebs-device.html). The attachment
# may land after boot: wait for it.
mount_data() {
  local device="/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_${GPUCLOUD_MONITOR_VOLUME_ID/-/}" waited=0
  until [[ -e "$device" ]]; do
    if (( waited >= 600 )); then log "data volume $GPUCLOUD_MONITOR_VOLUME_ID never appeared"; return 1; fi
    sleep 5; waited=$(( waited + 5 ))
  done
  if ! blkid -o value -s TYPE "$device" >/dev/null 2>&1; then mkfs.xfs -L gpucloud-tsdb "$device"; fi
  mkdir -p "$DATA"
  if ! grep -q "LABEL=gpucloud-tsdb" /etc/fstab; then
    echo "LABEL=gpucloud-tsdb $DATA xfs defaults,noatime,nofail 0 2" >> /etc/fstab
  fi
  mountpoint -q "$DATA" || mount "$DATA"
  log "tsdb: $GPUCLOUD_MONITOR_VOLUME_ID on $DATA"
}

# A Prometheus-project release (prometheus, alertmanager): the linux-amd64 tarball, verified.
install_release() {
  local name="$1" version="$2" dir base tarball
  dir="$(mktemp -d)"
  base="https://github.com/prometheus/$name/releases/download/v$version"
  tarball="$name-$version.linux-amd64.tar.gz"
  retry curl -fsSL -o "$dir/$tarball" "$base/$tarball"
  retry curl -fsSL -o "$dir/sha256sums.txt" "$base/sha256sums.txt"
  (cd "$dir" && grep " $tarball\$" sha256sums.txt | sha256sum -c --status) || { log "$tarball: checksum mismatch"; return 1; }
  tar -xzf "$dir/$tarball" -C "$dir"
  shift 2
  local binary
  for binary in "$@"; do install -m 0755 "$dir/$name-$version.linux-amd64/$binary" /usr/local/bin/; done
  rm -rf "$dir"
  log "$name $version installed"
}

install_grafana() {
  local deb="grafana_${GPUCLOUD_GRAFANA_VERSION}_amd64.deb" dir
  dir="$(mktemp -d)"
  retry curl -fsSL -o "$dir/$deb" "https://dl.grafana.com/oss/release/$deb"
  retry curl -fsSL -o "$dir/$deb.sha256" "https://dl.grafana.com/oss/release/$deb.sha256"
  # the .sha256 holds the hash (first field, whether or not a file name follows)
  echo "$(awk '{ print $1; exit }' "$dir/$deb.sha256")  $dir/$deb" | sha256sum -c --status || { log "$deb: checksum mismatch"; return 1; }
  retry apt-get update -q
  DEBIAN_FRONTEND=noninteractive retry apt-get install -y -q "$dir/$deb"
  rm -rf "$dir"
}

fetch_files() {
  if ! command -v aws >/dev/null 2>&1; then retry snap install aws-cli --classic; fi
  install -d -m 0755 "$CONF"
  retry aws s3 cp --recursive --only-show-errors --region "$GPUCLOUD_REGION" "$GPUCLOUD_MONITOR_FILES" "$CONF/"
  log "files: $GPUCLOUD_MONITOR_FILES -> $CONF"
}

unit() {  # name description command...
  local name="$1" description="$2"; shift 2
  cat > "/etc/systemd/system/$name.service" <<UNIT
[Unit]
Description=$description
Wants=network-online.target
After=network-online.target

[Service]
User=prometheus
ExecStart=$*
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT
}

start_prometheus() {
  id prometheus >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin prometheus
  install -d -o prometheus -g prometheus "$DATA/data" /var/lib/alertmanager
  chown -R prometheus:prometheus "$DATA/data" /var/lib/alertmanager
  unit prometheus "Prometheus (gpucloud monitor)" /usr/local/bin/prometheus \
    "--config.file=$CONF/prometheus.yml" "--storage.tsdb.path=$DATA/data" \
    "--storage.tsdb.retention.time=${GPUCLOUD_RETENTION_DAYS}d" \
    "--storage.tsdb.retention.size=${GPUCLOUD_RETENTION_SIZE_GIB}GB" --web.listen-address=127.0.0.1:9090
  unit alertmanager "Alertmanager (gpucloud monitor)" /usr/local/bin/alertmanager \
    "--config.file=$CONF/alertmanager.yml" --storage.path=/var/lib/alertmanager \
    --web.listen-address=127.0.0.1:9093 --cluster.listen-address=
  systemctl daemon-reload
  systemctl enable --now prometheus.service alertmanager.service
}

start_grafana() {
  local provisioning=/etc/grafana/provisioning password
  cat > "$provisioning/datasources/gpucloud.yaml" <<YAML
apiVersion: 1
datasources:
  - name: Prometheus
    uid: prometheus
    type: prometheus
    access: proxy
    url: http://127.0.0.1:9090
    isDefault: true
YAML
  cat > "$provisioning/dashboards/gpucloud.yaml" <<YAML
apiVersion: 1
providers:
  - name: gpucloud
    folder: gpucloud
    type: file
    allowUiUpdates: false
    options:
      path: $CONF/dashboards
YAML
  # Only SSM port forwarding reaches 127.0.0.1:3000; the admin password is on the monitor
  # (sudo cat /root/grafana-admin-password in an SSM session), never in the stack or user data.
  if [[ ! -s /root/grafana-admin-password ]]; then
    (umask 077 && head -c 24 /dev/urandom | base64 | tr -d '/+=' > /root/grafana-admin-password)
  fi
  password="$(cat /root/grafana-admin-password)"
  install -d -m 0755 /etc/systemd/system/grafana-server.service.d
  (umask 077 && cat > /etc/systemd/system/grafana-server.service.d/gpucloud.conf <<CONF
[Service]
Environment=GF_SERVER_HTTP_ADDR=127.0.0.1
Environment=GF_SECURITY_ADMIN_PASSWORD=$password
Environment=GF_ANALYTICS_REPORTING_ENABLED=false
CONF
  )
  systemctl daemon-reload
  systemctl enable --now grafana-server.service
}

# 5. The daily training-efficiency report (docs/cost.md, "The daily report"), when the stack asks for
#    it (GPUCLOUD_REPORT_SCHEDULE=daily): gpucloud in its own venv, and a systemd timer that writes
#    `gpucloud report --since 24h --output html` to the bucket's reports/ prefix every day and
#    publishes the summary to the alert topic.
REPORT_DIR=/opt/gpucloud-report
REPORT_SCRIPT=/usr/local/bin/gpucloud-daily-report

install_daily_report() {
  if [[ "${GPUCLOUD_REPORT_SCHEDULE:-off}" != daily ]]; then log "daily report: off"; return 0; fi
  : "${GPUCLOUD_QUEUE:?missing in $ENV_FILE}" "${GPUCLOUD_REPORTS:?missing in $ENV_FILE}"
  : "${GPUCLOUD_ALERT_TOPIC_ARN:?missing in $ENV_FILE}" "${GPUCLOUD_REPORT_PACKAGE:?missing in $ENV_FILE}"
  DEBIAN_FRONTEND=noninteractive retry apt-get install -y -q python3-venv
  python3 -m venv "$REPORT_DIR/venv"
  # The stack's agent.package, fetched as node-bootstrap.sh's install_agent_package does (a folder is a
  # wheelhouse, another s3:// URI one wheel, else a pip requirement). Not that function itself: each
  # script is a whole user data file (16 KiB), and the node's installs plain gpucloud with no index,
  # where this one adds the [report] extra (matplotlib) from the index (the monitor has NAT egress).
  local package="$GPUCLOUD_REPORT_PACKAGE" wheel
  if [[ "$package" == s3://*/ ]]; then
    install -d -m 0755 "$REPORT_DIR/wheelhouse"
    retry aws s3 cp --recursive --only-show-errors --region "$GPUCLOUD_REGION" "$package" "$REPORT_DIR/wheelhouse/"
    retry "$REPORT_DIR/venv/bin/pip" install --quiet --find-links "$REPORT_DIR/wheelhouse" "gpucloud[report]"
  elif [[ "$package" == s3://* ]]; then
    install -d -m 0755 "$REPORT_DIR/wheels"
    wheel="$REPORT_DIR/wheels/${package##*/}"  # pip reads the project and version from the file name: keep it
    retry aws s3 cp --only-show-errors --region "$GPUCLOUD_REGION" "$package" "$wheel"
    retry "$REPORT_DIR/venv/bin/pip" install --quiet "${wheel}[report]"
  else
    retry "$REPORT_DIR/venv/bin/pip" install --quiet "$package"
  fi
  write_report_units "${UNIT_DIR:-/etc/systemd/system}" "$REPORT_SCRIPT" "$REPORT_DIR/venv/bin/gpucloud"
  systemctl daemon-reload
  systemctl enable --now gpucloud-report.timer
  log "daily report: $GPUCLOUD_REPORTS every day at 06:00 UTC, summary to $GPUCLOUD_ALERT_TOPIC_ARN"
}

write_report_units() {  # unit-dir script gpucloud
  local units="$1" script="$2" gpucloud="$3"
  cat > "$script" <<'SCRIPT'
#!/usr/bin/env bash
# Written by the gpucloud monitor bootstrap: the daily report to S3, its summary to the alert topic.
set -euo pipefail
day="$(date -u +%F)"
summary="$(mktemp)"
trap 'rm -f "$summary" "$summary.msg"' EXIT
common=(--queue "$GPUCLOUD_QUEUE" --prometheus http://localhost:9090 --since 24h)
"$GPUCLOUD_BIN" report "${common[@]}" --output html --out "${GPUCLOUD_REPORTS}${day}.html"
"$GPUCLOUD_BIN" report "${common[@]}" --output table --out "$summary"
# The summary is the text before the tables (SNS takes 256 KB; the tables are in the page).
{ sed '/^$/q' "$summary"; echo "report: ${GPUCLOUD_REPORTS}${day}.html"; } > "$summary.msg"
aws sns publish --region "$GPUCLOUD_REGION" --topic-arn "$GPUCLOUD_ALERT_TOPIC_ARN" \
  --subject "gpucloud daily report $day" --message "file://$summary.msg" > /dev/null
SCRIPT
  chmod 0755 "$script"
  cat > "$units/gpucloud-report.service" <<UNIT
[Unit]
Description=gpucloud daily training-efficiency report
After=network-online.target prometheus.service
Wants=network-online.target

[Service]
Type=oneshot
EnvironmentFile=$ENV_FILE
# The aws CLI is a snap here (fetch_files)
Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/snap/bin
Environment=GPUCLOUD_BIN=$gpucloud
ExecStart=$script
UNIT
  cat > "$units/gpucloud-report.timer" <<UNIT
[Unit]
Description=gpucloud daily training-efficiency report, every day at 06:00 UTC

[Timer]
OnCalendar=*-*-* 06:00:00 UTC
Persistent=true
RandomizedDelaySec=300

[Install]
WantedBy=timers.target
UNIT
}

main() {
  log "monitor of ${GPUCLOUD_CLUSTER:-the cluster} started"
  mount_data
  fetch_files
  install_release prometheus "$GPUCLOUD_PROMETHEUS_VERSION" prometheus promtool
  install_release alertmanager "$GPUCLOUD_ALERTMANAGER_VERSION" alertmanager amtool
  install_grafana
  start_prometheus
  start_grafana
  install_daily_report
  log "monitor ready: aws ssm start-session --document-name AWS-StartPortForwardingSession --parameters portNumber=3000,localPortNumber=3000"
}

main "$@"
