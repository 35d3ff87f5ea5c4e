#!/bin/sh
# Push a locally built image to ECR, creating the repository if missing:
#   containers/push-image.sh IMAGE_NAME TAG        (make push-image)
# Needs Docker and the aws CLI with credentials; the region comes from
# AWS_REGION or the CLI profile.
set -eu

name="${1:?usage: push-image.sh IMAGE_NAME TAG}"
tag="${2:?usage: push-image.sh IMAGE_NAME TAG}"
region="${AWS_REGION:-$(aws configure get region || true)}"
if [ -z "$region" ]; then
    echo "error: no AWS region: export AWS_REGION or run 'aws configure'" >&2
    exit 2
fi
account="$(aws sts get-caller-identity --query Account --output text)"
registry="${account}.dkr.ecr.${region}.amazonaws.com"

if ! aws ecr describe-repositories --region "$region" --repository-names "$name" >/dev/null 2>&1; then
    aws ecr create-repository --region "$region" --repository-name "$name" \
        --image-scanning-configuration scanOnPush=true >/dev/null
    echo "created ECR repository $name"
fi
aws ecr get-login-password --region "$region" | docker login --username AWS --password-stdin "$registry"
docker tag "${name}:${tag}" "${registry}/${name}:${tag}"
docker push "${registry}/${name}:${tag}"
echo "pushed; set in your config:  pipeline.image_uri: ${registry}/${name}:${tag}"
