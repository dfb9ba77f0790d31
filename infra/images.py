"""Where the templates' images come from: ``<registry>/<image>:<tag>``.

The registry is ``gpuyard:image_registry`` when set (an ECR host plus the cluster
name, as the stack's ``ecr_repositories`` output gives it), else the cluster name,
which is also how ``gpuyard images build`` tags local builds. ECR repositories are named
``<cluster_name>/<image>``.
"""

from infra.config import StackConfig
from infra.conventions import IMAGE_NAMES


def repository_name(cluster_name: str, image: str) -> str:
    return f"{cluster_name}/{image}"


def image_ref(config: StackConfig, image: str) -> str:
    """The full reference of one of ``IMAGE_NAMES`` for this stack."""
    if image not in IMAGE_NAMES:
        raise ValueError(f"unknown image {image!r} (images: {', '.join(IMAGE_NAMES)})")
    registry = config.image_registry or config.cluster_name
    return f"{registry.rstrip('/')}/{image}:{config.image_tag}"
