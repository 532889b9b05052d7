#!/usr/bin/env bash
# Deploy as a Cloud Function (2nd gen) with the functions-framework target `pubsub_push`.
# The HTTP signature handles wrapped pushes and Eventarc CloudEvents alike.
#
#   PROJECT=my-project REGION=europe-west1 MONGODB_URI=... infra/deploy/cloud-function.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${PROJECT:?set PROJECT}" "${REGION:?set REGION}" "${MONGODB_URI:?set MONGODB_URI}"
NAME=${NAME:-partner-eventbus}
TOPIC=${PUBSUB_TOPIC:-partner-events}
gcloud --project "$PROJECT" functions deploy "$NAME" --gen2 --region "$REGION" \
  --runtime python311 --source . --entry-point pubsub_push --trigger-topic "$TOPIC" \
  --set-env-vars "MONGODB_URI=$MONGODB_URI,PUBSUB_TOPIC=$TOPIC,GOOGLE_CLOUD_PROJECT=$PROJECT" \
  --timeout 120s --retry
