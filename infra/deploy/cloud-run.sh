#!/usr/bin/env bash
# Deploy to Cloud Run and point an authenticated push subscription at it.
#
#   PROJECT=my-project REGION=europe-west1 MONGODB_URI=mongodb+srv://... infra/deploy/cloud-run.sh
#
# Creates (idempotently): the topic, a dead-letter topic, a push service account,
# the service (no unauthenticated access), and a push subscription with OIDC
# tokens, a retry policy (10 s .. 600 s) and a dead-letter policy.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${PROJECT:?set PROJECT}" "${REGION:?set REGION}" "${MONGODB_URI:?set MONGODB_URI}"
SERVICE=${SERVICE:-partner-eventbus}
TOPIC=${PUBSUB_TOPIC:-partner-events}
DLQ=${TOPIC}-dlq
PUSHER=${PUSHER:-pubsub-push}
PUSHER_EMAIL="$PUSHER@$PROJECT.iam.gserviceaccount.com"
g() { gcloud --project "$PROJECT" "$@"; }

g pubsub topics describe "$TOPIC" >/dev/null 2>&1 || g pubsub topics create "$TOPIC"
g pubsub topics describe "$DLQ" >/dev/null 2>&1 || g pubsub topics create "$DLQ"
g iam service-accounts describe "$PUSHER_EMAIL" >/dev/null 2>&1 ||
  g iam service-accounts create "$PUSHER" --display-name "Pub/Sub push to $SERVICE"

g run deploy "$SERVICE" --source . --region "$REGION" --no-allow-unauthenticated \
  --set-env-vars "MONGODB_URI=$MONGODB_URI,PUBSUB_TOPIC=$TOPIC,GOOGLE_CLOUD_PROJECT=$PROJECT,EVENTBUS_AUTH=true,EVENTBUS_AUTH_SERVICE_ACCOUNTS=$PUSHER_EMAIL" \
  --timeout 120
URL=$(g run services describe "$SERVICE" --region "$REGION" --format 'value(status.url)')
g run services update "$SERVICE" --region "$REGION" --update-env-vars "EVENTBUS_AUTH_AUDIENCE=$URL/"
g run services add-iam-policy-binding "$SERVICE" --region "$REGION" \
  --member "serviceAccount:$PUSHER_EMAIL" --role roles/run.invoker

SUB=${TOPIC}-push
if g pubsub subscriptions describe "$SUB" >/dev/null 2>&1; then
  g pubsub subscriptions modify-push-config "$SUB" --push-endpoint "$URL/" \
    --push-auth-service-account "$PUSHER_EMAIL" --push-auth-token-audience "$URL/"
else
  g pubsub subscriptions create "$SUB" --topic "$TOPIC" --push-endpoint "$URL/" \
    --push-auth-service-account "$PUSHER_EMAIL" --push-auth-token-audience "$URL/" \
    --ack-deadline 60 --min-retry-delay 10s --max-retry-delay 600s \
    --dead-letter-topic "$DLQ" --max-delivery-attempts 100 --message-retention-duration 7d
fi
echo "deployed $SERVICE at $URL; push subscription $SUB"
