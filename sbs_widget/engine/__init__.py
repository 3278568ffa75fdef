"""Running both sides in lockstep: entry points, the prepared pair, the run, FX side, ONNX segments,
node-local groups, runtimes, metrics, tolerance, time limits."""
