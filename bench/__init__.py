"""Fleet benchmarks: each script starts its own server and load-generator processes."""
