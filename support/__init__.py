"""What the tests, the benchmarks and the drills share: child processes that are always
stopped, waiting for a condition, free loopback ports, a loopback JSON client and a loopback
HTTP receiver."""
