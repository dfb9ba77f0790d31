"""Where the templates' images come from: ``<registry>/<image>:<tag>``.

The registry is ``gpuyard:image_registry`` (an ECR host plus the cluster name, as the stack's
``ecr_repositories`` output gives it). Job templates need it (``template_image``): a job never
falls back to a Docker Hub name nobody can pull. Without it, ``gpuyard images build`` tags local
builds with the cluster name instead. ECR repositories are named ``<cluster_name>/<image>``.
"""

from gpuyard.infra.config import ConfigError, StackConfig
from gpuyard.infra.conventions import IMAGE_NAMES


class NoImageRegistry(ConfigError):
    """The stack names no registry for its templates' images."""


def repository_name(cluster_name: str, image: str) -> str:
    return f"{cluster_name}/{image}"


def image_ref(config: StackConfig, image: str) -> str:
    """The full reference of one of ``IMAGE_NAMES`` for this stack."""
    if image not in IMAGE_NAMES:
        raise ValueError(f"unknown image {image!r} (images: {', '.join(IMAGE_NAMES)})")
    registry = config.image_registry or config.cluster_name
    return f"{registry.rstrip('/')}/{image}:{config.image_tag}"


def kept_tags(config: StackConfig) -> dict[str, tuple[str, ...]]:
    """Image -> the tags of its repository the stack's job templates and TrainingRuntimes run: the stack's
    ``image_tag``, and the tag of a team's ``image`` when that names one of the stack's repositories."""
    kept = {image: {config.image_tag} for image in IMAGE_NAMES}
    for team in config.teams:
        reference = team.image or ""
        path, _, tag = reference.rpartition(":")
        for image in IMAGE_NAMES:
            if "/" not in tag and path.endswith(f"/{repository_name(config.cluster_name, image)}"):
                kept[image].add(tag)
    return {image: tuple(sorted(tags)) for image, tags in kept.items()}


def template_image(config: StackConfig, image: str) -> str:
    """The image job templates run: the stack's ECR repository; a ConfigError says how to name one."""
    if not config.image_registry:
        raise NoImageRegistry(
            f"stack {config.stack!r} has no image registry: set gpuyard:image_registry to its ECR registry "
            f"(<account>.dkr.ecr.{config.region}.amazonaws.com/{config.cluster_name}, the prefix of "
            "`pulumi stack output ecr_repositories`)"
        )
    return image_ref(config, image)
