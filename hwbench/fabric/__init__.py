"""Collectives between ranks, measured as nccl-tests measures them (docs/collectives.md)."""
