"""Benchmarks (``cake-moe bench ...``): measured side by side with their anchors in one run."""
