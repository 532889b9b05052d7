#!/usr/bin/env bash
# Kept for old habits: deploy as a Cloud Function (gen2) with an authenticated push subscription,
# through the one deploy command (see README.md here).
#   PROJECT=my-project REGION=europe-west1 infra/deploy/cloud-function.sh
exec env TARGET=function bash "$(dirname "$0")/deploy.sh" "$@"
