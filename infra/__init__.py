"""Platform infrastructure shared by every stage: configuration, storage, Ray and MLflow plumbing.

Cluster definitions (container image, KubeRay and cluster-launcher manifests) live beside
this package under ``infra/``.
"""
