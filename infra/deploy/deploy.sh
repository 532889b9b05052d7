#!/usr/bin/env bash
# One command deploys the partner event bus to a Google Cloud project:
#
#   PROJECT=my-proj REGION=europe-west1 bash infra/deploy/deploy.sh
#
# It enables the APIs, checks the MongoDB secret, builds and pushes the image with Cloud Build
# (unless IMAGE is given), zips the source for TARGET=function, then runs `pulumi up --yes` in
# infra/deploy/pulumi on the stack named after the project. Run with --help for the variables.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: [VARIABLE=value ...] bash infra/deploy/deploy.sh [--help]

Deploys the Pub/Sub push handler and/or the pull worker, their topics, dead letters, jobs
and alerts with Pulumi.

Required:
  PROJECT                 Google Cloud project id
  REGION                  region of the service, jobs and schedules (e.g. europe-west1)
Optional (a value given is written to the stack's config; one not given keeps the stack's):
  TARGET                  run (Cloud Run service, default) or function (Cloud Functions gen2)
  IMAGE                   container image to deploy; built with Cloud Build when not given
  MONGODB_SECRET          Secret Manager secret holding MONGODB_URI (default mongodb-uri)
  MONGODB_SECRET_VERSION  version of that secret (default latest)
  MONGODB_URI             only used to create MONGODB_SECRET when it does not exist yet
  SERVICE                 service / function name (default partner-eventbus)
  PUBSUB_TOPIC            event topic (default partner-events; dead letters: <topic>-dlq)
  PUSH_SERVICE_ACCOUNT    id of the push service account (default pubsub-push)
  MIN_INSTANCES           minimum instances (default 0)
  MAX_INSTANCES           maximum instances (default 10)
  WEB_CONCURRENCY         gunicorn workers (default 2)
  GUNICORN_THREADS        gunicorn threads per worker (default 4); concurrency = workers x threads
  INGRESS                 internal (default) or all
  AUDIENCE                OIDC audience of the pushes (default: derived, see README)
  NOTIFICATION_CHANNELS   comma-separated monitoring notification channel names for alerts
  ERROR_RATE_THRESHOLD    5xx responses per second that raise the 5xx alert (default 0.5)
  BREAKER_ALERT_SECONDS   a partner's breaker open this long raises an alert (default 1800)
  BACKLOG_ALERT_SECONDS   a message unacked this long on a subscription raises an alert (default 3600)
  DEAD_LETTER_ALERT_MESSAGES  more dead letters waiting than this raise an alert (default 0)
  DELIVERY_HEALTH_THRESHOLD   the push subscription's health score below this raises an alert (default 1)
  RELAY_SCHEDULE          cron of the outbox relay job (default */5 * * * *)
  REDRIVE_SCHEDULE        cron of the redrive job (default */10 * * * *)
  DRAIN_SCHEDULE          cron of the dead-letter drain job (default */15 * * * *)
  CONSUMER                push (default), pull (the worker in a Cloud Run worker pool) or both
  PULL_EVENT_TYPES        with CONSUMER=both: comma-separated event types the worker takes
  PULL_EXACTLY_ONCE       true: exactly-once delivery on the worker's subscription (default false)
  PULL_ORDERED            true: message ordering on the worker's subscription (default false)
  WORKER_INSTANCES        worker pool instances (default 1; 0 pauses the worker)
  WORKER_BATCH_SIZE       events per batch (default 100)
  WORKER_RATE             events/s ceiling of each worker instance (default 0: none)
  PUBLIC_CONSUMERS        comma-separated NAME:TOPIC:VERSION:MEMBER: who reads which public
                          topic (docs/PUBLIC_TOPICS.md); each gets its own subscription
  ARCHIVE                 true: keep every message past retention, as Avro files in a bucket
                          and in a BigQuery table (docs/OPERATORS.md, "The archive")
  ARCHIVE_DAYS            days the archive keeps a message (default 365)
  REPOSITORY              Artifact Registry repository for built images (default eventbus)
  STACK                   Pulumi stack name (default: PROJECT)
  PULUMI_BACKEND_URL      Pulumi state backend (default gs://PROJECT-pulumi-state, created)
  PULUMI_CONFIG_PASSPHRASE  passphrase of the stack's secrets (default empty: none are stored)

Needs gcloud (logged in) and the pulumi CLI. Example:
  PROJECT=my-proj REGION=europe-west1 MONGODB_SECRET=mongodb-uri TARGET=run \
    bash infra/deploy/deploy.sh
EOF
}

case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  "") ;;
  *) echo "deploy.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
esac

: "${PROJECT:?set PROJECT to the Google Cloud project id (see --help)}"
: "${REGION:?set REGION, e.g. europe-west1 (see --help)}"
TARGET=${TARGET:-run}
SERVICE=${SERVICE:-partner-eventbus}
MONGODB_SECRET=${MONGODB_SECRET:-mongodb-uri}
case "$TARGET" in
  run | function) ;;
  *) echo "deploy.sh: TARGET must be run or function, not '$TARGET'" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PROGRAM=$ROOT/infra/deploy/pulumi
# Environment variable -> Pulumi config key (the camelCase fields of stack.DeployConfig).
CONFIG_KEYS=(
  "PROJECT project" "REGION region" "TARGET target" "IMAGE image" "SERVICE service"
  "PUBSUB_TOPIC topic" "MONGODB_SECRET mongodbSecretId"
  "MONGODB_SECRET_VERSION mongodbSecretVersion" "PUSH_SERVICE_ACCOUNT pushServiceAccountId"
  "MIN_INSTANCES minInstances" "MAX_INSTANCES maxInstances" "WEB_CONCURRENCY workers"
  "GUNICORN_THREADS threads" "INGRESS ingress" "AUDIENCE audience"
  "NOTIFICATION_CHANNELS notificationChannels" "ERROR_RATE_THRESHOLD errorRateThreshold"
  "RELAY_SCHEDULE relaySchedule" "REDRIVE_SCHEDULE redriveSchedule"
  "DRAIN_SCHEDULE drainSchedule" "FUNCTION_SOURCE functionSource"
  "CONSUMER consumer" "PULL_EVENT_TYPES pullEventTypes" "PULL_EXACTLY_ONCE pullExactlyOnce" "PULL_ORDERED pullOrdered"
  "WORKER_INSTANCES workerInstances" "WORKER_BATCH_SIZE workerBatchSize"
  "WORKER_RATE workerRate" "PUBLIC_CONSUMERS publicConsumers"
  "BREAKER_ALERT_SECONDS breakerAlertSeconds" "ARCHIVE archive" "ARCHIVE_DAYS archiveDays"
  "BACKLOG_ALERT_SECONDS backlogAlertSeconds" "DEAD_LETTER_ALERT_MESSAGES deadLetterAlertMessages"
  "DELIVERY_HEALTH_THRESHOLD deliveryHealthThreshold"
)

say() { printf '== %s\n' "$*" >&2; }
g() { gcloud --project "$PROJECT" --quiet "$@"; }

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "deploy.sh: $tool is not installed" >&2; exit 1; }
  done
}

enable_apis() {
  say "enabling APIs"
  local apis=(run pubsub secretmanager cloudscheduler cloudbuild artifactregistry monitoring
              logging iam iamcredentials cloudresourcemanager)
  [ "$TARGET" = function ] && apis+=(cloudfunctions storage)
  [ "${ARCHIVE:-}" = true ] && apis+=(storage bigquery)
  g services enable "${apis[@]/%/.googleapis.com}"
}

ensure_secret() {
  if g secrets describe "$MONGODB_SECRET" >/dev/null 2>&1; then
    [ -z "${MONGODB_URI:-}" ] ||
      say "secret $MONGODB_SECRET exists: MONGODB_URI ignored (rotate: gcloud secrets versions add)"
    return
  fi
  if [ -z "${MONGODB_URI:-}" ]; then
    echo "deploy.sh: no secret $MONGODB_SECRET in $PROJECT; create it first:" >&2
    echo "  printf %s \"\$URI\" | gcloud secrets create $MONGODB_SECRET --data-file=-" >&2
    exit 1
  fi
  say "creating secret $MONGODB_SECRET from MONGODB_URI"
  printf %s "$MONGODB_URI" | g secrets create "$MONGODB_SECRET" --data-file=-
}

source_tag() {
  local ref
  ref=$(git -C "$ROOT" stash create 2>/dev/null || true)   # the work tree, refs untouched
  git -C "$ROOT" rev-parse --short "${ref:-HEAD}" 2>/dev/null || date -u +%Y%m%d%H%M%S
}

build_image() {
  [ -z "${IMAGE:-}" ] || return 0
  local repo=${REPOSITORY:-eventbus} tmp
  g artifacts repositories describe "$repo" --location "$REGION" >/dev/null 2>&1 ||
    g artifacts repositories create "$repo" --location "$REGION" --repository-format docker
  IMAGE="$REGION-docker.pkg.dev/$PROJECT/$repo/$SERVICE:$(source_tag)"
  say "building $IMAGE with Cloud Build"
  tmp=$(mktemp -d)
  # shellcheck disable=SC2016  # $_IMAGE is a Cloud Build substitution, not a shell variable
  printf '%s\n' 'steps:' '- name: gcr.io/cloud-builders/docker' \
    '  args: [build, -f, infra/deploy/Dockerfile, -t, $_IMAGE, .]' 'images: [$_IMAGE]' \
    >"$tmp/cloudbuild.yaml"
  g builds submit "$ROOT" --config "$tmp/cloudbuild.yaml" \
    --substitutions "_IMAGE=$IMAGE"
  rm -rf "$tmp"
}

zip_function_source() {
  [ "$TARGET" = function ] || return 0
  local ref stage
  ref=$(git -C "$ROOT" stash create 2>/dev/null || true)
  ref=${ref:-HEAD}
  mkdir -p "$PROGRAM/.build"
  FUNCTION_SOURCE="$PROGRAM/.build/source-$(git -C "$ROOT" rev-parse --short "$ref").zip"
  say "staging the tracked source ($ref) into $FUNCTION_SOURCE"
  # The functions buildpack installs requirements.txt (the pins) and imports
  # main.py from the source root, so the library goes next to it, unpacked.
  stage=$(mktemp -d)
  git -C "$ROOT" archive "$ref" main.py gunicorn.conf.py requirements.txt handlers src/eventbus |
    tar -x -C "$stage"
  mv "$stage/src/eventbus" "$stage/eventbus" && rmdir "$stage/src"
  rm -f "$FUNCTION_SOURCE"
  (cd "$stage" && zip -qr "$FUNCTION_SOURCE" .)
  rm -rf "$stage"
}

pulumi_backend() {
  [ -z "${PULUMI_BACKEND_URL:-}" ] || return 0
  local bucket="$PROJECT-pulumi-state"
  g storage buckets describe "gs://$bucket" >/dev/null 2>&1 ||
    g storage buckets create "gs://$bucket" --location "$REGION" --uniform-bucket-level-access
  export PULUMI_BACKEND_URL="gs://$bucket"
}

pulumi_up() {
  local pair var
  cd "$PROGRAM"
  export PULUMI_CONFIG_PASSPHRASE=${PULUMI_CONFIG_PASSPHRASE-}
  say "pulumi up: stack ${STACK:-$PROJECT} at $PULUMI_BACKEND_URL"
  pulumi install
  pulumi stack select --create "${STACK:-$PROJECT}"
  pulumi config set gcp:project "$PROJECT"
  pulumi config set gcp:region "$REGION"
  for pair in "${CONFIG_KEYS[@]}"; do
    var=${pair%% *}
    [ -z "${!var:-}" ] || pulumi config set -- "${pair#* }" "${!var}"
  done
  pulumi up --yes
  pulumi stack output
}

need gcloud git pulumi
enable_apis
ensure_secret
build_image
zip_function_source
pulumi_backend
pulumi_up
