#!/usr/bin/env bash
# Kept for old habits: deploy to Cloud Run through the one deploy command (see README.md here).
#   PROJECT=my-project REGION=europe-west1 infra/deploy/cloud-run.sh
exec env TARGET=run bash "$(dirname "$0")/deploy.sh" "$@"
