"""`make bench`: round trips, speculative generation, client overhead and validation throughput (see README.md)."""
