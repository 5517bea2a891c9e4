"""What the tests, the benchmarks and the drills share: child processes that are always
stopped, waiting for a condition, free loopback ports, and a loopback JSON client."""
