"""L4, multi-model management: registry, evaluation, deployments and the OpenAI gateway."""
