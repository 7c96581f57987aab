"""Developer tools: the generated references (CLI, CRDs, metrics) and the estimator's protobuf codegen."""
