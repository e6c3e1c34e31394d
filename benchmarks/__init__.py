"""Side-by-side benchmarks of lossfns against its peers; run `python -m benchmarks`."""
