"""Benchmarks that need torch: all-reduce bandwidth in nccl-tests' terms."""
