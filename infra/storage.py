"""Storage: the private, encrypted, TLS-only checkpoint bucket and one ECR repository per image."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from gpuyard.infra.config import StorageConfig
from gpuyard.infra.conventions import IMAGE_NAMES
from gpuyard.infra.policies import bucket_tls_only_policy
from gpuyard.infra.images import repository_name


def checkpoint_lifecycle_rules(noncurrent_days: int) -> list[dict]:
    """Expire overwritten checkpoint versions after ``noncurrent_days``; abort stale multipart uploads."""
    return [
        {
            "id": "expire-old-checkpoint-versions",
            "status": "Enabled",
            "filter": {"prefix": ""},
            "noncurrent_version_expiration": {"noncurrent_days": noncurrent_days},
            "abort_incomplete_multipart_upload": {"days_after_initiation": 2},
        }
    ]


def ecr_lifecycle_policy(kept_tags: tuple[str, ...], keep: int = 50) -> dict:
    """Never expire an image tagged with one of ``kept_tags`` (what the stack's templates and TrainingRuntimes run);
    of the rest, keep the newest ``keep``.

    ECR's evaluation rules (docs.aws.amazon.com/AmazonECR/latest/userguide/LifecyclePolicies.html, "Lifecycle policy
    evaluation rules"): an image that matches the tagging requirements of a higher-priority rule cannot be expired by
    a lower-priority one, and an image is expired by at most one rule; a ``tagPatternList`` selects images with all
    its patterns (lifecycle_policy_parameters.html), hence one rule per tag; a ``tagStatus: any`` rule must come last.
    Tags are immutable, so each kept tag names one image: "more than 1" never holds and that rule expires nothing.
    """
    keep_rules = [
        {
            "rulePriority": priority,
            "description": f"never expire {tag}: the stack runs it",
            "selection": {"tagStatus": "tagged", "tagPatternList": [tag], "countType": "imageCountMoreThan",
                          "countNumber": 1},
            "action": {"type": "expire"},
        }
        for priority, tag in enumerate(sorted(kept_tags), start=1)
    ]
    return {
        "rules": [
            *keep_rules,
            {
                "rulePriority": len(keep_rules) + 1,
                "description": f"keep the newest {keep} images",
                "selection": {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": keep},
                "action": {"type": "expire"},
            },
        ]
    }


@dataclass(frozen=True)
class StorageArgs:
    cluster_name: str
    bucket_name: str
    config: StorageConfig
    aws_provider: aws.Provider
    kept_tags: dict[str, tuple[str, ...]]  # image -> tags its lifecycle policy never expires (gpuyard.infra.images.kept_tags)


class Storage(pulumi.ComponentResource):
    """Checkpoint bucket (versioned, SSE-KMS, no public access, TLS only, lifecycle) and ECR repositories."""

    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    repository_urls: pulumi.Output[dict[str, str]]

    def __init__(self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpuyard:storage:Storage", name, None, opts)
        self._name = name
        self._args = args
        self._opts = pulumi.ResourceOptions(parent=self, provider=args.aws_provider)
        self._kept = pulumi.ResourceOptions.merge(self._opts, pulumi.ResourceOptions(protect=args.config.protect))
        if args.config.protect:
            pulumi.log.info(f"checkpoint bucket {args.bucket_name} and the image registries are protected: pulumi "
                            "destroy stops at them (`pulumi state unprotect` first to delete them)", resource=self)
        bucket = self._create_bucket()
        access_block = self._create_public_access_block(bucket)
        self._create_encryption(bucket)
        self._create_versioning(bucket)
        self._create_tls_only_policy(bucket, access_block)
        self._create_lifecycle(bucket)
        repositories = self._create_repositories()
        self.bucket_name = bucket.bucket
        self.bucket_arn = bucket.arn
        self.repository_urls = pulumi.Output.all(**{image: repo.repository_url for image, repo in repositories.items()})
        self.register_outputs(
            {"bucket_name": self.bucket_name, "bucket_arn": self.bucket_arn, "repository_urls": self.repository_urls}
        )

    def _create_bucket(self) -> aws.s3.Bucket:
        return aws.s3.Bucket(
            f"{self._name}-checkpoints",
            bucket=self._args.bucket_name,
            force_destroy=self._args.config.force_destroy,
            opts=self._kept,
        )

    def _create_public_access_block(self, bucket: aws.s3.Bucket) -> aws.s3.BucketPublicAccessBlock:
        return aws.s3.BucketPublicAccessBlock(
            f"{self._name}-checkpoints",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=self._opts,
        )

    def _create_encryption(self, bucket: aws.s3.Bucket) -> None:
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{self._name}-checkpoints",
            bucket=bucket.id,
            rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": "aws:kms"}, "bucket_key_enabled": True}],
            opts=self._opts,
        )

    def _create_versioning(self, bucket: aws.s3.Bucket) -> None:
        aws.s3.BucketVersioning(
            f"{self._name}-checkpoints",
            bucket=bucket.id,
            versioning_configuration={"status": "Enabled"},
            opts=self._opts,
        )

    def _create_tls_only_policy(self, bucket: aws.s3.Bucket, access_block: aws.s3.BucketPublicAccessBlock) -> None:
        aws.s3.BucketPolicy(
            f"{self._name}-checkpoints",
            bucket=bucket.id,
            policy=bucket.arn.apply(lambda arn: json.dumps(bucket_tls_only_policy(arn))),
            opts=pulumi.ResourceOptions.merge(self._opts, pulumi.ResourceOptions(depends_on=[access_block])),
        )

    def _create_lifecycle(self, bucket: aws.s3.Bucket) -> None:
        aws.s3.BucketLifecycleConfiguration(
            f"{self._name}-checkpoints",
            bucket=bucket.id,
            rules=checkpoint_lifecycle_rules(self._args.config.noncurrent_days),
            opts=self._opts,
        )

    def _create_repositories(self) -> dict[str, aws.ecr.Repository]:
        repositories = {}
        for image in IMAGE_NAMES:
            repository = aws.ecr.Repository(
                f"{self._name}-{image}",
                name=repository_name(self._args.cluster_name, image),
                image_tag_mutability="IMMUTABLE",  # a tag a TrainingRuntime runs names one image, forever
                image_scanning_configuration={"scan_on_push": True},
                encryption_configurations=[{"encryption_type": "KMS"}],
                force_delete=self._args.config.force_destroy,
                opts=self._kept,
            )
            aws.ecr.LifecyclePolicy(
                f"{self._name}-{image}",
                repository=repository.name,
                policy=json.dumps(ecr_lifecycle_policy(self._args.kept_tags[image])),
                opts=self._opts,
            )
            repositories[image] = repository
        return repositories
