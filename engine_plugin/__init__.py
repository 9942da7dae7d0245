"""vLLM engine plugin: graph-fused per-request steering."""
