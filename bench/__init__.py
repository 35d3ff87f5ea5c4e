"""`make bench`: the training loops under the local service's cost model, learning parity, client overhead,
tracking and validation throughput (see README.md)."""
